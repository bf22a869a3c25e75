"""bf16 on the CPU (issue 44): which dtype `--dtype auto` takes from the CPU's flags, and SFT under bf16 autocast
against float32 (it runs on any CPU: where the hardware lacks bf16, oneDNN emulates it)."""

from __future__ import annotations

import os

import pytest
import torch

from rookworld.harness import context
from rookworld.net.device import cpu_bf16_flag

from conftest import REPO

# /proc/cpuinfo of real machines, cut to a few lines and flags.
ZEN4 = """processor	: 0
vendor_id	: AuthenticAMD
model name	: AMD EPYC 9654 96-Core Processor
flags		: fpu vme sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni clzero
"""
SAPPHIRE_RAPIDS = """processor	: 0
model name	: Intel(R) Xeon(R) Platinum 8480+
flags		: fpu avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8
"""
SKYLAKE_X = """processor	: 0
model name	: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz
flags		: fpu avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni
"""
GRAVITON3 = """processor	: 0
BogoMIPS	: 2100.00
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp sve bf16 i8mm
CPU implementer	: 0x41
"""


def cpus(*texts: str) -> str:
    return "\n".join(texts)


def test_the_bf16_flags_are_read_from_every_processors_flags_line():
    assert cpu_bf16_flag(ZEN4) == "avx512_bf16"
    assert cpu_bf16_flag(cpus(ZEN4, ZEN4.replace("processor\t: 0", "processor\t: 1"))) == "avx512_bf16"
    assert cpu_bf16_flag(SAPPHIRE_RAPIDS) == "amx_bf16"
    # AVX-512 without BF16 (where oneDNN emulates bf16, slower than float32); ARM's bf16 is not an x86 flag here.
    assert cpu_bf16_flag(SKYLAKE_X) is None
    assert cpu_bf16_flag(GRAVITON3) is None
    assert cpu_bf16_flag("") is None
    # A flag only some processors list, in a name or as part of another word, does not count.
    assert cpu_bf16_flag(cpus(ZEN4, SKYLAKE_X)) is None
    assert cpu_bf16_flag("model name\t: avx512_bf16 edition\nflags\t\t: fpu avx512f\n") is None
    assert cpu_bf16_flag("flags\t\t: fpu avx512_bf16x\n") is None


@pytest.mark.parametrize("flag, want, why", [
    ("amx_bf16", True, ": --dtype auto and the CPU has AMX (amx_bf16)"),
    ("avx512_bf16", False, ": --dtype auto; the CPU's avx512_bf16 measured 0.9-1.3x fp32 by shape, --dtype bf16 takes it"),
    (None, False, ": --dtype auto and the CPU has no amx_bf16 or avx512_bf16"),
])
def test_auto_takes_bf16_on_cuda_and_on_a_cpu_with_amx(monkeypatch, flag, want, why):
    monkeypatch.setattr(context, "cpu_bf16", lambda: flag)
    assert context.compute_dtype("auto", "cpu") == (want, why)
    assert context.compute_dtype("auto", "cuda") == (True, ": --dtype auto on CUDA")
    # An explicit --dtype is obeyed whatever the CPU has, and needs no reason in the header.
    assert context.compute_dtype("bf16", "cpu") == (True, "") and context.compute_dtype("fp32", "cpu") == (False, "")
    assert context.compute_dtype("fp32", "cuda") == (False, "")


def _sft_losses(tmp_path, dtype: str, steps: int) -> list[float]:
    from rookworld.settings.config import SFTConfig
    from rookworld.sft.trainer import SFTTrainer

    cfg = SFTConfig(init="tiny", n_layer=2, n_head=2, n_embd=64, vocabulary="chess", layout="compact",
                    data=[str(REPO / "data" / "chess-cpu-held-out.jsonl")], output_dir=str(tmp_path / dtype),
                    steps=steps, seq_len=256, rows_per_step=8, micro_batch_size=8, loss_on="target", lr=3e-3,
                    warmup_steps=0, eval_every=0, save_every=0, report_to="none", compile=False, device="cpu",
                    dtype=dtype, seed=1).validate()
    trainer = SFTTrainer(cfg, stream=open(os.devnull, "w"))
    try:
        assert trainer.run.context.amp_dtype == (torch.bfloat16 if dtype == "bf16" else None)
        return [trainer.train_step()["loss"] for _ in range(steps)]
    finally:
        trainer.close()


def test_sft_in_bf16_autocast_on_the_cpu_keeps_float32s_losses(tmp_path):
    """The same fresh model (2 layers, 64 wide, the chess vocabulary) on the same rows (8 a step, about 1,000
    counted tokens), 6 steps at a high learning rate (3e-3, no warm-up): each step's loss under bf16 autocast
    within 2e-3 of float32's, relatively.

    Why 2e-3: bf16 keeps 8 bits of mantissa, so each product's inputs are rounded by up to 2^-9 (2e-3) relatively,
    and a token's NLL moves by about that much; the step's loss is the mean over about 1,000 tokens, whose errors
    partly cancel, and the two runs' weights part only as far as those rounded gradients take them in 6 steps.
    Measured on an AMD EPYC with AVX-512 BF16 (2026-11-25), 5 seeds x 10 steps of this set-up: at most 1.5e-4
    (2e-5 to 1.5e-4 a seed, growing slowly with the steps), so 2e-3 leaves a margin of 13x; a loss rounded to bf16
    itself would already be off by up to 2e-3 (0.016 at ln 4,364)."""
    steps = 6
    fp32, bf16 = _sft_losses(tmp_path, "fp32", steps), _sft_losses(tmp_path, "bf16", steps)
    relative = [abs(b - a) / a for a, b in zip(fp32, bf16)]
    assert max(relative) < 2e-3, relative
    assert bf16 != fp32, "bf16 autocast changed nothing: was it on?"
    assert bf16[-1] < 0.95 * bf16[0] and fp32[-1] < 0.95 * fp32[0], (fp32, bf16)
