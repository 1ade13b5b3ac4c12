"""The RL loop, top to bottom: ``train`` -> ``collect_rollout`` -> ``optimizer_step``.

Each epoch: sample G responses per prompt, score them, turn rewards into deltas,
cache the old policy's log-probs once (a tensor, not a model), and take
``inner_steps`` optimizer steps on that batch (micro-batches with gradient
accumulation). A frozen reference copy exists only when ``kl_coef > 0``.
Shapes: B prompts, G responses per prompt, N = B*G responses, T response tokens.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rlvr import core
from rlvr.cluster.session import Cluster
from rlvr.cluster.session import wanted as cluster_wanted
from rlvr.config import AlgoConfig, Config
from rlvr.diagnostics import GradientNoiseMeter, flat_grad, max_reward_stats, prompt_solve_shares
from rlvr.dynamic_sampling import fill_with_learning_groups
from rlvr.engines import WeightSyncError
from rlvr.evaluation import evaluate
from rlvr.extras import check_extras
from rlvr.metrics import Record
from rlvr.optim import build_optimizer, build_scheduler
from rlvr.policies import build_policy, frozen_copy
from rlvr.rewards import TrainerState
from rlvr.rollout import Grades, Policy, Rollout, Samples, Task, contiguous_bounds, sampler_log_probs_exact
from rlvr.shaping import shaped_rewards
from rlvr.tasks import build_task, check_prompts_fit

logger = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. too many consecutive non-finite steps)."""


@dataclass
class TrainState:
    """Everything that changes during a run: enough to resume it (``rlvr.checkpoint``
    turns it into a checkpoint and back)."""

    policy: Policy
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    scheduler: torch.optim.lr_scheduler.LambdaLR
    ref_module: torch.nn.Module | None = None
    epoch: int = 0
    step: int = 0
    bad_steps: int = 0  # consecutive optimizer steps skipped for non-finite values
    inner_step: int = 0  # next inner step of the current epoch
    rollout: Rollout | None = None  # the current epoch's batch (None between epochs)
    records: list[Record] = field(default_factory=list)
    stop_requested: bool = False  # set by a signal handler: stop after the current step
    cluster: Any = None  # the run's Ray actors (rlvr.cluster.session.Cluster), while train runs


def setup(config: Config) -> tuple[Task, TrainState]:
    """Build the task, the policy (seeded) and the optimizer."""
    check_extras(config)  # a missing optional package: one line, before anything is built
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    if config.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=False)
    task = build_task(config)
    try:
        generator = seed_everything(config.seed)
        policy = build_policy(config)
        check_prompts_fit(task, policy)  # fixed prompts the model cannot take: an error before any work
    except BaseException:
        close = getattr(task, "close", None)  # its reward workers
        if close is not None:
            close()
        raise
    params = [p for p in policy.module.parameters() if p.requires_grad]
    optimizer = build_optimizer(config.optim, params)
    total = config.algo.epochs * config.algo.inner_steps
    return task, TrainState(policy, optimizer, generator, build_scheduler(config.optim, optimizer, total))


