"""The GPT-2 port: parity with transformers in both directions, loading/saving, padding invariance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from copy import deepcopy

import pytest
import torch

from conftest import tiny_gpt
from rookworld.net.head import head_grad_weight, head_input_grad
from rookworld.net.model import GPT, GPTConfig, positions_from_mask
from rookworld.net.model import linear, uses_onednn
from rookworld.net.precision import autocast_copy, refresh_copy
from rookworld.net.pretrained import ModelNotAvailableError, from_pretrained, save_pretrained

TOL = 1e-4


def _batch(seed: int = 0, B: int = 3, T: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids with left padding of different widths (row 0 unpadded)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50257, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    for row in range(1, B):
        mask[row, : 3 * row] = False
        ids[row, : 3 * row] = 50256
    return ids, mask


def _hf_logits(hf_model, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    with torch.no_grad():
        if mask is None:
            return hf_model(ids).logits
        return hf_model(ids, attention_mask=mask.long(), position_ids=positions_from_mask(mask)).logits


def test_gpt2_small_has_124m_parameters():
    with torch.device("meta"):
        model = GPT(GPTConfig())
    assert model.num_params() == 124_439_808
    assert model.lm_head.weight is model.transformer.wte.weight
    assert GPTConfig().dropout == 0.0 and GPTConfig().layer_norm_eps == 1e-5


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_loads_transformers_checkpoint_with_same_logits(fmt, hf_tiny, hf_tiny_bin):
    hf_model, directory = hf_tiny if fmt == "safetensors" else hf_tiny_bin
    assert (directory / ("model.safetensors" if fmt == "safetensors" else "pytorch_model.bin")).is_file()
    model = from_pretrained(directory)
    assert model.config.n_layer == 2 and model.config.n_embd == 64 and model.config.block_size == 128
    assert model.dtype == torch.float32 and not model.training
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied after loading

    ids, mask = _batch()
    with torch.no_grad():
        ours = model(ids[:1])
        ours_padded = model(ids, mask)
    theirs = _hf_logits(hf_model, ids[:1])
    assert theirs.abs().max() > 1.0  # the comparison below means something
    assert (ours - theirs).abs().max().item() < TOL
    theirs_padded = _hf_logits(hf_model, ids, mask)
    diff = (ours_padded - theirs_padded).abs()[mask]  # padding positions are garbage in both
    assert diff.max().item() < TOL


def test_saved_checkpoint_loads_in_transformers_with_same_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = tiny_gpt(seed=3, scale=4.0)
    out = save_pretrained(model, tmp_path / "ckpt")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert not [p for p in tmp_path.iterdir() if p.name != "ckpt"]  # no temporary directory left behind
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["activation_function"] == "gelu_new"

    hf_model = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    ids, mask = _batch(seed=1)
    with torch.no_grad():
        ours = model(ids, mask)
    diff = (ours - _hf_logits(hf_model, ids, mask)).abs()[mask]
    assert diff.max().item() < TOL
    with torch.no_grad():
        assert (model(ids[:1]) - _hf_logits(hf_model, ids[:1])).abs().max().item() < TOL


def test_save_load_round_trip_and_overwrite(tmp_path):
    model = tiny_gpt(seed=5)
    target = tmp_path / "ckpt"
    save_pretrained(tiny_gpt(seed=6), target)
    save_pretrained(model, target)  # replaces the files of an existing checkpoint
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    loaded = from_pretrained(target)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name

    # Laid out as a fresh model's parameters are (the file's Conv1D weights are [in, out]), so that AdamW's
    # moments, made in a parameter's layout, are the same in a run that loaded its model and in one that did not.
    assert [(n, p.stride()) for n, p in loaded.named_parameters()] == [(n, p.stride())
                                                                      for n, p in model.named_parameters()]

    bf16 = from_pretrained(target, dtype=torch.bfloat16)
    assert bf16.dtype == torch.bfloat16
    assert torch.equal(bf16.transformer.wte.weight, model.transformer.wte.weight.bfloat16())


def test_save_in_bf16_keeps_conv1d_layout(tmp_path):
    from safetensors.torch import load_file

    model = tiny_gpt(seed=2)
    save_pretrained(model, tmp_path / "bf16", dtype=torch.bfloat16)
    state = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    assert "lm_head.weight" not in state  # tied
    w = state["transformer.h.0.attn.c_attn.weight"]
    assert w.dtype == torch.bfloat16 and w.shape == (64, 192)  # Conv1D: [in, out]
    assert torch.equal(w, model.transformer.h[0].attn.c_attn.weight.t().bfloat16())
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_left_padding_does_not_change_logits(tiny_model):
    ids, mask = _batch(seed=4, B=4, T=20)
    with torch.no_grad():
        batch_logits = tiny_model(ids, mask)
        for row in range(4):
            alone = tiny_model(ids[row : row + 1, mask[row]])  # the prompt without any padding
            assert (alone[0] - batch_logits[row, mask[row]]).abs().max().item() < 1e-5


def test_rejects_unsupported_configs_and_missing_weights(tmp_path, hf_tiny):
    _, directory = hf_tiny
    config = json.loads((directory / "config.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({**config, "activation_function": "gelu"}))
    (bad / "model.safetensors").write_bytes((directory / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match="gelu_new"):
        from_pretrained(bad)

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps(config))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        from_pretrained(empty)

    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "config.json").write_text(json.dumps({**config, "n_layer": 3}))
    (wrong / "model.safetensors").write_bytes((directory / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match="do not match"):
        from_pretrained(wrong)


def test_hub_offline_with_empty_cache_raises_clear_error(tmp_path):
    # A fresh interpreter, because huggingface_hub reads HF_HUB_OFFLINE and its cache location at import.
    code = textwrap.dedent(
        """
        from rookworld.net.pretrained import from_pretrained, ModelNotAvailableError
        try:
            from_pretrained("jrahn/RookWorld-LM-124M")
        except ModelNotAvailableError as e:
            print("MESSAGE:", e)
        else:
            print("LOADED")
        """
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hub")}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    message = result.stdout
    assert "MESSAGE:" in message, message
    assert "jrahn/RookWorld-LM-124M" in message
    assert "HF_HUB_OFFLINE" in message
    assert str(tmp_path / "hub") in message  # says where it looked
    assert "from_pretrained('DIR')" in message and "local directory" in message and "--model DIR" in message


def test_hub_repo_id_loads_from_cache_offline(tmp_path, hf_tiny, monkeypatch):
    """A repo already in the hub cache loads with no network (the hub-id branch, not the local-dir one)."""
    from huggingface_hub import constants

    hf_model, directory = hf_tiny
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelNotAvailableError, match="cannot be reached"):
        from_pretrained("someone/tiny-gpt2", cache_dir=tmp_path)

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--someone--tiny-gpt2"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (snapshot / name).write_bytes((directory / name).read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)

    model = from_pretrained("someone/tiny-gpt2", cache_dir=tmp_path)
    ids, _ = _batch()
    with torch.no_grad():
        assert (model(ids) - _hf_logits(hf_model, ids)).abs().max().item() < TOL


def test_local_path_that_is_not_a_checkpoint_is_not_sent_to_the_hub(tmp_path, monkeypatch):
    from rookworld.net import pretrained as model_module

    def hub(*args):
        raise AssertionError(f"sent to the hub: {args}")

    monkeypatch.setattr(model_module, "_resolve_hub", hub)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "weights.bin").write_bytes(b"")
    # A typo under an existing directory looks like owner/name but is a path: "runs/sftt" beside "runs/".
    for name in (tmp_path / "does-not-exist", "runs/sftt", "./nope", "~/surely-not-here-rw", "a/b/c", "no spaces/x"):
        with pytest.raises(FileNotFoundError, match="no such model directory"):
            from_pretrained(name)
    with pytest.raises(NotADirectoryError, match="not a model directory"):
        from_pretrained("weights.bin")
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_pretrained(tmp_path)


def test_which_names_are_repo_ids(tmp_path, monkeypatch):
    from rookworld.settings.hub import is_local_path, is_repo_id

    monkeypatch.chdir(tmp_path)
    for name in ("jrahn/RookWorld-LM-124M", "gpt2/x", "someone/tiny-gpt2", "a_b/c.d"):
        assert is_repo_id(name) and not is_local_path(name), name
    for name in ("runs", "a/b/c", "-x/y", "x/.y", "x/y.", "a--b/c", "a/b..c", "", "x y/z"):
        assert not is_repo_id(name), name
    (tmp_path / "jrahn").mkdir()  # a local directory named like the owner: the path wins
    assert is_local_path("jrahn/RookWorld-LM-124M")


def test_training_mode_gradients_and_dropout_default_off(tiny_model):
    ids, mask = _batch(seed=7)
    tiny_model.train()
    with torch.no_grad():
        a, b = tiny_model(ids, mask), tiny_model(ids, mask)
    assert torch.equal(a, b)  # dropout 0 by default: train mode is deterministic
    loss = tiny_model(ids, mask)[mask].logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in tiny_model.parameters())


def _with_biases(model: GPT) -> GPT:
    """GPT-2's init zeroes every bias; give them values, so that casting them is checked too."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return model


