"""The errors a user sees as one line, and the "did you mean" hint they share."""

from __future__ import annotations

import difflib
import signal
import threading
from collections.abc import Iterable, Mapping


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field."""


class PromptError(ConfigError):
    """A prompt the model cannot take (too long, or a character the tokenizer cannot encode); ``index``: its
    position in the prompts checked (None: not one prompt's fault)."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class RunError(RuntimeError):
    """A run that cannot start or go on (its directory is taken, a write failed)."""


class CheckpointError(RuntimeError):
    """No usable checkpoint."""


class Stopped(KeyboardInterrupt):
    """The run stopped on a signal; the CLI exits with 128 + ``signum``, as a shell reports it."""

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.signum = signum


class CutShort(Stopped):
    """The run's first stop signal ended a wait on other processes' work: the trainer drops the batch or
    evaluation it was for."""


# The run's first stop signal, set by ``rlvr.runs.stops.stop_on_signals``: it ends waits on other processes' work at
# once (CutShort). The second signal raises Stopped.
STOPPING = threading.Event()


def did_you_mean(name: str, allowed: Iterable[str], elsewhere: Mapping[str, str] | None = None,
                 known: str | None = None, prefix: str = "") -> str:
    """"did you mean 'x'?" for ``name``, a key that is not one of ``allowed``.

    ``elsewhere``: the dotted paths of settings in other places, each with the choice under which it applies (""
    for always). A path whose last part is ``name`` is meant; else ``known`` (such as TRL's name for it); else the
    nearest of ``allowed`` and the paths' last parts; else the allowed names. ``prefix``: where ``allowed`` stand
    ("algo."), so that a name meant there reads as the path to type.
    """
    allowed, elsewhere = list(allowed), dict(elsewhere or {})
    exact = [path for path in elsewhere if path.rsplit(".", 1)[-1] == name]
    if exact:
        applying = [path for path in exact if not elsewhere[path]] or exact
        return f"did you mean {' or '.join(_named(path, elsewhere[path]) for path in applying)}?"
    if known:
        return known
    scored = [(_similarity(name, a), 1, a, "") for a in allowed]
    scored += [(_similarity(name, path.rsplit(".", 1)[-1]), 0, path, when) for path, when in elsewhere.items()]
    score, here, nearest, when = max(scored, default=(0.0, 0, "", ""))
    if score >= 0.5:
        return f"did you mean {repr(prefix + nearest) if here else _named(nearest, when)}?"
    return f"allowed: {', '.join(allowed)}"


def _similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def _named(path: str, when: str) -> str:
    """A path of ``elsewhere`` as a hint names it: "'seed' (top level)", "'x.y' (with task.name=z)"."""
    return f"{path!r}" + (f" (with {when})" if when else "" if "." in path else " (top level)")


def os_reason(err: OSError) -> str:
    """What went wrong with a file, in words ("No space left on device")."""
    return err.strerror or str(err)
