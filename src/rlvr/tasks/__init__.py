"""Verifiable tasks: prompts, reward specs and a gold check, one task per file.

``TASKS`` names every task; ``check_task_options`` checks a text task's keyword
arguments (``task.options``) against its constructor and declared rules. A config
becomes a task with its one RewardRunner (``rlvr.tasks.grading``) in ``rlvr.config.compose``.
"""

from __future__ import annotations

import inspect
from typing import Any, get_type_hints

from rlvr.base.errors import ConfigError, PromptError, did_you_mean
from rlvr.base.interfaces import Policy, Task
from rlvr.base.rules import check_rules, coerce
from rlvr.tasks.agent import AgentTask
from rlvr.tasks.arithmetic import ArithmeticTask
from rlvr.tasks.dataset import DatasetTask
from rlvr.tasks.environment import EnvironmentTask
from rlvr.tasks.grading import GradedTask, reward_runner
from rlvr.tasks.gsm8k import Gsm8kTask
from rlvr.tasks.reasoning_gym import ReasoningGymTask
from rlvr.tasks.sort_text import SortTextTask
from rlvr.tasks.sorting import SortingTask
from rlvr.tasks.verifiers_env import VerifiersTask

TASKS: dict[str, type[GradedTask]] = {
    cls.name: cls for cls in (SortingTask, SortTextTask, ArithmeticTask, Gsm8kTask, DatasetTask, ReasoningGymTask,
                              EnvironmentTask, AgentTask, VerifiersTask)
}

__all__ = ["TASKS", "GradedTask", "SortingTask", "check_prompts_fit", "check_task_options", "reward_runner",
           "settings_field", "task_class", "task_option_entries"]


def check_task_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """``task.options`` checked as the config's own fields are, without building the task
    (no data read): each a keyword argument of the task (an unknown key is a ConfigError
    naming the nearest), of the argument's type and within the rules its task declares
    (``GradedTask.options``), the required ones given. Returns them, numbers as their
    types take them."""
    cls = task_class(name)
    parameters = {name: p for name, p in inspect.signature(cls).parameters.items() if name not in ("args", "kwargs")}
    unknown = [key for key in options if key not in parameters]
    if unknown:
        raise ConfigError(f"{settings_field(name)}: " + "; ".join(
            f"unknown option {key!r}; {did_you_mean(key, parameters)}" for key in unknown))
    missing = [key for key, p in parameters.items() if p.default is p.empty and key not in options]
    if missing:
        raise ConfigError(f"task.options.{missing[0]} is required by task.name={name!r} "
                          f"({cls.options[missing[0]]['help']})")
    hints = get_type_hints(cls.__init__)
    checked = {}
    for key, value in options.items():
        path = f"task.options.{key}"
        checked[key] = coerce(path, value, hints[key])
        if checked[key] is not None:
            check_rules(path, checked[key], cls.options[key])
    return checked


def task_option_entries(task: Any, options: dict[str, Any]) -> list[tuple[str, Any, dict[str, Any]]]:
    """Each option the task (``task.name``'s class) takes, with its value in ``options``
    or else its default ("required" for one without), and its help and rules: what
    ``rlvr config`` lists under ``task.options``."""
    try:
        cls = task_class(task.name)
    except ConfigError:
        return []
    parameters = {name: p for name, p in inspect.signature(cls).parameters.items() if name not in ("args", "kwargs")}
    return [(key, options[key] if key in options else "required" if p.default is p.empty else p.default,
             cls.options.get(key, {})) for key, p in parameters.items()]


def check_prompts_fit(task: Task, policy: Policy) -> None:
    """Every prompt ``task`` knows before training (its ``fixed_prompts``) fits ``policy``
    (its ``check_prompts``): a PromptError naming the first that does not, before any
    work. Sorting and the positional policy take the defaults: nothing to check."""
    for what, prompts in task.fixed_prompts().items():
        try:
            policy.check_prompts(prompts, what)
        except PromptError as err:  # named by its place in the list: the task may know its file and line
            origin = None if err.index is None else task.prompt_origin(what, err.index)
            if origin is None:
                raise
            err.args = (f"{origin}: {err}",)  # the same error (its kind and details), placed in its file
            raise


def task_class(name: str) -> type[GradedTask]:
    if name not in TASKS:
        raise ConfigError(f"task.name={name!r} is not allowed; {did_you_mean(name, TASKS)}")
    return TASKS[name]


def settings_field(name: str) -> str:
    """Where a task's settings are in a config, for messages."""
    return f"task.options for {name!r}"