def seed_everything(seed: int) -> torch.Generator:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def train(
    config: Config,
    on_record: Callable[[Record], None] | None = None,
    state: tuple[Task, TrainState] | None = None,
    on_epoch_end: Callable[[TrainState], None] | None = None,
) -> list[Record]:
    """Run the configured epochs; return the records (one per inner step, plus evals).

    ``on_record`` sees every record as it is made (the CLI writes them to disk);
    ``on_epoch_end`` sees the state after each epoch, and after the step at which a
    stop was requested (the CLI writes checkpoints then). ``state`` continues a run
    built by ``setup`` or restored from a checkpoint, mid-epoch included.
    """
    task, st = state if state is not None else setup(config)
    a = config.algo
    emit = on_record or (lambda record: None)

    def record(*records: Record) -> None:
        for r in records:
            st.records.append(r)
            emit(r)

    if config.log.eval_at_start and st.step == 0 and not st.records:
        sync_engine(st)
        record(*evaluate(config, task, st.policy, 0, 0))  # the starting point
    try:
        if cluster_wanted(config):  # Ray rollout workers and/or data-parallel learners
            st.cluster = Cluster(config, st)
        learners = None if st.cluster is None else st.cluster.learners
        while st.epoch < a.epochs:
            if st.rollout is None:
                st.rollout = collect_rollout(config, task, st)
                if config.log.prompt_records and st.rollout.prompt_solved is not None:
                    record({"kind": "prompts", "epoch": st.epoch, "step": st.step, "solved": st.rollout.prompt_solved})
            while st.inner_step < a.inner_steps:
                if learners is None:
                    record(optimizer_step(config, st, st.rollout))
                else:
                    record(learners.optimizer_step(st, st.rollout, measure_noise=noise_due(config, st)))
                st.inner_step += 1
                if st.stop_requested and st.inner_step < a.inner_steps:
                    break
            if learners is not None:  # the driver samples, evaluates and checkpoints with their weights
                learners.pull(st)
            if st.inner_step == a.inner_steps:  # the epoch is complete
                st.rollout, st.inner_step = None, 0
                st.epoch += 1
                if st.epoch % config.log.eval_every == 0 or st.epoch == a.epochs:
                    sync_engine(st)  # evaluation samples with the weights of the steps just taken
                    record(*evaluate(config, task, st.policy, st.epoch, st.step))
            if on_epoch_end is not None:
                on_epoch_end(st)
            if st.stop_requested:
                break
    finally:
        if st.cluster is not None:  # the Ray actors end with the run
            st.cluster.close()
            st.cluster = None
    return st.records


def collect_rollout(config: Config, task: Task, st: TrainState) -> Rollout:
    """The epoch's batch: sample G responses per prompt and grade them (what a rollout
    worker does), then deltas, old and reference log-probs and loss weights."""
    a = config.algo
    if a.kl_coef > 0 and (st.ref_module is None or st.epoch % a.ref_update_every == 0):
        st.ref_module = frozen_copy(st.policy.module)  # the reference: a frozen copy, refreshed every K epochs
    if st.cluster is not None and st.cluster.rollouts is not None:
        # Ray actors sample, with the weights of the last optimizer step (max_staleness k = 0)
        # or of up to k epochs before (k >= 1: corrected by TIS in build_rollout)
        samples, grades, stats = st.cluster.rollouts.sample_and_grade(st, task)
    else:
        engine_stats = sync_engine(st)  # the engine samples with the weights of the last optimizer step
        state = trainer_state_at(config, st.epoch, st.step)
        sample = lambda: sample_and_grade(config, task, st.policy, st.generator, trainer_state=state)  # noqa: E731
        if a.dynamic_sampling:  # DAPO: only groups whose deltas are not all zero, sampled until B of them
            samples, grades, timings = fill_with_learning_groups(a, sample)
        else:
            samples, grades, timings = sample()
        stats = {**timings, **engine_stats}
    # the hacking monitor: top-reward responses that fail the gold check
    stats.update(max_reward_stats(grades.rewards, grades.correct, getattr(task, "max_reward", None),
                                  reward_is_gold=getattr(task, "reward_is_gold", False)))
    return build_rollout(config, st, samples, grades, stats)


def trainer_state_at(config: Config, epoch: int, step: int) -> TrainerState:
    """What reward functions get as ``trainer_state`` for a batch of ``epoch`` sampled after ``step`` steps."""
    return TrainerState(global_step=step, epoch=epoch, max_steps=config.algo.epochs * config.algo.inner_steps)


def sample_and_grade(config: Config, task: Task, policy: Policy, generator: torch.Generator, prompts: Any = None,
                     trainer_state: TrainerState | None = None) -> tuple[Samples, Grades, dict[str, float]]:
    """B prompts from the task (or these ``prompts``), G responses each from the policy,
    graded (the reward functions get the responses' token ids and ``trainer_state``): the
    samples, the grades and the phase timings."""
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


