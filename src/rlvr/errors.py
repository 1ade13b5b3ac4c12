"""The errors a user sees as one line, and the "did you mean" hint they share."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field."""


class RunError(RuntimeError):
    """A run that cannot start or go on (its directory is taken, a write failed)."""


def did_you_mean(name: str, allowed: Iterable[str]) -> str:
    """"did you mean 'x'?" for the allowed name nearest ``name``, else the allowed names."""
    allowed = list(allowed)
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.5)
    return f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(allowed)}"


def os_reason(err: OSError) -> str:
    """What went wrong with a file, in words ("No space left on device")."""
    return err.strerror or str(err)
