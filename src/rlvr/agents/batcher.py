"""The engine's side of the endpoint: one thread that samples the requests of every live episode in batches, each
completion with its own seed, so that an episode's draws do not depend on what it was batched with."""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rlvr.policies.causal_lm import CausalLMPolicy

Outcome = tuple[list[int], list[float], str, str]  # a completion: its ids, log-probs, text and finish reason
POLL = 0.002  # seconds between the batcher's looks at the live episodes
GAP = 0.2  # seconds without a new request after which the batcher stops waiting for the rest


@dataclass
class Job:
    """One completion to sample (``seed`` None: greedy); ``future`` gets its ``Outcome``."""

    episode: str
    prompt_ids: list[int]
    seed: int | None
    temperature: float
    max_new: int
    stop: tuple[str, ...]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class Batcher:
    """The thread that samples pending requests in batches: from the first request it waits until every live
    episode has one pending, while requests keep arriving (being read, or queued within ``GAP`` seconds of the
    last), ``wait`` seconds at most (an agent may be running its tools), then sends them all to the engine, one
    call per (temperature, stop strings), each row cut to its own ``max_new``."""

    def __init__(self, policy: CausalLMPolicy, wait: float, live: Callable[[], int], arriving: Callable[[], int]
                 ) -> None:
        self.policy, self.wait, self.live, self.arriving = policy, wait, live, arriving
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rlvr-endpoint-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=60)
            self._thread = None

    def put(self, job: Job) -> None:
        self._queue.put(job)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            jobs, start = [first], time.monotonic()
            last = start
            while len({job.episode for job in jobs}) < self.live():
                now = time.monotonic()
                if (now - last > GAP and not self.arriving()) or now - start > self.wait:
                    break  # none arriving (being read, or sent within GAP), or waited long enough
                # short waits: an episode that finishes meanwhile lowers the count waited for
                taken = self._take(jobs, POLL)
                if taken is None:
                    break
                if taken:
                    last = time.monotonic()
            while self._take(jobs, None):  # and whatever else is already waiting
                pass
            groups: dict[tuple, list[Job]] = {}
            for job in jobs:
                groups.setdefault((job.temperature, job.stop), []).append(job)
            for (temperature, stop), group in groups.items():
                try:
                    self._generate(group, temperature, stop)
                except BaseException as err:  # noqa: BLE001 - every waiting request gets the error
                    for job in group:
                        if not job.future.done():
                            job.future.set_exception(err)

    calls = 0  # engine calls made so far

    def _take(self, jobs: list[Job], timeout: float | None) -> bool | None:
        """Move one queued job into ``jobs`` (waiting ``timeout`` seconds; None: not at all): whether one was there,
        None at the stop mark (left queued)."""
        try:
            job = self._queue.get(timeout=timeout) if timeout is not None else self._queue.get_nowait()
        except queue.Empty:
            return False
        if job is None:
            self._queue.put(None)
            return None
        jobs.append(job)
        return True

    def _generate(self, jobs: list[Job], temperature: float, stop: tuple[str, ...]) -> None:
        from rlvr.environments.episodes import turn_calls
        from rlvr.policies import turns

        policy = self.policy
        prefixes = [job.prompt_ids for job in jobs]
        room = [job.max_new for job in jobs]
        for rows, max_new in turn_calls([len(p) for p in prefixes], room, max(room), policy.max_positions):
            self.calls += 1
            seeds = None if temperature == 0 else torch.tensor([jobs[i].seed for i in rows], dtype=torch.long)
            with torch.no_grad():
                generation, texts = turns.next_turns(policy, [prefixes[i] for i in rows], temperature, max_new,
                                                     seeds, stop)
            lengths = generation.lengths.tolist()
            ids, log_probs = generation.response_ids.tolist(), generation.sample_log_probs.tolist()
            ends = set(policy.sampling.end_token_ids)
            for k, i in enumerate(rows):
                job, length, text = jobs[i], lengths[k], texts[k]
                if length > job.max_new:  # drawn with a roomier row: cut at its own limit
                    length = job.max_new
                    text = policy.tokenizer.decode(ids[k][:length], skip_special_tokens=True)
                ended = length > 0 and (ids[k][length - 1] in ends or length < job.max_new
                                        or any(s in text for s in stop + policy.sampling.stop_strings))
                job.future.set_result((ids[k][:length], log_probs[k][:length], text, "stop" if ended else "length"))


def call_seed(episode_seed: int, index: int) -> int:
    """The seed of an episode's completion ``index``: its draws depend on the episode's seed and its place alone."""
    from rlvr.engines.hf import keyed_uniforms

    return int(keyed_uniforms(torch.tensor([episode_seed]), index).item() * 2**62)
