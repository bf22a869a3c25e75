"""How a setting is declared, once: `setting(default, help, section, check=...)` as a field of a small group
(`@group`), and how a command's settings are composed of groups (`@composed`, with the command's own defaults
where they differ, and its own words for a shared setting that means something narrower there: `Meaning`).
`Settings.validate` runs every setting's declared check, then each group's checks of how its settings combine;
`from_dict` reads a TOML table or a saved config.json into the same fields.
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rookworld.io.quote import quoted
from rookworld.settings.base import MAX_INT, ConfigError, flag, nearest, need

# The sections of `--help`, in order (a training command lists its main settings before them all).
MODEL, RUN, SERVER, DATA, POSITIONS, SUITES_, OPPONENT, GAME, SAMPLING, DECODING, REWARDS, STOCKFISH, ADVANTAGES, \
    KL, LOSS, CRITIC, OPTIM, LOGGING, OUTPUT = (
        "the model", "run: steps, output, precision, seed", "the server", "data", "positions", "suites",
        "Stockfish as the opponent", "the game", "sampling", "decoding", "rewards", "Stockfish", "advantages",
        "the KL leash to the frozen reference", "the loss", "the critic (--advantage gae only)", "optimisation",
        "logging, evaluation, checkpoints", "output")
# What `rookworld plot` draws: the runs it reads, listed before its output.
RUNS = "the runs"
SECTIONS = [MODEL, RUN, RUNS, SERVER, DATA, POSITIONS, SUITES_, OPPONENT, GAME, SAMPLING, DECODING, REWARDS, STOCKFISH,
            ADVANTAGES, KL, LOSS, CRITIC, OPTIM, LOGGING, OUTPUT]

def setting(default: Any, help: str, section: str, *, check: Callable[[str, Any], str | None] | None = None,
            choices: tuple | None = None, main: bool = False, flag: str | None = None, aliases: tuple = (),
            was: tuple = (), metavar: str | None = None, nargs: str | None = None, most: int = MAX_INT) -> Any:
    """A setting: its default, its one help text, its section of `--help` and its check. `main` lists it among the
    few that matter most (training commands); `flag` spells its flag otherwise than its name (--from); `aliases`
    are other spellings that work; `was` are old spellings that answer with the new one; `nargs` makes it a
    positional argument; `most` is an integer setting's largest value (every integer has one)."""
    meta = {"help": help, "section": section, "main": main, "check": check, "choices": choices, "flag": flag,
            "aliases": aliases, "was": was, "metavar": metavar, "nargs": nargs, "shown": None, "most": most}
    return _field(default, meta)


def _field(default: Any, metadata: Any) -> Any:
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def group(cls: type) -> type:
    """A small group of settings, each declared here and nowhere else: a dataclass that names its own settings in
    `__declares__` (a command composed of two groups that declare one name is refused: `composed`)."""
    cls = dataclass(cls)
    cls.__declares__ = tuple(name for name in vars(cls).get("__annotations__", {}) if name in cls.__dataclass_fields__)
    return cls


def groups(cls: type) -> list[type]:
    """The setting groups a command's settings are composed of, in the order they are listed."""
    return [c for c in cls.__mro__ if "__declares__" in vars(c)]


def declaring_group(cls: type, name: str) -> type:
    """The group of `cls`'s settings that declares setting `name`."""
    return next(g for g in groups(cls) if name in g.__declares__)


#: A `Meaning`'s default when it keeps the declared one (None is a default of its own).
SAME_DEFAULT: Any = object()


@dataclass(frozen=True)
class Meaning:
    """What a shared setting means in one command, where its declared help speaks of what it does in others (the
    seed of ask's sampling is not the seed of a fresh model's weights): the command's own help, the section of its
    `--help` it is listed in, what its default is said to be when the value alone does not say it, and its default.
    The name, the type and the check stay the declared ones."""

    help: str | None = None
    section: str | None = None
    shown: str | None = None
    default: Any = SAME_DEFAULT


def composed(**defaults: Any) -> Callable[[type], type]:
    """A command's settings, composed of the groups it inherits: a dataclass whose own fields are the command's
    defaults where they differ from the declarations, or its own `Meaning` of a setting (the check stays the
    declared one). Two groups that declare one name are refused."""

    def wrap(cls: type) -> type:
        _check_declared_once(cls)
        inherited: dict[str, dataclasses.Field] = {}
        for base in reversed(cls.__mro__[1:]):
            inherited.update(getattr(base, "__dataclass_fields__", {}))
        own = []
        for name, value in defaults.items():
            base = inherited[name]  # a KeyError: only a declared setting takes a command's default
            metadata = dict(base.metadata)
            if isinstance(value, Meaning):
                metadata.update({key: getattr(value, key) for key in ("help", "section", "shown")
                                 if getattr(value, key) is not None})
                value = _default(base) if value.default is SAME_DEFAULT else value.default
            # A list default (sft's --data) makes the flag repeatable in that command.
            own.append((name, "list" if isinstance(value, list) else base.type, _field(value, metadata)))
        made = dataclasses.make_dataclass(cls.__name__, own, bases=(cls,),
                                          namespace={"__module__": cls.__module__, "__doc__": cls.__doc__})
        made.__qualname__ = cls.__qualname__
        return made

    return wrap


