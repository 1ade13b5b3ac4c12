"""vLLM's requests driven one engine step at a time: ``LLM.generate``'s loop written out, so that new weights can
come in between two steps and every token is tagged with the weights version that drew it
(docs/explanation/engines.md)."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Drawn:
    """One response as it is drawn (``log_probs`` empty when none were asked for)."""

    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)


@dataclass
class Request:
    """One added request: its responses by index and the prompt's log-probs once reported (when asked for)."""

    id: str
    responses: dict[int, Drawn] = field(default_factory=dict)
    prompt_log_probs: list[Any] | None = None
    finished: bool = False


def can_pause(llm: Any) -> bool:
    """Does this vLLM keep requests across a pause and recompute them after new weights?"""
    sleep, reset = inspect.signature(llm.sleep).parameters, inspect.signature(llm.reset_prefix_cache).parameters
    return "mode" in sleep and "reset_running_requests" in reset


class Requests:
    """The requests of one vLLM ``LLM``, stepped by ``run``; ``version()`` names the weights loaded now."""

    def __init__(self, llm: Any, version: Callable[[], int]) -> None:
        self.llm, self.version = llm, version
        self.open: dict[str, Request] = {}
        self.ids = itertools.count()

    def add(self, prompt: Any, params: Any) -> Request:
        """Add a request (a ``TokensPrompt`` and vLLM ``SamplingParams``, changed to stream)."""
        from vllm.sampling_params import RequestOutputKind

        params.output_kind = RequestOutputKind.DELTA
        request_id = f"rlvr-{next(self.ids)}"
        self.llm.llm_engine.add_request(request_id, prompt, params)
        self.open[request_id] = request = Request(request_id)
        return request

    def run(self, requests: list[Request], between: Callable[[], Any] | None = None) -> None:
        """Step the engine until ``requests`` are finished, calling ``between`` after each step that leaves some
        running (new weights). Interrupted, the unfinished ones are aborted: no later call steps them."""
        try:
            while not all(r.finished for r in requests):
                self.step()
                if between is not None and not all(r.finished for r in requests):
                    between()
        except BaseException:
            unfinished = [r.id for r in requests if not r.finished]
            self.llm.llm_engine.abort_request(unfinished)
            for request_id in unfinished:
                self.open.pop(request_id, None)
            raise

    def step(self) -> None:
        version = self.version()
        for out in self.llm.llm_engine.step():
            request = self.open[out.request_id]
            if out.prompt_logprobs is not None:
                request.prompt_log_probs = out.prompt_logprobs
            for c in out.outputs:
                drawn = request.responses.setdefault(c.index, Drawn())
                drawn.token_ids += c.token_ids
                drawn.versions += [version] * len(c.token_ids)
                if c.logprobs:
                    drawn.log_probs += [scores[t].logprob for scores, t in zip(c.logprobs, c.token_ids)]
            if out.finished:
                request.finished = True
                del self.open[out.request_id]

    def load_weights(self, reload: Callable[[], None]) -> None:
        """``reload()`` the weights, then drop every key and value the old ones computed: the prefix cache, and the
        running requests' (paused meanwhile, recomputed after)."""
        running = bool(self.open)
        if running:
            self.llm.sleep(level=0, mode="keep")
        try:
            reload()
            # a vLLM without the pause API takes no reset_running_requests (nothing runs then)
            kept = {"reset_running_requests": True} if running else {}
            if not self.llm.reset_prefix_cache(**kept):
                raise RuntimeError("vLLM did not reset its prefix cache after a weight update")
        finally:
            if running:
                self.llm.wake_up(tags=["scheduling"])
