"""rookworld's chess as a verifiers v1 (0.4 and later) Environments Hub package: `vf-eval rookworld-chess-v1`.
The taskset, env and harness are rookworld's own (`rookworld.integrations.verifiers_v1`), so that rewards are
exactly those of `rookworld train`."""

from rookworld.integrations.verifiers_v1 import *  # noqa: F403
from rookworld.integrations.verifiers_v1 import __all__  # noqa: F401
