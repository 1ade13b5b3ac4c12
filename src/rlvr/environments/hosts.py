"""Where environment code runs, and the contract every call into it has.

A call into environment code (making the environment, ``reset``, ``step``, ``tools()``, one
of its own tools) is a request to the host of its episode's environment, and answers with a
value or an ``EnvironmentFailed`` (one line naming the call). Whatever the code does, it
ends that episode alone: an exception of any kind (SystemExit, KeyboardInterrupt and
RecursionError too), a wrong type, or a call past its time limit.

``EnvironmentHosts(make_env, workers)`` keeps the environments of a batch's episodes:

  * ``workers`` > 0 (the default, where ``fork`` exists): in that many worker processes
    forked from the trainer, episode row ``i`` in worker ``i % workers`` (with as many
    workers as episodes, each episode has one of its own). The factory runs in the
    worker. All requests of a batch are in flight at once, one at a time per worker, so
    episodes that hang time out together, not one after another. A call has ``seconds``
    in the worker (``StepTimeout``, raised again every half second, so that
    ``except Exception`` does not swallow it); a worker that has not answered
    ``HARD_GRACE`` seconds after that, whatever its code does (a C loop, a swallowed
    BaseException), is killed with its process group and every episode it hosts ends with
    the error. The run's first stop signal (``rlvr.base.errors.STOPPING``) ends the waits at
    once: the workers in mid-call are killed and ``CutShort`` is raised (the trainer drops
    the batch). Workers die with the trainer (as reward workers do:
    ``rlvr.rewards.workers``).
  * ``workers`` = 0: in the trainer's process, one call after another, each under
    SIGALRM alone (``time_limit``: in the main thread only; code that blocks signals or
    loops in C is not stopped).

A value crosses from a worker by ``pickle`` (a prompt, an observation, a tool's text): one
that does not pickle fails the call, named.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import math
import multiprocessing
import numbers
import os
import pickle
import signal
import threading
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from rlvr.base.errors import STOPPING, CutShort, Stopped
from rlvr.environments.base import Environment, Observation, Step, describe_error
from rlvr.rewards.workers import Reaper, die_with_parent, lead_group, trainer_ends

HARD_GRACE = 2.0  # seconds past a call's limit before its worker is killed
WORKERS = 64  # worker processes at most by default: episodes beyond share them
MAX_SCHEMA_CHARS = 65_536  # an environment's tool schemas, as JSON
MAX_SNAPSHOT_BYTES = 1 << 20  # an environment's snapshot, pickled: attributes past it are left out
_POLL = 0.25  # seconds between looks at the run's stop request while waiting on workers
logger = logging.getLogger(__name__)


class EnvironmentFailed(Exception):
    """Environment code failed (raised, ran past its time, answered with the wrong type): one line."""


class StepTimeout(BaseException):
    """Environment code ran past its time limit (a BaseException, as KeyboardInterrupt is:
    an ``except Exception`` in the environment does not swallow it)."""


# A request: (episode row, operation, arguments). The operations, each run where the
# row's environment lives; ``what`` names the call in its error.

def _make(envs: dict[int, Any], row: int, make_env: Callable[[], Environment]) -> str:
    envs[row] = make_env()
    return type(envs[row]).__name__


def _reset(envs: dict[int, Any], row: int, start: Any) -> Observation:
    env = envs[row]
    prompt = env.reset(start)
    if not (isinstance(prompt, str) or is_chat(prompt)):
        raise TypeError(f"reset returned {kind(prompt)}, not text or a list of messages "
                        "({'role': ..., 'content': ...})")
    return prompt


def _tools(envs: dict[int, Any], row: int) -> list[str]:
    """The names of the environment's own tools."""
    tools = getattr(envs[row], "tools", None)
    if not callable(tools):
        return []
    found = tools()
    if not isinstance(found, Mapping) or not all(isinstance(k, str) and callable(v) for k, v in found.items()):
        raise TypeError(f"tools() returned {kind(found)}, not a mapping of names to callables")
    return list(found)


def _tool(envs: dict[int, Any], row: int, name: str, args: tuple, kwargs: dict) -> str:
    """The environment's tool ``name`` called, text arguments converted to its annotated types."""
    from rlvr.environments.tool_parsing import typed_arguments

    tool = envs[row].tools()[name]
    args, kwargs = typed_arguments(tool, args, kwargs)
    return str(tool(*args, **kwargs))


