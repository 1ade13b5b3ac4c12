"""Aggregation of a per-token loss [N, T] into a scalar, as per-token weights.

Shapes: N responses, T response tokens. Every aggregation is a weighted sum ``sum(w * x)`` with weights w [N, T], 0
off the response tokens, so one implementation serves the whole batch (``aggregate_loss``) and micro-batches
(``weighted_sum`` of a slice of the whole batch's weights: accumulated gradients equal the full-batch gradient).

``AGGREGATIONS`` maps each mode to ``(response_mask, normalizer) -> w``: response_mask [N, T] 0/1 in the weights'
dtype, normalizer Dr. GRPO's constant or None, w [N, T] in the same dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlvr.core.registry import lookup


def _normalizer(num_tokens: int, normalizer: float | None) -> float:
    """Dr. GRPO's constant: the given one, else the batch's width T (1 when T = 0)."""
    if normalizer is None:
        return float(max(num_tokens, 1))
    if normalizer <= 0:
        raise ValueError(f"normalizer must be positive, got {normalizer}")
    return normalizer


def seq_mean_token_mean(response_mask: torch.Tensor, normalizer: float | None) -> torch.Tensor:
    """w = 1 / (length of the response * N): mean over each response's tokens, then over responses (GRPO paper; an
    empty response counts as a zero). [N, T] -> [N, T]."""
    num_responses = response_mask.shape[0]
    lengths = response_mask.sum(dim=-1, keepdim=True).clamp(min=1)  # [N, 1]
    return response_mask / lengths / max(num_responses, 1)


def token_mean(response_mask: torch.Tensor, normalizer: float | None) -> torch.Tensor:
    """w = 1 / (number of response tokens in the batch) (DAPO). [N, T] -> [N, T]."""
    return response_mask / response_mask.sum().clamp(min=1)


def seq_mean_token_sum(response_mask: torch.Tensor, normalizer: float | None) -> torch.Tensor:
    """w = 1 / (normalizer * N): sum over each response's tokens / normalizer, then mean over responses (Dr. GRPO).
    [N, T] -> [N, T]. normalizer None: T; the trainer passes the longest possible response, so that a token's weight
    does not depend on the batch's longest response."""
    num_responses = response_mask.shape[0]
    return response_mask / _normalizer(response_mask.shape[-1], normalizer) / max(num_responses, 1)


AGGREGATIONS: dict[str, Callable[[torch.Tensor, float | None], torch.Tensor]] = {
    "seq_mean_token_mean": seq_mean_token_mean,
    "token_mean": token_mean,
    "seq_mean_token_sum": seq_mean_token_sum,
}


def aggregation_weights(response_mask: torch.Tensor, mode: str, normalizer: float | None = None,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Per-token weights w [N, T] = ``AGGREGATIONS[mode]`` of response_mask [N, T] (bool or 0/1). ``dtype``: the
    loss's when wider than float32, or the weights' rounding limits how exactly micro-batches add up."""
    weights_fn = lookup(AGGREGATIONS, mode, "aggregation")
    return weights_fn(response_mask.to(dtype), normalizer)


def weighted_sum(per_token_loss: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``sum(weights * per_token_loss)`` over [N, T]: a micro-batch's share of an aggregated loss. Tokens of weight 0
    are left out, not multiplied, so a non-finite loss on padding does not leak into the sum or its gradient."""
    return torch.where(weights > 0, per_token_loss * weights, 0.0).sum()


def aggregate_loss(per_token_loss: torch.Tensor, response_mask: torch.Tensor, mode: str,
                   normalizer: float | None = None) -> torch.Tensor:
    """A per-token loss [N, T] as a scalar: ``sum(w * x)``, w = ``aggregation_weights`` of response_mask [N, T] in
    the loss's dtype. An empty batch gives 0, not NaN."""
    if per_token_loss.shape != response_mask.shape:
        raise ValueError(f"loss shape {tuple(per_token_loss.shape)} != response_mask shape "
                         f"{tuple(response_mask.shape)}")
    weights = aggregation_weights(response_mask, mode, normalizer, dtype=per_token_loss.dtype)  # [N, T]
    return weighted_sum(per_token_loss, weights)
