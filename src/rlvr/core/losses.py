"""Per-token policy-gradient losses.

Shapes: N responses, T response tokens. ``log_probs`` [N, T] are log pi(a_t | s_t) of the sampled tokens under the
current policy; ``deltas`` [N] or [N, 1] apply to every token of their response (outcome reward), or [N, T] one per
token (per-token advantages, as a Tinker client sends them).

``LOSS_MODES`` maps each mode to ``LossInputs -> (per_token_loss [N, T], stats)``, stats ``ratio`` [N, T] (detached)
and ``clipped`` [N, T] bool: the tokens whose term the clip changed (their gradient is 0, but for ``cispo``, which
scales it by the clipped weight).

Modes: ``naive`` and ``ratio`` (the plain policy gradient, on- and off-policy), ``clipped`` (PPO), ``dual_clip`` (PPO
with a floor on negative deltas), ``gspo`` (one clipped ratio per response), ``cispo`` (REINFORCE with a clipped,
detached weight). ``entropy_bonus`` is a per-token term to add to any of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlvr.core.masked import masked_mean
from rlvr.core.registry import lookup

LossStats = dict[str, torch.Tensor]


@dataclass(frozen=True)
class LossInputs:
    """What every loss mode reads; each mode uses the fields it needs."""

    log_probs: torch.Tensor  # [N, T], carries the gradient
    deltas: torch.Tensor  # [N, 1] or [N, T], constants in the dtype of log_probs
    old_log_probs: torch.Tensor | None  # [N, T], pi_old's; every mode but naive needs them
    clip_eps: float | None  # the ratio's lower clip range (None: no lower clip)
    clip_eps_high: float | None  # its upper clip range (None: clip_eps)
    clip_ratio_c: float  # dual_clip's floor on negative deltas, > 1
    response_mask: torch.Tensor | None  # [N, T] bool; gspo needs it


LossFn = Callable[[LossInputs], tuple[torch.Tensor, LossStats]]


def _log_ratio(x: LossInputs, mode: str) -> torch.Tensor:
    """log(pi / pi_old) = log_prob - old_log_prob; [N, T] each -> [N, T]. ``old_log_probs`` are detached here too:
    a ratio whose denominator carries gradient is identically 1 and its gradient silently 0."""
    log_probs, old_log_probs = x.log_probs, x.old_log_probs
    if old_log_probs is None:
        raise ValueError(f"loss mode {mode!r} needs old_log_probs")
    if old_log_probs.shape != log_probs.shape:
        raise ValueError(f"old_log_probs shape {tuple(old_log_probs.shape)} != log_probs shape "
                         f"{tuple(log_probs.shape)}")
    return log_probs - old_log_probs.detach()


def _ratio(x: LossInputs, mode: str) -> torch.Tensor:
    """ratio = pi / pi_old = exp(log_prob - old_log_prob); [N, T] each -> [N, T]."""
    return torch.exp(_log_ratio(x, mode))


def _clip_range(x: LossInputs) -> tuple[float, float]:
    """The ratio's range [1 - clip_eps, 1 + clip_eps_high] (``clip_eps_high`` None: ``clip_eps``); ``clip_eps``
    None: no lower clip (the range starts at 0), and then ``clip_eps_high`` must be given."""
    clip_eps, clip_eps_high = x.clip_eps, x.clip_eps_high
    if clip_eps is None:
        if clip_eps_high is None:
            raise ValueError("clip_eps None (no lower clip) needs clip_eps_high")
        return 0.0, 1.0 + clip_eps_high
    return 1.0 - clip_eps, 1.0 + (clip_eps if clip_eps_high is None else clip_eps_high)


def _clipped_objective(ratio: torch.Tensor, deltas: torch.Tensor, low: float, high: float
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's min(ratio * delta, clip(ratio, low, high) * delta) [N, T], and the tokens whose gradient the clip
    removed [N, T] bool; ratio [N, T], deltas [N, 1]."""
    unclipped = ratio * deltas
    clipped_obj = torch.clamp(ratio, low, high) * deltas
    objective = torch.minimum(unclipped, clipped_obj)
    # A token is clipped when the min picks the clipped branch and that branch is flat.
    was_clipped = (clipped_obj < unclipped) & ((ratio < low) | (ratio > high))
    return objective, was_clipped