def build_rollout(config: Config, st: TrainState, samples: Samples, grades: Grades, stats: dict[str, float]
                  ) -> Rollout:
    """Graded samples -> the batch the inner steps train on: deltas [N], old and reference
    log-probs [N, T] (constants), aggregation weights [N, T] and the epoch's stats."""
    a, policy, temp = config.algo, st.policy, config.policy.temperature
    clock = time.perf_counter()
    kl_in_reward = a.kl_coef > 0 and a.kl_in == "reward"
    # no_grad: old and reference log-probs are constants. If they carried gradient,
    # pi/pi_old would be identically 1 and its gradient silently 0.
    old_log_probs = ref_log_probs = importance_weights = None
    mismatch: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        if a.loss != "naive" or a.tis_cap is not None or kl_in_reward:  # the naive loss alone needs none
            old_log_probs, importance_weights, mismatch = old_policy_log_probs(a, policy, samples, temp)
        if a.kl_coef > 0:
            ref_log_probs, _ = reference_log_probs(policy, st.ref_module, samples, temp)
    rewards, mask, shaping = shaped_rewards(config, policy, samples, grades.rewards, old_log_probs, ref_log_probs)
    # kl_in=reward keeps the reference log-probs: the steps log the policy's KL, and add no term to the loss
    lengths = mask.sum(dim=-1).reshape(rewards.shape)  # [B, G]: reinforce_pp whitens over these tokens
    deltas = core.compute_deltas(rewards, a.deltas, eps=a.adv_eps, lengths=lengths).reshape(-1)  # [N]; 0: abstained
    pg_token_mask = None
    if a.top_entropy_q is not None:  # the policy gradient of the batch's highest-entropy tokens only
        with torch.no_grad():
            _, entropy = policy.log_probs(samples, temp, with_entropy=True)  # [N, T]
        pg_token_mask = core.top_entropy_mask(entropy, mask, a.top_entropy_q)
    score_seconds = time.perf_counter() - clock
    tokens = samples.response_mask.sum().item()
    stats = {
        **rollout_stats(grades.rewards, grades.correct, deltas, a.group_size),  # the task's rewards, unshaped
        **grades.metrics,
        # the first failure of each reward function that failed, for the end-of-run summary
        **{f"reward/{name}/failure": line for name, line in grades.failures.items()},
        **stats,  # time/generate, time/reward and the sampler's own numbers
        **shaping,
        "time/score": score_seconds,
        "response_tokens": tokens,
        "response_length": tokens / max(samples.num_responses, 1),
        "tokens_per_sec_generate": tokens / max(stats["time/generate"], 1e-9),
        **{key: value.item() for key, value in mismatch.items()},
    }
    # Dr. GRPO's constant defaults to the policy's longest possible response, not this
    # batch's width T: with T, one long response would shrink every other token's
    # weight, and the step size would change from epoch to epoch.
    normalizer = policy.max_response_length if a.normalizer is None else a.normalizer
    weights = core.aggregation_weights(mask, a.aggregation, normalizer)  # [N, T]
    solved = None if grades.prompts is None else prompt_solve_shares(grades.prompts, grades.correct)
    return Rollout(samples, deltas, old_log_probs, ref_log_probs, weights, stats, importance_weights, solved,
                   pg_token_mask)


def old_policy_log_probs(
    a: AlgoConfig, policy: Policy, samples: Samples, temperature: float
) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
    """The old policy's log-probs [N, T], the TIS weights [N, T] (None unless ``a.tis_cap``)
    and the sampler-trainer mismatch (scalar tensors, only when recomputed); call under no_grad.

    sampler: the log-probs recorded while sampling (no extra pass). recompute: the
    trainer's scorer on the sampled tokens, so pi / pi_old compares the trainer with
    itself, and the recorded ones measure (and, with TIS, correct) the sampler's gap.
    auto: recompute when TIS is on or the sampler's numbers are not the trainer's.
    """
    recorded = samples.sample_log_probs  # [N, T], or None: the policy records none
    recompute = a.old_log_probs == "recompute" or (
        a.old_log_probs == "auto" and (a.tis_cap is not None or not sampler_log_probs_exact(policy)))
    if recorded is not None and not recompute:
        return recorded, None, {}
    old_log_probs, _ = policy.log_probs(samples, temperature)  # [N, T]
    if recorded is None:
        if a.tis_cap is not None:
            raise TrainingError(f"algo.tis_cap={a.tis_cap}: the weights pi_old / pi_sampler need the sampler's "
                                "log-probs, and this policy records none (sample_log_probs is None)")
        return old_log_probs, None, {}
    mask, cap = samples.response_mask, math.inf if a.tis_cap is None else a.tis_cap  # [N, T]
    mismatch = {
        "mismatch/k3": core.mismatch_k3(old_log_probs, recorded, mask),
        "mismatch/max_abs_gap": core.max_abs_log_prob_gap(old_log_probs, recorded, mask),
        "mismatch/tis_truncated_frac": core.tis_truncated_frac(old_log_probs, recorded, cap, mask),
    }
    weights = None if a.tis_cap is None else core.tis_weights(old_log_probs, recorded, a.tis_cap)
    return old_log_probs, weights, mismatch


