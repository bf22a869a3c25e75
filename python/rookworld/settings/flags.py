"""A command's flags, made from its settings' declarations by one function, and read back into its settings:
defaults, then a TOML file (--config, train and sft), then flags, then the checks."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from rookworld.io.files import no_file_there
from rookworld.settings import presets, shipped
from rookworld.settings.base import ConfigError, flag
from rookworld.settings.declare import SECTIONS, Settings, base_type, declared_fields, option

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class Renamed(argparse.Action):
    """The old spelling of a renamed flag: one line naming the new one."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is now {self.new}")


class Gone(argparse.Action):
    """A flag that no longer exists: one line saying why."""

    def __init__(self, option_strings, dest, why: str, **kwargs):
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, default=argparse.SUPPRESS)
        self.why = why

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is gone: {self.why}")


def _say_a_second(action: argparse.Action, parser, namespace, value) -> None:
    # argparse keeps the last of a flag given twice, silently: a second --data once dropped the first file's prompts
    # (--data repeats now). Wrappers that add a flag to override their own stay free to; the run says so.
    if getattr(namespace, action.dest, argparse.SUPPRESS) is not argparse.SUPPRESS:
        print(f"{parser.prog}: warning: {'/'.join(action.option_strings)} given twice: the last ({value}) is used",
              file=sys.stderr)


class Once(argparse._StoreAction):
    """A single-valued flag: given twice, the last is used, and a warning says so."""

    def __call__(self, parser, namespace, values, option_string=None):
        _say_a_second(self, parser, namespace, values)
        super().__call__(parser, namespace, values, option_string)


class OnceBoolean(argparse.BooleanOptionalAction):
    """An on/off flag: given twice (--compile --no-compile), the last is used, and a warning says so."""

    def __call__(self, parser, namespace, values, option_string=None):
        _say_a_second(self, parser, namespace, option_string)
        super().__call__(parser, namespace, values, option_string)


def add_arguments(parser: argparse.ArgumentParser, cls: type[Settings]) -> None:
    """One flag per setting of `cls`, section by section (a command with --config lists its main settings first).
    Defaults are SUPPRESSed, so that only the flags given override the file; `from_args` fills in the rest."""
    main = None
    if cls.config_section:
        main = parser.add_argument_group("main settings (the rest below, by section)")
        main.add_argument("--config", metavar="FILE.toml|PRESET",
                          help="read settings from a TOML file, or a preset shipped with rookworld "
                               f"({', '.join(presets.names())}); flags override it")
    groups: dict[str, argparse._ArgumentGroup] = {}
    fields = sorted(declared_fields(cls), key=lambda f: (not (main and f.metadata["main"]),
                                                         SECTIONS.index(f.metadata["section"])))
    for f in fields:
        meta, default = f.metadata, _default(f)
        section = meta["section"]
        group = main if main and meta["main"] else groups.setdefault(section, parser.add_argument_group(section))
        # A default that is no value (None, nothing) is said in words, by the help text itself ("default: none") or
        # by the command's `Meaning`; a required positional argument has none.
        shown = meta["shown"] or (_shown(default) if default not in (None, [], "") and "default" not in meta["help"]
                                  and meta["nargs"] not in ("1", "+") else None)
        help_text = f"{meta['help']} (default: {shown})" if shown else meta["help"]
        if meta["nargs"]:  # a positional argument
            group.add_argument(f.name, metavar=meta["metavar"], nargs=None if meta["nargs"] == "1" else meta["nargs"],
                               default=default, help=help_text)
            continue
        typ = base_type(f)
        kwargs: dict[str, Any] = {"default": argparse.SUPPRESS, "dest": f.name, "help": help_text,
                                  "required": f.name in cls.required}
        if typ is bool:
            kwargs.update(action=OnceBoolean)
        elif typ is list:
            kwargs.update(action="append", metavar=meta["metavar"] or "FILE")
        elif meta["choices"]:
            kwargs.update(action=Once, type=typ, choices=meta["choices"])
        else:
            named = f.name.upper().replace("_", "-") if typ is str else typ.__name__.upper()
            kwargs.update(action=Once, type=typ, metavar=meta["metavar"] or named)
        group.add_argument(option(f), *(f"--{a}" for a in meta["aliases"]), **kwargs)
        for old in meta["was"]:
            _renamed(parser, old, option(f))
    for old, new in cls.renamed.items():
        _renamed(parser, old, f"--{flag(new)}")
    for name, why in cls.gone.items():
        parser.add_argument(f"--{flag(name)}", action=Gone, why=why, dest=f"_gone_{name}")


