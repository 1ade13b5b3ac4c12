"""Environments users already have, as rlvr's ``Environment``.

TRL's ``GRPOTrainer(environment_factory=...)`` takes a class made once per episode: ``reset(**row)`` gets the
dataset row's columns as keyword arguments ("prompt" included) and returns None or text that TRL appends to the
prompt's last message; its public methods, ``reset`` and ``get_reward`` excepted, are the tools the model calls;
the episode ends at the first turn that calls no tool. Its reward comes from an optional ``get_reward()`` (sync or
async), or, in TRL's examples, a ``reward`` attribute that a reward function reads from ``environments``.
``TRLEnvironment`` wraps one instance; ``environment_from_factory`` takes either kind of class, and
``load_environment_factory`` imports one named ``"module:Class"``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from numbers import Real
from typing import Any

from rlvr.base.errors import ConfigError
from rlvr.environments.base import Environment, EnvironmentFactory, Message, Observation, Step
from rlvr.environments.calls import public_attributes
from rlvr.environments.tool_parsing import tool_schema
from rlvr.rewards.calls import RewardError
from rlvr.rewards.loading import _import

RESERVED_METHODS = ("reset", "get_reward")  # TRL's lifecycle methods: never tools


class TRLEnvironment:
    """One instance of a TRL ``environment_factory`` class as an rlvr Environment.

    reset(start): ``instance.reset(**start)`` for a dataset row; for an int seed, ``instance.reset(seed=start)``
    when reset takes a ``seed`` (or ``**kwargs``), else ``instance.reset()``. The prompt is the row's "prompt" with
    reset's text appended as TRL appends it (to the last message's content, no separator), or that text as one
    user message when the row has no prompt. tools(): the public bound methods (an async one run to completion).

    step(text): a turn that calls no tool ends the episode, as in TRL. Its reward is ``get_reward()`` where
    defined, else the numeric ``reward`` attribute, else 0.0; its ``solved`` is the bool ``solved`` attribute,
    else None. An episode ended at its turn or token limit reads the same (``final_reward``), as TRL reads every
    finished episode's.
    """

    def __init__(self, instance: Any) -> None:
        if not callable(getattr(instance, "reset", None)):
            raise TypeError(f"{type(instance).__name__} has no reset method: a TRL environment_factory class "
                            "defines reset(**row)")
        self.instance = instance

    def reset(self, start: Any) -> Observation:
        if isinstance(start, dict):
            text, prompt = self.instance.reset(**start), start.get("prompt")
        else:
            seeded = _accepts_keyword(self.instance.reset, "seed")
            text, prompt = self.instance.reset(**({"seed": start} if seeded else {})), None
        return _prompt_with(prompt, _resolved(text))

    def tools(self) -> dict[str, Callable[..., Any]]:
        return {
            name: _synchronous(method)
            for name, method in inspect.getmembers(self.instance, predicate=inspect.ismethod)
            if name not in RESERVED_METHODS and not name.startswith("_")
        }

    def step(self, text: str) -> Step:
        return Step(observation=None, reward=self.reward(), done=True, solved=self.solved())

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools' function schemas, shown to the policy as TRL shows them (``shown_tools``)."""
        return [tool_schema(tool) for tool in self.tools().values()]

    def snapshot(self) -> Any:
        """The instance's public attributes, what reward functions read from ``environments``."""
        return public_attributes(self.instance)

    def final_reward(self) -> tuple[float, bool | None]:
        """(reward, solved) of an episode ended at its turn or token limit: TRL reads ``get_reward()`` for every
        finished episode."""
        return self.reward(), self.solved()

    def reward(self) -> float:
        """The episode's reward from the instance's state (see the class docstring)."""
        get_reward = getattr(self.instance, "get_reward", None)
        if callable(get_reward):
            value, source = _resolved(get_reward()), "get_reward()"
        else:
            value, source = getattr(self.instance, "reward", 0.0), "reward"
            if callable(value):  # a public method named reward is a tool in TRL, not the reward
                return 0.0
        if not isinstance(value, Real):
            raise TypeError(f"{type(self.instance).__name__}.{source} is {value!r}, not a number")
        return float(value)

    def solved(self) -> bool | None:
        value = getattr(self.instance, "solved", None)
        return value if isinstance(value, bool) else None


