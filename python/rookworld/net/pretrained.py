"""RookWorld's models as Hugging Face GPT-2 directories: a local directory or a hub repo id read (config.json, the
weights, checked before they are trusted) into a `GPT`, and a `GPT` written back in the layout that
`transformers.GPT2LMHeadModel.from_pretrained` loads."""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from rookworld.ground.files import publish, temporary_directory
from rookworld.net.model import GPT, GPTConfig, check_memory
from rookworld.net.tokenizer import model_tokenizer
from rookworld.settings.hub import is_local_path

DEFAULT_REPO = "jrahn/RookWorld-LM-124M"
#: The GPT-2 vocabulary as the hub's GPT-2 repos carry it; `rookworld.net.tokenizer` reads and writes these.
TOKENIZER_FILES = ("vocab.json", "merges.txt")

# HF's GPT-2 uses Conv1D, which stores weights as [in, out]; nn.Linear wants [out, in].
_CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# HF buffers (causal-mask tables) that older checkpoints carry; SDPA makes them unnecessary.
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
# Both spellings mean GELU with the tanh approximation.
_TANH_GELU_NAMES = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


class ModelNotAvailableError(OSError):
    """The checkpoint could not be found locally and could not be fetched from the hub."""


#: The sizes of a config.json: (its key, GPT-2 small's value). Each is a whole number from 1 to `_MAX_SIZE`; the
#: memory check (`check_memory`) bounds what they make together.
_SIZES = (("n_positions", 1024), ("vocab_size", 50257), ("n_layer", 12), ("n_head", 12), ("n_embd", 768))
#: The largest size: a tensor's dimension and a token id (the tokenizer's are 32-bit) carry it.
_MAX_SIZE = 2**31 - 1


def _shown(value: Any) -> str:
    """A config value as JSON, cut short: a message quotes one line of it, whatever the file holds."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:40] + "..."


def _size(hf: dict[str, Any], key: str, default: int) -> int:
    value = hf.get(key, hf.get("n_ctx", default) if key == "n_positions" else default)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= _MAX_SIZE:
        raise ValueError(f"{key} must be a whole number from 1 to {_MAX_SIZE:,}, got {_shown(value)}")
    return value


def _epsilon(hf: dict[str, Any]) -> float:
    """LayerNorm's epsilon: at 0 or below, rows of small variance divide by zero or take the square root of a
    negative number, and NaN flows through the model (`ask` gave no answer in 205 s); at 1 or above it drowns the
    activations."""
    value = hf.get("layer_norm_epsilon", 1e-5)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < 1:  # NaN fails too
        raise ValueError(f"layer_norm_epsilon must be a number above 0 and below 1 (GPT-2's is 1e-05), got "
                         f"{_shown(value)}")
    return float(value)


def config_from_hf(hf: dict[str, Any]) -> GPTConfig:
    """Read a Hugging Face GPT-2 `config.json` dict, refusing variants this module does not implement and values
    no model can have (a ValueError saying which)."""
    sizes = {key: _size(hf, key, default) for key, default in _SIZES}
    n_embd, n_head = sizes["n_embd"], sizes["n_head"]
    if n_embd % n_head:
        raise ValueError(f"n_embd ({n_embd}) must be a multiple of n_head ({n_head})")
    act = hf.get("activation_function", "gelu_new")
    if act not in _TANH_GELU_NAMES:
        raise ValueError(f"unsupported activation_function {_shown(act)}: this GPT-2 uses the tanh GELU (gelu_new)")
    if hf.get("n_inner") not in (None, 4 * n_embd):
        raise ValueError(f"unsupported n_inner {_shown(hf['n_inner'])}: only 4 * n_embd is implemented")
    if not hf.get("tie_word_embeddings", True):
        raise ValueError("unsupported tie_word_embeddings=false: GPT-2 ties lm_head to wte")
    if hf.get("scale_attn_by_inverse_layer_idx", False) or not hf.get("scale_attn_weights", True):
        raise ValueError("unsupported attention scaling: only 1/sqrt(head_dim) is implemented")
    if hf.get("add_cross_attention", False):
        raise ValueError("unsupported add_cross_attention=true")
    return GPTConfig(block_size=sizes["n_positions"], vocab_size=sizes["vocab_size"], n_layer=sizes["n_layer"],
                     n_head=n_head, n_embd=n_embd, layer_norm_eps=_epsilon(hf))


def config_to_hf(config: GPTConfig) -> dict[str, Any]:
    """The `config.json` that `transformers.GPT2LMHeadModel.from_pretrained` expects."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "activation_function": "gelu_new",
        "n_positions": config.block_size,
        "n_ctx": config.block_size,
        "vocab_size": config.vocab_size,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_embd": config.n_embd,
        "n_inner": None,
        "layer_norm_epsilon": config.layer_norm_eps,
        "attn_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "resid_pdrop": config.dropout,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        # <|endoftext|> is the last id of every vocabulary rookworld writes: 50256 in GPT-2's, 4363 in the chess one.
        "bos_token_id": config.vocab_size - 1,
        "eos_token_id": config.vocab_size - 1,
        "use_cache": True,
    }