def sync_engine(st: TrainState) -> dict[str, float]:
    """Hand the policy's generation engine the trainer's current weights, named by the
    step count (``sync_engine`` of an LM policy; a policy that samples by itself has
    none): engine/* numbers."""
    sync = getattr(st.policy, "sync_engine", None)
    if sync is None:
        return {}
    try:
        return sync(st.step)
    except WeightSyncError as err:
        raise TrainingError(f"epoch {st.epoch}, step {st.step}: {err}") from err


def optimizer_step(config: Config, st: TrainState, rollout: Rollout) -> Record:
    """One optimizer step on the epoch's rollout: the gradient accumulated over
    micro-batches, then the step (skipped when anything is not finite)."""
    clock = time.perf_counter()
    st.optimizer.zero_grad(set_to_none=True)
    meter = GradientNoiseMeter() if noise_due(config, st) else None
    sums = accumulate_gradients(config, st.policy, rollout, config.optim.micro_batches, meter)
    metrics = step_metrics(sums, clip_gradients(st.policy.module, config.optim.max_grad_norm))
    skipped = not all(math.isfinite(v) for v in metrics.values())
    if skipped:
        skip_step(st, st.policy.module, metrics, config.optim.max_bad_steps)
    else:
        st.optimizer.step()
        st.bad_steps = 0
    if meter is not None:  # after the check: a zero gradient has an undefined (NaN) noise scale
        metrics.update(noise_metrics(meter, st.step))
    lr = st.scheduler.get_last_lr()[0]
    st.scheduler.step()  # counts steps, skipped ones too: the schedule follows the step number
    record = {"kind": "train", "epoch": st.epoch, "step": st.step, **metrics, "skipped_step": float(skipped),
              **rollout.stats, "lr": lr, "time/step": time.perf_counter() - clock}
    st.step += 1
    return record


def noise_due(config: Config, st: TrainState) -> bool:
    """Does this step measure the gradient's noise? The first step of every
    ``log.grad_noise_every``-th epoch."""
    every = config.log.grad_noise_every
    return bool(every) and st.inner_step == 0 and st.epoch % every == 0


