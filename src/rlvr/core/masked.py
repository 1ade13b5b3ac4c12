"""Masked reductions over response tokens.

``mask`` is True (or 1) on the entries that count, e.g. real response tokens.
"""

from __future__ import annotations

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``sum(x * mask)`` over ``dim`` (all dims if None); mask broadcastable to x."""
    masked = torch.where(mask.bool(), x, torch.zeros_like(x))
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``sum(x * mask) / sum(mask)``; a row with no masked entry has mean 0, not NaN. mask broadcastable to x."""
    mask = mask.bool().expand_as(x)
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    total = masked_sum(x, mask, dim)
    return total / count.clamp(min=1).to(total.dtype)


def masked_normalize(x: torch.Tensor, mask: torch.Tensor, normalizer: float, dim: int | None = None) -> torch.Tensor:
    """Masked sum divided by a constant: ``sum(x * mask) / normalizer`` (Dr. GRPO's form)."""
    if normalizer <= 0:
        raise ValueError(f"normalizer must be positive, got {normalizer}")
    return masked_sum(x, mask, dim) / normalizer


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy ``-sum_v p_v log p_v`` over the last axis; logits [..., V] -> [...] (half precision upcast to float32).

    Computed as ``logsumexp(z) - sum softmax(z) * z``, finite for extreme logits and for -inf logits (masked vocabulary
    entries contribute 0).
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    # H is shift-invariant; subtracting the max keeps logsumexp(z) - E[z] from cancelling (at logits 1e4 the float32
    # spacing is 1e-3, which swamped ln 2).
    logits = logits - logits.amax(dim=-1, keepdim=True).detach()
    log_z = torch.logsumexp(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1)
    # 0 * -inf is NaN: replace the logit, not the product, so the gradient stays finite too.
    finite_logits = torch.where(probs > 0, logits, torch.zeros_like(logits))
    return log_z - (probs * finite_logits).sum(dim=-1)
