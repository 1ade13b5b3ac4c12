"""Per-token estimators of KL(pi || pi_ref) from samples of pi, and their gradients.

With r = pi_ref(a) / pi(a): k1 = -log r, k2 = (log r)^2 / 2, k3 = r - log r - 1 (the lecture's), and k1+ / k3+ (the
value of k1 / k3 with k2's gradient, as verl). As a loss term k1's expected gradient is 0 and k3's is that of the
reverse KL; in the reward (``kl_reward_penalty``) k1 is right. Which gradient each gives: docs/explanation/core.md
(test_kl.py checks each by exact enumeration)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlvr.core.masked import masked_sum
from rlvr.core.registry import lookup


def k1(log_ratio: torch.Tensor) -> torch.Tensor:
    """k1 = -log r; log_ratio = log r = log(pi_ref / pi) [N, T] -> [N, T]."""
    return -log_ratio


def k2(log_ratio: torch.Tensor) -> torch.Tensor:
    """k2 = (log r)^2 / 2; [N, T] -> [N, T]."""
    return 0.5 * log_ratio.square()


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3 = r - log r - 1; [N, T] -> [N, T]. log r is clamped to [-20, 20] so that exp never overflows (e^20 is
    already a huge penalty)."""
    log_ratio = log_ratio.clamp(min=-20.0, max=20.0)
    # expm1 keeps the small-|log r| terms accurate; exp(x) - x - 1 rounds to -6e-8 in float32 for many small x. The
    # clamp makes the k3 >= 0 guarantee exact.
    return (torch.expm1(log_ratio) - log_ratio).clamp(min=0.0)


def _with_k2_gradient(value: torch.Tensor, log_ratio: torch.Tensor) -> torch.Tensor:
    """Straight-through: ``value``'s value to the bit (k2 - k2.detach() is exactly 0), k2's gradient; [N, T]."""
    k2_value = k2(log_ratio)
    return value.detach() + (k2_value - k2_value.detach())


def k1_plus(log_ratio: torch.Tensor) -> torch.Tensor:
    """k1+ = k1's value with k2's gradient (verl's "k1+"); [N, T] -> [N, T]."""
    return _with_k2_gradient(k1(log_ratio), log_ratio)


def k3_plus(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3+ = k3's value with k2's gradient (verl's "k3+"); [N, T] -> [N, T]."""
    return _with_k2_gradient(k3(log_ratio), log_ratio)


# Each maps log r = log(pi_ref / pi) [N, T] to the per-token estimate [N, T].
KL_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": k1,
    "k2": k2,
    "k3": k3,
    "k1+": k1_plus,
    "k3+": k3_plus,
}
# Those whose expected gradient minimises a KL; k1's is zero, so it cannot be a loss term.
KL_LOSS_ESTIMATORS = {name: KL_ESTIMATORS[name] for name in ("k1+", "k2", "k3", "k3+")}


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL estimate ``KL_ESTIMATORS[estimator](log r)``; log_probs, ref_log_probs: [N, T] -> [N, T]. For a
    loss term use ``kl_loss_term``, which refuses k1."""
    estimator_fn = lookup(KL_ESTIMATORS, estimator, "KL estimator")
    return estimator_fn(ref_log_probs - log_probs)  # log r = log(pi_ref / pi)


def kl_loss_term(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: str) -> torch.Tensor:
    """``kl_penalty`` for adding to the per-token loss, [N, T] -> [N, T]; refuses k1, whose expected gradient
    E_pi[grad log pi] = 0 moves nothing toward the reference, however large its coefficient."""
    if estimator not in KL_LOSS_ESTIMATORS:
        raise ValueError(f"KL estimator {estimator!r} cannot be a loss term: its gradient is zero in expectation "
                         f"(E_pi[grad log pi] = 0); use one of {', '.join(KL_LOSS_ESTIMATORS)} "
                         "(k1+: k1's value with k2's gradient, the gradient of KL(pi||ref))")
    return kl_penalty(log_probs, ref_log_probs, estimator)


def kl_reward_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, response_mask: torch.Tensor, coef: float
                      ) -> torch.Tensor:
    """beta * sum over response tokens of k1 = beta * sum_t (log pi_t - log pi_ref_t); [N, T] each -> [N].

    Subtracted from each response's reward before the deltas (a NaN reward stays NaN). ``log_probs`` are the sampling
    policy's (old or sampler log-probs). The sum is log pi(y) / pi_ref(y), an unbiased estimate of the sequence-level
    KL(pi || ref); in the reward its gradient is that of -beta * KL(pi || ref), which k1 as a loss term cannot give.
    Detached: a reward is a constant of the step.
    """
    if not coef >= 0:
        raise ValueError(f"KL reward coef must be >= 0, got {coef}")
    if not log_probs.shape == ref_log_probs.shape == response_mask.shape:
        raise ValueError(f"log_probs {tuple(log_probs.shape)}, ref_log_probs {tuple(ref_log_probs.shape)} and "
                         f"response_mask {tuple(response_mask.shape)} must have one shape [N, T]")
    k1_tokens = kl_penalty(log_probs.detach(), ref_log_probs.detach(), "k1")  # [N, T]
    return coef * masked_sum(k1_tokens, response_mask, dim=-1)