def _logits_under_bf16_autocast(model: GPT, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        return model(ids, mask)


def test_autocast_copy_computes_the_same_bits_as_the_fp32_model_under_autocast():
    model = _with_biases(tiny_gpt(scale=4.0))
    copy = autocast_copy(model, torch.bfloat16)
    attn = copy.transformer.h[0].attn.c_attn
    assert attn.weight.dtype == attn.bias.dtype == copy.lm_head.weight.dtype == torch.bfloat16
    assert copy.transformer.wte.weight.dtype == copy.transformer.ln_f.weight.dtype == torch.float32
    assert torch.equal(copy.lm_head.weight, model.transformer.wte.weight.bfloat16())  # untied, stored rounded
    assert not any(p.requires_grad for p in copy.parameters()) and not copy.training
    # The model itself is left as it was: fp32, tied, trainable.
    assert model.lm_head.weight is model.transformer.wte.weight and model.dtype == torch.float32
    assert all(p.requires_grad for p in model.parameters())

    ids, mask = _batch(seed=3)
    expected = _logits_under_bf16_autocast(model, ids, mask)
    got = _logits_under_bf16_autocast(copy, ids, mask)
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)
    # What the test would catch: casting the whole model (embeddings and LayerNorms too) changes the logits.
    whole = _logits_under_bf16_autocast(deepcopy(model).to(torch.bfloat16), ids, mask)
    assert not torch.equal(whole, expected)


