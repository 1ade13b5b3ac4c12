"""The Python API: ``rlvr.train(config, reward_funcs=[...], out_dir=...)`` and ``rlvr.check``.

``train`` takes a config in any form the command line does (a ``Config``, a mapping, a YAML path, plus
``key=value`` overrides) and reward functions as plain callables (``fn(prompts, completions, **columns) ->
list[float | None]``, see ``rlvr.rewards``). With a run directory (``out_dir=`` or ``config.out_dir``) it writes
exactly what ``rlvr train`` writes; without one it trains in memory and writes nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.base.errors import ConfigError
from rlvr.base.extras import missing_module_hint
from rlvr.batch.record import Record
from rlvr.config import Config, check_options, config_from_dict, merge, parse_overrides, read_mapping
from rlvr.config.compose import check_extras


@dataclass
class TrainResult:
    """What ``train`` returns.

    records: every record of the run, as ``metrics.jsonl`` holds them.
    run_dir: the run directory, or None for a run in memory.
    policy:  the trained policy (``rlvr.batch.interfaces.Policy``; for a causal LM ``policy.module`` is the
             transformers model and ``policy.tokenizer`` its tokenizer).
    config:  the resolved config the run used.
    """

    records: list[Record]
    run_dir: Path | None
    policy: Any
    config: Config


def resolve_config(config: Config | dict | str | Path | None = None, overrides: Sequence[str] = (),
                   reward_funcs: Sequence[Callable] = (), out_dir: str | Path | None = None,
                   environment_factory: Callable | None = None) -> Config:
    """One validated Config from the arguments ``train`` takes; a ``Config`` passed in is never changed."""
    if isinstance(config, (str, Path)):
        data = read_mapping(config)
    elif isinstance(config, Config):
        data = config.to_dict()
    elif isinstance(config, dict) or config is None:
        data = copy.deepcopy(config or {})
    else:
        raise ConfigError(f"config: expected a Config, a mapping or a YAML path, got {type(config).__name__}")
    if overrides:
        if isinstance(overrides, str):
            raise ConfigError(f"overrides: expected a list of 'key=value' strings, got the string {overrides!r}")
        data = merge(data, parse_overrides(list(overrides)))
    if reward_funcs:
        _check_callables(reward_funcs)
        rewards = data.setdefault("rewards", {})
        if not isinstance(rewards, dict):
            raise ConfigError(f"rewards: expected a mapping, got {rewards!r}")
        rewards["functions"] = [*(rewards.get("functions") or []), *reward_funcs]
    if out_dir is not None:
        data["out_dir"] = str(out_dir)
    if environment_factory is not None:
        if not callable(environment_factory):
            raise ConfigError(f"environment_factory={environment_factory!r} is not a class; give the class itself "
                              "(a 'module:Class' name goes in task.options.environment_factory)")
        task = data.setdefault("task", {})
        if not isinstance(task, dict):
            raise ConfigError(f"task: expected a mapping, got {task!r}")
        task["name"] = "environment"
        task["options"] = {**(task.get("options") or {}), "environment_factory": environment_factory}
    return config_from_dict(data)


def check(config: Config | dict | str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Everything ``train`` checks before any work, without loading a model: the config's fields and options, the
    optional packages its back ends need, the task built (its data read, the reward functions imported; no worker
    started) and closed. Returns the resolved Config; raises ConfigError naming what is wrong (``rlvr config``)."""
    from rlvr.config.compose import build_task

    resolved = config if isinstance(config, Config) and not overrides else resolve_config(config, overrides)
    check_options(resolved)
    check_extras(resolved)
    try:
        build_task(resolved, serve=False).close()
    except ImportError as err:  # an optional reader the task's options need (a Parquet file: pyarrow)
        hint = missing_module_hint(err)
        if hint is None:
            raise
        raise ConfigError(f"task.name={resolved.task.name!r}: {hint}") from err
    return resolved


def train(config: Config | dict | str | Path | None = None, overrides: Sequence[str] = (), *,
          reward_funcs: Sequence[Callable] = (), out_dir: str | Path | None = None,
          on_record: Callable[[Record], None] | None = None, environment_factory: Callable | None = None
          ) -> TrainResult:
    """Train a policy; returns a ``TrainResult`` (records, run_dir, policy, config).

    config:       a ``Config``, a mapping of the YAML file's shape, a YAML path, or None (the lecture's run);
                  ``overrides`` (``["algo.group_size=16"]``) apply on top.
    reward_funcs: callables appended to ``rewards.functions``, each named by its ``__name__`` in the records.
    out_dir:      the run directory (else ``config.out_dir``), written as ``rlvr train`` writes it (then
                  ``on_record`` is not called). None: the run stays in memory.
    on_record:    called with each record as it is made (in-memory runs).
    environment_factory: a class whose instances are episodes' environments (an rlvr ``Environment`` or a
                  TRL-style class): the task becomes ``environment`` with it.
    transformers' progress bars and deprecation warnings are off while it runs, as in the CLI.
    """
    from rlvr.modeling import quiet_libraries

    with quiet_libraries():
        resolved = resolve_config(config, overrides, reward_funcs, out_dir, environment_factory)
        if resolved.out_dir is None:
            return _train_in_memory(resolved, on_record)
        from rlvr.runs.launch import train_in_run_dir

        return TrainResult(*train_in_run_dir(resolved), resolved)


def _train_in_memory(config: Config, on_record: Callable[[Record], None] | None) -> TrainResult:
    from rlvr.cluster.session import loop_parts, trained_policy
    from rlvr.loop.trainer import setup
    from rlvr.loop.trainer import train as train_loop

    task, st = setup(config)
    try:
        with loop_parts(config, st) as (source, learner):
            records = train_loop(config, on_record=on_record, state=(task, st), source=source, learner=learner)
            policy = trained_policy(config, task, st, learner)
    finally:
        task.close()  # its reward workers
    return TrainResult(records, None, policy, config)


def run_loop(config: Config, on_record: Callable[[Record], None] | None = None,
             state: tuple[Any, Any] | None = None, on_epoch_end: Callable[[Any], None] | None = None) -> list[Record]:
    """``rlvr.loop.trainer.train`` with the seams ``config`` asks for (this process's, or Ray actors that end with
    the loop); ``state`` as ``setup`` builds it (default: built here)."""
    from rlvr.cluster.session import loop_parts
    from rlvr.loop.trainer import setup
    from rlvr.loop.trainer import train as train_loop

    task, st = state if state is not None else setup(config)
    with loop_parts(config, st) as (source, learner):
        return train_loop(config, on_record=on_record, state=(task, st), on_epoch_end=on_epoch_end, source=source,
                          learner=learner)


def _check_callables(reward_funcs: Sequence[Callable]) -> None:
    if isinstance(reward_funcs, (str, bytes)) or callable(reward_funcs):
        raise ConfigError("reward_funcs: expected a list of functions, e.g. reward_funcs=[my_reward]")
    for i, fn in enumerate(reward_funcs):
        if not callable(fn):
            raise ConfigError(f"reward_funcs[{i}]={fn!r} is not callable; give the function itself "
                              "(a 'module:function' name goes in rewards.functions)")
