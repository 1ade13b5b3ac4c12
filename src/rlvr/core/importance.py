"""Sampler-trainer mismatch: truncated importance sampling (TIS) and how far apart they are.

An engine that samples with its own numbers (vLLM's kernels, another precision) draws
tokens from pi_sampler, which is not quite the trainer's old policy pi_old. The policy
gradient wants samples of pi_old, so each token's term is reweighted by
pi_old / pi_sampler, truncated at C to bound the variance (Yao et al. 2025, "Your
efficient RL framework secretly brings you off-policy RL training"):

    w = min(pi_old / pi_sampler, C) = exp(min(old_log_probs - sample_log_probs, log C))

Shapes: N responses, T response tokens. ``old_log_probs`` [N, T] are the trainer's
log-probs of the sampled tokens (recomputed by its own scorer), ``sample_log_probs``
[N, T] the sampler's; both 0 off the response mask, where w is therefore 1.
``response_mask`` [N, T] bool is True on real response tokens.
"""

from __future__ import annotations

import math

import torch

from rlvr.core.kl import k3
from rlvr.core.masked import masked_mean


def _log_ratio(old_log_probs: torch.Tensor, sample_log_probs: torch.Tensor) -> torch.Tensor:
    """log r = log(pi_old / pi_sampler) = old_log_probs - sample_log_probs; [N, T] -> [N, T], detached."""
    if old_log_probs.shape != sample_log_probs.shape:
        raise ValueError(f"old_log_probs shape {tuple(old_log_probs.shape)} != sample_log_probs shape "
                         f"{tuple(sample_log_probs.shape)}")
    return (old_log_probs - sample_log_probs).detach()


def tis_weights(old_log_probs: torch.Tensor, sample_log_probs: torch.Tensor, cap: float) -> torch.Tensor:
    """w = min(pi_old / pi_sampler, C) = exp(min(old_log_probs - sample_log_probs, log C)); [N, T].

    Detached: the weights correct which distribution the tokens came from and are
    constants of the step, like the deltas. Taking the min in log space means a huge
    ratio never overflows before it is capped. ``cap`` C >= 1.
    """
    if not cap >= 1.0:
        raise ValueError(f"the TIS cap must be >= 1, got {cap}")
    return torch.exp(_log_ratio(old_log_probs, sample_log_probs).clamp(max=math.log(cap)))


def tis_truncated_frac(
    old_log_probs: torch.Tensor, sample_log_probs: torch.Tensor, cap: float, response_mask: torch.Tensor
) -> torch.Tensor:
    """Fraction of response tokens whose raw ratio pi_old / pi_sampler exceeds C (the cap
    changed their weight); [N, T] each -> scalar. 0 when there are no response tokens."""
    truncated = _log_ratio(old_log_probs, sample_log_probs) > math.log(cap)
    return masked_mean(truncated.to(old_log_probs.dtype), response_mask)


def mismatch_k3(
    old_log_probs: torch.Tensor, sample_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """Mean over response tokens of k3 = r - log r - 1, r = pi_old / pi_sampler; [N, T] each -> scalar.

    The tokens are samples of pi_sampler, so this estimates KL(pi_sampler || pi_old)
    (unbiased: E_sampler[r] = 1), >= 0, and 0 exactly when the two agree on every token
    (log r clamped to [-20, 20] as in ``rlvr.core.kl.k3``).
    """
    return masked_mean(k3(_log_ratio(old_log_probs, sample_log_probs)), response_mask)


def max_abs_log_prob_gap(
    old_log_probs: torch.Tensor, sample_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """max over response tokens of |old_log_probs - sample_log_probs|; [N, T] each -> scalar (0 if none)."""
    gap = _log_ratio(old_log_probs, sample_log_probs).abs().masked_fill(~response_mask.bool(), 0.0)
    return gap.max() if gap.numel() else gap.sum()
