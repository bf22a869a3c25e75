"""Loading a trained model for eval, ask and play."""

from __future__ import annotations

from rookworld.commands.common import CliError
from rookworld.lm.answers import RookWorldLM
from rookworld.net.pretrained import ModelNotAvailableError
from rookworld.net.tokenizer import TokenizerUnavailableError


def load_lm(s, **kwargs) -> RookWorldLM:
    """The model of --model/--revision on --device, with its tokenizer; a model that cannot be had, or a device
    that is not here (a ConfigError, a ValueError), is one line."""
    try:
        return RookWorldLM.load(s.model, revision=s.revision, device=s.device, **kwargs)
    except (ModelNotAvailableError, FileNotFoundError, NotADirectoryError, ValueError,
            TokenizerUnavailableError) as e:
        raise CliError(str(e)) from None
