"""The optimizer step, one implementation for every learner: the gradient accumulated over micro-batches, the step's
sums and metrics, clipping, skipping non-finite steps, and the gradient-noise meter's parts.

A learner in this process (``rlvr.loop.seams.LocalLearner``) and each data-parallel learner (``rlvr.cluster.learners``)
call ``optimizer_step``; a data-parallel learner hands it the backward pass of its share summed over the group
(``gradients``), and everything after the sum is the same code. Shapes: N responses, T response tokens; n rows of a
micro-batch.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from rlvr import core
from rlvr.batch.interfaces import Policy
from rlvr.batch.record import Record
from rlvr.batch.rollout import Rollout, contiguous_bounds
from rlvr.config import Config
from rlvr.loop.diagnostics import GradientNoiseMeter, flat_grad
from rlvr.loop.optim import clear_grads, optimizer_update
from rlvr.loop.state import TrainingError, TrainState

logger = logging.getLogger(__name__)

Gradients = Callable[[GradientNoiseMeter | None], dict[str, torch.Tensor]]


def optimizer_step(config: Config, st: TrainState, rollout: Rollout, measure_noise: bool | None = None,
                   gradients: Gradients | None = None) -> Record:
    """One optimizer step on the epoch's rollout, skipped when anything is not finite. ``measure_noise``: None:
    ``noise_due``. ``gradients``: fills each parameter's ``.grad`` with the batch's gradient and returns the step's
    sums, given the noise meter (default: ``accumulate_gradients`` over ``rollout``)."""
    clock = time.perf_counter()
    clear_grads(st.optimizer)
    meter = GradientNoiseMeter() if (noise_due(config, st) if measure_noise is None else measure_noise) else None
    if gradients is None:
        sums = accumulate_gradients(config, st.policy, rollout, config.optim.micro_batches, meter)
    else:
        sums = gradients(meter)
    metrics = step_metrics(sums, whole(clip_gradients(st.policy.module, config.optim.max_grad_norm)))
    skipped = not all(math.isfinite(v) for v in metrics.values())
    if skipped:
        skip_step(st, st.policy.module, metrics, config.optim.max_bad_steps)
    else:
        optimizer_update(st.optimizer)
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
    """Does this step measure the gradient's noise? The first step of every ``log.grad_noise_every``-th epoch."""
    every = config.log.grad_noise_every
    return bool(every) and st.inner_step == 0 and st.epoch % every == 0


def accumulate_gradients(config: Config, policy: Policy, rollout: Rollout, num_micro_batches: int,
                         meter: GradientNoiseMeter | None = None, batch: Rollout | None = None
                         ) -> dict[str, torch.Tensor]:
    """Backpropagate the loss of ``rollout`` in micro-batches into each parameter's ``.grad``; returns the step's sums
    (``step_sums``, added up). ``meter``: measure the gradient's noise, over at least ``log.grad_noise_parts`` parts of
    whole groups. ``batch``: the whole batch when ``rollout`` is a learner's share of it."""
    a, temp = config.algo, config.policy.temperature
    sums: dict[str, torch.Tensor] = {}
    if meter is None:
        parts = micro_batches(rollout, num_micro_batches)
    else:
        parts = group_parts(rollout, max(num_micro_batches, config.log.grad_noise_parts), a.group_size)
    entropy_args = {"with_entropy": config.log.entropy or a.entropy_coef > 0,
                    **({"entropy_grad": True} if a.entropy_coef > 0 else {})}
    for mb in parts:
        policy_mask = mb.samples.policy_mask  # [n, T]: only the policy's tokens train
        log_probs, entropy = policy.log_probs(mb.samples, temp, **entropy_args)  # [n, T]
        pg, stats = core.policy_loss(log_probs, mb.deltas, a.loss, mb.old_log_probs, a.clip_eps, a.clip_eps_high,
                                     clip_ratio_c=a.clip_ratio_c, response_mask=policy_mask)
        if mb.importance_weights is not None:
            # The off-policy correction (algo.is_correction, tis_cap): the tokens came from the sampler, not pi_old; w
            # is a constant (min(pi_old / pi_sampler, C) for TIS, 0 on masked tokens) of the policy-gradient term only:
            # the KL term and the aggregation's normaliser keep every token.
            pg = pg * mb.importance_weights
        if mb.pg_token_mask is not None:
            # The top-entropy selection removes the other tokens' policy-gradient terms; the weights keep every token,
            # so the normaliser and the KL term are those of the whole response (as the method).
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
        for key, value in step_sums(mb.weights, policy_mask, loss, pg, kl, stats["clipped"], entropy).items():
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
    """The size, in prompts, of a part of ``batch`` for the noise meter: the part carries size / B of the batch's loss
    (by responses under the sequence-mean aggregations, by loss weight under token_mean)."""
    if aggregation == "token_mean":
        prompts = batch.samples.num_episodes / group_size
        return (part.weights.sum() / batch.weights.sum()).item() * prompts
    if batch.samples.episodes is None:
        return part.samples.num_responses / group_size
    # a row's share of a sequence-mean loss is 1 / R: the part's rows' share of the batch's prompts
    return part.samples.num_responses * batch.samples.num_episodes / (batch.samples.num_responses * group_size)


@torch.no_grad()
def step_sums(w, policy_mask, loss, pg, kl, clipped, entropy) -> dict[str, torch.Tensor]:
    """One micro-batch's sums, to be added over the step's micro-batches; all [n, T]. loss and pg_loss are weighted with
    w; kl, clip_frac and entropy are plain sums over the policy's tokens, counted in ``tokens``, for token means as TRL
    and verl report them."""
    kl = torch.zeros_like(pg) if kl is None else kl
    return {
        "loss": loss.detach(),
        "pg_loss": core.weighted_sum(pg, w),
        "kl": core.masked_sum(kl, policy_mask),
        "clip_frac": core.masked_sum(clipped.to(pg.dtype), policy_mask),
        **({} if entropy is None else {"entropy": core.masked_sum(entropy, policy_mask)}),
        "tokens": policy_mask.sum(),
    }


def step_metrics(sums: dict[str, torch.Tensor], grad_norm: torch.Tensor) -> dict[str, float]:
    """The step's named numbers from the micro-batch sums: loss and pg_loss as summed; kl, clip_frac and entropy divided
    by the batch's token count once, so micro-batching does not change them; the gradient norm."""
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
    clear_grads(st.optimizer)
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
    starts = rollout.samples.group_rows(group_size).tolist()  # [B + 1]: each group's first row
    groups = len(starts) - 1
    return [rollout.rows(slice(starts[start], starts[stop]))
            for start, stop in contiguous_bounds(groups, min(count, groups))]


def micro_batches(rollout: Rollout, count: int) -> list[Rollout]:
    """``count`` parts of ``rollout`` (contiguous rows, so views, not copies)."""
    if count == 1:
        return [rollout]
    n = rollout.samples.num_responses
    size = -(-n // count)  # ceil, as torch.chunk
    return [rollout.rows(slice(start, start + size)) for start in range(0, n, size)]


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


def whole(x: Any) -> Any:
    """A sharded DTensor (an FSDP learner's) gathered whole; a plain tensor or value as it is."""
    return x.full_tensor() if hasattr(x, "full_tensor") else x