def model_directory(name_or_path: str | os.PathLike = DEFAULT_REPO, revision: str | None = None,
                    cache_dir: str | os.PathLike | None = None) -> Path:
    """The local directory of a model: `name_or_path` itself, or the hub snapshot of a repo id (downloaded when it
    is not in the cache). Raises FileNotFoundError for a path that is not a directory."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise NotADirectoryError(f"{name_or_path} is a file, not a model directory")
    if is_local_path(str(name_or_path)):
        raise FileNotFoundError(f"no such model directory: {name_or_path}")
    return _resolve_hub(str(name_or_path), revision, cache_dir)


def _resolve_hub(repo_id: str, revision: str | None, cache_dir: str | os.PathLike | None) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    try:
        # Ask for safetensors first so that a repo carrying both formats is downloaded only once.
        for weights in ("model.safetensors", "pytorch_model.bin"):
            folder = Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir,
                                            allow_patterns=["config.json", weights, *TOKENIZER_FILES]))
            if (folder / weights).is_file():
                break
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as e:
        where = cache_dir if cache_dir is not None else constants.HF_HUB_CACHE
        offline = " (HF_HUB_OFFLINE is set)" if constants.HF_HUB_OFFLINE else ""
        raise ModelNotAvailableError(
            f"Cannot load {repo_id!r}{f' at revision {revision!r}' if revision else ''}: the Hugging Face hub "
            f"cannot be reached{offline} and the model is not in the local cache ({where}). "
            f"On a machine with network access run `hf download {repo_id} --local-dir DIR` "
            f"(or huggingface_hub.snapshot_download({repo_id!r}, local_dir='DIR')), copy DIR here and pass the "
            "local directory instead: --model DIR on the command line, from_pretrained('DIR') in Python. The "
            "directory needs config.json and model.safetensors (or pytorch_model.bin), and vocab.json and merges.txt "
            "for the vocabulary."
        ) from e
    return folder


class ModelFileError(ModelNotAvailableError, ValueError):
    """A model directory whose config.json or weights cannot be read: cut short, corrupt, or not what they say (a
    ValueError too, as an unsupported config always was to the Python API)."""


def _regular(file: Path) -> None:
    """A model's file that is there but no regular file (a FIFO would never end, a device never either) is said."""
    if file.exists() and not file.is_file():
        raise ModelFileError(f"{file} is not a regular file: copy the {file.name} saved with this model in its place")


#: The largest config.json read: transformers' GPT-2 configs take about 1 KB.
_MAX_CONFIG = 1 << 20


