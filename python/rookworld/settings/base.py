"""What every settings module shares: the error a bad setting raises, and a setting's flag."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting that cannot work, said in one line."""


def need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def flag(name: str) -> str:
    """The command-line flag of setting `name`, without its dashes."""
    return name.replace("_", "-")
