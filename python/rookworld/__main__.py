"""`python -m rookworld`, which is also what `torchrun -m rookworld` runs."""

import sys

from rookworld.cli import main

sys.exit(main())
