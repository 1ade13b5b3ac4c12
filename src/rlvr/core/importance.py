"""Sampler-trainer mismatch: the off-policy corrections of the policy gradient, and how far apart they are.

The design: ``docs/explanation/core.md`` (``rlvr.core.importance``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from rlvr.core.kl import k3
from rlvr.core.masked import masked_mean, masked_sum
from rlvr.core.registry import lookup

Bound = float | None  # a correction's cap C, or a bound low / high of its ratios; None: not set


class Correction(NamedTuple):
    """An off-policy correction of one batch, all [N, T] and detached.

    weights:   each token's factor of its policy-gradient term (0 where masked, 1 off the mask)
    truncated: bool, the policy tokens whose weight the cap C lowered
    masked:    bool, the policy tokens dropped (weight 0)
    """

    weights: torch.Tensor
    truncated: torch.Tensor
    masked: torch.Tensor


def _log_ratio(old_log_probs: torch.Tensor, sample_log_probs: torch.Tensor) -> torch.Tensor:
    """log r = log(pi_old / pi_sampler) = old_log_probs - sample_log_probs; [N, T] -> [N, T], detached."""
    if old_log_probs.shape != sample_log_probs.shape:
        raise ValueError(f"old_log_probs shape {tuple(old_log_probs.shape)} != sample_log_probs shape "
                         f"{tuple(sample_log_probs.shape)}")
    return (old_log_probs - sample_log_probs).detach()


def tis_weights(old_log_probs: torch.Tensor, sample_log_probs: torch.Tensor, cap: float) -> torch.Tensor:
    """w = min(pi_old / pi_sampler, C) = exp(min(old_log_probs - sample_log_probs, log C)); [N, T], detached (constants
    of the step, like the deltas). The min in log space: a huge ratio never overflows before it is capped. C >= 1."""
    if not cap >= 1.0:
        raise ValueError(f"the TIS cap must be >= 1, got {cap}")
    return torch.exp(_log_ratio(old_log_probs, sample_log_probs).clamp(max=math.log(cap)))


def _finish(weights: torch.Tensor, truncated: torch.Tensor, masked: torch.Tensor, mask: torch.Tensor) -> Correction:
    """Weight 1 off the mask (a neutral factor: those tokens carry no loss weight), flags on it only; all [N, T]."""
    return Correction(torch.where(mask, weights, 1.0), truncated & mask, masked & mask)


def _capped(log_ratio: torch.Tensor, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(exp(min(log r, log C)), log r > log C): the truncated ratio and where the cap lowered it."""
    return torch.exp(log_ratio.clamp(max=math.log(cap))), log_ratio > math.log(cap)


