"""One call of a reward function: how it is called, and how what it returns is judged.

The TRL form, ``fn(prompts, completions, **columns) -> list[float | None]``, with ``completion_ids`` and
``trainer_state`` beside the data's columns. A call's outcome is plain data ("ok", "scored", "error", "timeout"),
judged where it is produced; ``judge_outcome`` turns it into what each completion gets. Which exceptions a call
catches, and why: docs/explanation/rewards.md."""

from __future__ import annotations

import math
import numbers
import os
import pickle
import signal
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

RewardFn = Callable[..., Sequence[Any]]

# A reward beyond this in absolute value is invalid, as NaN is: its sums and squares overflow in the group statistics
MAX_ABS_REWARD = 1e9
MAX_NOTE_CHARS = 500  # of a value's note kept for samples.md (a judge's reply)
_CAUGHT = (BaseException,)  # what user code may raise without ending its caller (but see call_reward)


class RewardError(RuntimeError):
    """A reward function failed in strict mode, could not be loaded, or could not run."""


@dataclass(frozen=True)
class TrainerState:
    """Where the run is, passed to reward functions as ``trainer_state`` (the attributes of TRL's that they read)."""

    global_step: int  # optimizer steps taken before the graded batch was sampled
    epoch: int  # the RL epoch (one batch of B prompts x G responses) being graded, from 0
    max_steps: int  # optimizer steps the whole run takes (``algo.epochs * algo.inner_steps``)


def call_reward(
    fn: RewardFn, prompts: Sequence, completions: Sequence, columns: dict[str, Sequence], in_process: bool = False
) -> tuple:
    """The outcome of one call run in this process: ("ok", judged), ("error", what, detail), or, ``in_process``
    (the outcome is not sent anywhere), ("scored", values, mean)."""
    cwd = _getcwd()
    try:
        returned = fn(prompts=prompts, completions=completions, **columns)  # keywords, as TRL calls
    except _CAUGHT as exc:  # not swallowed: the runner counts it, logs it once or raises it (strict)
        if isinstance(exc, KeyboardInterrupt) and (
            type(exc) is not KeyboardInterrupt  # the trainer's own stop (a second signal)
            or signal.getsignal(signal.SIGINT) is signal.default_int_handler  # library use: a real Ctrl-C
        ):
            raise
        outcome = ("error", f"raised {type(exc).__qualname__}", traceback.format_exc())
    else:
        mean = _finite_mean(returned, len(completions)) if in_process else None
        outcome = ("ok", judge_values(returned, len(completions))) if mean is None else ("scored", returned, mean)
    if cwd is not None and _getcwd() != cwd:  # relative paths (the run's directory) would move with it
        os.chdir(cwd)
        outcome = ("error", "changed the working directory", f"restored to {cwd}")
    return outcome


def _getcwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # it was removed
        return None


def check_picklable(fn: RewardFn, name: str, start_method: str) -> None:
    """Raise RewardError unless ``fn`` can be sent to a worker started with ``start_method``."""
    try:
        pickle.dumps(fn)
    except Exception as exc:  # pickle raises several types; all mean the same here
        raise RewardError(
            f"reward function {name!r} cannot be sent to a {start_method!r} worker "
            f"({type(exc).__name__}: {exc}); use a module-level function (or a "
            "functools.partial of one), or start_method='fork'"
        ) from exc


def judge_outcome(outcome: tuple, size: int) -> list[tuple[str, float, str, str]]:
    """(kind, value, what, detail) of each completion of a call from the call's outcome."""
    if outcome[0] == "timeout":
        return [("timeouts", math.nan, "", "")] * size
    if outcome[0] == "error":
        return [("errors", math.nan, outcome[1], outcome[2])] * size
    if outcome[0] == "scored":
        return [("scored", value, "", "") for value in outcome[1].tolist()]
    return outcome[1]


def _finite_mean(returned: Any, size: int) -> float | None:
    """The mean of ``returned`` if it is a 1-d floating CPU tensor of ``size`` > 0 finite values, else None (judge
    it value by value)."""
    if not (
        isinstance(returned, torch.Tensor) and returned.dim() == 1 and returned.shape[0] == size > 0
        and returned.dtype.is_floating_point and returned.is_cpu and not returned.requires_grad
    ):
        return None
    values = returned.tolist()
    try:
        total = math.fsum(values)  # the sum is NaN or inf (or raises) unless every value is finite
    except (ValueError, OverflowError):  # inf - inf; finite values whose sum overflows
        return None
    if not math.isfinite(total) or max(map(abs, values)) > MAX_ABS_REWARD:
        return None
    return total / size


def judge_values(returned: Any, size: int) -> list[tuple[str, float, str, str]]:
    """(kind, value, what, detail) of each of ``size`` completions from what a call returned: "scored" (a finite
    float; detail its ``note``, if any), "abstained" (None) or "invalid" (what says why). Accepted, as TRL accepts
    them: a list or tuple, or a 1-d numpy array or tensor, of numbers, None, 0-d arrays or 0-d tensors.
    """
    try:
        if getattr(returned, "ndim", None) == 1:  # a numpy array or a tensor
            returned = returned.tolist()
    except _CAUGHT as exc:  # the object's own code failed
        what = f"returned {_describe(returned)}, which raised {type(exc).__qualname__} when converted to a list"
        return [("invalid", math.nan, what, "")] * size
    if not isinstance(returned, (list, tuple)):
        return [("invalid", math.nan, f"returned a {type(returned).__name__}, not a list", "")] * size
    if len(returned) != size:
        return [("invalid", math.nan, f"returned {len(returned)} values for {size} completions", "")] * size
    return [_judge_value(value) for value in returned]


def _judge_value(value: Any) -> tuple[str, float, str, str]:
    if value is None:
        return ("abstained", math.nan, "", "")
    try:
        if getattr(value, "ndim", None) == 0:  # a 0-d tensor or numpy array
            value = value.item()
        if not isinstance(value, numbers.Real):  # bool, int, float and numpy scalars pass; str does not
            return ("invalid", math.nan, f"returned {_describe(value)}, not a number", "")
        as_float = float(value)
    except _CAUGHT as exc:  # the value's own __float__ (or .item()) failed
        if isinstance(exc, OverflowError) and isinstance(value, int):
            return ("invalid", math.nan, f"returned an int of {int.bit_length(value)} bits, too large", "")
        what = f"returned {_describe(value)}, which raised {type(exc).__qualname__} when converted to a float"
        return ("invalid", math.nan, what, "")
    if not math.isfinite(as_float):
        return ("invalid", math.nan, f"returned {as_float!r}, not a finite number", "")
    if abs(as_float) > MAX_ABS_REWARD:
        what = f"returned {as_float!r}, beyond the bound of {MAX_ABS_REWARD:g} on a reward's size"
        return ("invalid", math.nan, what, "")
    return ("scored", as_float, "", _note(value))


def _note(value: Any) -> str:
    """A scored value's ``note`` (a judge's reply), cut to MAX_NOTE_CHARS; "" for a plain number."""
    note = getattr(value, "note", None)
    return note[:MAX_NOTE_CHARS] if isinstance(note, str) else ""


def _describe(value: Any) -> str:
    """A value's repr (cut to 60 characters) and type, for a message; never raises."""
    kind = type(value).__name__
    try:
        text = repr(value)
    except _CAUGHT as exc:  # a user object's own __repr__, or an int too long to print
        return f"a {kind} (its repr raised {type(exc).__qualname__})"
    return f"{text:.60} ({kind})"
