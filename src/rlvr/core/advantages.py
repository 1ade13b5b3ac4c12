"""Deltas from rewards: the factor that multiplies grad log pi(a|s).

Every method is ``grad log pi(a|s) * delta``; they differ only in delta. Rewards and
deltas are ``[B, G]``: B prompts (states), G sampled responses per prompt (the group).
"""

from __future__ import annotations

import torch

DELTA_MODES = ("raw", "centered", "normalized", "max_only", "leave_one_out")


def _group_mean(rewards: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over the valid entries of each group, and their count. [B, G] -> [B, 1] each.

    rewards: [B, G] with G > 0 and invalid entries already zeroed.
    """
    count = valid.sum(dim=1, keepdim=True).to(rewards.dtype)
    # Sum offsets from the group's first valid reward: a constant group then has a mean
    # exactly equal to its value, so its centered deltas are exactly 0. A plain sum
    # leaves rounding (0.1 seven times: centered -7e-9, normalized -0.007).
    first = valid.to(torch.int8).argmax(dim=1, keepdim=True)  # [B, 1]; 0 if none valid
    shift = rewards.gather(1, first)  # [B, 1]
    offsets = torch.where(valid, rewards - shift, torch.zeros_like(rewards))
    return shift + offsets.sum(dim=1, keepdim=True) / count.clamp(min=1), count


def compute_deltas(
    rewards: torch.Tensor,
    mode: str,
    eps: float = 1e-6,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-response deltas from group rewards.

    rewards: [B, G] float. valid: optional [B, G] bool, False where the reward abstained
    (those entries are left out of the group statistics and get delta 0). NaN rewards
    count as abstentions too.

    Modes (r = a group's valid rewards, G' = their number):
      raw:           delta = r                       (naive policy gradient)
      centered:      delta = r - mean(r)             (group-mean baseline)
      normalized:    delta = (r - mean(r)) / (std(r) + eps), std with Bessel's
                     correction as ``torch.std`` (GRPO); a group with G' = 1 has std 0
      max_only:      delta = r where r equals the group max, else 0
      leave_one_out: delta = r - mean of the other G'-1 rewards
                     = G'/(G'-1) * (r - mean(r))  (RLOO); 0 when G' = 1
    Returns [B, G] with the dtype of ``rewards``.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [B, G], got shape {tuple(rewards.shape)}")
    if mode not in DELTA_MODES:
        raise ValueError(f"unknown delta mode {mode!r}; allowed: {', '.join(DELTA_MODES)}")
    if valid is not None and valid.shape != rewards.shape:
        raise ValueError(f"valid shape {tuple(valid.shape)} != rewards shape {tuple(rewards.shape)}")
    if rewards.numel() == 0:  # B = 0 or G = 0: no group statistics to take
        return torch.zeros_like(rewards)
    finite = torch.isfinite(rewards)
    valid = finite if valid is None else (valid.bool() & finite)
    zero = torch.zeros_like(rewards)
    rewards = torch.where(valid, rewards, zero)

    if mode == "raw":
        deltas = rewards
    elif mode == "max_only":
        masked = torch.where(valid, rewards, torch.full_like(rewards, -torch.inf))
        group_max = masked.max(dim=1, keepdim=True).values
        deltas = torch.where(rewards == group_max, rewards, zero)
    else:
        mean, count = _group_mean(rewards, valid)
        centered = rewards - mean
        if mode == "centered":
            deltas = centered
        elif mode == "normalized":
            sq = torch.where(valid, centered.square(), zero).sum(dim=1, keepdim=True)
            std = (sq / (count - 1).clamp(min=1)).sqrt()
            deltas = centered / (std + eps)
        else:  # leave_one_out
            deltas = centered * count / (count - 1).clamp(min=1)
            deltas = torch.where(count > 1, deltas, zero)
    return torch.where(valid, deltas, zero)