def test_refresh_copy_follows_the_model_in_place():
    model = _with_biases(tiny_gpt(scale=4.0))
    copy = autocast_copy(model, torch.bfloat16)
    addresses = {name: p.data_ptr() for name, p in copy.named_parameters()}
    with torch.no_grad():  # an optimizer step, embeddings included
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ids, mask = _batch(seed=4)
    expected = _logits_under_bf16_autocast(model, ids, mask)
    assert not torch.equal(_logits_under_bf16_autocast(copy, ids, mask), expected), "a stale copy must show"
    assert refresh_copy(copy, model) is copy
    assert torch.equal(_logits_under_bf16_autocast(copy, ids, mask), expected)
    assert {name: p.data_ptr() for name, p in copy.named_parameters()} == addresses  # CUDA graphs stay valid


def test_keeping_freed_memory_stops_chunks_of_logits_faulting_in_fresh_pages():
    """glibc trims its heap when enough lies free at the top, so freeing a few 25 MB tensors at once hands their
    pages back and the next ones fault them in again; after `keep_freed_memory` they are mostly reused. Counted in
    a child process: the setting is the whole process's."""
    script = textwrap.dedent("""
        import resource, torch
        from rookworld.net import device
        def faults(rounds=8):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(rounds):
                chunks = [torch.empty(125, 50257).fill_(1.0) for _ in range(4)]  # 25 MB each, freed together
                del chunks
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        faults(1)
        default = faults()
        kept = device.keep_freed_memory()
        faults()  # the heap settles
        print(default, kept, faults())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    default, kept, after = int(out[0]), out[1], int(out[2])
    assert kept == "True"
    # 6,135 pages of 4 KiB a chunk: by default a chunk's worth comes back in almost every round; kept, hardly
    # ever once the heap has settled (a small allocation can split a hole a chunk would have reused).
    assert default > 5 * 6_000
    assert after * 4 < default



def _float64_linear(x, weight, bias, upstream):
    """F.linear's output and its gradients w.r.t. x, weight and bias in float64: the reference."""
    x64, w64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    b64 = None if bias is None else bias.detach().double().requires_grad_()
    y = torch.nn.functional.linear(x64, w64, b64)
    y.backward(upstream.double())
    return y, x64.grad, w64.grad, None if b64 is None else b64.grad


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 5, 48), (7, 48), (0, 48)])
def test_cpu_linear_by_onednn_matches_float64_in_value_and_gradients(shape, bias):
    """`linear` takes oneDNN's inner product on the CPU in float32 (forward and the input's gradient) and torch.mm
    for the weight's: each checked against F.linear in float64, with a non-trivial upstream gradient."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(*shape, generator=g).requires_grad_()
    weight = torch.randn(40, 48, generator=g).requires_grad_()
    b = torch.randn(40, generator=g).requires_grad_() if bias else None
    assert uses_onednn(x, weight)
    y = linear(x, weight, b)
    upstream = torch.randn(y.shape, generator=g)
    y.backward(upstream)
    want_y, want_x, want_w, want_b = _float64_linear(x, weight, b, upstream)
    assert y.shape == want_y.shape and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.double(), want_x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weight.grad.double(), want_w, rtol=1e-5, atol=1e-5)
    if bias:
        torch.testing.assert_close(b.grad.double(), want_b, rtol=1e-5, atol=1e-5)


def test_cpu_linear_takes_strided_inputs_and_leaves_what_onednn_does_not_do_to_f_linear():
    g = torch.Generator().manual_seed(12)
    weight, b = torch.randn(24, 16, generator=g), torch.randn(24, generator=g)
    last = torch.randn(4, 3, 16, generator=g)[:, -1]  # a decode step's last position: not contiguous
    assert not last.is_contiguous()
    torch.testing.assert_close(linear(last, weight, b), torch.nn.functional.linear(last, weight, b))
    with torch.no_grad():  # nothing to differentiate: no graph
        assert linear(last.requires_grad_(), weight, b).grad_fn is None
    # Not oneDNN's: float64, a transposed view of a weight, bf16 autocast.
    assert not uses_onednn(last.double(), weight.double())
    assert not uses_onednn(last, weight.t().contiguous().t())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not uses_onednn(last, weight)
        assert linear(last, weight, b).dtype == torch.bfloat16


def test_head_input_grad_by_the_transposed_weight_matches_float64():
    g = torch.Generator().manual_seed(13)
    hidden, weight = torch.randn(24, 32, generator=g), torch.randn(300, 32, generator=g)
    dz = torch.randn(24, 300, generator=g)
    transposed = head_grad_weight(hidden, weight)
    assert transposed is not None and transposed.is_contiguous() and transposed.shape == (32, 300)
    want = dz.double() @ weight.double()
    torch.testing.assert_close(head_input_grad(dz, weight, transposed).double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(head_input_grad(dz, weight).double(), want, rtol=1e-5, atol=1e-5)
    assert head_grad_weight(hidden.double(), weight.double()) is None
