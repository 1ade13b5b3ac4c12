"""Deltas from rewards: the factor that multiplies grad log pi(a|s).

Every method is ``grad log pi(a|s) * delta``; they differ only in delta. Rewards and deltas are ``[B, G]``: B prompts,
G sampled responses per prompt (the group). ``DELTA_MODES`` maps each mode to ``(rewards, valid, eps, lengths) ->
deltas``, invalid entries zeroed by ``compute_deltas``; ``REWARD_SCALES`` name the centered modes by their scale
(none / group / batch). In full: docs/explanation/core.md."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlvr.core.registry import lookup


def _group_mean(rewards: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over the valid entries of each group, and their count G'; rewards [B, G] (invalid ones zeroed) ->
    [B, 1] each."""
    count = valid.sum(dim=1, keepdim=True).to(rewards.dtype)
    # Sum offsets from the group's first valid reward: a constant group's mean is then exactly its value, so its
    # centered deltas are exactly 0. A plain sum leaves rounding (0.1 seven times: centered -7e-9, normalized -0.007).
    first = valid.to(torch.int8).argmax(dim=1, keepdim=True)  # [B, 1]; 0 if none valid
    shift = rewards.gather(1, first)  # [B, 1]
    offsets = torch.where(valid, rewards - shift, torch.zeros_like(rewards))
    return shift + offsets.sum(dim=1, keepdim=True) / count.clamp(min=1), count


def raw(rewards: torch.Tensor, valid: torch.Tensor, eps: float, lengths: torch.Tensor) -> torch.Tensor:
    """delta = r (naive policy gradient). [B, G] -> [B, G]."""
    return rewards


def centered(rewards: torch.Tensor, valid: torch.Tensor, eps: float, lengths: torch.Tensor) -> torch.Tensor:
    """delta = r - mean(r) (group-mean baseline). [B, G] -> [B, G]."""
    mean, _ = _group_mean(rewards, valid)
    return rewards - mean


def normalized(rewards: torch.Tensor, valid: torch.Tensor, eps: float, lengths: torch.Tensor) -> torch.Tensor:
    """delta = (r - mean(r)) / (std(r) + eps) (GRPO), Bessel std (G' = 1: 0). [B, G] -> [B, G]."""
    mean, count = _group_mean(rewards, valid)
    deviations = rewards - mean  # [B, G]
    sq = torch.where(valid, deviations.square(), torch.zeros_like(rewards)).sum(dim=1, keepdim=True)
    std = (sq / (count - 1).clamp(min=1)).sqrt()  # [B, 1]
    return deviations / (std + eps)