def accumulate_gradients(config: Config, policy: Policy, rollout: Rollout, num_micro_batches: int,
                         meter: GradientNoiseMeter | None = None, batch: Rollout | None = None
                         ) -> dict[str, torch.Tensor]:
    """Backpropagate the loss of ``rollout`` in micro-batches, the gradients adding up in
    each parameter's ``.grad``; returns the step's sums (``step_sums``, added up).

    ``meter``: measure the gradient's noise on this step; ``rollout`` (whole groups) is then
    split into at least ``log.grad_noise_parts`` parts of whole groups, each part's gradient
    handed to the meter with its size in prompts (``noise_part_size``; the gradient summed
    is the same, up to float rounding). ``batch``: the whole batch when ``rollout`` is a
    learner's share of it (default: ``rollout``).

    The loss of any part of a rollout (``Rollout.rows``) is its share of the whole batch's
    loss, so the gradients of parts add up to the full-batch gradient: micro-batches here,
    and the shares of data-parallel learners, whose gradients and sums are summed across
    learners before ``step_metrics`` and the optimizer step.
    """
    a, temp = config.algo, config.policy.temperature
    sums: dict[str, torch.Tensor] = {}
    if meter is None:
        parts = micro_batches(rollout, num_micro_batches)
    else:
        parts = group_parts(rollout, max(num_micro_batches, config.log.grad_noise_parts), a.group_size)
    entropy_args = {"with_entropy": config.log.entropy or a.entropy_coef > 0,
                    **({"entropy_grad": True} if a.entropy_coef > 0 else {})}
    for mb in parts:
        log_probs, entropy = policy.log_probs(mb.samples, temp, **entropy_args)  # [n, T]
        pg, stats = core.policy_loss(log_probs, mb.deltas, a.loss, mb.old_log_probs, a.clip_eps, a.clip_eps_high,
                                     clip_ratio_c=a.clip_ratio_c, response_mask=mb.samples.response_mask)
        if mb.importance_weights is not None:
            # TIS: the tokens came from the sampler, not pi_old; w = min(pi_old / pi_sampler, C), a constant
            pg = pg * mb.importance_weights
        if mb.pg_token_mask is not None:
            # The top-entropy selection removes the other tokens' policy-gradient terms; the weights keep
            # every token, so the normaliser and the KL term are those of the whole response (as the method).
            pg = torch.where(mb.pg_token_mask, pg, 0.0)
        kl = None
        per_token = pg
        if mb.ref_log_probs is not None and a.kl_in == "reward":  # the penalty is in the rewards: the KL is logged
            kl = core.kl_penalty(log_probs.detach(), mb.ref_log_probs, a.kl_estimator)
        elif mb.ref_log_probs is not None:
            # kl_loss_term, not kl_penalty: it refuses k1, whose gradient is zero in expectation.
            kl = core.kl_loss_term(log_probs, mb.ref_log_probs, a.kl_estimator)
            per_token = pg + a.kl_coef * kl
        if a.entropy_coef > 0:
            per_token = per_token + core.entropy_bonus(entropy, a.entropy_coef)
        loss = core.weighted_sum(per_token, mb.weights)
        loss.backward()
        if meter is not None:
            size = noise_part_size(a.aggregation, mb, rollout if batch is None else batch, a.group_size)
            if size > 0:  # a part without loss weight (every token masked) has no gradient to compare
                meter.add_running_sum(flat_grad(policy.module), size)
        for key, value in step_sums(mb.weights, mb.samples.response_mask, loss, pg, kl, stats["clipped"],
                                    entropy).items():
            sums[key] = sums.get(key, 0) + value
    return sums


def noise_metrics(meter: GradientNoiseMeter, step: int) -> dict[str, float]:
    """The meter's grad/* numbers; none (and a warning) when fewer than 2 parts carried loss."""
    if len(meter.sizes) < 2:
        logger.warning("step %d: gradient noise not measured: %d part of the batch carried loss, it needs 2",
                       step, len(meter.sizes))
        return {}
    return meter.metrics()


def noise_part_size(aggregation: str, part: Rollout, batch: Rollout, group_size: int) -> float:
    """The size, in prompts, of a part of ``batch`` for the noise meter: the part carries
    size / B of the batch's loss, its own gradient estimate is (B / size) times its gradient.

    The sequence-mean aggregations are means over responses: a part of n responses carries
    n / N of the loss whatever their lengths (under seq_mean_token_sum its loss weight is
    its share of the tokens, not of the responses), so its size is n / G. token_mean is a
    mean over tokens: the part's share of the loss weight, times B.
    """
    if aggregation == "token_mean":
        prompts = batch.samples.num_responses / group_size
        return (part.weights.sum() / batch.weights.sum()).item() * prompts
    return part.samples.num_responses / group_size


@torch.no_grad()
def step_sums(w, response_mask, loss, pg, kl, clipped, entropy) -> dict[str, torch.Tensor]:
    """One micro-batch's sums, to be added over the step's micro-batches; all [n, T].

    loss, pg_loss: aggregated with the loss weights w (they are the loss).
    kl, clip_frac, entropy: plain sums over response tokens, with their count in
    ``tokens``, for token means as TRL and verl report them. Weighted, they would
    scale with length / normalizer under seq_mean_token_sum (a clip fraction of 2).
    """
    kl = torch.zeros_like(pg) if kl is None else kl
    return {
        "loss": loss.detach(),
        "pg_loss": core.weighted_sum(pg, w),
        "kl": core.masked_sum(kl, response_mask),
        "clip_frac": core.masked_sum(clipped.to(pg.dtype), response_mask),
        **({} if entropy is None else {"entropy": core.masked_sum(entropy, response_mask)}),
        "tokens": response_mask.sum(),
    }


