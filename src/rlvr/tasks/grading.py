"""How every task grades: its built-in reward specs and the user's, in one RewardRunner.

A task declares its rewards and does not run them itself: ``reward_specs()``, its built-in RewardSpecs, and
``gold_reward``, the name of the spec whose 1.0 means "the response is right" (the gold check; weight 0 makes it a
reported metric that is not rewarded). ``reward_runner`` is the one place a runner is built: the task's specs plus
the user's ``rewards.functions``. ``grade`` scores a batch (prompt dicts, B lists of G responses) with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from rlvr.base.errors import ConfigError, RunError
from rlvr.batch.interfaces import Task
from rlvr.batch.rollout import Grades
from rlvr.rewards import RewardError, RewardResult, RewardRunner, RewardSpec, TrainerState, load_reward_specs

Prompt = dict[str, Any]


def reward_runner(task: GradedTask, functions: Sequence[Any] = (), timeout: float | None = None, *,
                  strict: bool = False, num_workers: int | None = None, replace_task_rewards: bool = False
                  ) -> RewardRunner:
    """The RewardRunner of ``task``: its built-in specs and the user's ``functions`` (``timeout`` unless one sets
    its own), with ``num_workers`` (or the task's ``reward_workers``; None: 2). With the defaults: the built-in
    specs alone, lenient, as a task constructed directly grades.

    The specs are summed in order, the task's first unless ``user_rewards_first``. With ``replace_task_rewards``
    only the task's gold check is kept, with weight 0 and not required: the solve rate is still measured, and only
    the user's functions make the reward. ConfigError naming the field, also when no function would make a reward.
    """
    user: list[RewardSpec] = []
    if functions:
        try:
            user = load_reward_specs(list(functions), timeout, where="rewards.functions")
        except RewardError as err:
            raise ConfigError(str(err)) from err
    builtin = task.reward_specs()
    if replace_task_rewards:
        if not user:
            raise ConfigError("rewards.replace_task_rewards=true needs rewards.functions to replace the task's rewards")
        builtin = [dataclasses.replace(s, weight=0.0, required=False) for s in builtin if s.name == task.gold_reward]
    if not user and not builtin:
        raise ConfigError(f"task {task.name!r} has no reward of its own here ({task.no_reward_hint}); "
                          "add rewards.functions, e.g. ['rlvr.rewards.verifiers:math_answer']")
    specs = [*user, *builtin] if task.user_rewards_first else [*builtin, *user]
    num_workers = task.reward_workers or (2 if num_workers is None else num_workers)
    try:
        return RewardRunner(specs, strict=strict, num_workers=num_workers)
    except ValueError as err:  # a user function named like another
        raise ConfigError(f"rewards.functions: {err}") from err
    except RewardError as err:  # a function that cannot reach a worker (no fork here, and it does not pickle)
        raise ConfigError(f"rewards.functions: {err}") from err


class GradedTask(Task):
    """The grading every task shares (see the module docstring). ``runner`` is built from the task's specs alone on
    first use, unless ``build_task`` gave it the config's; ``close()`` it (or use ``with``) to stop its workers.
    """

    name: ClassVar[str]  # ``task.name`` in a config
    gold_reward: str | None  # None: no gold check, and no response counts as solved
    no_reward_hint: ClassVar[str] = ""  # for the error: what gives the task a reward when it has none of its own
    # task.options: each keyword argument's help and rules (rlvr.base.rules.option); its type and
    # default are the argument's (rlvr.tasks.options_section), but where a config's default differs
    options: ClassVar[dict[str, dict[str, Any]]] = {}
    config_defaults: ClassVar[dict[str, Any]] = {}
    user_rewards_first: ClassVar[bool] = False
    # per-function metrics of the task's own specs too (else the user's only: the toy's reward is its reward_mean)
    reports_builtin_rewards: ClassVar[bool] = True
    reward_workers: int | None = None  # None: ``rewards.num_workers``
    no_gold_hint: str = ""  # for the error: what to check when the gold check grades none of a batch
    data_files: tuple[Path, ...] = ()  # where the prompts came from; a resume refuses to go on when one changed
    _runner: RewardRunner | None = None
    _user_reward_names: list[str]  # the runner's functions that are not the task's own

    def reward_specs(self) -> list[RewardSpec]:
        """The task's built-in reward specs, in the order they are summed."""
        raise NotImplementedError

    @property
    def runner(self) -> RewardRunner:
        if self._runner is None:
            self.runner = reward_runner(self)
        return self._runner

    @runner.setter
    def runner(self, runner: RewardRunner) -> None:
        if self._runner is not None:
            self._runner.close()
        self._runner = runner
        builtin = {spec.name for spec in self.reward_specs()}
        self._user_reward_names = [name for name in runner.names if name not in builtin]

    @property
    def reward_is_gold(self) -> bool:
        """Is the gold check the only weighted spec? The hacking monitor then has nothing to compare."""
        weighted = [spec.name for spec in self.runner.specs if spec.weight != 0]
        return self.gold_reward is not None and weighted == [self.gold_reward]

    def score(self, prompts: list[Prompt], responses: list[list[str]], *, completion_ids: Any = None,
              trainer_state: TrainerState | None = None) -> RewardResult:
        """Every reward of B prompt dicts x G responses: rewards [B, G], per function [B, G, F] and per-function
        stats; completion_ids ([B*G] lists) and trainer_state reach the reward functions when given."""
        return self.runner.score_groups(prompts, responses, completion_ids=completion_ids, trainer_state=trainer_state,
                                        completion_columns=self.completion_columns(responses))

    def completion_columns(self, responses: list[list[Any]]) -> dict[str, list[Any]]:
        """Columns the reward functions get with one value a response (name -> [B*G]), beside the data's."""
        return {}

    def grade(self, prompts: Any, responses: Any, *, completion_ids: Any = None,
              trainer_state: TrainerState | None = None) -> Grades:
        """Rewards [B, G] (NaN = abstain), gold check [B, G] and reward metrics, in one pass; RunError when the
        gold check grades none of the responses."""
        result = self.score(prompts, responses, completion_ids=completion_ids, trainer_state=trainer_state)
        if self.gold_reward is None:
            correct = torch.zeros(result.rewards.shape, dtype=torch.bool)
        else:
            check_gold_graded(result, self.gold_reward, self.no_gold_hint)
            correct = result.column(self.gold_reward) == 1.0  # an abstention is not right
        reported = None if self.reports_builtin_rewards else self._user_reward_names
        failures = {f"reward/{name}/failure": line for name, line in result.failures.items()}
        notes = None
        if any(result.notes):
            size = result.rewards.shape[1]
            notes = [result.notes[b * size:(b + 1) * size] for b in range(result.rewards.shape[0])]
        return Grades(result.rewards, correct, result.metrics(reported), prompts, failures, notes)

    @property
    def services(self) -> list[Any]:
        """What the run serves for this task's rewards (a judge's reference model), closed with it."""
        if "_services" not in self.__dict__:
            self._services = []
        return self._services

    def close(self) -> None:
        """Stop the reward workers and the services, if any."""
        if self._runner is not None:
            self._runner.close()
        for service in self.services:
            service.close()
        self.services.clear()

    def __enter__(self) -> GradedTask:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def check_gold_graded(result: RewardResult, gold: str, hint: str = "") -> None:
    """RunError when the gold check graded none of a batch's responses (every one abstained, failed, timed out or
    was invalid): nothing could count as right, and a required one leaves every reward abstaining. A gold check
    that cannot read a whole batch's answers is a broken setup, not bad luck."""
    stats = result.stats[gold]
    total = stats.scored + stats.abstained + stats.errors + stats.timeouts + stats.invalid
    if total == 0 or stats.scored > 0:
        return
    failure = result.failures.get(gold)
    raise RunError(f"the gold check {gold!r} graded none of the {total} responses of a batch (abstained "
                   f"{stats.abstained}, errors {stats.errors}, timeouts {stats.timeouts}, invalid {stats.invalid}"
                   + (f"; first failure: {failure}" if failure else "")
                   + "), so nothing can be learned or solved" + (f"; {hint}" if hint else ""))
