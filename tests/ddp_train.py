"""`rookworld train` as one rank of torchrun, with each rank writing a digest of its parameters when the run
ends, so that a test can check that the ranks hold the same weights (only rank 0 writes checkpoints).

    python -m torch.distributed.run --nproc_per_node 2 tests/ddp_train.py DIGEST_DIR train --model ...
"""

from __future__ import annotations

import hashlib
import os
import sys
import weakref
from pathlib import Path

from rookworld import cli
from rookworld.grpo.trainer import Trainer

from conftest import check_teardown_order


def main() -> int:
    digest_dir = Path(sys.argv[1])
    digest_dir.mkdir(parents=True, exist_ok=True)
    close = Trainer.close
    wrappers = check_teardown_order()

    def close_with_digest(self: Trainer) -> None:
        wrappers.append(weakref.ref(self.models.policy_pass))
        h = hashlib.sha256()
        for name, p in sorted(self.run.policy.state_dict().items()):
            h.update(name.encode())
            h.update(p.detach().float().cpu().numpy().tobytes())
        (digest_dir / f"rank{os.environ.get('RANK', '0')}.txt").write_text(h.hexdigest())
        close(self)

    Trainer.close = close_with_digest
    return cli.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
