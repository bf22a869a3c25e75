"""rookworld: GRPO with verifiable rewards for RookWorld-LM."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rookworld")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"
