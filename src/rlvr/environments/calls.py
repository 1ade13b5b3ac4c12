"""What a host does with an environment (``rlvr.environments.workers``): the operations a request names (make,
reset, tools, tool, step, final, schemas, snapshot), each run under its time limit (``time_limit``), with the checks
of what the environment answered (``step_reward``, ``as_observation``); ``EnvironmentHost`` runs them.

A prompt, an observation or a tool's text longer than its episode could hold (``episode_chars``) is cut where it is
made (``cut_observation``), before it crosses to the trainer; a worker's answer past ``reply_limit`` bytes (pickled)
fails its call, named."""

from __future__ import annotations

import contextlib
import json
import numbers
import pickle
import signal
import threading
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from rlvr.base.errors import Stopped
from rlvr.environments.base import Environment, Observation, Step, describe_error

MAX_SCHEMA_CHARS = 65_536  # an environment's tool schemas, as JSON
MAX_SNAPSHOT_BYTES = 1 << 20  # an environment's snapshot, pickled: attributes past it are left out
MAX_REPLY_BYTES = 16 << 20  # a worker's pickled answer, beyond the 4 bytes a character its observations may take


class StepTimeout(BaseException):
    """Environment code ran past its time limit (a BaseException: an ``except Exception`` there does not swallow it)."""


# A request: (episode row, operation, arguments). The operations, each run where the row's environment lives.

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
    """(reward, done, solved, observation) of the step on ``text``, read here: a Step's fields may run its code."""
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
    """A truncated episode's (reward, solved) from ``final_reward()`` (a TRL-style get_reward); None without one."""
    final = getattr(envs[row], "final_reward", None)
    if not callable(final):
        return None
    reward, solved = final()
    return step_reward(reward), None if solved is None else bool(solved)


def _schemas(envs: dict[int, Any], row: int) -> list[dict[str, Any]]:
    """``tool_schemas()`` (dicts, at most MAX_SCHEMA_CHARS of JSON in all); none where it defines none."""
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
    """What reward functions get of the environment: ``snapshot()`` where defined, else its public attributes."""
    env = envs[row]
    snapshot = getattr(env, "snapshot", None)
    return snapshot() if callable(snapshot) else public_attributes(env)


def public_attributes(instance: Any) -> types.SimpleNamespace:
    """A copy of ``instance``'s public attributes as a namespace: those that pickle (open files and locks do not),
    in order while they fit in MAX_SNAPSHOT_BYTES in all; the rest are left out."""
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


def run_request(envs: dict[int, Any], make_env: Callable[[], Environment], request: tuple, seconds: float | None,
                max_chars: int | None = None) -> tuple:
    """One request, run here: ("ok", value) or ("failed", one line, whether it timed out); a
    prompt, an observation or a tool's text cut past ``max_chars`` characters (``cut_observation``)."""
    row, operation, args = request
    if operation == "make":
        args = (make_env,)
    what = call_name(type(envs[row]).__name__ if row in envs else None, operation, args)
    try:
        with time_limit(seconds):
            value = _OPERATIONS[operation](envs, row, *args)
            if max_chars is not None and operation == "reset":
                value = cut_observation(value, max_chars)
            elif max_chars is not None and operation == "step" and value[3] is not None:
                value = (*value[:3], cut_observation(value[3], max_chars))
            elif max_chars is not None and operation == "tool":
                value = cut_observation(value, max_chars)
            return ("ok", value)
    except Stopped:
        raise
    except BaseException as err:  # noqa: BLE001 - the environment's failure ends its episode, not the run
        return ("failed", f"{what}: {describe_error(err)}"[:500], isinstance(err, StepTimeout))


class CutText(str):
    """Text cut where it was made (``cut_observation``); ``chars``: its characters before."""

    chars: int


class CutChat(list):
    """Messages cut where they were made (``cut_observation``); ``chars``: their contents' characters before."""

    chars: int


def cut_observation(observation: Observation, max_chars: int) -> Observation:
    """``observation`` with ``max_chars + 1`` characters of content at most (messages past it left out): one past
    the most its episode can hold, so that it still reads as too long there and is never encoded. One that was
    cut says how long it was (``CutText``, ``CutChat``)."""
    from rlvr.policies.prompts import content_chars

    chars = content_chars(observation)
    if chars <= max_chars + 1:
        return observation
    if isinstance(observation, str):
        cut: Any = CutText(observation[:max_chars + 1])
        cut.chars = chars
        return cut
    kept, left = CutChat(), max_chars + 1
    kept.chars = chars
    for message in observation:
        content = message.get("content")
        if isinstance(content, str):
            if left <= 0:
                break
            message = {**message, "content": content[:left]}
            left -= len(message["content"])
        kept.append(message)
    return kept


def episode_chars(max_tokens: int, max_positions: int | None, tokenizer: Any) -> int:
    """The characters of a prompt, an observation or a tool's text that cross whole (``max_chars``): what an
    episode could hold (``max_positions`` or ``max_tokens``) at the most characters a token stands for."""
    from rlvr.policies.prompts import max_token_chars

    return max(max_tokens, max_positions or 0) * max_token_chars(tokenizer)


def reply_limit(max_chars: int | None) -> int:
    """The bytes a worker's pickled answer may take: MAX_REPLY_BYTES, and 4 a character of ``max_chars``."""
    return MAX_REPLY_BYTES + 4 * (max_chars or 0)


def step_reward(reward: object) -> float:
    """A Step's reward as a float: a real number, never text or None (``float`` would read "1" or crash)."""
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
    """Raise StepTimeout in the code within after ``seconds`` (SIGALRM: a POSIX main thread; elsewhere no limit)."""
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


class EnvironmentHost:
    """Where a row's environments live: ``host((request, seconds, max_chars))`` runs a request on them. A worker
    of ``EnvironmentHosts`` serves with one, and so does the trainer's process when there are no workers."""

    def __init__(self, make_env: Callable[[], Environment]) -> None:
        self.make_env = make_env
        self.envs: dict[int, Any] = {}

    def __call__(self, message: tuple) -> tuple:
        request, seconds, max_chars = message
        return run_request(self.envs, self.make_env, request, seconds, max_chars)

    def close(self) -> None:
        self.envs.clear()
