"""RookWorld's models as Hugging Face GPT-2 directories: a local directory or a hub repo id read (config.json, the
weights, checked before they are trusted) into a `GPT`, and a `GPT` written back in the layout that
`transformers.GPT2LMHeadModel.from_pretrained` loads."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from rookworld.ground.files import publish, temporary_directory
from rookworld.net.model import GPT, GPTConfig
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


def config_from_hf(hf: dict[str, Any]) -> GPTConfig:
    """Read a Hugging Face GPT-2 `config.json` dict, refusing variants this module does not implement."""
    act = hf.get("activation_function", "gelu_new")
    if act not in _TANH_GELU_NAMES:
        raise ValueError(f"unsupported activation_function {act!r}: this GPT-2 uses the tanh GELU (gelu_new)")
    n_embd = hf.get("n_embd", 768)
    if hf.get("n_inner") not in (None, 4 * n_embd):
        raise ValueError(f"unsupported n_inner {hf['n_inner']}: only 4 * n_embd is implemented")
    if not hf.get("tie_word_embeddings", True):
        raise ValueError("unsupported tie_word_embeddings=false: GPT-2 ties lm_head to wte")
    if hf.get("scale_attn_by_inverse_layer_idx", False) or not hf.get("scale_attn_weights", True):
        raise ValueError("unsupported attention scaling: only 1/sqrt(head_dim) is implemented")
    if hf.get("add_cross_attention", False):
        raise ValueError("unsupported add_cross_attention=true")
    return GPTConfig(
        block_size=hf.get("n_positions", hf.get("n_ctx", 1024)),
        vocab_size=hf.get("vocab_size", 50257),
        n_layer=hf.get("n_layer", 12),
        n_head=hf.get("n_head", 12),
        n_embd=n_embd,
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
    )


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


def _read_config(directory: Path) -> GPTConfig:
    config_file = directory / "config.json"
    if not config_file.is_file():
        inside = sorted(p.parent.name for p in directory.glob("*/config.json"))
        raise FileNotFoundError(f"{directory} has no config.json" + (
            f"; the models in it: {', '.join(inside[:8])}{' ...' if len(inside) > 8 else ''} (pass one, such as "
            f"--model {directory / inside[0]})" if inside else ""))
    try:
        hf = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ModelFileError(f"{config_file} cannot be read as JSON: {e}") from None
    if not isinstance(hf, dict):
        raise ModelFileError(f"{config_file} holds a JSON {type(hf).__name__}, not the object of a GPT-2 config")
    try:
        config = config_from_hf(hf)
        sizes = (config.block_size, config.vocab_size, config.n_layer, config.n_head, config.n_embd)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes) \
                or config.n_embd % config.n_head:
            raise ValueError("n_positions, vocab_size, n_layer, n_head and n_embd must be positive integers, "
                             "n_embd a multiple of n_head")
    except (ValueError, TypeError) as e:
        raise ModelFileError(f"{config_file}: {e}") from None
    return config


def _read_hf_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    safetensors_file = directory / "model.safetensors"
    bin_file = directory / "pytorch_model.bin"
    if safetensors_file.is_file():
        try:
            return load_file(str(safetensors_file))
        except Exception as e:  # safetensors' own error type: a file cut short, empty or not safetensors
            raise ModelFileError(f"{safetensors_file} cannot be read ({e}): it is cut short or not a safetensors "
                                 f"file; copy or download it again") from None
    if bin_file.is_file():
        # weights_only: a .bin is a pickle, and a pickle from the internet must not run code.
        try:
            return torch.load(bin_file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            raise ModelFileError(f"{bin_file} holds more than tensors (a pickle that could run code), which "
                                 f"rookworld does not load; convert a model you trust to model.safetensors with "
                                 f"transformers (save_pretrained) and load that") from None
        except Exception as e:  # a file cut short, or not a torch file
            raise ModelFileError(f"{bin_file} cannot be read ({str(e).splitlines()[0] if str(e) else e!r}); copy or "
                                 f"download it again") from None
    raise FileNotFoundError(
        f"{directory} has neither model.safetensors nor pytorch_model.bin (sharded checkpoints are not supported)"
    )


def _from_hf_state_dict(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for key, tensor in hf_state.items():
        if key.endswith(_IGNORED_SUFFIXES) or key == "lm_head.weight":  # lm_head is tied to wte
            continue
        name = key if key.startswith("transformer.") else f"transformer.{key}"  # GPT2Model saves lack the prefix
        # Contiguous, as a fresh model's [out, in] weights are: a transposed view would give the loaded model's
        # parameters (and AdamW's state, made in their layout) another layout than a fresh model's.
        state[name] = tensor.t().contiguous() if name.endswith(_CONV1D_SUFFIXES) else tensor
    if "transformer.wte.weight" in state:
        state["lm_head.weight"] = state["transformer.wte.weight"]
    return state


def from_pretrained(
    name_or_path: str | os.PathLike = DEFAULT_REPO,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> GPT:
    """Load a GPT-2 checkpoint in the Hugging Face layout from a local directory or a hub repo id.

    The directory needs `config.json` and `model.safetensors` (preferred) or `pytorch_model.bin`. A repo id is
    fetched with `huggingface_hub.snapshot_download` (`revision`, `cache_dir` passed through; HF_HUB_OFFLINE
    and the hub cache are honoured). `dtype` defaults to float32 whatever the file holds (the hub checkpoint is
    bf16): the trainer needs fp32 master weights; pass torch.bfloat16 for an inference-only copy.
    The model is returned in eval mode (dropout off).
    """
    directory = model_directory(name_or_path, revision, cache_dir)
    config = _read_config(directory)
    state = _from_hf_state_dict(_read_hf_state_dict(directory))

    with torch.device("meta"):  # no point in random-initialising 124M parameters that are overwritten next
        model = GPT(config)
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as e:
        raise ValueError(f"{directory}: weights do not match config.json: {e}") from e
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