def _batch_std(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Bessel std of ``values`` [B, G] over the batch's valid entries, [] (0 when N' <= 1; exactly 0 when constant)."""
    count = valid.sum().to(values.dtype)
    mean = torch.where(valid, values, torch.zeros_like(values)).sum() / count.clamp(min=1)
    sq = torch.where(valid, (values - mean).square(), torch.zeros_like(values)).sum()
    return (sq / (count - 1).clamp(min=1)).sqrt()


def batch_normalized(rewards: torch.Tensor, valid: torch.Tensor, eps: float, lengths: torch.Tensor) -> torch.Tensor:
    """delta = (r - mean(r)) / (Bessel std of the batch's rewards + eps). [B, G] -> [B, G].

    The scale is shared by all groups, so a group whose rewards barely differ is not blown up to unit scale as with
    ``normalized``, and the between-group spread counts in the std too.
    """
    mean, _ = _group_mean(rewards, valid)
    return (rewards - mean) / (_batch_std(rewards, valid) + eps)


def reinforce_pp(rewards: torch.Tensor, valid: torch.Tensor, eps: float, lengths: torch.Tensor) -> torch.Tensor:
    """delta = (c - m) / (s + eps), c = r - mean(r): the group-centered rewards whitened over the batch's response
    tokens (REINFORCE++ with a group baseline: verl's reinforce_plus_plus_baseline, OpenRLHF's reinforce_baseline).
    [B, G] -> [B, G]. Each response's c stands at each of its L tokens, so over the valid responses

        m   = sum L c / sum L                      (the token mean)
        s^2 = sum L (c - m)^2 / (sum L - 1)        (Bessel over tokens, as verl's masked_whiten)

    A group of equal rewards gets -m / s, not 0, when the batch's lengths differ (verl's too). With equal lengths
    m = 0; unlike ``batch_normalized`` the spread between group means does not enter the scale.
    """
    mean, _ = _group_mean(rewards, valid)
    centered_rewards = rewards - mean  # [B, G]
    lengths = torch.where(valid, lengths, torch.zeros_like(lengths))
    tokens = lengths.sum()
    # sum L c = sum (L - the group's mean L) c, since each group's c sum to 0: exactly 0 when a group's lengths are
    # equal, so equal lengths leave a constant group's deltas exactly 0.
    group_lengths, _ = _group_mean(lengths, valid)
    token_mean = torch.where(valid, (lengths - group_lengths) * centered_rewards, torch.zeros_like(rewards)).sum()
    token_mean = token_mean / tokens.clamp(min=1)
    deviations = centered_rewards - token_mean
    sq = torch.where(valid, lengths * deviations.square(), torch.zeros_like(rewards)).sum()
    return deviations / ((sq / (tokens - 1).clamp(min=1)).sqrt() + eps)


def max_only(rewards: torch.Tensor, valid: torch.Tensor, eps: float, lengths: torch.Tensor) -> torch.Tensor:
    """delta = r where r equals the group max, else 0. [B, G] -> [B, G]."""
    masked = torch.where(valid, rewards, torch.full_like(rewards, -torch.inf))
    group_max = masked.max(dim=1, keepdim=True).values  # [B, 1]
    return torch.where(rewards == group_max, rewards, torch.zeros_like(rewards))


def leave_one_out(rewards: torch.Tensor, valid: torch.Tensor, eps: float, lengths: torch.Tensor) -> torch.Tensor:
    """delta = r - mean of the other G'-1 rewards = G'/(G'-1) * (r - mean(r)) (RLOO); 0 when G' = 1. [B, G]."""
    mean, count = _group_mean(rewards, valid)
    deltas = (rewards - mean) * count / (count - 1).clamp(min=1)
    return torch.where(count > 1, deltas, torch.zeros_like(rewards))


DELTA_MODES: dict[str, Callable[[torch.Tensor, torch.Tensor, float, torch.Tensor], torch.Tensor]] = {
    "raw": raw,
    "centered": centered,
    "normalized": normalized,
    "max_only": max_only,
    "leave_one_out": leave_one_out,
    "batch_normalized": batch_normalized,
    "reinforce_pp": reinforce_pp,
}

# The scale the group-centered rewards are divided by -> the delta mode that does it.
REWARD_SCALES: dict[str, str] = {"none": "centered", "group": "normalized", "batch": "batch_normalized"}


def compute_deltas(rewards: torch.Tensor, mode: str, eps: float = 1e-6, valid: torch.Tensor | None = None,
                   lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Per-response deltas [B, G] from rewards [B, G]: ``DELTA_MODES[mode]`` over the valid rewards. ``valid`` [B, G]
    bool is False where the reward abstained, as is a NaN reward: left out of the group statistics, delta 0.
    ``lengths`` [B, G]: each response's tokens in the loss (``reinforce_pp``); None: 1 each.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [B, G], got shape {tuple(rewards.shape)}")
    delta_fn = lookup(DELTA_MODES, mode, "delta mode")
    if valid is not None and valid.shape != rewards.shape:
        raise ValueError(f"valid shape {tuple(valid.shape)} != rewards shape {tuple(rewards.shape)}")
    if lengths is not None and lengths.shape != rewards.shape:
        raise ValueError(f"lengths shape {tuple(lengths.shape)} != rewards shape {tuple(rewards.shape)}")
    if rewards.numel() == 0:  # B = 0 or G = 0: no group statistics to take
        return torch.zeros_like(rewards)
    finite = torch.isfinite(rewards)
    valid = finite if valid is None else (valid.bool() & finite)
    zero = torch.zeros_like(rewards)
    rewards = torch.where(valid, rewards, zero)
    lengths = torch.ones_like(rewards) if lengths is None else lengths.to(rewards.dtype)
    return torch.where(valid, delta_fn(rewards, valid, eps, lengths), zero)


def scale_rewards(rewards: torch.Tensor, scale: str, eps: float = 1e-6, valid: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """Group-centered rewards divided by a scale: ``compute_deltas`` with ``REWARD_SCALES[scale]``; [B, G] -> [B, G].

    none:  r - mean(r)                               (``centered``)
    group: (r - mean(r)) / (group std + eps)         (``normalized``, GRPO)
    batch: (r - mean(r)) / (batch reward std + eps)  (``batch_normalized``)
    """
    return compute_deltas(rewards, lookup(REWARD_SCALES, scale, "reward scale"), eps, valid)
