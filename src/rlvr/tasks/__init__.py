"""Verifiable tasks: prompts, reward specs and a gold check, one task per file.

``TASKS`` names every task; ``build_task`` turns the ``task`` and ``rewards`` sections
of a config into a task with its one RewardRunner (``rlvr.tasks.grading``). Sorting
takes its settings from ``task.*``; the text tasks take their constructor's keyword
arguments from ``task.options``, and a task that shuffles its data (a ``shuffle_seed``
argument: dataset, reasoning_gym) gets the run's ``seed`` there unless the options set it.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, get_type_hints

from rlvr.errors import ConfigError, did_you_mean
from rlvr.policies.prompts import PromptError
from rlvr.rules import check_rules, coerce
from rlvr.tasks.arithmetic import ArithmeticTask
from rlvr.tasks.dataset import DatasetTask
from rlvr.tasks.grading import GradedTask, reward_runner
from rlvr.tasks.gsm8k import Gsm8kTask
from rlvr.tasks.reasoning_gym import ReasoningGymTask
from rlvr.tasks.sort_text import SortTextTask
from rlvr.tasks.sorting import SortingTask

if TYPE_CHECKING:
    from rlvr.config import Config

TASKS: dict[str, type[GradedTask]] = {
    cls.name: cls for cls in (SortingTask, SortTextTask, ArithmeticTask, Gsm8kTask, DatasetTask, ReasoningGymTask)
}

__all__ = ["TASKS", "GradedTask", "build_task", "check_prompts_fit", "check_task_options", "reward_runner"]


def build_task(config: Config) -> GradedTask:
    """The task of ``config`` with the runner of its and the user's reward functions;
    configuration errors name the field."""
    t = config.task
    cls = _task_class(t.name)
    options = check_task_options(config)
    try:
        if cls is SortingTask:
            task: GradedTask = SortingTask(
                num_numbers=t.num_numbers, vocab_size=t.vocab_size, reward=t.reward,
                allow_repeats=t.allow_repeats, fixed_prompts=t.prompts, eval_size=t.eval_size,
            )
        else:
            if "shuffle_seed" in inspect.signature(cls).parameters:
                options.setdefault("shuffle_seed", config.seed)
            task = cls(**options)
    except (TypeError, ValueError, OSError) as err:
        raise ConfigError(f"{_settings_field(t.name)}: {err}") from err
    task.runner = reward_runner(task, config.rewards)  # the task has started no runner of its own
    return task


def check_task_options(config: Config) -> dict[str, Any]:
    """``task.options`` checked as the config's own fields are, without building the task
    (no data read): each a keyword argument of the task (an unknown key is a ConfigError
    naming the nearest), of the argument's type and within the rules its task declares
    (``GradedTask.options``), the required ones given. Returns them, numbers as their
    types take them. Sorting does not read ``task.options``."""
    t = config.task
    cls = _task_class(t.name)
    if cls is SortingTask:
        return {}
    parameters = {name: p for name, p in inspect.signature(cls).parameters.items() if name not in ("args", "kwargs")}
    unknown = [key for key in t.options if key not in parameters]
    if unknown:
        raise ConfigError(f"{_settings_field(t.name)}: " + "; ".join(
            f"unknown option {key!r}; {did_you_mean(key, parameters)}" for key in unknown))
    missing = [name for name, p in parameters.items() if p.default is p.empty and name not in t.options]
    if missing:
        raise ConfigError(f"task.options.{missing[0]} is required by task.name={t.name!r} "
                          f"({cls.options[missing[0]]['help']})")
    hints = get_type_hints(cls.__init__)
    checked = {}
    for key, value in t.options.items():
        path = f"task.options.{key}"
        checked[key] = coerce(path, value, hints[key])
        if checked[key] is not None:
            check_rules(path, checked[key], cls.options[key])
    return checked


def check_prompts_fit(task: Any, policy: Any) -> None:
    """Every prompt ``task`` knows before training (its ``fixed_prompts``) fits ``policy``
    (its ``check_prompts``): a PromptError naming the first that does not, before any
    work. Sorting and the positional policy have neither method: nothing to check."""
    check, fixed = getattr(policy, "check_prompts", None), getattr(task, "fixed_prompts", None)
    if check is not None and fixed is not None:
        for what, prompts in fixed().items():
            try:
                check(prompts, what)
            except PromptError as err:  # named by its place in the list: the task may know its file and line
                origin = None if err.index is None else task.prompt_origin(what, err.index)
                if origin is None:
                    raise
                err.args = (f"{origin}: {err}",)  # the same error (its kind and details), placed in its file
                raise


def _task_class(name: str) -> type[GradedTask]:
    if name not in TASKS:
        raise ConfigError(f"task.name={name!r} is not allowed; {did_you_mean(name, TASKS)}")
    return TASKS[name]


def _settings_field(name: str) -> str:
    """Where a task's settings are in a config, for messages."""
    return "task" if name == SortingTask.name else f"task.options for {name!r}"
