"""Verifiable tasks: prompts, reward functions and a gold check, one task per file.

``build_task`` turns the ``task`` and ``rewards`` sections of a config into a task;
text tasks take their constructor arguments from ``task.options``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlvr.config import Config

TEXT_TASKS = ("sort_text", "arithmetic", "gsm8k")


def _text_task_class(name: str) -> type:
    if name == "sort_text":
        from rlvr.tasks.sort_text import SortTextTask

        return SortTextTask
    if name == "arithmetic":
        from rlvr.tasks.arithmetic import ArithmeticTask

        return ArithmeticTask
    from rlvr.tasks.gsm8k import Gsm8kTask

    return Gsm8kTask


def user_reward_specs(config: Config) -> list:
    """RewardSpecs of ``rewards.functions``, each imported from its explicit module:function
    (``required`` as in ``rlvr.rewards``: a sample it does not score abstains)."""
    from rlvr.config import ConfigError
    from rlvr.rewards import RewardError, RewardSpec, load_reward_function

    specs = []
    for i, item in enumerate(config.rewards.functions):
        item = {"function": item} if isinstance(item, str) else item
        try:
            fn = load_reward_function(item["function"])
        except RewardError as err:
            raise ConfigError(f"rewards.functions[{i}]: {err}") from err
        timeout = item.get("timeout", config.rewards.timeout)
        specs.append(RewardSpec(
            fn, float(item.get("weight", 1.0)), item.get("name", ""), timeout, item.get("required", False)
        ))
    return specs


def _runner(specs: list, config: Config):
    from rlvr.rewards import RewardRunner

    return RewardRunner(specs, strict=config.rewards.strict, num_workers=config.rewards.num_workers)


def check_options(where: str, options: dict, cls: type) -> None:
    """Unknown keyword options are a ConfigError naming the nearest allowed one."""
    import difflib
    import inspect

    from rlvr.config import ConfigError

    allowed = [n for n in inspect.signature(cls).parameters if n not in ("self", "args", "kwargs")]
    for key in options:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(allowed)}"
            raise ConfigError(f"{where}: unknown option {key!r}; {hint}")


def build_task(config: Config) -> Any:
    """The task of ``config``; configuration errors name the field."""
    from rlvr.config import ConfigError

    t = config.task
    extra = user_reward_specs(config)
    if t.name == "sorting":
        from rlvr.tasks.sorting import SortingTask

        # sorting adds its user rewards to its own (an abstention adds 0): it never withholds one
        for i, spec in enumerate(extra):
            if spec.required:
                raise ConfigError(f"rewards.functions[{i}].required: only text tasks can require a reward")
        try:
            return SortingTask(
                num_numbers=t.num_numbers,
                vocab_size=t.vocab_size,
                reward=t.reward,
                allow_repeats=t.allow_repeats,
                fixed_prompts=t.prompts,
                eval_size=t.eval_size,
                extra_rewards=_runner(extra, config) if extra else None,
            )
        except ValueError as err:
            raise ConfigError(f"task: {err}") from err
    cls = _text_task_class(t.name)
    check_options(f"task.options for {t.name!r}", t.options, cls)
    try:
        task = cls(**t.options)
    except (TypeError, ValueError, OSError) as err:
        raise ConfigError(f"task.options for {t.name!r}: {err}") from err
    if extra or config.rewards.strict:
        builtin = list(task.runner.specs)
        task.runner.close()
        try:
            task.runner = _runner(builtin + extra, config)
        except ValueError as err:
            raise ConfigError(f"rewards.functions: {err}") from err
    return task


def check_prompts_fit(task: Any, policy: Any) -> None:
    """Every prompt ``task`` knows before training (its ``fixed_prompts``) fits ``policy``
    (its ``check_prompts``): a PromptError naming the first that does not, before any
    work. Sorting and the positional policy have neither method: nothing to check."""
    check, fixed = getattr(policy, "check_prompts", None), getattr(task, "fixed_prompts", None)
    if check is not None and fixed is not None:
        for what, prompts in fixed().items():
            check(prompts, what)
