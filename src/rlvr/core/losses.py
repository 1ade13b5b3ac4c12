"""Per-token policy-gradient losses and their aggregation.

Shapes: N responses, T response tokens. ``log_probs`` [N, T] are log pi(a_t | s_t) of
the sampled tokens under the current policy; ``deltas`` are per response, [N] or
[N, 1], and apply to every token of the response (outcome reward: credit is spread
evenly over positions).
"""

from __future__ import annotations

import torch

from rlvr.core.masked import masked_mean, masked_normalize

LOSS_MODES = ("naive", "ratio", "clipped")
AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum")


def _per_response(deltas: torch.Tensor, n: int) -> torch.Tensor:
    if deltas.dim() == 1:
        deltas = deltas.unsqueeze(-1)
    if deltas.dim() != 2 or deltas.shape != (n, 1):
        raise ValueError(f"deltas must be [N] or [N, 1] with N={n}, got {tuple(deltas.shape)}")
    return deltas


def policy_loss(
    log_probs: torch.Tensor,
    deltas: torch.Tensor,
    mode: str,
    old_log_probs: torch.Tensor | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss whose gradient is the (clipped, importance-weighted) policy gradient.

    naive:   -delta * log_prob
    ratio:   -delta * ratio,  ratio = exp(log_prob - old_log_prob)  (pi / pi_old)
    clipped: -min(ratio * delta, clip(ratio, 1 - clip_eps, 1 + clip_eps_high) * delta)

    ``old_log_probs`` must be constants (sampled under no_grad): they are detached here
    too, because a ratio whose denominator carries gradient is identically 1 and its
    gradient silently 0. Returns (per_token_loss [N, T], stats) where stats holds
    ``ratio`` [N, T] and ``clipped`` [N, T] bool (tokens whose gradient the clip removed).
    """
    if mode not in LOSS_MODES:
        raise ValueError(f"unknown loss mode {mode!r}; allowed: {', '.join(LOSS_MODES)}")
    deltas = _per_response(deltas, log_probs.shape[0]).to(log_probs.dtype).detach()
    if mode == "naive":
        loss = -deltas * log_probs
        ones = torch.ones_like(log_probs).detach()
        return loss, {"ratio": ones, "clipped": torch.zeros_like(log_probs, dtype=torch.bool)}
    if old_log_probs is None:
        raise ValueError(f"loss mode {mode!r} needs old_log_probs")
    if old_log_probs.shape != log_probs.shape:
        raise ValueError(
            f"old_log_probs shape {tuple(old_log_probs.shape)} != log_probs shape {tuple(log_probs.shape)}"
        )
    ratio = torch.exp(log_probs - old_log_probs.detach())
    unclipped = ratio * deltas
    if mode == "ratio":
        return -unclipped, {"ratio": ratio.detach(), "clipped": torch.zeros_like(ratio, dtype=torch.bool)}
    high = clip_eps if clip_eps_high is None else clip_eps_high
    clipped_obj = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high) * deltas
    objective = torch.minimum(unclipped, clipped_obj)
    # A token is clipped when the min picks the clipped branch and that branch is flat.
    was_clipped = (clipped_obj < unclipped) & ((ratio < 1.0 - clip_eps) | (ratio > 1.0 + high))
    return -objective, {"ratio": ratio.detach(), "clipped": was_clipped.detach()}


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    normalizer: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss [N, T] to a scalar over the masked tokens.

    seq_mean_token_mean: mean over each response's tokens, then mean over responses
                         (GRPO paper; long responses weigh less per token)
    token_mean:          sum over all tokens / number of tokens (DAPO)
    seq_mean_token_sum:  sum over each response's tokens / normalizer, then mean over
                         responses (Dr. GRPO). None: T, this batch's padded width; pass a
                         constant (the trainer passes the longest possible response) so
                         a token's weight does not depend on the batch's longest response.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; allowed: {', '.join(AGGREGATIONS)}")
    if per_token_loss.shape != mask.shape:
        raise ValueError(f"loss shape {tuple(per_token_loss.shape)} != mask shape {tuple(mask.shape)}")
    n = max(per_token_loss.shape[0], 1)  # sum / max(N, 1), not .mean(): N = 0 gives 0, not NaN
    if mode == "token_mean":
        return masked_mean(per_token_loss, mask)
    if mode == "seq_mean_token_mean":
        return masked_mean(per_token_loss, mask, dim=-1).sum() / n
    norm = _normalizer(per_token_loss.shape[-1], normalizer)
    return masked_normalize(per_token_loss, mask, norm, dim=-1).sum() / n


def _normalizer(max_len: int, normalizer: float | None) -> float:
    """Dr. GRPO's constant: the given one, else the batch's width T (1 when T = 0:
    there is nothing to sum)."""
    if normalizer is None:
        return float(max(max_len, 1))
    if normalizer <= 0:
        raise ValueError(f"normalizer must be positive, got {normalizer}")
    return normalizer


def aggregation_weights(
    mask: torch.Tensor,
    mode: str,
    normalizer: float | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Per-token weights w [N, T] such that ``aggregate_loss(x) == sum(w * x)`` over the batch.

    Used for micro-batching: a micro-batch's loss is ``sum(w[mb] * x[mb])`` with w
    computed on the whole batch, so accumulated gradients equal the full-batch gradient.
    ``dtype``: pass the loss's dtype when it is wider than float32 (e.g. float64), or the
    weights' rounding limits how exactly the two gradients agree.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; allowed: {', '.join(AGGREGATIONS)}")
    maskf = mask.to(dtype)
    n = mask.shape[0]
    if mode == "token_mean":
        return maskf / maskf.sum().clamp(min=1)
    if mode == "seq_mean_token_mean":
        return maskf / maskf.sum(dim=-1, keepdim=True).clamp(min=1) / max(n, 1)
    return maskf / _normalizer(mask.shape[-1], normalizer) / max(n, 1)


def weighted_sum(per_token_loss: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``sum(weights * per_token_loss)``: the micro-batch share of an aggregated loss."""
    return torch.where(weights > 0, per_token_loss * weights, 0.0).sum()