def _within(log_ratio: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """low <= r <= high, compared as log-ratios (bool, the shape of ``log_ratio``)."""
    return (log_ratio >= math.log(low)) & (log_ratio <= math.log(high))


def _seq_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log prod_s r_s = sum over the response's policy tokens of log r_s; [N, T] -> [N, 1] (0: no tokens)."""
    return masked_sum(log_ratio, mask, dim=-1).unsqueeze(-1)


def _keep(keep: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor, cap: float | None) -> Correction:
    """A masking method's correction: ``keep`` [N, T] or [N, 1] bool; kept tokens weigh 1 (min(r_t, C) with a cap)."""
    keep = keep.expand_as(log_ratio)
    if cap is None:
        weights, over = torch.ones_like(log_ratio), torch.zeros_like(keep)
    else:
        weights, over = _capped(log_ratio, cap)
    return _finish(torch.where(keep, weights, 0.0), over & keep, ~keep, mask)


def token_tis(log_ratio: torch.Tensor, mask: torch.Tensor, cap: Bound, low: Bound, high: Bound) -> Correction:
    """w_t = min(r_t, C) (``tis_weights``): each token's ratio, truncated at C."""
    weights, over = _capped(log_ratio, cap)
    return _finish(weights, over, torch.zeros_like(over), mask)


def seq_tis(log_ratio: torch.Tensor, mask: torch.Tensor, cap: Bound, low: Bound, high: Bound) -> Correction:
    """w_t = min(prod_s r_s, C) = exp(min(sum_s log r_s, log C)): the sequence's importance weight, truncated at C."""
    weights, over = _capped(_seq_log_ratio(log_ratio, mask), cap)  # [N, 1]
    return _finish(weights.expand_as(log_ratio), over.expand_as(mask), torch.zeros_like(mask), mask)


def token_mis(log_ratio: torch.Tensor, mask: torch.Tensor, cap: Bound, low: Bound, high: Bound) -> Correction:
    """Masked importance sampling per token: w_t = 1[low <= r_t <= high] (times min(r_t, C) with a cap)."""
    return _keep(_within(log_ratio, low, high), log_ratio, mask, cap)


def seq_mis(log_ratio: torch.Tensor, mask: torch.Tensor, cap: Bound, low: Bound, high: Bound) -> Correction:
    """Masked IS per response: dropped when prod_s r_s is outside [low, high]; w_t = 1 (or min(r_t, C)) otherwise."""
    return _keep(_within(_seq_log_ratio(log_ratio, mask), low, high), log_ratio, mask, cap)


def geo_mask(log_ratio: torch.Tensor, mask: torch.Tensor, cap: Bound, low: Bound, high: Bound) -> Correction:
    """Geometric-mean sequence masking: a response is dropped when exp(mean_s log r_s) is outside [low, high]. The
    mean, unlike the product, does not grow with the length, so one pair of bounds fits short and long responses
    (verl's rollout_rs=geometric; "When Speed Kills Stability", Liu, Li et al. 2025)."""
    geo_log_ratio = masked_mean(log_ratio, mask, dim=-1).unsqueeze(-1)  # [N, 1], mean_s log r_s (0: no tokens)
    return _keep(_within(geo_log_ratio, low, high), log_ratio, mask, cap)


def icepop(log_ratio: torch.Tensor, mask: torch.Tensor, cap: Bound, low: Bound, high: Bound) -> Correction:
    """IcePop (Ring team 2025, "Every Step Evolves"): w_t = M(r_t) with M(k) = k for k in [alpha, beta] = [low, high],
    0 otherwise: verl's token IS with cap ``high`` beside token rejection, slime's MIS."""
    return _keep(_within(log_ratio, low, high), log_ratio, mask, high)  # min(r_t, high) = r_t where kept


def seq_mask_is(log_ratio: torch.Tensor, mask: torch.Tensor, cap: Bound, low: Bound, high: Bound) -> Correction:
    """Sequence-level masked IS: w_t = prod_s r_s for all of a response's tokens when that ratio is at most C, 0 above
    (TRL's sequence_mask, default C = 3): dropped where seq_tis would truncate. No lower bound."""
    weights, over = _capped(_seq_log_ratio(log_ratio, mask), cap)  # [N, 1]
    keep = ~over.expand_as(mask)
    return _finish(torch.where(keep, weights.expand_as(log_ratio), 0.0), torch.zeros_like(mask), ~keep, mask)


# name -> fn(log_ratio [N, T], mask [N, T] bool, cap, low, high) -> Correction
IS_CORRECTIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, Bound, Bound, Bound], Correction]] = {
    "token_tis": token_tis,
    "seq_tis": seq_tis,
    "token_mis": token_mis,
    "seq_mis": seq_mis,
    "icepop": icepop,
    "geo_mask": geo_mask,
    "seq_mask_is": seq_mask_is,
}
TRUNCATING_CORRECTIONS = ("token_tis", "seq_tis")  # weigh min(ratio, C): need the cap C
MASKING_CORRECTIONS = ("token_mis", "seq_mis", "icepop", "geo_mask")  # drop ratios outside [low, high]: need them
CAP_MASKING_CORRECTIONS = ("seq_mask_is",)  # drop ratios above the cap C: need it, and no bounds


