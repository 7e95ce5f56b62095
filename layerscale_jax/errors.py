"""The user-error types: a mistake in what the user gave, raised where it enters, reported as one line.

``run_cli`` (``layerscale_jax.cli``) prints a ``UserError`` as ``error: <message>`` without a traceback; every
other exception is a bug and keeps its traceback. Raise the narrowest type at the point of entry, naming the field
or the file and the value:

    UserError        the base: a mistake in the config, a file, the dataset, the devices or the disk.
    ConfigError      a config field or an argument has a value the code cannot use (also a ``ValueError``).
    InputFileError   a file the user named is not what it should be: its format or contents (also a
                     ``ValueError``).
"""
from __future__ import annotations

import difflib
from typing import Iterable


class UserError(Exception):
    """A mistake in the user's input (config, file, dataset, devices, disk), reported in one line without a
    traceback by ``run_cli``. Raise it where the input enters, naming the field or the file and the value."""


class ConfigError(UserError, ValueError):
    """A config field or an argument with a value the code cannot use: ``train.steps=0 must be ...``."""


class InputFileError(UserError, ValueError):
    """A file the user named whose format or contents are wrong: ``'w.npz' is not a valid .npz file ...``."""


def close_matches(word: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The candidates closest to ``word`` (difflib), best first."""
    return difflib.get_close_matches(word, list(candidates), n=n, cutoff=0.6)


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``" (did you mean 'a' or 'b'?)"`` for the close matches of ``word``, or ``""`` when there are none."""
    matches = close_matches(word, candidates)
    if not matches:
        return ""
    quoted = [repr(m) for m in matches]
    listed = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
    return f" (did you mean {listed}?)"
