"""Running agents against the endpoint: G episodes per row, each its own agent run.

An agent is the user's ``run(client, row)`` (async or plain), its client pointed at the episode's own URL and key;
it returns a reward, or a dict with ``reward``, ``solved`` and more numbers. A failed episode abstains, and a stop
signal cancels them all (``CutShort``). In full: docs/explanation/agents.md."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import inspect
import math
import os
import sysconfig
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlvr.agents.calls import AgentEpisode, join_calls
from rlvr.agents.server import Endpoint
from rlvr.base.errors import STOPPING, CutShort
from rlvr.environments.base import Episode, describe_error

STOP_POLL = 0.05  # seconds between looks at the run's stop signal while agents run
MAX_SEGMENTS = 8  # sequences one episode may train as; past it the episode abstains


@dataclass
class AgentLimits:
    """timeout: seconds one episode may take; max_tokens: an episode's tokens after its first prompt."""

    concurrency: int = 32
    timeout: float = 120.0
    max_tokens: int = 1024


@dataclass
class AgentRun(Episode):
    """An agent's episode: its first segment's Episode, the number of calls and segments, the agent's metrics."""

    calls: int = 0
    segments: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


def run_agents(endpoint: Endpoint, agent: Callable[..., Any], starts: Sequence[Any], group_size: int,
               temperature: float, seeds: Sequence[int], limits: AgentLimits) -> list[AgentRun]:
    """G episodes from each of B ``starts`` (row ``b*G + g``), episode i drawing from ``seeds[i]``."""
    rows = [start for start in starts for _ in range(group_size)]
    coroutine = _run_all(endpoint, agent, rows, temperature, seeds, limits)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlvr-agents") as pool:
        return pool.submit(asyncio.run, coroutine).result()  # its own event loop, whatever the caller runs


