"""A run's training time, measured the same way on every side of a benchmark: the wall clock
since the run began less the wall clock of its held-out evaluations.

Standard library only: ``trl_step.py`` runs in an interpreter without rlvr and times TRL's run
with this same file, ``time_to_accuracy.py`` rlvr's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class TrainingClock:
    """Starts when made (just before the run loads its model). ``evaluation()`` brackets each
    evaluation: its wall time is not training, and the training seconds at its start are kept
    in ``at_evaluations`` (in order). ``step_ended()`` keeps the training seconds at the end of
    each optimizer step in ``at_steps`` (both sides call it just after their optimizer steps)."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self._now = now
        self._start = now()
        self._evaluating = 0.0
        self.at_evaluations: list[float] = []
        self.at_steps: list[float] = []

    def seconds(self) -> float:
        """Wall seconds since the start, less those spent in evaluations."""
        return self._now() - self._start - self._evaluating

    def step_ended(self) -> None:
        self.at_steps.append(self.seconds())

    @contextmanager
    def evaluation(self) -> Iterator[None]:
        begin = self._now()
        self.at_evaluations.append(begin - self._start - self._evaluating)
        try:
            yield
        finally:
            self._evaluating += self._now() - begin
