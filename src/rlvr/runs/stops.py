"""A run's progress on stderr, and the stop signals (SIGINT, SIGTERM) that end it at a checkpoint."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from rlvr.base.errors import STOPPING, CutShort, Stopped
from rlvr.batch.record import Record
from rlvr.loop.state import TrainState


class Progress:
    """Progress over epochs with the mean reward and solve rate: a bar on a terminal; elsewhere a plain line every
    tenth of the run, since a bar's carriage returns make one unreadable line of a log."""

    def __init__(self, epochs: int, enabled: bool, desc: str, initial: int = 0, stream: IO[str] | None = None):
        self.stream = sys.stderr if stream is None else stream
        self.plain = enabled and not self.stream.isatty()
        self.epochs, self.desc, self.every = epochs, desc, max(1, epochs // 10)
        self.bar = tqdm(total=epochs, initial=initial, disable=not enabled or self.plain, desc=desc,
                        dynamic_ncols=True, leave=True, mininterval=0.5, file=self.stream)
        self.epoch = -1

    def __call__(self, record: Record) -> None:
        if record["kind"] == "train" and record["epoch"] != self.epoch:
            self.epoch = record["epoch"]
            self.bar.update(1)
            self.bar.set_postfix(reward=f"{record['reward_mean']:.3f}", solve=f"{record['solve_rate']:.2f}")
            number = self.epoch + 1  # the epoch whose batch this is, counted from 1
            if self.plain and (number % self.every == 0 or number == self.epochs):
                print(f"{self.desc}: epoch {number}/{self.epochs}  reward {record['reward_mean']:.3f}  "
                      f"solve rate {record['solve_rate']:.2f}", file=self.stream, flush=True)
        elif record["kind"] == "eval":
            self.bar.set_postfix(eval_greedy=f"{record['greedy_solve_rate']:.2f}")

    def close(self) -> None:
        self.bar.close()


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C; schedulers and ``docker stop``


class Stops:
    """The stop signals a run received, and the stretch in which a second one does not abort (``shielded``):
    while the run's parts close (Ray shutting down), an abort would leave them half closed."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.shield = False

    @contextmanager
    def shielded(self, parts: Any) -> Iterator[Any]:
        """``parts`` (a context manager) entered as it is, its exit shielded from an abort."""
        with ExitStack() as stack:
            stack.callback(setattr, self, "shield", False)  # last on the way out
            value = stack.enter_context(parts)
            stack.callback(setattr, self, "shield", True)  # first: the parts' exit comes after it
            yield value


@contextmanager
def stop_on_signals(st: TrainState, run_dir: Path) -> Iterator[Stops]:
    """First SIGINT or SIGTERM: finish the current step, checkpoint, stop. A second one: stop at once (or, while
    the run's parts close, once they have closed)."""
    stops = Stops()

    def handler(signum, frame):
        stops.received.append(signum)
        name = signal.Signals(signum).name
        if st.stop_requested:
            stopped = Stopped(f"stopped by a second {name} without a checkpoint; continue from the last one "
                              f"with: rlvr train resume={run_dir}", signum)
            if stops.shield:
                print(f"\nrlvr: {name}: the run is closing its parts; it stops once they are closed", flush=True)
                return
            raise stopped
        st.stop_requested = True
        STOPPING.set()
        print(f"\nrlvr: {name}: stopping after this step and writing a checkpoint (send it again to abort)", flush=True)

    try:
        previous = {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}
    except ValueError:  # not the main thread: leave signals alone
        yield stops
        return
    STOPPING.clear()
    try:
        yield stops
    except CutShort as cut:  # before the loop (the start check, the first evaluation): nothing to keep
        name = signal.Signals(stops.received[0] if stops.received else signal.SIGINT)
        raise Stopped(f"stopped by {name.name} before any work ({cut})", name) from None
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
        STOPPING.clear()
