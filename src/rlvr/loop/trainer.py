"""The RL loop, top to bottom: ``train`` -> ``collect_rollout`` -> ``learner.optimizer_step``.

Each epoch: a rollout source samples G responses per prompt and grades them, the rewards become deltas, the old policy's
log-probs are cached once (a tensor, not a model), and the learner takes ``inner_steps`` optimizer steps on that batch
(``rlvr.loop.step``: micro-batches with gradient accumulation). A frozen reference copy exists only when ``kl_coef >
0``. The source and the learner are the loop's seams (``rlvr.loop.seams``): in this process or on Ray actors, built once
by ``rlvr.cluster.session.loop_parts`` and handed in by the caller (``rlvr.api.run_loop``, ``rlvr.runs.launch``); the
loop never asks which. Shapes: B prompts, G responses per prompt, N = B*G responses, T response tokens.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from rlvr import core
from rlvr.base.errors import CutShort
from rlvr.batch.interfaces import Policy, Task, sampler_log_probs_exact
from rlvr.batch.record import Record
from rlvr.batch.rollout import Grades, Rollout, Samples
from rlvr.config import AlgoConfig, Config
from rlvr.config.compose import build_policy, build_task, check_extras, driver_holds_weights, runs_on_ray
from rlvr.loop.diagnostics import max_reward_stats, prompt_solve_shares
from rlvr.loop.optim import build_optimizer, build_scheduler
from rlvr.loop.seams import Learner, LocalLearner, LocalRolloutSource, RolloutSource, local_learner
from rlvr.loop.shaping import shaped_rewards
from rlvr.loop.state import TrainingError, TrainState, seed_everything
from rlvr.tasks import check_prompts_fit


def setup(config: Config) -> tuple[Task, TrainState]:
    """Build the task, the policy (seeded; without weights where the learners and rollout workers hold them:
    ``driver_holds_weights``) and the optimizer."""
    check_extras(config)  # a missing optional package: one line, before anything is built
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    if config.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=False)
    task = build_task(config)
    try:
        generator = seed_everything(config.seed)
        policy = build_policy(config, task, weights=driver_holds_weights(config))  # none: the learners hold them
        check_prompts_fit(task, policy)  # fixed prompts the model cannot take: an error before any work
    except BaseException:
        task.close()  # its reward workers
        raise
    params = [p for p in policy.module.parameters() if p.requires_grad]
    optimizer = build_optimizer(config.optim, params)
    total = config.algo.epochs * config.algo.inner_steps
    return task, TrainState(policy, optimizer, generator, build_scheduler(config.optim, optimizer, total))


def train(
    config: Config,
    on_record: Callable[[Record], None] | None = None,
    state: tuple[Task, TrainState] | None = None,
    on_epoch_end: Callable[[TrainState], None] | None = None,
    source: RolloutSource | None = None,
    learner: Learner | None = None,
) -> list[Record]:
    """Run the configured epochs; return the records (one per inner step, plus evals).

    ``on_record`` sees every record as it is made (the CLI writes them to disk); ``on_epoch_end`` sees the state after
    each epoch, and after the step at which a stop was requested (the CLI writes checkpoints then). ``state`` continues
    a run built by ``setup`` or restored from a checkpoint, mid-epoch included. ``source``, ``learner``: ``seams``.
    """
    source, learner = seams(config, source, learner)
    task, st = state if state is not None else setup(config)
    a = config.algo
    emit = on_record or (lambda record: None)

    def record(*records: Record) -> None:
        for r in records:
            st.records.append(r)
            emit(r)

    if config.log.eval_at_start and st.step == 0 and not st.records:
        record(*unless_cut_short(st, lambda: source.evaluate(st, task)) or ())  # the starting point
    while st.epoch < a.epochs:
        if st.rollout is None:
            st.rollout = unless_cut_short(st, lambda: collect_rollout(config, task, st, source, learner))
            if st.rollout is not None and config.log.prompt_records and st.rollout.prompt_solved is not None:
                record({"kind": "prompts", "epoch": st.epoch, "step": st.step, "solved": st.rollout.prompt_solved})
        while st.rollout is not None and st.inner_step < a.inner_steps:
            record(learner.optimizer_step(st, st.rollout))
            source.offer_weights(st)  # for rollout workers that take new weights between batches
            st.inner_step += 1
            if st.stop_requested and st.inner_step < a.inner_steps:
                break
        learner.pull(st)  # the scheduler (and the weights, where the driver samples or checkpoints with them)
        if st.inner_step == a.inner_steps:  # the epoch is complete
            st.rollout, st.inner_step = None, 0
            st.epoch += 1
            if st.epoch % config.log.eval_every == 0 or st.epoch == a.epochs:
                record(*unless_cut_short(st, lambda: source.evaluate(st, task)) or ())  # the new weights
        if on_epoch_end is not None:
            on_epoch_end(st)
        if st.stop_requested:
            break
    return st.records


def seams(config: Config, source: RolloutSource | None, learner: Learner | None) -> tuple[RolloutSource, Learner]:
    """The loop's seams: the ones given (both or neither), else this process's."""
    if (source is None) != (learner is None):
        raise ValueError("train: give both a rollout source and a learner, or neither")
    if source is not None:
        return source, learner
    if runs_on_ray(config):
        raise ValueError("train: this config runs parts of the loop on Ray; rlvr.api.run_loop (or rlvr.train) "
                         "builds them (rlvr.cluster.session.loop_parts) and hands them in")
    return LocalRolloutSource(config), local_learner(config)


def unless_cut_short(st: TrainState, make: Callable[[], Any]) -> Any:
    """``make()``, or None when the run's stop signal cut it short (``CutShort``: episodes waiting on their
    environments): the batch or evaluation is dropped, and the run's generator is as before it, so that a resumed run
    draws the batch again."""
    before = st.generator.get_state()
    try:
        return make()
    except CutShort:
        st.generator.set_state(before)
        return None


def collect_rollout(config: Config, task: Task, st: TrainState, source: RolloutSource | None = None,
                    learner: Learner | None = None) -> Rollout:
    """The epoch's batch: G responses per prompt sampled and graded by ``source``, then deltas, and the old and
    reference log-probs scored by ``learner`` (default: both in this process), and loss weights."""
    source = LocalRolloutSource(config) if source is None else source
    learner = LocalLearner(config) if learner is None else learner
    learner.refresh_reference(st)  # the reference: a frozen copy, refreshed every K epochs
    samples, grades, stats = source.sample_and_grade(st, task)
    # the hacking monitor: top-reward responses that fail the gold check
    stats.update(max_reward_stats(grades.rewards, grades.correct, task.max_reward, reward_is_gold=task.reward_is_gold))
    return build_rollout(config, st, samples, grades, stats, learner)


def build_rollout(config: Config, st: TrainState, samples: Samples, grades: Grades, stats: dict[str, float],
                  learner: Learner) -> Rollout:
    """Graded samples -> the batch the inner steps train on: deltas [N], old and reference log-probs [N, T] (constants,
    scored by ``learner``), aggregation weights [N, T] and the epoch's stats."""
    a, policy, temp = config.algo, st.policy, config.policy.temperature
    score = partial(learner.log_probs, st)
    clock = time.perf_counter()
    # no_grad: old and reference log-probs are constants. If they carried gradient, pi/pi_old would be identically 1 and
    # its gradient silently 0.
    old_log_probs = ref_log_probs = importance_weights = None
    mismatch: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        if a.needs_old_log_probs:  # the naive loss alone needs none
            old_log_probs, importance_weights, mismatch = old_policy_log_probs(a, policy, score, samples, temp)
        if a.kl_coef > 0:
            ref_log_probs, _ = score(samples, temp, reference=True)
    rewards, mask, shaping = shaped_rewards(config, policy, samples, grades.rewards, old_log_probs, ref_log_probs)
    # kl_in=reward keeps the reference log-probs: the steps log the policy's KL, and add no term to the loss
    lengths = samples.per_episode(mask.sum(dim=-1)).reshape(rewards.shape)  # [B, G]: reinforce_pp whitens over these
    deltas = core.compute_deltas(rewards, a.deltas, eps=a.adv_eps, lengths=lengths).reshape(-1)  # [N]; 0: abstained
    pg_token_mask = None
    if a.top_entropy_q is not None:  # the policy gradient of the batch's highest-entropy tokens only
        _, entropy = score(samples, temp, with_entropy=True)  # [N, T]
        pg_token_mask = core.top_entropy_mask(entropy, mask, a.top_entropy_q)
    score_seconds = time.perf_counter() - clock
    tokens = samples.response_mask.sum().item()  # the responses' extent, not only the policy's tokens
    stats = {
        # the task's rewards, unshaped
        **rollout_stats(grades.rewards, grades.correct, deltas, a.group_size),  # per response
        **grades.metrics,
        **grades.failures,  # the first failure of each reward function, and an environment's, for the summary
        **stats,  # time/generate, time/reward and the sampler's own numbers
        **shaping,
        "time/score": score_seconds,
        "response_tokens": tokens,
        "response_length": tokens / max(samples.num_episodes, 1),
        "tokens_per_sec_generate": tokens / max(stats["time/generate"], 1e-9),
        **{key: value.item() for key, value in mismatch.items()},
    }
    # Dr. GRPO's constant defaults to the policy's longest possible response, not this batch's width T: with T, one long
    # response would shrink every other token's weight, and the step size would change from epoch to epoch.
    normalizer = policy.max_response_length if a.normalizer is None else a.normalizer
    weights = core.aggregation_weights(mask, a.aggregation, normalizer)  # [N, T]
    solved = None if grades.prompts is None else prompt_solve_shares(grades.prompts, grades.correct)
    return Rollout(samples, samples.per_row(deltas), old_log_probs, ref_log_probs, weights, stats, importance_weights,
                   solved, pg_token_mask)