def _read_config(directory: Path) -> GPTConfig:
    config_file = directory / "config.json"
    _regular(config_file)
    if not config_file.is_file():
        inside = sorted(p.parent.name for p in directory.glob("*/config.json"))
        raise FileNotFoundError(f"{directory} has no config.json" + (
            f"; the models in it: {', '.join(inside[:8])}{' ...' if len(inside) > 8 else ''} (pass one, such as "
            f"--model {directory / inside[0]})" if inside else ""))
    try:
        if config_file.stat().st_size > _MAX_CONFIG:
            raise ValueError(f"{config_file.stat().st_size:,} bytes, where a GPT-2 config takes about 1,000")
        # utf-8-sig: a byte-order mark (Windows editors write one) is read past, as before data and TOML files.
        hf = json.loads(config_file.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ModelFileError(f"{config_file} cannot be read as JSON: {e}") from None
    if not isinstance(hf, dict):
        raise ModelFileError(f"{config_file} holds a JSON {type(hf).__name__}, not the object of a GPT-2 config")
    try:
        return config_from_hf(hf)
    except ValueError as e:
        raise ModelFileError(f"{config_file}: {e}") from None


def _weights_file(directory: Path) -> Path:
    for name in ("model.safetensors", "pytorch_model.bin"):  # safetensors first: it runs no code and maps lazily
        _regular(directory / name)
        if (directory / name).is_file():
            return directory / name
    raise FileNotFoundError(
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


def _safetensors_header(file: Path) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
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


def _read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file))
    except Exception as e:  # safetensors' own error type: a file cut short, empty or not safetensors
        raise _unreadable(file, e) from None


def _read_bin(file: Path) -> dict[str, torch.Tensor]:
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


def _check_shapes(config: GPTConfig, shapes: dict[str, tuple[int, ...]], weights: Path, config_file: Path) -> None:
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
        want = want[::-1] if name.endswith(_CONV1D_SUFFIXES) else want  # the file's Conv1D layout: [in, out]
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


def _check_dtypes(dtypes: dict[str, str], weights: Path) -> None:
    """Refuses, naming the first tensor, weights of a dtype this GPT-2 does not load (`SUPPORTED_DTYPES`): read from
    a safetensors header, before any tensor is."""
    for key, dtype in dtypes.items():
        if _our_name(key) is not None and dtype not in SUPPORTED_DTYPES:
            raise ModelFileError(f"{weights}: {key} holds {dtype} weights, and rookworld loads "
                                 f"{', '.join(SUPPORTED_DTYPES)} ones: use the model's unquantized weights, or save "
                                 f"them in one of those dtypes")


def _check_finite(hf_state: dict[str, torch.Tensor], weights: Path) -> None:
    """Refuses weights holding NaN or infinity, naming the first tensor. Refused, not warned about: one such value
    makes every logit NaN, so the model answers garbage (`+++...`) and a run trained from it learns nothing, for
    as long as it runs."""
    for key, tensor in hf_state.items():
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


