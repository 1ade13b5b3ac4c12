"""Verifiable tasks: prompts, reward specs and a gold check, one task per file.

``TASKS`` names every task; ``build_task`` turns the ``task`` and ``rewards`` sections
of a config into a task with its one RewardRunner (``rlvr.tasks.grading``). Sorting
takes its settings from ``task.*``; the text tasks take their constructor's keyword
arguments from ``task.options``, and a task that shuffles its data (a ``shuffle_seed``
argument: dataset, reasoning_gym) gets the run's ``seed`` there unless the options set it.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from rlvr.errors import ConfigError, did_you_mean
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
    check_task_options(config)
    try:
        if cls is SortingTask:
            task: GradedTask = SortingTask(
                num_numbers=t.num_numbers, vocab_size=t.vocab_size, reward=t.reward,
                allow_repeats=t.allow_repeats, fixed_prompts=t.prompts, eval_size=t.eval_size,
            )
        else:
            options = dict(t.options)
            if "shuffle_seed" in inspect.signature(cls).parameters:
                options.setdefault("shuffle_seed", config.seed)
            task = cls(**options)
    except (TypeError, ValueError, OSError) as err:
        raise ConfigError(f"{_settings_field(t.name)}: {err}") from err
    task.runner = reward_runner(task, config.rewards)  # the task has started no runner of its own
    return task


def check_task_options(config: Config) -> None:
    """Unknown keys in ``task.options`` are a ConfigError naming the nearest allowed one,
    found without building the task (no data read). Sorting does not read ``task.options``."""
    t = config.task
    cls = _task_class(t.name)
    if cls is SortingTask:
        return
    allowed = [name for name in inspect.signature(cls).parameters if name not in ("self", "args", "kwargs")]
    for key in t.options:
        if key not in allowed:
            raise ConfigError(f"{_settings_field(t.name)}: unknown option {key!r}; {did_you_mean(key, allowed)}")


def check_prompts_fit(task: Any, policy: Any) -> None:
    """Every prompt ``task`` knows before training (its ``fixed_prompts``) fits ``policy``
    (its ``check_prompts``): a PromptError naming the first that does not, before any
    work. Sorting and the positional policy have neither method: nothing to check."""
    check, fixed = getattr(policy, "check_prompts", None), getattr(task, "fixed_prompts", None)
    if check is not None and fixed is not None:
        for what, prompts in fixed().items():
            check(prompts, what)


def _task_class(name: str) -> type[GradedTask]:
    if name not in TASKS:
        raise ConfigError(f"task.name={name!r} is not allowed; {did_you_mean(name, TASKS)}")
    return TASKS[name]


def _settings_field(name: str) -> str:
    """Where a task's settings are in a config, for messages."""
    return "task" if name == SortingTask.name else f"task.options for {name!r}"
