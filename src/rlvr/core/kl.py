"""Per-token estimators of KL(pi || pi_ref) from samples of pi.

With tokens sampled from pi and r = pi_ref(a) / pi(a):
  k1 = log pi - log pi_ref = -log r      unbiased, high variance, can be negative
  k2 = (log r)^2 / 2                     biased, low variance, >= 0
  k3 = r - log r - 1                     unbiased (E_pi[r] = 1), >= 0, low variance
k3 is the lecture's low-variance form.
"""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL estimate; log_probs, ref_log_probs: [N, T] -> [N, T].

    log r is clamped to [-20, 20] inside k3 so that exp never overflows: a token the
    reference finds e^20 times likelier than the policy is already a huge penalty.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; allowed: {', '.join(KL_ESTIMATORS)}")
    log_ratio = ref_log_probs - log_probs  # log r = log(pi_ref / pi)
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    log_ratio = log_ratio.clamp(min=-20.0, max=20.0)
    # expm1 keeps the small-|log r| terms accurate; exp(x) - x - 1 rounds to -6e-8 in
    # float32 for many small x. The clamp makes the k3 >= 0 guarantee exact.
    return (torch.expm1(log_ratio) - log_ratio).clamp(min=0.0)
