"""The loop's two seams, and their kinds in this process.

``RolloutSource``: where an epoch's graded samples come from. ``Learner``: who takes the optimizer steps and holds the
trained state. ``rlvr.loop.trainer.train`` receives one of each (``rlvr.cluster.session.loop_parts`` builds them from
the config) and never asks which kind it has: sampling here (``LocalRolloutSource``) or on Ray rollout workers
(``rlvr.cluster.rollout.RayRolloutSource``); stepping here (``LocalLearner``) or on data-parallel learners
(``rlvr.cluster.learners.LearnerGroup``).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch

from rlvr.batch.interfaces import Policy, Task
from rlvr.batch.record import Record
from rlvr.batch.rollout import Grades, Rollout, Samples
from rlvr.config import Config
from rlvr.engines import WeightSyncError
from rlvr.loop.dynamic_sampling import fill_with_learning_groups
from rlvr.loop.evaluation import evaluate
from rlvr.loop.state import TrainingError, TrainState
from rlvr.loop.step import optimizer_step
from rlvr.policies import frozen_copy
from rlvr.rewards import TrainerState


class RolloutSource(Protocol):
    """Samples and grades the batch of epoch ``st.epoch`` with the trained weights of step ``st.step``, and evaluates
    them."""

    def sample_and_grade(self, st: TrainState, task: Task) -> tuple[Samples, Grades, dict[str, float]]:
        """The samples, their grades and the sampler's numbers (``time/*``, ``engine/*``, ...)."""
        ...

    def evaluate(self, st: TrainState, task: Task) -> list[Record]:
        """``rlvr.loop.evaluation.evaluate`` at ``st``'s epoch and step, with its weights."""
        ...

    def offer_weights(self, st: TrainState) -> None:
        """The weights of the optimizer step just taken, for samplers that take new weights between batches
        (``cluster.weights_in_flight``); else nothing."""
        ...

    def state(self) -> dict[str, Any] | None:
        """What a checkpoint must keep of the source for a resumed run to go on as the run would have (the batches
        sampled ahead of the trainer), as tensors and plain data; None: nothing."""
        ...

    def restore(self, state: dict[str, Any] | None) -> None:
        """Go on from ``state()`` as the run's last checkpoint kept it (None: nothing kept)."""
        ...