def _check_declared_once(cls: type) -> None:
    seen: dict[str, type] = {}
    for g in groups(cls):
        for name in g.__declares__:
            if name in seen:
                raise TypeError(f"setting {name!r} is declared twice: in {seen[name].__name__} and {g.__name__}")
            seen[name] = g


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def declared_fields(cls: type) -> list[dataclasses.Field]:
    """A command's settings in the order its groups are listed (not dataclasses' order, which puts the last base's
    first): `--help` shows them so, and `validate` checks them so."""
    own = {f.name: f for f in dataclasses.fields(cls)}
    return [own[name] for g in groups(cls) for name in g.__declares__ if name in own]


def option(f: dataclasses.Field) -> str:
    """How a user names the setting: its flag, or a positional argument's metavar."""
    if f.metadata["nargs"]:
        return f.metadata["metavar"] or f.name.upper()
    return f"--{f.metadata['flag'] or flag(f.name)}"


class Settings:
    """What a command's settings share: the checks, and reading and writing them as a dict."""

    #: The TOML table --config reads ([train], [sft]); None: the command takes no --config.
    config_section: ClassVar[str | None] = None
    #: Settings the command cannot do without.
    required: ClassVar[tuple[str, ...]] = ()
    #: Old spellings of this command only (old=new, names without dashes), and flags that are gone (name: why).
    renamed: ClassVar[dict[str, str]] = {}
    gone: ClassVar[dict[str, str]] = {}

    def __post_init__(self):
        # One file named alone where a list of files is taken: train's --data, which took one until it repeated, as
        # runs saved before then and `TrainConfig(data="positions.jsonl")` say it.
        for f in dataclasses.fields(self):
            if base_type(f) is list and isinstance(getattr(self, f.name), str):
                setattr(self, f.name, [getattr(self, f.name)])

    def validate(self):
        for f in declared_fields(type(self)):
            v = getattr(self, f.name)
            if v is None:
                continue
            choices, check = f.metadata["choices"], f.metadata["check"]
            # `--lr inf` turned every weight into NaN and the run still exited 0: no setting is infinite or NaN.
            need(base_type(f) is not float or math.isfinite(v), f"{option(f)} must be a finite number, got {v!r}")
            need(choices is None or v in choices, f"{option(f)} must be one of {', '.join(choices or ())}, "
                                                  f"got {quoted(v)}")
            if check is not None:
                message = check(option(f), v)
                need(message is None, message or "")
            if base_type(f) is int:  # after the setting's own check, whose words say more (seeds: 2^63 - 1)
                most = f.metadata["most"]
                need(v <= most, f"{option(f)} must be at most {most:,}, got {reprlib.repr(v)}")
                need(v >= -MAX_INT, f"{option(f)} must be at least {-MAX_INT:,}, got {reprlib.repr(v)}")
        # Then each group's checks of how its settings combine, the lowest group first.
        for cls in reversed(type(self).__mro__):
            if "check_together" in vars(cls):
                vars(cls)["check_together"](self, need)
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict, source: str = "config"):
        known = {f.name for f in dataclasses.fields(cls)}
        clean = {}
        for key, value in values.items():
            name = key.replace("-", "_")
            if name not in known:
                near = nearest(name, known)
                meant = f" (did you mean {flag(near) if '-' in key else near}?)" if near else ""
                raise ConfigError(f"{source}: unknown setting {quoted(key)}{meant}")
            clean[name] = value
        cfg = cls(**clean)
        for f in dataclasses.fields(cls):  # TOML has no None; types are checked here, values in validate()
            v = getattr(cfg, f.name)
            if v is not None and not _type_ok(f, v):
                # reprlib: a value of any length or depth is said in a few words
                raise ConfigError(f"{source}: {f.name} = {reprlib.repr(v)} is not {TYPE_WORDS[base_type(f)]}")
        return cfg


def default(cls: type, name: str) -> Any:
    """The default of setting `name` in a command's settings."""
    return _default(cls.__dataclass_fields__[name])


#: A setting's type as an error says what a value is not ("steps = 'ten' is not an integer").
TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
              list: "a list of file names"}


def base_type(f: dataclasses.Field) -> type:
    t = str(f.type)
    for name, typ in (("bool", bool), ("int", int), ("float", float), ("str", str), ("list", list)):
        if t.startswith(name):
            return typ
    raise TypeError(t)


def _type_ok(f: dataclasses.Field, v: Any) -> bool:
    t = base_type(f)
    if t is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if t is list:
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    return isinstance(v, t)