def old_policy_log_probs(
    a: AlgoConfig, policy: Policy, score: Callable[..., tuple[torch.Tensor, torch.Tensor | None]], samples: Samples,
    temperature: float
) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
    """The old policy's log-probs [N, T], the off-policy correction's weights [N, T] of the policy-gradient term (None
    without one: ``a.off_policy_method``) and the sampler-trainer mismatch with what the correction truncated or masked
    (scalar tensors, only when recomputed); call under no_grad. Recomputed by ``score`` (``Learner.log_probs``), pi /
    pi_old compares the trainer with itself, and the recorded log-probs measure (and, with a correction, correct) the
    sampler's gap. TrainingError when a correction masks every policy token of the batch: the steps would train nothing.
    """
    recorded = samples.sample_log_probs  # [N, T], or None: the policy records none
    method = a.off_policy_method
    named = f"algo.is_correction={method}" if a.is_correction else f"algo.tis_cap={a.tis_cap}"
    recompute = a.old_log_probs == "recompute" or (
        a.old_log_probs == "auto" and (method is not None or not sampler_log_probs_exact(policy)))
    if recorded is not None and not recompute:
        return recorded, None, {}
    old_log_probs, _ = score(samples, temperature)  # [N, T]
    if recorded is None:
        if method is not None:
            raise TrainingError(f"{named}: the weights pi_old / pi_sampler need the sampler's log-probs, and this "
                                "policy records none (sample_log_probs is None)")
        return old_log_probs, None, {}
    mask, dtype = samples.policy_mask, old_log_probs.dtype  # [N, T]: only the policy's tokens are weighted
    mismatch = {
        "mismatch/k3": core.mismatch_k3(old_log_probs, recorded, mask),
        "mismatch/max_abs_gap": core.max_abs_log_prob_gap(old_log_probs, recorded, mask),
    }
    if method is None:
        return old_log_probs, None, mismatch
    correction = core.off_policy_correction(method, old_log_probs, recorded, mask, cap=a.tis_cap, low=a.is_low,
                                            high=a.is_high)
    if bool(mask.any()) and bool(correction.masked[mask].all()):
        if method in core.CAP_MASKING_CORRECTIONS:
            outside, widen = f"their responses' ratios above algo.tis_cap={a.tis_cap:g}", "raise the cap"
        else:
            low = 1.0 / a.is_high if a.is_low is None else a.is_low
            outside, widen = f"their ratios pi_old / pi_sampler outside [{low:g}, {a.is_high:g}]", "widen the bounds"
        raise TrainingError(f"{named} masked every one of the batch's {int(mask.sum())} policy tokens ({outside}), "
                            f"so the steps would train nothing; {widen} or check that the sampler's log-probs are "
                            "the policy's")
    if a.tis_cap is not None and method not in core.CAP_MASKING_CORRECTIONS:
        # only a cap truncates: without one the share is 0 by construction (icepop's too), and a cap that drops what is
        # above it truncates nothing
        mismatch["mismatch/tis_truncated_frac"] = core.token_fraction(correction.truncated, mask, dtype)
    if method == "seq_tis":
        mismatch["mismatch/seq_truncated_frac"] = core.response_fraction(correction.truncated, mask, dtype)
    if method in core.MASKING_CORRECTIONS + core.CAP_MASKING_CORRECTIONS:
        mismatch["mismatch/masked_token_frac"] = core.token_fraction(correction.masked, mask, dtype)
        mismatch["mismatch/masked_seq_frac"] = core.response_fraction(correction.masked, mask, dtype)
    return old_log_probs, correction.weights, mismatch


def rollout_stats(rewards: torch.Tensor, correct: torch.Tensor, deltas: torch.Tensor, group_size: int) -> Record:
    """Per-epoch numbers about the sampled batch: rewards, correct [B, G] (a NaN reward abstained), deltas [N]. With
    abstentions the reward's mean and std are over the scored rewards only."""
    flat = rewards.reshape(-1)  # [N]
    valid = torch.isfinite(flat)
    scored = flat if bool(valid.all()) else flat[valid]
    mean = scored.mean() if scored.numel() else flat.new_tensor(math.nan)
    std = scored.std() if scored.numel() > 1 else flat.new_tensor(0.0)
    zero_groups = (deltas.reshape(-1, group_size) == 0).all(dim=1)  # [B]
    columns = [mean, std, correct.float().mean(), zero_groups.float().mean(), valid.float().mean()]
    keys = ("reward_mean", "reward_std", "solve_rate", "frac_zero_delta_groups")
    # one tensor, one conversion; the abstained share in Python floats, as 1 - the scored share
    row = torch.stack(columns).tolist()
    return {**dict(zip(keys, row)), "abstain_frac": 1.0 - row[-1]}
