"""One SFT step, alone or as one rank under torchrun; rank 0 writes the gradients the step left and its metrics.
`test_sft.py` compares 1 rank with 2.

    python tests/ddp_sft.py DATA OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import weakref
from pathlib import Path

import torch

from rookworld.settings.config import SFTConfig
from rookworld.sft.trainer import SFTTrainer

from conftest import check_teardown_order


def main() -> int:
    data, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        # One document a row: rows differ a lot in length, so the ranks count very different numbers of tokens.
        cfg = SFTConfig(init="tiny", n_embd=32, data=[data], output_dir=tmp, steps=1, seq_len=256, pack=False,
                        rows_per_step=8, micro_batch_size=3, max_grad_norm=0.0, eval_every=0, warmup_steps=0,
                        compile=False, device="cpu", dtype="fp32").validate()  # compared to float32's rounding
        wrappers = check_teardown_order()
        trainer = SFTTrainer(cfg, stream=open(os.devnull, "w"))
        wrappers.append(weakref.ref(trainer.policy_pass))
        m = trainer.train_step()
        if int(os.environ.get("RANK", 0)) == 0:
            torch.save({k: p.grad for k, p in trainer.run.policy.named_parameters()}, out / "grads.pt")
            (out / "metrics.json").write_text(json.dumps(m))
        trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
