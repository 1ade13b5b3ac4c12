"""Reward functions that misbehave on purpose, for fault-tolerance tests and the soak run.

Each is deterministic in the completion text (a hash picks the victims), so a run
that resumes sees the same faults. Use them as ``rewards.functions``, e.g.
``rewards.functions=['faulty_rewards:flaky']``, with this folder on ``sys.path`` (the
benchmarks run from it; the tests have it on theirs: ``pythonpath`` in pyproject.toml).
"""

from __future__ import annotations

import time
import zlib


def _pick(text: str, salt: str, rate: float) -> bool:
    return zlib.crc32(f"{salt}:{text}".encode()) / 2**32 < rate


def flaky(prompts: list[str], completions: list[str], **columns) -> list[float]:
    """0.5 per completion, but raises ValueError when any completion is picked (rate 0.2)."""
    for text in completions:
        if _pick(text, "flaky", 0.2):
            raise ValueError(f"flaky reward refuses {text!r}")
    return [0.5] * len(completions)


def sometimes_hangs(prompts: list[str], completions: list[str], **columns) -> list[float]:
    """0.25 per completion, but sleeps 60 s when any completion is picked (rate 0.05)."""
    if any(_pick(text, "hang", 0.05) for text in completions):
        time.sleep(60)
    return [0.25] * len(completions)


def sometimes_nan(prompts: list[str], completions: list[str], **columns) -> list[float]:
    """NaN for picked completions (rate 0.1), else 0.1."""
    return [float("nan") if _pick(text, "nan", 0.1) else 0.1 for text in completions]
