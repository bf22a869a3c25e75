"""A model directory's weights file, read and checked before it is trusted: safetensors (its header first, so that
shapes and dtypes are known before any tensor is read) or a pickle read weights-only; every tensor's shape against
config.json, its dtype, its values finite; Hugging Face's names to ours. `pretrained.from_pretrained` puts them
together."""

from __future__ import annotations

import json
import math
import pickle
import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from rookworld.io.errors import RookworldError
from rookworld.net.model import GPTConfig

# HF's GPT-2 uses Conv1D, which stores weights as [in, out]; nn.Linear wants [out, in].
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# HF buffers (causal-mask tables) that older checkpoints carry; SDPA makes them unnecessary.
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


class ModelNotAvailableError(RookworldError, OSError):
    """The checkpoint could not be found locally and could not be fetched from the hub."""


class ModelFileError(ModelNotAvailableError, ValueError):
    """A model directory whose config.json or weights cannot be read: cut short, corrupt, or not what they say (a
    ValueError too, as an unsupported config always was to the Python API)."""


class NoModelFile(RookworldError, FileNotFoundError):
    """A model directory, or a file a model directory needs, is not there."""


class NotAModelDirectory(RookworldError, NotADirectoryError):
    """What was named as a model directory is a file (or something else), not a directory."""


def regular(file: Path) -> None:
    """A model's file that is there but no regular file (a FIFO would never end, a device never either) is said."""
    if file.exists() and not file.is_file():
        raise ModelFileError(f"{file} is not a regular file: copy the {file.name} saved with this model in its place")


def weights_file(directory: Path) -> Path:
    for name in ("model.safetensors", "pytorch_model.bin"):  # safetensors first: it runs no code and maps lazily
        regular(directory / name)
        if (directory / name).is_file():
            return directory / name
    raise NoModelFile(
        f"{directory} has neither model.safetensors nor pytorch_model.bin (sharded checkpoints are not supported)"
    )


#: safetensors' own bound on its JSON header.
_MAX_HEADER = 100_000_000
#: Bytes an element of each safetensors dtype takes.
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2,
                "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}
#: torch's names of safetensors' dtypes, as messages give them.
_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                       "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "I64": "int64", "I32": "int32",
                       "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8",
                       "BOOL": "bool"}
#: The dtypes of weights rookworld loads (and converts to the dtype asked for): a model's weights are floats, and
#: integer or 8-bit float ones are quantized models, whose scales this GPT-2 does not read.
SUPPORTED_DTYPES = ("float32", "bfloat16", "float16", "float64")


def _unreadable(file: Path, why: object) -> ModelFileError:
    return ModelFileError(f"{file} cannot be read ({why}): it is cut short or not a safetensors file; copy or "
                          f"download it again")


def safetensors_header(file: Path) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """Each tensor's shape and dtype (torch's name) from a safetensors file's header, no tensor read: the file starts
    with the length of a JSON header (8 bytes, little-endian) naming each tensor's dtype, shape and byte range after
    it."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if size < 8 or length > min(size - 8, _MAX_HEADER):
                raise ValueError(f"a header of {length:,} bytes in a file of {size:,}")
            header = json.loads(f.read(length))
        shapes, dtypes, end = {}, {}, 0
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            shape, (start, stop) = entry["shape"], entry["data_offsets"]
            size_of = _DTYPE_BYTES.get(entry["dtype"])  # another dtype is left to safetensors to read or refuse
            if (not all(isinstance(n, int) and n >= 0 for n in (*shape, start, stop)) or start > stop
                    or size_of is not None and stop - start != math.prod(shape) * size_of):
                raise ValueError(f"tensor {name}: {entry['dtype']} {shape} in bytes {start} to {stop}")
            shapes[name], end = tuple(shape), max(end, stop)
            dtypes[name] = _SAFETENSORS_DTYPES.get(entry["dtype"], str(entry["dtype"])[:20])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:  # JSON errors too
        raise _unreadable(file, e) from None
    if 8 + length + end > size:
        raise _unreadable(file, f"its tensors end at byte {8 + length + end:,} of a file of {size:,}")
    return shapes, dtypes


def read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file))
    except Exception as e:  # safetensors' own error type: a file cut short, empty or not safetensors
        raise _unreadable(file, e) from None


def read_bin(file: Path) -> dict[str, torch.Tensor]:
    # weights_only: a .bin is a pickle, and a pickle from the internet must not run code.
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ModelFileError(f"{file} holds more than tensors (a pickle that could run code), which rookworld does "
                             f"not load; convert a model you trust to model.safetensors with transformers "
                             f"(save_pretrained) and load that") from None
    except Exception as e:  # a file cut short, or not a torch file
        raise ModelFileError(f"{file} cannot be read ({str(e).splitlines()[0] if str(e) else e!r}); copy or "
                             f"download it again") from None
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise ModelFileError(f"{file} holds a {type(state).__name__} of more than tensors, not a model's weights")
    return state


def _our_name(key: str) -> str | None:
    """The name in a `GPT` of a tensor of a Hugging Face GPT-2 file; None for what is not loaded (the causal-mask
    buffers, the lm_head tied to wte)."""
    if key.endswith(_IGNORED_SUFFIXES) or key == "lm_head.weight":
        return None
    return key if key.startswith("transformer.") else f"transformer.{key}"  # GPT2Model saves lack the prefix


_BLOCK = re.compile(r"transformer\.h\.(\d+)\.(.+)")


def _place(name: str) -> tuple[int, str]:
    """(layer, name within the block) of a block's tensor; (-1, name) of one outside the blocks."""
    in_block = _BLOCK.fullmatch(name)
    return (int(in_block[1]), in_block[2]) if in_block else (-1, name)