def _no_clip(ratio: torch.Tensor) -> torch.Tensor:  # the ``clipped`` stat of an unclipped loss
    return torch.zeros_like(ratio, dtype=torch.bool)


def naive_loss(x: LossInputs) -> tuple[torch.Tensor, LossStats]:
    """loss = -delta * log_prob; [N, T] (ratio reported as 1): the policy gradient at pi = pi_old."""
    loss = -x.deltas * x.log_probs
    ones = torch.ones_like(x.log_probs).detach()
    return loss, {"ratio": ones, "clipped": _no_clip(x.log_probs)}


def ratio_loss(x: LossInputs) -> tuple[torch.Tensor, LossStats]:
    """loss = -delta * ratio, ratio = exp(log_prob - old_log_prob) (pi / pi_old); [N, T]."""
    ratio = _ratio(x, "ratio")
    return -(ratio * x.deltas), {"ratio": ratio.detach(), "clipped": _no_clip(ratio)}


def clipped_loss(x: LossInputs) -> tuple[torch.Tensor, LossStats]:
    """PPO: loss = -min(ratio * delta, clip(ratio, 1 - clip_eps, 1 + clip_eps_high) * delta); [N, T]."""
    ratio = _ratio(x, "clipped")
    objective, was_clipped = _clipped_objective(ratio, x.deltas, *_clip_range(x))
    return -objective, {"ratio": ratio.detach(), "clipped": was_clipped.detach()}


def dual_clip_loss(x: LossInputs) -> tuple[torch.Tensor, LossStats]:
    """Dual-clip PPO; [N, T]:

        objective = max(min(ratio * delta, clip(ratio, 1 - clip_eps, 1 + clip_eps_high) * delta), c * delta)
                    where delta < 0, the clipped objective where delta >= 0;   loss = -objective

    c = ``clip_ratio_c`` > 1. For delta < 0 the plain clip leaves min(...) = ratio * delta unbounded below as the
    ratio grows: one token the policy now finds far likelier can dominate the step. The floor c * delta caps its
    loss at -c * delta and its gradient at 0; it binds exactly where ratio > c. ``clipped``: either clip's tokens.
    """
    if not x.clip_ratio_c > 1.0:
        raise ValueError(f"dual_clip needs clip_ratio_c > 1 (the floor c * delta on negative deltas), "
                         f"got {x.clip_ratio_c}")
    ratio = _ratio(x, "dual_clip")
    objective, was_clipped = _clipped_objective(ratio, x.deltas, *_clip_range(x))
    floor = x.clip_ratio_c * x.deltas  # [N, 1] or [N, T]
    floored = (x.deltas < 0) & (floor > objective)  # [N, T]
    objective = torch.where(floored, floor, objective)
    return -objective, {"ratio": ratio.detach(), "clipped": (was_clipped | floored).detach()}


def gspo_loss(x: LossInputs) -> tuple[torch.Tensor, LossStats]:
    """GSPO: one clipped ratio per response, on every one of its tokens; [N, T]:

        s_i = exp(mean over response i's tokens of (log_prob - old_log_prob))     [N, 1]
        loss_i,t = -min(s_i * delta_i, clip(s_i, 1 - clip_eps, 1 + clip_eps_high) * delta_i)

    s_i is the length-normalised sequence ratio (pi(y_i) / pi_old(y_i))^(1 / |y_i|), over real tokens only
    (``response_mask``); the clip keeps or drops whole responses. Sequence ratios sit much closer to 1 than token
    ratios: GSPO's clip ranges are small (3e-4 / 4e-4 in the paper).

    Computed in the per-token form s_i,t = sg(s_i) * pi_t / sg(pi_t): the value is s_i at every token, and token t's
    gradient is s_i * delta_i * grad log pi_t (per-token deltas [N, T]: delta_i,t on token t). With weights constant
    over a response's tokens (every aggregation) this is exactly the sequence-level gradient, since
    sum_t grad log pi_t / |y_i| = grad log s_i; a per-token weight (TIS, a token selection) acts on its own token.
    With seq_mean_token_mean the loss is the paper's -mean_i min(s_i delta_i, clip(s_i) delta_i).
    ``clipped``: every token of a clipped response.
    """
    if x.response_mask is None:
        raise ValueError("loss mode 'gspo' needs response_mask: its ratio is a mean over each response's tokens")
    log_ratio = _log_ratio(x, "gspo")  # [N, T]
    seq_log_ratio = masked_mean(log_ratio.detach(), x.response_mask, dim=-1).unsqueeze(-1)  # [N, 1]
    # log_probs - log_probs.detach() is exactly 0 in value and carries token t's gradient.
    ratio = torch.exp(seq_log_ratio + (x.log_probs - x.log_probs.detach()))  # [N, T], s_i on row i
    objective, was_clipped = _clipped_objective(ratio, x.deltas, *_clip_range(x))
    return -objective, {"ratio": ratio.detach(), "clipped": was_clipped.detach()}