def _step(envs: dict[int, Any], row: int, text: str, chat: bool
          ) -> tuple[float, bool, bool | None, Observation | None]:
    """The environment's step on ``text``, read: its reward, done, solved and observation
    (a Step's fields may run its own code, so they are read inside the contract)."""
    env = envs[row]
    step = env.step(text)
    if not isinstance(step, Step):
        raise TypeError(f"step returned {type(step).__name__}, not an rlvr Step")
    reward, done = step_reward(step.reward), bool(step.done)
    solved = None if step.solved is None else bool(step.solved)
    observation = None if done or step.observation is None else as_observation(step.observation, chat,
                                                                                 type(env).__name__)
    return reward, done, solved, observation


def _final(envs: dict[int, Any], row: int) -> tuple[float, bool | None] | None:
    """A truncated episode's reward from its environment's state, where it has one to read
    (``final_reward()``: a TRL-style class's get_reward); None where it has not."""
    final = getattr(envs[row], "final_reward", None)
    if not callable(final):
        return None
    reward, solved = final()
    return step_reward(reward), None if solved is None else bool(solved)


def _schemas(envs: dict[int, Any], row: int) -> list[dict[str, Any]]:
    """The function schemas of the tools the environment shows the policy (``tool_schemas()``:
    a list of dicts, JSON text at most MAX_SCHEMA_CHARS in all); none where it defines none."""
    schemas = getattr(envs[row], "tool_schemas", None)
    if not callable(schemas):
        return []
    found = schemas()
    if not isinstance(found, list) or not all(isinstance(schema, dict) for schema in found):
        raise TypeError(f"tool_schemas() returned {kind(found)}, not a list of function schemas (dicts)")
    size = len(json.dumps(found))
    if size > MAX_SCHEMA_CHARS:
        raise ValueError(f"tool_schemas() is {size:,} characters of JSON; at most {MAX_SCHEMA_CHARS:,}")
    return found


def _snapshot(envs: dict[int, Any], row: int) -> Any:
    """What reward functions get of the environment as its episode ends: ``snapshot()`` where
    it defines one, else a copy of its public attributes (``public_attributes``)."""
    env = envs[row]
    snapshot = getattr(env, "snapshot", None)
    return snapshot() if callable(snapshot) else public_attributes(env)


def public_attributes(instance: Any) -> types.SimpleNamespace:
    """A copy of ``instance``'s public attributes (names not starting with "_") as a
    namespace: those that pickle (open files and locks do not), in order while they fit
    in MAX_SNAPSHOT_BYTES in all; the rest are left out."""
    kept, size = {}, 0
    for name, value in getattr(instance, "__dict__", {}).items():
        if name.startswith("_"):
            continue
        try:
            data = pickle.dumps(value)
        except Exception:  # noqa: S112 (what does not pickle is not part of the snapshot)
            continue
        if size + len(data) <= MAX_SNAPSHOT_BYTES:
            kept[name], size = pickle.loads(data), size + len(data)  # noqa: S301 (bytes made just above)
    return types.SimpleNamespace(**kept)


_OPERATIONS = {"make": _make, "reset": _reset, "tools": _tools, "tool": _tool, "step": _step, "final": _final,
               "schemas": _schemas, "snapshot": _snapshot}


def call_name(env_name: str | None, operation: str, args: tuple) -> str:
    """How an error names a call: "making the environment", a tool's name, "Class.step"."""
    if operation == "make":
        return "making the environment"
    if operation == "tool":
        return args[0]
    return f"{env_name or 'the environment'}.{operation}"


def _what(envs: dict[int, Any], row: int, operation: str, args: tuple) -> str:
    return call_name(type(envs[row]).__name__ if row in envs else None, operation, args)


def _run(envs: dict[int, Any], make_env: Callable[[], Environment], request: tuple, seconds: float | None) -> tuple:
    """One request, run here: ("ok", value) or ("failed", one line, whether it timed out)."""
    row, operation, args = request
    if operation == "make":
        args = (make_env,)
    what = _what(envs, row, operation, args)
    try:
        with time_limit(seconds):
            return ("ok", _OPERATIONS[operation](envs, row, *args))
    except Stopped:
        raise
    except BaseException as err:  # noqa: BLE001 - the environment's failure ends its episode, not the run
        return ("failed", f"{what}: {describe_error(err)}"[:500], isinstance(err, StepTimeout))


def step_reward(reward: object) -> float:
    """A Step's reward as a float: a real number (bool, int, float, a numpy scalar), never
    text or None, which ``float`` would read as 1.0 or refuse with a crash."""
    if not isinstance(reward, numbers.Real):
        raise TypeError(f"Step(reward={reward!r:.60}): a reward is a real number, not {type(reward).__name__}")
    return float(reward)


