"""RookWorld's models as Hugging Face GPT-2 directories: a local directory or a hub repo id read (config.json here,
the weights file in `weights`, each checked before it is trusted) into a `GPT`, and a `GPT` written back in the
layout that `transformers.GPT2LMHeadModel.from_pretrained` loads."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from rookworld.io.files import publish, temporary_directory, what_is_at
from rookworld.net.memory import check_memory
from rookworld.net.model import GPT, GPTConfig
from rookworld.net.tokenizer import model_tokenizer
from rookworld.net.weights import (CONV1D_SUFFIXES, ModelFileError, ModelNotAvailableError, NoModelFile,
                                   NotAModelDirectory, check_dtypes, check_finite, check_shapes, from_hf_state_dict,
                                   read_bin, read_safetensors, regular, safetensors_header, weights_file)
from rookworld.settings.hub import is_local_path

DEFAULT_REPO = "jrahn/RookWorld-LM-124M"
#: The GPT-2 vocabulary as the hub's GPT-2 repos carry it; `rookworld.net.tokenizer` reads and writes these.
TOKENIZER_FILES = ("vocab.json", "merges.txt")

# Both spellings mean GELU with the tanh approximation.
_TANH_GELU_NAMES = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


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
    if (what := what_is_at(path)) != "nothing":
        raise NotAModelDirectory(f"{name_or_path} is {what}, not a model directory")
    if is_local_path(str(name_or_path)):
        raise NoModelFile(f"no such model directory: {name_or_path}")
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


#: The largest config.json read: transformers' GPT-2 configs take about 1 KB.
_MAX_CONFIG = 1 << 20


def _read_config(directory: Path) -> GPTConfig:
    config_file = directory / "config.json"
    regular(config_file)
    if not config_file.is_file():
        inside = sorted(p.parent.name for p in directory.glob("*/config.json"))
        raise NoModelFile(f"{directory} has no config.json" + (
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


def _checked(directory: Path, device: torch.device | str | None, dtype: torch.dtype | None, training: bool
             ) -> tuple[GPTConfig, Path, dict[str, torch.Tensor] | None]:
    """from_pretrained's checks, before any memory is taken for the model: its config, its weights file, and the
    pickle's tensors when the weights are a pickle (whose shapes are known only once read)."""
    config = _read_config(directory)
    weights = weights_file(directory)
    hf_state = read_bin(weights) if weights.suffix == ".bin" else None
    if hf_state is None:
        shapes, dtypes = safetensors_header(weights)
    else:
        shapes = {k: tuple(v.shape) for k, v in hf_state.items()}
        dtypes = {k: str(v.dtype).removeprefix("torch.") for k, v in hf_state.items()}
    check_shapes(config, shapes, weights, directory / "config.json")
    check_dtypes(dtypes, weights)
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
    hf_state = hf_state if hf_state is not None else read_safetensors(weights)
    check_finite(hf_state, weights)
    state = from_hf_state_dict(hf_state)

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
        if name.endswith(CONV1D_SUFFIXES):
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