class Learner(Protocol):
    """Holds the trained policy (and the KL reference): scores an epoch's samples and takes the optimizer steps on its
    rollout."""

    def log_probs(self, st: TrainState, samples: Samples, temperature: float, reference: bool = False,
                  with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``Policy.log_probs`` of ``samples`` [N, T] (and entropy) under the trained weights, or the reference's;
        constants (no gradient)."""
        ...

    def refresh_reference(self, st: TrainState) -> None:
        """The KL reference a frozen copy of the trained weights, when ``reference_due``."""
        ...

    def optimizer_step(self, st: TrainState, rollout: Rollout) -> Record:
        """One optimizer step at ``st``'s epoch and step count (which it advances): the step's record."""
        ...

    def pull(self, st: TrainState) -> None:
        """The trained state into ``st`` at the end of each epoch's steps: the scheduler and the count of skipped steps,
        and the weights and optimizer state where the driver holds them (it samples, evaluates or checkpoints with
        them)."""
        ...


class LocalRolloutSource:
    """Samples with the policy in this process: its engine synced with the trainer's weights first, then G responses to
    each of B prompts, graded; with ``algo.dynamic_sampling``, batches until B groups carry a gradient."""

    def __init__(self, config: Config) -> None:
        self.config = config

    def sample_and_grade(self, st: TrainState, task: Task) -> tuple[Samples, Grades, dict[str, float]]:
        engine_stats = sync_engine(st)  # the engine samples with the weights of the last optimizer step
        state = trainer_state_at(self.config, st.epoch, st.step)
        sample = lambda: sample_and_grade(self.config, task, st.policy, st.generator, trainer_state=state)  # noqa: E731
        if self.config.algo.dynamic_sampling:  # DAPO: only groups whose deltas are not all zero, until B of them
            samples, grades, timings = fill_with_learning_groups(self.config.algo, sample)
        else:
            samples, grades, timings = sample()
        return samples, grades, {**timings, **engine_stats}

    def evaluate(self, st: TrainState, task: Task) -> list[Record]:
        sync_engine(st)  # evaluation samples with the weights of the steps just taken
        return evaluate(self.config, task, st.policy, st.epoch, st.step)

    def offer_weights(self, st: TrainState) -> None:
        pass  # it samples with the weights of st when the loop asks

    def state(self) -> None:
        return None  # it samples each batch when the loop asks: none is ever ahead

    def restore(self, state: dict[str, Any] | None) -> None:
        if state is not None:
            raise ValueError("a source that samples in this process holds no batches sampled ahead to restore")


class LocalLearner:
    """Steps the driver's own policy and optimizer (``rlvr.loop.step.optimizer_step``); its state is the driver's, so
    ``pull`` has nothing to do."""

    def __init__(self, config: Config) -> None:
        self.config = config

    def log_probs(self, st: TrainState, samples: Samples, temperature: float, reference: bool = False,
                  with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        with torch.no_grad():
            return st.policy.log_probs(samples, temperature, with_entropy=with_entropy,
                                       module=st.ref_module if reference else None)

    def refresh_reference(self, st: TrainState) -> None:
        if reference_due(self.config, st.epoch, st.ref_module is not None):
            st.ref_module = frozen_copy(st.policy.module)

    def optimizer_step(self, st: TrainState, rollout: Rollout) -> Record:
        return optimizer_step(self.config, st, rollout)

    def pull(self, st: TrainState) -> None:
        pass


def local_learner(config: Config) -> Learner:
    """The learner that steps in this process."""
    return LocalLearner(config)


def reference_due(config: Config, epoch: int, held: bool) -> bool:
    """Whether the KL reference is (re)made at the start of ``epoch``: with a KL term, when none is ``held`` or every
    ``algo.ref_update_every`` epochs."""
    return config.algo.kl_coef > 0 and (not held or epoch % config.algo.ref_update_every == 0)


def trainer_state_at(config: Config, epoch: int, step: int) -> TrainerState:
    """What reward functions get as ``trainer_state`` for a batch of ``epoch`` sampled after ``step`` steps."""
    return TrainerState(global_step=step, epoch=epoch, max_steps=config.algo.epochs * config.algo.inner_steps)


def sample_and_grade(config: Config, task: Task, policy: Policy, generator: torch.Generator, prompts: Any = None,
                     trainer_state: TrainerState | None = None) -> tuple[Samples, Grades, dict[str, float]]:
    """B prompts from the task (or these ``prompts``), G responses each from the policy, graded (the reward functions
    get the responses' token ids and ``trainer_state``): the samples, the grades and the phase timings."""
    clock = time.perf_counter()
    if prompts is None:
        prompts = task.sample_prompts(config.task.prompts_per_epoch, generator)
    samples = policy.sample(prompts, config.algo.group_size, config.policy.temperature, generator)
    timings = {"time/generate": time.perf_counter() - clock}
    clock = time.perf_counter()
    grades = task.grade(prompts, samples.responses, completion_ids=samples.completion_ids(),
                        trainer_state=trainer_state)
    timings["time/reward"] = time.perf_counter() - clock
    return samples, grades, timings


def sync_engine(st: TrainState) -> dict[str, float]:
    """Hand the policy's generation engine the trainer's current weights, named by the step count (``sync_engine`` of an
    LM policy; a policy that samples by itself has none): engine/* numbers."""
    try:
        return st.policy.sync_engine(st.step)
    except WeightSyncError as err:
        raise TrainingError(f"epoch {st.epoch}, step {st.step}: {err}") from err