def cispo_loss(x: LossInputs) -> tuple[torch.Tensor, LossStats]:
    """CISPO: loss = -sg(clip(ratio, 1 - clip_eps, 1 + clip_eps_high)) * delta * log_prob; [N, T].

    REINFORCE with a truncated importance weight: the gradient -clip(ratio) * delta * grad log pi keeps every token,
    however far its ratio (PPO's clip zeroes those, often the rare high-information ones). The weight is a constant
    (sg = detach). The paper bounds only the top, as TRL does: clip_eps None gives clip(ratio, 0, 1 + clip_eps_high).
    ``clipped``: the tokens whose weight the clip changed. The loss's value is no surrogate; its gradient is the point.
    """
    ratio = _ratio(x, "cispo").detach()
    low, high = _clip_range(x)
    weight = torch.clamp(ratio, low, high)  # [N, T], a constant
    return -(weight * x.deltas) * x.log_probs, {"ratio": ratio, "clipped": (ratio < low) | (ratio > high)}


LOSS_MODES: dict[str, LossFn] = {
    "naive": naive_loss,
    "ratio": ratio_loss,
    "clipped": clipped_loss,
    "dual_clip": dual_clip_loss,
    "gspo": gspo_loss,
    "cispo": cispo_loss,
}


def policy_loss(log_probs: torch.Tensor, deltas: torch.Tensor, mode: str, old_log_probs: torch.Tensor | None = None,
                clip_eps: float | None = 0.2, clip_eps_high: float | None = None, *, clip_ratio_c: float = 3.0,
                response_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``LOSS_MODES[mode]``: per-token loss [N, T] whose gradient is the (clipped, importance-weighted) policy
    gradient, and stats ``ratio``, ``clipped`` [N, T]. log_probs [N, T]; deltas [N], [N, 1] or [N, T] and
    old_log_probs [N, T] (every mode but ``naive``) are detached; response_mask [N, T] bool (``gspo``)."""
    loss_fn = lookup(LOSS_MODES, mode, "loss mode")
    if deltas.dim() == 1:
        deltas = deltas.unsqueeze(-1)  # [N] -> [N, 1]
    if deltas.shape not in ((log_probs.shape[0], 1), log_probs.shape):
        raise ValueError(f"deltas must be [N], [N, 1] or [N, T] with [N, T]={list(log_probs.shape)}, "
                         f"got {tuple(deltas.shape)}")
    deltas = deltas.to(log_probs.dtype).detach()  # [N, 1] or [N, T]
    if response_mask is not None and response_mask.shape != log_probs.shape:
        raise ValueError(f"response_mask shape {tuple(response_mask.shape)} != log_probs shape "
                         f"{tuple(log_probs.shape)}")
    return loss_fn(LossInputs(log_probs, deltas, old_log_probs, clip_eps, clip_eps_high, clip_ratio_c, response_mask))


def entropy_bonus(entropy: torch.Tensor, coef: float) -> torch.Tensor:
    """Per-token loss term -coef * H_t; entropy [N, T] (carrying the gradient) -> [N, T]. Minimising it raises the
    entropy. coef >= 0: a negative one would be an entropy penalty, almost surely a sign mistake."""
    if not coef >= 0:
        raise ValueError(f"entropy bonus coef must be >= 0, got {coef}")
    return -coef * entropy