def as_observation(observation: Any, chat: bool, name: str) -> Observation:
    """``observation`` in its episode's form: text for a text episode, messages for a chat."""
    if chat:
        if isinstance(observation, str):
            return [{"role": "user", "content": observation}]
        if not is_chat(observation):
            raise TypeError(f"{name} answered with {kind(observation)}: a chat episode takes text or a list of "
                            "messages ({'role': ..., 'content': ...})")
        return observation
    if is_chat(observation):
        raise TypeError(f"{name} answered a text episode with chat messages; an episode whose prompt is text "
                        "takes text observations")
    if not isinstance(observation, str):
        raise TypeError(f"{name} answered with {kind(observation)}: a text episode takes text observations")
    return observation


def kind(value: Any) -> str:
    return "None" if value is None else f"{type(value).__name__} {value!r:.40}"


def is_chat(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value)


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise StepTimeout in the code within after ``seconds`` (SIGALRM: in the main thread of
    a POSIX process; elsewhere, or with None, no limit)."""
    usable = (seconds is not None and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise StepTimeout(f"no answer within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.5)  # again every half second, should code swallow it
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _Worker:
    """One worker process, its end of the pipe, and the request it runs."""

    def __init__(self, process: multiprocessing.process.BaseProcess, conn: Any) -> None:
        self.process, self.conn = process, conn
        self.task: int | None = None  # index of the request in flight
        self.deadline = math.inf


class EnvironmentHosts:
    """The environments of a batch's episodes, by row, made by ``make_env`` in ``workers``
    worker processes (0: in this process); see the module docstring."""

    def __init__(self, make_env: Callable[[], Environment], workers: int = WORKERS) -> None:
        self.make_env = make_env
        self.num_workers = workers if hasattr(os, "fork") else 0
        self._envs: dict[int, Any] = {}  # in this process
        self._workers: dict[int, _Worker] = {}
        self._names: dict[int, str] = {}  # row -> its environment's class name, as its worker made it
        self._hosted: dict[int, set[int]] = collections.defaultdict(set)  # worker -> the rows it made
        self._lost: dict[int, str] = {}  # row -> why its environment is gone (its worker was stopped)
        self._reaper: Reaper | None = None

    def call(self, requests: Sequence[tuple[int, str, tuple]], seconds: float | None) -> list[Any]:
        """Each request's value, or its EnvironmentFailed; a row's requests run in order."""
        if not self.num_workers:
            outcomes = [_run(self._envs, self.make_env, request, seconds) for request in requests]
        else:
            outcomes = self._in_workers(requests, seconds)
        return [self._value(outcome, seconds) for outcome in outcomes]

    def close(self) -> None:
        for slot in list(self._workers):
            self._stop(slot)
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None
        self._envs.clear()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    @staticmethod
    def _value(outcome: tuple, seconds: float | None) -> Any:
        if outcome[0] == "ok":
            return outcome[1]
        _, message, timed_out = outcome
        what = message.split(": ")[0]
        if timed_out and what not in _TIMED_OUT:  # said at once: the next may cost as long
            _TIMED_OUT.add(what)
            logger.warning("%s ran past its time limit of %g s: its episode ends with an error; calls that hang "
                           "like it time out together, each batch (task.options.step_timeout or tool_timeout)",
                           what, seconds)
        return EnvironmentFailed(message)

    def _in_workers(self, requests: Sequence[tuple[int, str, tuple]], seconds: float | None) -> list[tuple]:
        outcomes: list[tuple | None] = [None] * len(requests)
        queues: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        for index, (row, _, _) in enumerate(requests):
            queues[row % self.num_workers].append(index)
        try:
            for slot in queues:
                self._send_next(slot, queues, requests, outcomes, seconds)
            while any(w.task is not None for w in self._workers.values()):
                if STOPPING.is_set():
                    raise CutShort("a stop signal cut the episodes' waits on their environments short")
                self._collect(queues, requests, outcomes, seconds)
        finally:
            for slot in [s for s, w in self._workers.items() if w.task is not None]:
                self._stop(slot, "its worker was stopped mid-call")  # its reply would be stale
        return outcomes  # type: ignore[return-value]

    def _send_next(self, slot: int, queues: dict, requests: Sequence, outcomes: list, seconds: float | None) -> None:
        if not queues[slot]:
            return
        index = queues[slot].popleft()
        row, operation, _ = requests[index]
        if operation == "make":
            self._lost.pop(row, None)
            self._hosted[slot].add(row)
        elif row in self._lost:
            outcomes[index] = ("failed", f"{self._what(requests[index])}: its environment is gone ({self._lost[row]})",
                               False)
            self._send_next(slot, queues, requests, outcomes, seconds)
            return
        worker = self._workers.get(slot) or self._start(slot)
        try:
            worker.conn.send_bytes(pickle.dumps((requests[index], seconds)))
        except (OSError, pickle.PicklingError, TypeError, AttributeError) as err:
            outcomes[index] = ("failed", f"{self._what(requests[index])}: its arguments could not reach the "
                               f"environment's worker: {describe_error(err, 200)}", False)
            self._send_next(slot, queues, requests, outcomes, seconds)
            return
        worker.task = index
        worker.deadline = math.inf if seconds is None else time.monotonic() + seconds + HARD_GRACE

    def _collect(self, queues: dict, requests: Sequence, outcomes: list, seconds: float | None) -> None:
        """Wait for the first reply, death or deadline among the busy workers, and handle it."""
        from multiprocessing.connection import wait

        busy = {slot: w for slot, w in self._workers.items() if w.task is not None}
        until = min(w.deadline for w in busy.values())
        ready = wait([w.conn for w in busy.values()], timeout=max(0.0, min(until - time.monotonic(), _POLL)))
        now = time.monotonic()
        for slot, worker in busy.items():
            if worker.conn in ready:
                try:
                    outcomes[worker.task] = pickle.loads(worker.conn.recv_bytes())
                except (EOFError, OSError):
                    worker.process.join(timeout=1.0)
                    self._lose(slot, queues, requests, outcomes,
                               f"lost its worker process (exit code {worker.process.exitcode})", seconds)
                    continue
                row, operation, _ = requests[worker.task]
                if operation == "make" and outcomes[worker.task][0] == "ok":
                    self._names[row] = outcomes[worker.task][1]
                worker.task, worker.deadline = None, math.inf
                self._send_next(slot, queues, requests, outcomes, seconds)
            elif now >= worker.deadline:
                self._lose(slot, queues, requests, outcomes,
                           f"StepTimeout: no answer within {seconds:g} s (its worker was killed)", seconds, True)

    def _lose(self, slot: int, queues: dict, requests: Sequence, outcomes: list, why: str, seconds: float | None,
              timed_out: bool = False) -> None:
        """A worker gone (killed here or dead): its call fails with ``why``, the rest of its
        queue and every later call to an environment it hosted with the worker named."""
        worker = self._workers[slot]
        request = requests[worker.task]
        outcomes[worker.task] = ("failed", f"{self._what(request)}: {why}", timed_out)
        self._stop(slot, f"its worker was stopped: {self._what(request)}: {why}")
        self._send_next(slot, queues, requests, outcomes, seconds)  # the rest: on a new worker, or failed

    def _what(self, request: tuple) -> str:
        row, operation, args = request
        return call_name(self._names.get(row), operation, args)

    def _start(self, slot: int) -> _Worker:
        if self._reaper is None and os.name == "posix":
            self._reaper = Reaper(None)
        context = multiprocessing.get_context("fork")
        parent_conn, child_conn = context.Pipe()
        trainer_ends.add(parent_conn)  # before the fork, so that the worker closes its copy too
        process = context.Process(target=_worker_main, args=(child_conn, self.make_env, os.getpid()),
                                  name="rlvr-environment-worker", daemon=True)
        process.start()
        child_conn.close()
        if self._reaper is not None:
            lead_group(process.pid)
            self._reaper.watch(process.pid)
        self._workers[slot] = _Worker(process, parent_conn)
        return self._workers[slot]

    def _stop(self, slot: int, why: str = "its worker was stopped") -> None:
        """Kill a worker and every process in its group; the environments it hosted are gone."""
        worker = self._workers.pop(slot)
        for row in self._hosted.pop(slot, ()):
            self._lost[row] = why
        if self._reaper is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.process.pid, signal.SIGKILL)
            self._reaper.forget(worker.process.pid)
        worker.process.kill()
        worker.process.join()
        worker.conn.close()


_TIMED_OUT: set[str] = set()  # the calls whose time-out this process has said


def _worker_main(conn: Any, make_env: Callable[[], Environment], parent: int) -> None:
    """A worker's loop: receive a request, run it, send back its outcome."""
    if os.name == "posix":
        lead_group(0)
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C and the run's stop are the trainer's
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    STOPPING.clear()
    envs: dict[int, Any] = {}
    while True:
        try:
            request, seconds = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the trainer is gone
            return
        outcome = _run(envs, make_env, request, seconds)
        try:
            message = pickle.dumps(outcome)
        except Exception as err:  # noqa: BLE001 - a value of the environment's that does not pickle
            message = pickle.dumps(("failed", f"{_what(envs, request[0], request[1], request[2])}: its answer "
                                    f"could not be sent back: {describe_error(err, 200)}", False))
        try:
            conn.send_bytes(message)
        except (EOFError, OSError):
            return