async def _run_all(endpoint: Endpoint, agent: Callable[..., Any], rows: list[Any], temperature: float,
                   seeds: Sequence[int], limits: AgentLimits) -> list[AgentRun]:
    import openai

    gate = asyncio.Semaphore(limits.concurrency)
    # one HTTP connection pool for every episode's client (a client of its own costs ~20 ms to make)
    shared = openai.DefaultAsyncHttpxClient() if inspect.iscoroutinefunction(agent) else openai.DefaultHttpxClient()

    async def one(row: Any, seed: int) -> AgentRun:
        async with gate:
            episode_id = endpoint.open(seed, temperature, limits.max_tokens)
            outcome: Any = None
            error = None
            try:
                outcome = await asyncio.wait_for(_call_agent(agent, endpoint, episode_id, copy.deepcopy(row), shared),
                                                 limits.timeout)
            except asyncio.TimeoutError:
                error = f"the agent ran past task.options.episode_timeout={limits.timeout:g} s"
            except Exception as exc:  # noqa: BLE001 - the user's agent: its failure is its episode's
                error = raised(exc, agent)
            finally:
                record = endpoint.finish(episode_id)  # also when cut short: no episode stays live
            return episode_of(row, record, outcome, error, endpoint.policy.tokenizer.decode)

    episodes = asyncio.gather(*(one(row, seed) for row, seed in zip(rows, seeds)))
    stop = asyncio.ensure_future(_stop_signal())
    try:
        await asyncio.wait({episodes, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not episodes.done():  # the run's first stop signal: every episode cancelled, the batch dropped
            episodes.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await episodes
            raise CutShort("a stop signal cut the agents' episodes short")
        return list(episodes.result())
    finally:
        stop.cancel()
        await shared.aclose() if isinstance(shared, openai.DefaultAsyncHttpxClient) else shared.close()


async def _stop_signal() -> None:
    """Returns once the run's first stop signal is set (``rlvr.base.errors.STOPPING``)."""
    while not STOPPING.is_set():
        await asyncio.sleep(STOP_POLL)


async def _call_agent(agent: Callable[..., Any], endpoint: Endpoint, episode_id: str, row: Any, shared: Any) -> Any:
    """The agent on ``row`` with a client for the episode's URL over the ``shared`` connections."""
    import openai

    url = endpoint.url(episode_id)
    if inspect.iscoroutinefunction(agent):
        client = openai.AsyncOpenAI(base_url=url, api_key=endpoint.key(episode_id), max_retries=0, http_client=shared)
        return await agent(client, row)
    client = openai.OpenAI(base_url=url, api_key=endpoint.key(episode_id), max_retries=0, http_client=shared)
    return await asyncio.to_thread(agent, client, row)


def episode_of(row: Any, record: AgentEpisode, outcome: Any, error: str | None,
               decode: Callable[[list[int]], str] | None = None) -> AgentRun:
    """The agent's episode from the endpoint's record and what the agent returned (or why it failed); ``decode``
    gives the text of the context between its calls."""
    reward, solved, metrics = None, None, {}
    if error is None:
        reward, solved, metrics, error = _outcome(outcome)
    segments = join_calls(record.calls, decode)
    if error is None and not segments:
        error = "the agent made no call to the model"
    if error is None and len(segments) > MAX_SEGMENTS:
        error = (f"its {len(record.calls)} calls split into {len(segments)} segments, more than the {MAX_SEGMENTS} "
                 "an episode may train as (each a row of the batch)")
    run = AgentRun(start=row, prompt=record.prompt or "", prompt_ids=segments[0].prompt_ids if segments else [],
                   turns=segments[0].turns if segments else [], solved=solved, done=True, truncated=record.truncated,
                   error=error, calls=len(record.calls), segments=len(segments), metrics=metrics,
                   more_segments=[(s.prompt_ids, s.turns) for s in segments[1:]])
    if run.turns and reward is not None:
        run.turns[-1].reward = reward
    return run


def raised(exc: BaseException, agent: Any) -> str:
    """"the agent raised <type>: <message> (at <file>:<line> in <function>: <code>)", the innermost frame of the
    user's code the exception passed through."""
    text = f"the agent raised {describe_error(exc, 300)}"
    try:
        own = inspect.getsourcefile(inspect.unwrap(agent))
    except TypeError:  # not a function of a file (a builtin, a callable object of C)
        own = None
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = os.path.realpath(frame.filename)
        if frame.filename.startswith("<") or _under(path, _RLVR):  # <string>, <frozen ...>; rlvr's own frames
            continue
        if frame.filename == own or not _under(path, _PYTHON):
            code = (frame.line or "").strip()
            code = f": {code[:80]}{'...' if len(code) > 80 else ''}" if code else ""
            return f"{text} (at {_shown_path(frame.filename)}:{frame.lineno} in {frame.name}{code})"
    return text


# Python's libraries (an agent installed among them is the user's where it is the agent's own file), and rlvr
_PYTHON = tuple({os.path.realpath(sysconfig.get_path(name)) for name in ("stdlib", "platstdlib", "purelib", "platlib")})
_RLVR = (os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),)


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + os.sep) for root in roots)


def _shown_path(filename: str) -> str:
    """``filename`` relative to the working folder where it lies under it."""
    relative = os.path.relpath(filename)
    return filename if relative.startswith(os.pardir) else relative


def _outcome(value: Any) -> tuple[float | None, bool | None, dict[str, float], str | None]:
    """(reward, solved, metrics, error) of what an agent returned."""
    solved, metrics = None, {}
    if isinstance(value, dict):
        if "reward" not in value:
            return None, None, {}, f"the agent returned a dict without 'reward' (keys: {', '.join(map(str, value))})"
        solved = None if value.get("solved") is None else bool(value["solved"])
        metrics = {str(k): float(v) for k, v in value.items()
                   if k not in ("reward", "solved") and isinstance(v, (int, float)) and not isinstance(v, bool)}
        value = value["reward"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, None, {}, f"the agent returned {type(value).__name__} {value!r:.60}, not a number"
    if not math.isfinite(value):
        return None, None, {}, f"the agent returned a reward of {value}"
    return float(value), solved, metrics, None