def check_shapes(config: GPTConfig, shapes: dict[str, tuple[int, ...]], weights: Path, config_file: Path) -> None:
    """Raises ModelFileError, naming the first tensor that differs in the model's order (the embeddings first, then
    layer by layer), unless the file holds exactly the tensors of a GPT of `config`: checked on shapes alone,
    before any memory is taken for the model."""
    top, block = config.parameter_shapes()
    found = {name: (key, tuple(shape)) for key, shape in shapes.items() if (name := _our_name(key)) is not None}
    places = {name: _place(name) for name in found}
    layers: dict[int, set[str]] = {}
    for layer, part in places.values():
        if layer >= 0:
            layers.setdefault(layer, set()).add(part)

    def mismatch(problem: str) -> ModelFileError:
        held = _held_sizes(found, len(layers))
        return ModelFileError(f"the weights in {weights} do not match {config_file}: {problem} ({config_file.name} "
                              f"says {config.describe()}{f'; the weights hold {held}' if held else ''}): use the "
                              f"config.json saved with these weights, or the directory they were saved in")

    def model_order(name: str) -> tuple[int, int]:
        layer, part = places[name]
        order = list(top if layer < 0 else block)
        return layer, order.index(part) if part in order else len(order)

    for name in sorted(found, key=model_order):
        (key, shape), (layer, part) = found[name], places[name]
        want = top.get(part) if layer < 0 else block.get(part) if layer < config.n_layer else None
        if want is None:
            raise mismatch(f"{key} is no tensor of this model")
        want = want[::-1] if name.endswith(CONV1D_SUFFIXES) else want  # the file's Conv1D layout: [in, out]
        if shape != want:
            raise mismatch(f"{key} is {list(shape)} where the config makes it {list(want)}")
    missing = next((name for name in top if name not in found), None)
    if missing is None:  # every layer of the file lies below n_layer, so one up to len(layers) lacks a tensor
        layer = next((i for i in range(min(config.n_layer, len(layers) + 1)) if layers.get(i) != set(block)), None)
        if layer is not None:
            missing = f"transformer.h.{layer}.{next(p for p in block if p not in layers.get(layer, ()))}"
    if missing is not None:
        raise mismatch(f"{missing} is missing")


def _held_sizes(found: dict[str, tuple[str, tuple[int, ...]]], layers: int) -> str:
    """The sizes a file's tensors have, as far as its embeddings tell them."""
    wte, wpe = (found.get(f"transformer.{name}.weight", (None, ()))[1] for name in ("wte", "wpe"))
    if len(wte) != 2:
        return ""
    return (f"{layers} layer{'s' if layers != 1 else ''}, {wte[1]} wide, {wte[0]} tokens"
            + (f", {wpe[0]} positions" if len(wpe) == 2 else ""))


def check_dtypes(dtypes: dict[str, str], weights: Path) -> None:
    """Refuses, naming the first tensor, weights of a dtype this GPT-2 does not load (`SUPPORTED_DTYPES`): read from
    a safetensors header, before any tensor is."""
    for key, dtype in dtypes.items():
        if _our_name(key) is not None and dtype not in SUPPORTED_DTYPES:
            raise ModelFileError(f"{weights}: {key} holds {dtype} weights, and rookworld loads "
                                 f"{', '.join(SUPPORTED_DTYPES)} ones: use the model's unquantized weights, or save "
                                 f"them in one of those dtypes")


#: The largest weight taken: a trained GPT-2's are within a few units; one of 3e38 is finite but overflows the first
#: product it enters, and the model answers `+++...`.
MAX_WEIGHT = 1e4


def check_finite(hf_state: dict[str, torch.Tensor], weights: Path) -> None:
    """Refuses weights holding NaN or infinity, or values past `MAX_WEIGHT`, naming the first tensor. Refused, not
    warned about: one such value makes every logit NaN, so the model answers garbage (`+++...`) and a run trained
    from it learns nothing, for as long as it runs."""
    for key, tensor in hf_state.items():
        if _our_name(key) is not None and tensor.numel() and tensor.is_floating_point():
            low, high = torch.aminmax(tensor)
            if torch.isfinite(low) and torch.isfinite(high) and max(-float(low), float(high)) > MAX_WEIGHT:
                raise ModelFileError(f"{weights}: {key} holds a weight of {max(-float(low), float(high)):.3g}, and "
                                     f"weights past {MAX_WEIGHT:g} overflow the model's activations (it answers "
                                     f"nothing): use a checkpoint saved before they grew, or copy or download the "
                                     f"model again")
        # A sum is NaN or infinite wherever a value is, and some 30 times quicker to take than isfinite (a 124M model
        # in 0.1 s); only a sum past the dtype's range (a float16 one past 65,504) needs each value looked at.
        if _our_name(key) is None or torch.isfinite(tensor.sum()):
            continue
        finite = torch.isfinite(tensor)
        if not bool(finite.all()):
            bad = tensor.numel() - int(finite.sum())
            raise ModelFileError(f"{weights}: {key} holds {bad:,} NaN or infinite values of {tensor.numel():,}, "
                                 f"and such a model answers nothing (every logit NaN): use a checkpoint saved before "
                                 f"they appeared, or copy or download the model again")


def from_hf_state_dict(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for key, tensor in hf_state.items():
        name = _our_name(key)
        if name is None:
            continue
        # Contiguous, as a fresh model's [out, in] weights are: a transposed view would give the loaded model's
        # parameters (and AdamW's state, made in their layout) another layout than a fresh model's.
        state[name] = tensor.t().contiguous() if name.endswith(CONV1D_SUFFIXES) else tensor
    if "transformer.wte.weight" in state:
        state["lm_head.weight"] = state["transformer.wte.weight"]
    return state