def _from_hf_state_dict(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for key, tensor in hf_state.items():
        name = _our_name(key)
        if name is None:
            continue
        # Contiguous, as a fresh model's [out, in] weights are: a transposed view would give the loaded model's
        # parameters (and AdamW's state, made in their layout) another layout than a fresh model's.
        state[name] = tensor.t().contiguous() if name.endswith(_CONV1D_SUFFIXES) else tensor
    if "transformer.wte.weight" in state:
        state["lm_head.weight"] = state["transformer.wte.weight"]
    return state


def _checked(directory: Path, device: torch.device | str | None, dtype: torch.dtype | None, training: bool
             ) -> tuple[GPTConfig, Path, dict[str, torch.Tensor] | None]:
    """from_pretrained's checks, before any memory is taken for the model: its config, its weights file, and the
    pickle's tensors when the weights are a pickle (whose shapes are known only once read)."""
    config = _read_config(directory)
    weights = _weights_file(directory)
    hf_state = _read_bin(weights) if weights.suffix == ".bin" else None
    if hf_state is None:
        shapes, dtypes = _safetensors_header(weights)
    else:
        shapes = {k: tuple(v.shape) for k, v in hf_state.items()}
        dtypes = {k: str(v.dtype).removeprefix("torch.") for k, v in hf_state.items()}
    _check_shapes(config, shapes, weights, directory / "config.json")
    _check_dtypes(dtypes, weights)
    model_tokenizer(directory, config.vocab_size)
    check_memory(config, device or "cpu", training=training, dtype=dtype or torch.float32, what=str(directory),
                 instead="run it where more memory is free (another --device, or another machine)")
    return config, weights, hf_state


def check_model(directory: str | os.PathLike, device: torch.device | str | None = None) -> None:
    """What from_pretrained checks, without loading: for a caller that reads a model directory's files (hashes its
    weights) before loading it, so that a file that does not fit its config is refused before it is read whole."""
    _checked(Path(directory), device, None, False)


def from_pretrained(
    name_or_path: str | os.PathLike = DEFAULT_REPO,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    training: bool = False,
) -> GPT:
    """Load a GPT-2 checkpoint in the Hugging Face layout from a local directory or a hub repo id.

    The directory needs `config.json` and `model.safetensors` (preferred) or `pytorch_model.bin`. A repo id is
    fetched with `huggingface_hub.snapshot_download` (`revision`, `cache_dir` passed through; HF_HUB_OFFLINE
    and the hub cache are honoured). `dtype` defaults to float32 whatever the file holds (the hub checkpoint is
    bf16): the trainer needs fp32 master weights; pass torch.bfloat16 for an inference-only copy.
    The model is returned in eval mode (dropout off).

    Before any memory is taken for the model, the directory is checked whole (a ModelFileError, or a
    TokenizerUnavailableError for its vocabulary, naming the file): the weights' shapes, read from the safetensors
    header, against config.json; its vocabulary (`get_tokenizer` of the directory) against the embedding's rows;
    and the model's size against the memory free on `device` (a NotEnoughMemory), counting what training it
    takes besides the weights when `training`.
    """
    directory = model_directory(name_or_path, revision, cache_dir)
    config, weights, hf_state = _checked(directory, device, dtype, training)
    hf_state = hf_state if hf_state is not None else _read_safetensors(weights)
    _check_finite(hf_state, weights)
    state = _from_hf_state_dict(hf_state)

    with torch.device("meta"):  # no point in random-initialising 124M parameters that are overwritten next
        model = GPT(config)
    model.load_state_dict(state, strict=True, assign=True)  # every name and shape was checked above
    model.lm_head.weight = model.transformer.wte.weight  # assign=True replaced the Parameter; tie again
    model.to(device=device or "cpu", dtype=dtype or torch.float32)
    return model.eval()


def save_pretrained(model: GPT, directory: str | os.PathLike, *, dtype: torch.dtype | None = None) -> Path:
    """Write `config.json` + `model.safetensors` in the HF GPT-2 layout (Conv1D weights, `transformer.` keys).

    `transformers.GPT2LMHeadModel.from_pretrained(directory)` loads the result. The files are written into a
    temporary directory next to the target and renamed into place, so a crash never leaves a half-written
    checkpoint: a new directory appears whole, and in an existing one each file is replaced atomically.
    """
    model = getattr(model, "_orig_mod", model)  # a torch.compile'd model: save the module it wraps
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":  # tied; HF re-ties it, and safetensors refuses shared tensors
            continue
        tensor = tensor.detach()
        if name.endswith(_CONV1D_SUFFIXES):
            tensor = tensor.t()
        state[name] = tensor.to(device="cpu", dtype=dtype or tensor.dtype).contiguous()
    hf_config = config_to_hf(model.config)
    hf_config["torch_dtype"] = str(dtype or model.dtype).removeprefix("torch.")

    tmp = temporary_directory(f".{directory.name}.tmp-", directory.parent)
    try:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        publish(tmp)
        if not directory.exists():
            os.replace(tmp, directory)
        else:
            # Weights before config, so that a config never describes weights that are not there yet.
            for name in ("model.safetensors", "config.json"):
                os.replace(tmp / name, directory / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory
