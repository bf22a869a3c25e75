"""Loading a trained model for eval, ask, play and uci."""

from __future__ import annotations

from rookworld.commands.common import CliError
from rookworld.lm.answers import RookWorldLM
from rookworld.net.pretrained import ModelFileError, ModelNotAvailableError
from rookworld.net.tokenizer import TokenizerUnavailableError
from rookworld.settings import shipped
from rookworld.settings.hub import is_local_path


def load_lm(s, **kwargs) -> RookWorldLM:
    """The model of --model/--revision on --device, with its tokenizer; a model that cannot be had, or a device
    that is not here (a ConfigError, a ValueError), is one line. A hub model out of reach (offline, and not in the
    cache) is said with what to pass instead (`not_available`)."""
    try:
        return RookWorldLM.load(s.model, revision=s.revision, device=s.device, **kwargs)
    except ModelNotAvailableError as e:
        raise CliError(not_available(s.model, e, f"pass --model DIR, a model directory ({shipped.MODEL} of a clone "
                                                 "of rookworld's repository runs offline)")) from None
    except (FileNotFoundError, NotADirectoryError, ValueError, TokenizerUnavailableError) as e:
        raise CliError(str(e)) from None


def not_available(model: str, e: ModelNotAvailableError, offline: str) -> str:
    """A model that cannot be had, in one line; for a hub model out of reach, the cause (the error's first
    sentence), then what runs offline instead (`offline`), then how to fetch the model elsewhere."""
    if is_local_path(model) or isinstance(e, ModelFileError):
        return str(e)
    cause, _, advice = str(e).partition(". ")
    return f"{cause}: {offline}. {advice}".rstrip(". ") + "."
