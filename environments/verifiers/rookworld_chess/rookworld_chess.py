"""rookworld's chess as an Environments Hub package: `vf.load_environment("rookworld-chess", task=...)`. The
environment itself is rookworld's (`rookworld.integrations.verifiers`), so that it scores exactly as rookworld does."""

from rookworld.integrations.verifiers import load_environment

__all__ = ["load_environment"]