def off_policy_correction(method: str, old_log_probs: torch.Tensor, sample_log_probs: torch.Tensor,
                          mask: torch.Tensor, *, cap: float | None = None, low: float | None = None,
                          high: float | None = None) -> Correction:
    """``IS_CORRECTIONS[method]`` of r = pi_old / pi_sampler; old_log_probs, sample_log_probs, mask [N, T] ->
    Correction. ``cap`` C >= 1: token_tis, seq_tis and seq_mask_is need it; beside token_mis, seq_mis or geo_mask the
    kept tokens weigh min(r_t, C); icepop takes none. ``low`` < 1 < ``high``: the masking bounds (low: 1 / high)."""
    fn = lookup(IS_CORRECTIONS, method, "off-policy correction")
    if cap is not None and not cap >= 1.0:
        raise ValueError(f"the TIS cap must be >= 1, got {cap}")
    if method in TRUNCATING_CORRECTIONS + CAP_MASKING_CORRECTIONS and cap is None:
        raise ValueError(f"{method} needs the cap C")
    if method in CAP_MASKING_CORRECTIONS and (low is not None or high is not None):
        raise ValueError(f"{method} drops ratios above the cap C; it takes no bounds low, high")
    if method == "icepop" and cap is not None:
        raise ValueError("icepop weighs the kept tokens by their own ratio, at most high; it takes no cap")
    if method in MASKING_CORRECTIONS:
        if high is None:
            raise ValueError(f"{method} needs the upper bound high")
        low = 1.0 / high if low is None else low
        if not 0 < low < 1 < high:
            raise ValueError(f"{method} needs 0 < low < 1 < high, got low={low}, high={high}")
    return fn(_log_ratio(old_log_probs, sample_log_probs), mask.bool(), cap, low, high)


def token_fraction(flags: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Share of the policy tokens flagged; flags, mask [N, T] bool -> scalar of ``dtype`` (0 if no tokens)."""
    return masked_mean(flags.to(dtype), mask)


def response_fraction(flags: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Share of the responses with a flagged policy token, over those with any policy token; flags, mask [N, T] bool
    -> scalar of ``dtype`` (0 if none). verl's seq_masked_fraction divides by all responses instead."""
    mask = mask.bool()
    return masked_mean((flags & mask).any(dim=-1).to(dtype), mask.any(dim=-1))


def tis_truncated_frac(old_log_probs: torch.Tensor, sample_log_probs: torch.Tensor, cap: float,
                       response_mask: torch.Tensor) -> torch.Tensor:
    """Fraction of response tokens whose ratio pi_old / pi_sampler exceeds C; [N, T] each -> scalar (0 if none)."""
    truncated = _log_ratio(old_log_probs, sample_log_probs) > math.log(cap)
    return masked_mean(truncated.to(old_log_probs.dtype), response_mask)


def mismatch_k3(old_log_probs: torch.Tensor, sample_log_probs: torch.Tensor, response_mask: torch.Tensor
                ) -> torch.Tensor:
    """Mean over response tokens of k3 = r - log r - 1, r = pi_old / pi_sampler; [N, T] each -> scalar. The tokens
    are pi_sampler's samples: an unbiased estimate of KL(pi_sampler || pi_old) >= 0, 0 exactly where they agree."""
    return masked_mean(k3(_log_ratio(old_log_probs, sample_log_probs)), response_mask)


def max_abs_log_prob_gap(old_log_probs: torch.Tensor, sample_log_probs: torch.Tensor, response_mask: torch.Tensor
                         ) -> torch.Tensor:
    """max over response tokens of |old_log_probs - sample_log_probs|; [N, T] each -> scalar (0 if none)."""
    gap = _log_ratio(old_log_probs, sample_log_probs).abs().masked_fill(~response_mask.bool(), 0.0)
    return gap.max() if gap.numel() else gap.sum()
