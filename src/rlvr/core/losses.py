"""Per-token policy-gradient losses.

Shapes: N responses, T response tokens. ``log_probs`` [N, T] are log pi(a_t | s_t) of
the sampled tokens under the current policy; ``deltas`` are per response, [N] or
[N, 1], and apply to every token of the response (outcome reward: credit is spread
evenly over positions).

``LOSS_MODES`` maps each mode to its function
``(log_probs, deltas, old_log_probs, clip_eps, clip_eps_high) -> (per_token_loss, stats)``
with log_probs [N, T], deltas [N, 1] (constants, in the dtype of log_probs),
old_log_probs [N, T] or None, per_token_loss [N, T] and stats ``ratio`` [N, T] (detached)
and ``clipped`` [N, T] bool (tokens whose gradient the clip removed).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlvr.core.registry import lookup

LossStats = dict[str, torch.Tensor]
# (log_probs, deltas, old_log_probs, clip_eps, clip_eps_high) -> (per_token_loss, stats)
LossFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor | None, float, float | None], tuple[torch.Tensor, LossStats]
]


def _per_response(deltas: torch.Tensor, num_responses: int) -> torch.Tensor:
    """deltas [N] or [N, 1] -> [N, 1], N = ``num_responses``."""
    if deltas.dim() == 1:
        deltas = deltas.unsqueeze(-1)
    if deltas.dim() != 2 or deltas.shape != (num_responses, 1):
        raise ValueError(f"deltas must be [N] or [N, 1] with N={num_responses}, got {tuple(deltas.shape)}")
    return deltas


def _ratio(log_probs: torch.Tensor, old_log_probs: torch.Tensor | None, mode: str) -> torch.Tensor:
    """ratio = pi / pi_old = exp(log_prob - old_log_prob); [N, T] each -> [N, T].

    ``old_log_probs`` must be constants (sampled under no_grad): they are detached here
    too, because a ratio whose denominator carries gradient is identically 1 and its
    gradient silently 0.
    """
    if old_log_probs is None:
        raise ValueError(f"loss mode {mode!r} needs old_log_probs")
    if old_log_probs.shape != log_probs.shape:
        raise ValueError(
            f"old_log_probs shape {tuple(old_log_probs.shape)} != log_probs shape {tuple(log_probs.shape)}"
        )
    return torch.exp(log_probs - old_log_probs.detach())


def _no_clip(ratio: torch.Tensor) -> torch.Tensor:
    """``clipped`` stat of an unclipped loss: all False, [N, T]."""
    return torch.zeros_like(ratio, dtype=torch.bool)


def naive_loss(
    log_probs: torch.Tensor,
    deltas: torch.Tensor,
    old_log_probs: torch.Tensor | None,
    clip_eps: float,
    clip_eps_high: float | None,
) -> tuple[torch.Tensor, LossStats]:
    """loss = -delta * log_prob; [N, T] (ratio reported as 1, nothing clipped).

    Its gradient -delta * grad log pi is the policy gradient at pi = pi_old.
    """
    loss = -deltas * log_probs
    ones = torch.ones_like(log_probs).detach()
    return loss, {"ratio": ones, "clipped": _no_clip(log_probs)}


def ratio_loss(
    log_probs: torch.Tensor,
    deltas: torch.Tensor,
    old_log_probs: torch.Tensor | None,
    clip_eps: float,
    clip_eps_high: float | None,
) -> tuple[torch.Tensor, LossStats]:
    """loss = -delta * ratio, ratio = exp(log_prob - old_log_prob) (pi / pi_old); [N, T]."""
    ratio = _ratio(log_probs, old_log_probs, "ratio")
    return -(ratio * deltas), {"ratio": ratio.detach(), "clipped": _no_clip(ratio)}


def clipped_loss(
    log_probs: torch.Tensor,
    deltas: torch.Tensor,
    old_log_probs: torch.Tensor | None,
    clip_eps: float,
    clip_eps_high: float | None,
) -> tuple[torch.Tensor, LossStats]:
    """loss = -min(ratio * delta, clip(ratio, 1 - clip_eps, 1 + clip_eps_high) * delta); [N, T].

    PPO's clipped surrogate; ``clip_eps_high`` None means ``clip_eps`` (symmetric clip).
    """
    ratio = _ratio(log_probs, old_log_probs, "clipped")
    unclipped = ratio * deltas
    high = clip_eps if clip_eps_high is None else clip_eps_high
    clipped_obj = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high) * deltas
    objective = torch.minimum(unclipped, clipped_obj)
    # A token is clipped when the min picks the clipped branch and that branch is flat.
    was_clipped = (clipped_obj < unclipped) & ((ratio < 1.0 - clip_eps) | (ratio > 1.0 + high))
    return -objective, {"ratio": ratio.detach(), "clipped": was_clipped.detach()}


LOSS_MODES: dict[str, LossFn] = {"naive": naive_loss, "ratio": ratio_loss, "clipped": clipped_loss}


def policy_loss(
    log_probs: torch.Tensor,
    deltas: torch.Tensor,
    mode: str,
    old_log_probs: torch.Tensor | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss whose gradient is the (clipped, importance-weighted) policy gradient.

    ``LOSS_MODES[mode]`` with log_probs [N, T], deltas [N] or [N, 1] (detached here: they
    are constants, not trained by the policy loss), old_log_probs [N, T] (needed by
    ``ratio`` and ``clipped``; detached too). Returns (per_token_loss [N, T], stats) where
    stats holds ``ratio`` [N, T] and ``clipped`` [N, T] bool.
    """
    loss_fn = lookup(LOSS_MODES, mode, "loss mode")
    deltas = _per_response(deltas, log_probs.shape[0]).to(log_probs.dtype).detach()  # [N, 1]
    return loss_fn(log_probs, deltas, old_log_probs, clip_eps, clip_eps_high)
