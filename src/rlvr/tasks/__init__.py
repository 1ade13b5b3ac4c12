"""Verifiable tasks: prompts, reward specs and a gold check, one task per file.

``TASKS`` names every task and ``TASK_OPTIONS`` the section of ``task.options`` each takes, made from its constructor's
keyword arguments and declared rules. A config becomes a task with its one RewardRunner (``rlvr.tasks.grading``) in
``rlvr.config.compose``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
from typing import get_type_hints

from rlvr.base.errors import ConfigError, PromptError, did_you_mean
from rlvr.batch.interfaces import Policy, Task
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

__all__ = ["TASKS", "TASK_OPTIONS", "GradedTask", "SortingTask", "check_prompts_fit", "options_section",
           "reward_runner", "task_class"]


def options_section(cls: type[GradedTask]) -> type:
    """The dataclass of ``task.options`` for the task ``cls``: a field per keyword argument of its constructor, with the
    help and rules the task declares (``GradedTask.options``). A required argument's field is null until given, as is
    ``shuffle_seed``, which the run's seed fills."""
    hints, fields = get_type_hints(cls.__init__), []
    for name, p in inspect.signature(cls).parameters.items():
        metadata, default = dict(cls.options[name]), cls.config_defaults.get(name, p.default)
        if p.default is p.empty:
            metadata["required"] = True
        if p.default is p.empty or name == "shuffle_seed":
            default, hints[name] = None, hints[name] | None
        made = functools.partial(copy.deepcopy, default)
        fields.append((name, hints[name], dataclasses.field(default_factory=made, metadata=metadata)))
    return dataclasses.make_dataclass(f"{cls.__name__}Options", fields, namespace={"__module__": __name__})


TASK_OPTIONS = {name: options_section(cls) for name, cls in TASKS.items()}  # task.name -> its options
globals().update({section.__name__: section for section in TASK_OPTIONS.values()})  # found by pickle, by name


def check_prompts_fit(task: Task, policy: Policy) -> None:
    """Every prompt ``task`` knows before training (its ``fixed_prompts``) fits ``policy`` (its ``check_prompts``): a
    PromptError naming the first that does not, before any work."""
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