def _renamed(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    parser.add_argument(f"--{flag(old)}", action=Renamed, new=new, dest=f"_renamed_{old}", default=argparse.SUPPRESS)


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


#: The tables of a --config file: one per command that reads one.
TABLES = ("train", "sft")
#: More than any settings file holds (a preset is a few KB): a larger file is not one.
CONFIG_BYTES = 1 << 20


def from_args(args: argparse.Namespace, cls: type[Settings]):
    """A command's settings from its parsed flags (and --config's file, where the command takes one), checked. The
    files a preset or a default names are found here, else in the clone rookworld was installed from."""
    values: dict = {}
    source, preset = "config", None
    if getattr(args, "config", None):
        preset = presets.path(args.config) if not Path(args.config).exists() else None
        values, source = config_values(args.config, preset, cls.config_section)
        if preset is not None:
            values = presets.placed(values)
    from_file = dict(values)
    for f in dataclasses.fields(cls):
        if hasattr(args, f.name):
            if flag(f.name) != f.name:
                values.pop(flag(f.name), None)
            values[f.name] = getattr(args, f.name)
    # What the preset names and no flag replaced (a flag's missing file is said by its own check).
    if preset is not None and (missing := presets.missing(args.config, {k: v for k, v in values.items()
                                                                        if not hasattr(args, k)})):
        raise ConfigError(missing)
    given = {f.name for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    fit_schedule(values, from_file, given, where=f"{'preset ' if preset is not None else ''}{args.config}"
                 if from_file else "")
    if from_file:
        fit_evaluation(values, cls, given)
    model = cls.__dataclass_fields__.get("model")
    if model is not None and "model" not in values and _default(model) == shipped.MODEL:
        values["model"] = shipped.model()
    return cls.from_dict(values, source).validate()


#: The schedule's lengths that --steps fits to itself when a --config file's do not fit in it.
SCHEDULE = ("warmup_steps", "cooldown_steps")
SCHEDULE_WORDS = {"warmup_steps": "warm-up", "cooldown_steps": "cooldown"}


def fit_schedule(values: dict, from_file: dict, given: set[str], where: str) -> None:
    """--steps N given over a --config whose warm-up and cooldown do not fit in N (a short first try of a preset):
    the lengths the file set and no flag replaced are scaled to N as they were to the file's own steps (a cooldown
    kept at 1 step at least: 0 would make it a cosine decay), and a line on stderr says so. Otherwise nothing
    changes, and lengths that still do not fit are refused as ever."""
    steps, file_steps = values.get("steps"), from_file.get("steps")
    if "steps" not in given or not file_steps or not isinstance(steps, int) or steps <= 0:
        return
    scaled = {k: from_file[k] for k in SCHEDULE if k in from_file and k not in given}
    if not scaled or sum(int(values.get(k) or 0) for k in SCHEDULE) <= steps:
        return
    for k, n in scaled.items():
        values[k] = max(1 if k == "cooldown_steps" and n > 0 else 0, round(n * steps / file_steps))
    cooldown = int(values.get("cooldown_steps") or 0)
    if values.get("warmup_steps", 0) + cooldown > steps and "warmup_steps" in scaled:
        values["warmup_steps"] = max(0, steps - cooldown)
    was = " and ".join(f"{SCHEDULE_WORDS[k]} {n:,}" for k, n in scaled.items())
    now = " ".join(f"--{flag(k)} {values[k]}" for k in scaled)
    print(f"rookworld: --steps {steps} is shorter than {where}'s schedule ({was} of its {file_steps:,} steps): "
          f"scaled to fit, {now}", file=sys.stderr)


#: The fewest held-out positions a short run's evaluation is cut to: enough that its figures are not all 0 or 100%.
FEWEST_EVAL_POSITIONS = 20


def fit_evaluation(values: dict, cls: type[Settings], given: set[str]) -> None:
    """A run of a --config file shorter than its --eval-every evaluates only where it starts and ends, and a
    smaller share of --eval-size: its share of --eval-every (FEWEST_EVAL_POSITIONS at least), so that a 5-step try
    of a preset does not spend most of its time evaluating. --eval-size given as a flag is kept, and a line on
    stderr says what was cut."""
    fields = cls.__dataclass_fields__
    if not {"steps", "eval_every", "eval_size"} <= fields.keys() or "eval_size" in given:
        return
    def get(name):
        return values[name] if name in values else _default(fields[name])
    steps, every, size = get("steps"), get("eval_every"), get("eval_size")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (steps, every, size)) \
            or steps >= every:
        return
    fitted = max(FEWEST_EVAL_POSITIONS, round(size * steps / every))
    if fitted >= size:
        return
    values["eval_size"] = fitted
    print(f"rookworld: --steps {steps} is shorter than --eval-every {every}: its held-out evaluations, where it "
          f"starts and where it ends, take the first {fitted} of --eval-size {size} positions (--eval-size sets "
          f"them)", file=sys.stderr)


def config_values(name: str, preset: Path | None, section: str) -> tuple[dict, str]:
    """The settings of `rookworld SECTION` in --config NAME (a TOML file, or `preset`'s), and what to call their
    source: the top level of the file, or its [SECTION] table, which every other table must be another command's."""
    path = preset or Path(name)
    values = read_toml(path)
    tables = [k for k, v in values.items() if isinstance(v, dict)]
    loose = [k for k in values if k not in tables]
    if preset is not None and section not in values:
        raise ConfigError(f"--config {name}: the preset has no settings for rookworld {section} (it has "
                          f"{', '.join('rookworld ' + k for k in values)})")
    if section not in values and (others := [t for t in tables if t in TABLES]):
        raise ConfigError(f"--config {path} holds settings for rookworld {others[0]} ([{others[0]}]), not for "
                          f"rookworld {section}: run rookworld {others[0]} --config {path}, or put the settings of "
                          f"rookworld {section} under [{section}]")
    if foreign := [t for t in tables if t not in TABLES]:
        raise ConfigError(f"--config {path}: [{foreign[0]}] is no table rookworld reads: put the settings of "
                          f"rookworld {section} under [{section}], or at the top level")
    if section in values and loose:  # read as settings, they would be dropped for the table's without a word
        raise ConfigError(f"--config {path}: {', '.join(loose)} {'is' if len(loose) == 1 else 'are'} outside its "
                          f"[{section}] table, where rookworld {section} reads settings: move "
                          f"{'it' if len(loose) == 1 else 'them'} under [{section}]")
    return dict(values.get(section, values)), f"preset {name}" if preset else str(path)


def read_toml(path: Path) -> dict:
    """A --config file read as TOML, whatever is in its place: a directory, a pipe or a device (which would be
    read for ever), a file too large or not text, a byte order mark before the first line (as some Windows editors
    write, and TOML forbids), values nested past Python's recursion limit."""
    what = f"give a TOML file or a preset (presets: {', '.join(presets.names())})"
    if path.is_dir():
        raise ConfigError(f"--config {path} is a directory: {what}")
    if (why := no_file_there(path)) not in (None, "no such file"):
        raise ConfigError(f"--config {path} is {why}: {what}")
    try:
        with open(path, "rb") as f:
            data = f.read(CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"--config: no such file or preset: {path} (presets: {', '.join(presets.names())})"
                          ) from None
    except OSError as e:
        raise ConfigError(f"--config {path}: cannot read it ({e.strerror})") from None
    if len(data) > CONFIG_BYTES:
        raise ConfigError(f"--config {path} is over {CONFIG_BYTES >> 20} MB, which no settings file is: {what}")
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        raise ConfigError(f"--config {path} is not a text file: give a TOML file or a preset") from None
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise ConfigError(f"--config {path}: values nested too deep for settings (a setting is a number, a string, "
                          f"a boolean or a list of file names)") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config {path}: {e}") from None
    except ValueError:  # an integer past Python's 4300 digits
        raise ConfigError(f"--config {path}: a number too long for any setting") from None
