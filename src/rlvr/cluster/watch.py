"""The learners' watchdog: what each learner is doing, asked while it works, and the one line
that names the learner a stuck or failed call comes down to.

A learner says what it is doing as it goes and whether that is a wait on its peers (a collective), answering
``activity`` in a concurrency group of its own (``WATCH``) beside the call in progress. When a group call runs past
``cluster.call_timeout`` or fails, ``diagnose`` asks every learner: one that is dead died; one that does not answer
is stopped or stuck outside Python; one busy outside a collective is the one its peers wait for. Under FSDP the
collectives run inside the backward pass, so a waiting peer reads as busy, and the line names every busy learner.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rlvr.cluster import PROBE_TIMEOUT, first_line

WATCH = "watch"  # the concurrency group that answers ``activity`` while a call runs
IDLE = "idle"


class Activity:
    """What this learner is doing, since when, and whether that is waiting on its peers."""

    doing, since, waiting = "starting", 0.0, False

    def _doing(self, what: str, waiting: bool = False) -> None:
        self.doing, self.since, self.waiting = what, time.monotonic(), waiting

    @contextmanager
    def _busy(self, what: str, waiting: bool = False) -> Iterator[None]:
        """Doing ``what`` for the block, idle after it however it ends."""
        self._doing(what, waiting)
        try:
            yield
        finally:
            self._doing(IDLE)

    def activity(self) -> tuple[str, float, bool]:
        """(what it is doing, for how many seconds, whether it waits in a collective)."""
        return self.doing, time.monotonic() - self.since, self.waiting


def _ranks(ranks: list[int]) -> str:
    return f"learner rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}"


def diagnose(ray: Any, learners: list[Any], doing: str, elapsed: float, failed: tuple[int, BaseException] | None = None
             ) -> str:
    """One line naming the learner(s) a group call comes down to: it ran ``elapsed`` seconds and ran out of time
    or ``failed`` (a rank and its error)."""
    from ray.exceptions import GetTimeoutError, RayActorError

    probes = [learner.activity.options(concurrency_group=WATCH).remote() for learner in learners]
    ray.wait(probes, num_returns=len(probes), timeout=PROBE_TIMEOUT)
    dead: dict[int, str] = {}
    silent, busy, waiting = [], [], []
    for rank, probe in enumerate(probes):
        try:
            what, seconds, in_collective = ray.get(probe, timeout=0)
        except GetTimeoutError:
            silent.append(rank)
        except RayActorError as err:
            dead[rank] = first_line(err)
        else:
            if in_collective:
                waiting.append((rank, what))
            elif what != IDLE:
                busy.append((rank, what, seconds))
    if dead:
        return f"{_ranks(list(dead))} died while {doing}, after {elapsed:.1f} s ({next(iter(dead.values()))})"
    peers = "".join(f"; rank {rank} waits in {what}" for rank, what in waiting)
    if silent or busy:
        hung = sorted(silent + [rank for rank, _, _ in busy])
        how = [f"rank {rank} does not answer at all (stopped, or stuck outside Python)" for rank in silent]
        how += [f"rank {rank} has been {what} for {seconds:.1f} s" for rank, what, seconds in busy]
        return f"{_ranks(hung)} hung while {doing}: no answer after {elapsed:.1f} s; {'; '.join(how)}{peers}"
    if failed is not None:
        rank, err = failed
        cause = getattr(err, "cause", None) or err  # a RayTaskError's own exception, not Ray's pages
        return f"{_ranks([rank])} failed while {doing}, after {elapsed:.1f} s: {first_line(cause)}"
    if waiting:
        return (f"{_ranks([r for r, _ in waiting])} hung in {waiting[0][1]} while {doing}: no answer after "
                f"{elapsed:.1f} s")
    return f"the learners gave no answer while {doing}, after {elapsed:.1f} s"