def environment_from_factory(factory: Callable[[], Any], where: str = "environment_factory") -> EnvironmentFactory:
    """A factory of rlvr Environments: a class with ``step`` is used as it is; one with ``reset`` and no ``step``
    (TRL's) makes instances wrapped in TRLEnvironment; any other callable is called per episode and its result
    taken by the same rule. ConfigError naming ``where`` for a class with neither method or a non-callable."""
    kind = _kind(factory, where)
    if kind == "rlvr":
        return factory
    if kind == "trl":
        return functools.partial(_wrapped, factory)  # a partial, not a closure: it pickles for rollout workers
    return functools.partial(_either, factory)


def load_environment_factory(spec: str, where: str) -> Callable[[], Any]:
    """The class (or factory function) named ``"module:Class"``, imported as reward functions are (``sys.path``,
    then the working directory). ConfigError naming ``where`` for a malformed spec, a module that is missing or
    fails to import, a missing attribute, or something neither environment class nor callable."""
    module_name, _, attr = spec.partition(":")
    if not attr or not all(part.isidentifier() for part in module_name.split(".")) or not attr.isidentifier():
        raise ConfigError(f"{where}: {spec!r}: expected 'module:Class', e.g. 'my_envs:GuessingGame'")
    try:
        module = _import(spec, module_name, module_name.split(".")[0])
    except RewardError as err:  # its message speaks of a reward function; say what was loaded here
        raise ConfigError(f"{where}: {spec!r}: {str(err).removeprefix(f'reward function {spec!r}: ')}") from err
    if not hasattr(module, attr):
        classes = sorted(name for name, value in vars(module).items()
                         if isinstance(value, type) and not name.startswith("_")
                         and value.__module__ == module.__name__)
        defined = f"; it defines: {', '.join(classes)}" if classes else ""
        raise ConfigError(f"{where}: {spec!r}: module {module_name!r} has no {attr!r}{defined}")
    factory = getattr(module, attr)
    _kind(factory, f"{where}: {spec!r}")
    return factory


def _kind(factory: Any, where: str) -> str:
    """"rlvr" (a class with step), "trl" (reset, no step), "callable" (known only once called); else ConfigError."""
    if isinstance(factory, type):
        if callable(getattr(factory, "step", None)):
            return "rlvr"
        if callable(getattr(factory, "reset", None)):
            return "trl"
        raise ConfigError(f"{where}: class {factory.__name__} has neither step(text) (rlvr's Environment) "
                          "nor reset(**row) (a TRL environment_factory class)")
    if callable(factory):
        return "callable"
    raise ConfigError(f"{where}: expected an environment class or a factory, got {type(factory).__name__} "
                      f"{factory!r:.60}")


def _wrapped(factory: Callable[[], Any]) -> Environment:
    return TRLEnvironment(factory())


def _either(factory: Callable[[], Any]) -> Environment:
    instance = factory()
    return instance if callable(getattr(instance, "step", None)) else TRLEnvironment(instance)


def _prompt_with(prompt: Any, text: str | None) -> Observation:
    """The row's prompt (text, messages or None) with reset's text appended, as TRL appends it."""
    if text is not None and not isinstance(text, str):
        raise TypeError(f"reset returned {type(text).__name__}; a TRL environment's reset returns text or None")
    if prompt is None:
        if text is None:
            raise ValueError("the row has no 'prompt' and reset returned nothing: the episode has no prompt")
        return [{"role": "user", "content": text}]
    if text is None:
        return prompt
    if isinstance(prompt, str):
        return prompt + text
    messages: list[Message] = [dict(message) for message in prompt]
    content = messages[-1].get("content", "")
    if isinstance(content, list):  # content blocks: the text as one more block
        messages[-1]["content"] = [*content, {"type": "text", "text": text}]
    else:
        messages[-1]["content"] = content + text
    return messages


def _accepts_keyword(function: Callable[..., Any], name: str) -> bool:
    parameters = inspect.signature(function).parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _resolved(value: Any) -> Any:
    """``value``, or what it returns when run (an async reset or get_reward gives a coroutine)."""
    return asyncio.run(value) if inspect.iscoroutine(value) else value


def _synchronous(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` as a plain call: an async tool is run to completion (its name, docstring and signature kept)."""
    if not inspect.iscoroutinefunction(method):
        return method

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(method(*args, **kwargs))

    return call
