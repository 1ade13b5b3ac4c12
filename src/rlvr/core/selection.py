"""Which groups, responses and tokens train: selections and a length penalty.

Shapes: B prompts, G responses per prompt (N = B*G, row ``b * G + g`` is response g of prompt b), T response tokens.
``response_mask`` [N, T] bool is True on real response tokens.

- ``nonzero_delta_groups``: the groups that carry a gradient (DAPO's dynamic sampling drops the others).
- ``overlong_mask``: the response mask without truncated responses (DAPO's overlong filtering).
- ``overlong_penalty``: DAPO's soft length penalty, added to the rewards.
- ``top_entropy_mask``: the highest-entropy fraction of the batch's response tokens ("Beyond the 80/20 rule").
"""

from __future__ import annotations

import math

import torch


def nonzero_delta_groups(deltas: torch.Tensor, group_size: int) -> torch.Tensor:
    """True for each group with a nonzero delta: deltas [N] -> [B] bool. A group whose deltas are all 0 contributes
    no gradient; a constant group's centered deltas are exactly 0 (``compute_deltas``), so no tolerance is needed."""
    if group_size <= 0:
        raise ValueError(f"group_size must be positive, got {group_size}")
    if deltas.dim() != 1 or deltas.shape[0] % group_size:
        raise ValueError(f"deltas must be [N] with N a multiple of group_size={group_size}, "
                         f"got shape {tuple(deltas.shape)}")
    return (deltas.reshape(-1, group_size) != 0).any(dim=1)  # [B, G] -> [B]


def overlong_mask(truncated: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``response_mask`` [N, T] with the rows of truncated [N] responses set False (a response cut off has no final
    answer). Apply it before ``aggregation_weights`` so the removed tokens leave the denominators too."""
    if truncated.dim() != 1 or response_mask.dim() != 2 or truncated.shape[0] != response_mask.shape[0]:
        raise ValueError(f"truncated must be [N] and response_mask [N, T], got {tuple(truncated.shape)} "
                         f"and {tuple(response_mask.shape)}")
    return response_mask.bool() & ~truncated.bool().unsqueeze(-1)


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int, factor: float,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """DAPO's soft length penalty, to add to the rewards: lengths [N] (response tokens) -> [N] <= 0.

        penalty = 0                                       for L <= max_len - cache_len
                  -factor * (L - (max_len - cache_len)) / cache_len   in between
                  -factor                                 for L >= max_len

    Graded rather than a cliff, so a response just past the soft limit is barely penalised.
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(f"overlong penalty needs 0 < cache_len <= max_len, got cache_len={cache_len}, "
                         f"max_len={max_len}")
    if not factor >= 0:
        raise ValueError(f"overlong penalty factor must be >= 0, got {factor}")
    excess = (lengths.to(torch.float64) - (max_len - cache_len)) / cache_len
    return (-factor * excess.clamp(min=0.0, max=1.0)).to(dtype)


def top_entropy_mask(entropy: torch.Tensor, response_mask: torch.Tensor, q: float) -> torch.Tensor:
    """The ceil(q * n) highest-entropy tokens among the n response tokens of the whole batch (not a micro-batch: the
    threshold is the batch's): entropy, response_mask [N, T] -> [N, T] bool, a subset of ``response_mask``. Ties go
    to the earlier position, so the selection is deterministic. q in (0, 1]; ``entropy`` finite on response tokens.
    """
    if not 0 < q <= 1:
        raise ValueError(f"top-entropy fraction q must be in (0, 1], got {q}")
    if entropy.shape != response_mask.shape or entropy.dim() != 2:
        raise ValueError(f"entropy {tuple(entropy.shape)} and response_mask {tuple(response_mask.shape)} "
                         "must have one shape [N, T]")
    response_mask = response_mask.bool()
    keys = torch.where(response_mask, entropy.detach(), -math.inf).flatten()  # padding ranks last
    order = torch.sort(keys, descending=True, stable=True).indices  # stable: ties keep position order
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    num_tokens = response_mask.sum().clamp(min=1).to(torch.float64)
    # rank / n < q keeps ranks 0 .. ceil(q n) - 1: a correctly rounded division compared with q, not rank < q * n,
    # whose rounding (0.07 * 100 = 7.000000000000001) keeps one more.
    return response_mask & (rank.reshape(entropy.shape).to(torch.float64) / num_tokens < q)