def step_metrics(sums: dict[str, torch.Tensor], grad_norm: torch.Tensor) -> dict[str, float]:
    """The step's named numbers from the micro-batch sums: loss and pg_loss as summed;
    kl, clip_frac and entropy divided by the batch's token count once, so micro-batching
    does not change them; the gradient norm."""
    tokens = sums["tokens"].clamp(min=1)
    values = {"loss": sums["loss"], "pg_loss": sums["pg_loss"], "kl": sums["kl"] / tokens,
              "clip_frac": sums["clip_frac"] / tokens, "grad_norm": grad_norm}
    if "entropy" in sums:  # computed only when logged (log.entropy)
        values["entropy"] = sums["entropy"] / tokens
    numbers = torch.stack(list(values.values())).tolist()  # one tensor: one device sync
    return dict(zip(values, numbers))


def skip_step(st: TrainState, module: torch.nn.Module, metrics: dict[str, float], max_bad_steps: int) -> None:
    """Drop a step whose loss or gradients are not finite; stop after too many in a row."""
    bad = [key for key, v in metrics.items() if not math.isfinite(v)]
    bad += [f"grad of {name}" for name, p in module.named_parameters()
            if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
    st.optimizer.zero_grad(set_to_none=True)
    st.bad_steps += 1
    logger.warning("step %d: non-finite %s; optimizer step skipped (%d in a row)",
                   st.step, ", ".join(bad), st.bad_steps)
    if st.bad_steps >= max_bad_steps:
        raise TrainingError(
            f"{st.bad_steps} consecutive steps with non-finite values (last: {', '.join(bad)}) at epoch "
            f"{st.epoch}, step {st.step}; stopping. The last checkpoint written before this is intact."
        )


def group_parts(rollout: Rollout, count: int, group_size: int) -> list[Rollout]:
    """``count`` parts of ``rollout`` made of whole groups (at most one part per group)."""
    groups = rollout.samples.num_responses // group_size
    return [rollout.rows(slice(start * group_size, stop * group_size))
            for start, stop in contiguous_bounds(groups, min(count, groups))]


def micro_batches(rollout: Rollout, count: int) -> list[Rollout]:
    """``count`` parts of ``rollout`` (contiguous rows, so views, not copies)."""
    if count == 1:
        return [rollout]
    n = rollout.samples.num_responses
    size = -(-n // count)  # ceil, as torch.chunk
    return [rollout.rows(slice(start, start + size)) for start in range(0, n, size)]


def reference_log_probs(
    policy: Policy, ref_module: torch.nn.Module, samples: Samples, temperature: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs under the frozen reference: the policy's scorer with the reference weights."""
    return policy.log_probs(samples, temperature, module=ref_module)


def clip_gradients(module: torch.nn.Module, max_norm: float | None) -> torch.Tensor:
    """The total gradient norm (before clipping); clips in place when ``max_norm`` is set."""
    params = [p for p in module.parameters() if p.grad is not None]
    if not params:
        return torch.zeros(())
    # One foreach call for all per-tensor norms: the toy's step is dominated by per-op overhead.
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm([p.grad for p in params])))
    if max_norm is not None:
        # the parameters, not their gradients: it scales each argument's .grad (a gradient has none)
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=True)
    return norm


def rollout_stats(rewards: torch.Tensor, correct: torch.Tensor, deltas: torch.Tensor, group_size: int) -> Record:
    """Per-epoch numbers about the sampled batch; rewards, correct [B, G], deltas [N]."""
    valid = torch.isfinite(rewards)
    r = rewards[valid]
    zero_groups = (deltas.reshape(-1, group_size) == 0).all(dim=1)
    return {
        "reward_mean": r.mean().item() if r.numel() else float("nan"),
        "reward_std": r.std().item() if r.numel() > 1 else 0.0,
        "solve_rate": correct.float().mean().item(),
        "frac_zero_delta_groups": zero_groups.float().mean().item(),
        "abstain_frac": 1.0 - valid.float().mean().item(),
    }

