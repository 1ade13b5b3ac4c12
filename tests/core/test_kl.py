"""KL estimators: exact expectations by enumeration, unbiasedness by Monte Carlo, variances."""

import math

import pytest
import torch

from rlvr.core import KL_ESTIMATORS, kl_loss_term, kl_penalty


def _moments(log_pi, log_ref, estimator):
    """Exact mean and variance of an estimator under a ~ pi, by enumerating the K actions."""
    values = kl_penalty(log_pi, log_ref, estimator)
    pi = log_pi.exp()
    mean = (pi * values).sum()
    return mean.item(), (pi * (values - mean).square()).sum().item()


def _exact_kl(log_pi, log_ref):
    return (log_pi.exp() * (log_pi - log_ref)).sum().item()


def test_by_hand_two_actions():
    # pi = [0.5, 0.5], ref = [0.9, 0.1]:
    #   KL(pi||ref) = 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1) = 0.5 ln(25/9) = ln(5/3) = 0.5108
    #   E[k2] = 0.5 * 0.5 * (ln(5/9)^2 + ln(5)^2) = 0.25 * (0.3455 + 2.5903) = 0.7340 != KL
    #   E[k3] = sum_a pi (ref/pi - 1) + KL = (sum ref - 1) + KL = KL
    log_pi = torch.log(torch.tensor([0.5, 0.5], dtype=torch.float64))
    log_ref = torch.log(torch.tensor([0.9, 0.1], dtype=torch.float64))
    kl = math.log(5 / 3)
    assert _exact_kl(log_pi, log_ref) == pytest.approx(kl, rel=1e-14)
    assert _moments(log_pi, log_ref, "k1")[0] == pytest.approx(kl, rel=1e-14)
    assert _moments(log_pi, log_ref, "k3")[0] == pytest.approx(kl, rel=1e-14)
    k2 = 0.25 * (math.log(5 / 9) ** 2 + math.log(5) ** 2)
    assert k2 == pytest.approx(0.7340, abs=1e-4)
    assert _moments(log_pi, log_ref, "k2")[0] == pytest.approx(k2, rel=1e-14)
    # Per-token values for the first action (r = ref/pi = 1.8):
    #   k1 = -ln 1.8 = -0.5878 (negative!), k2 = 0.5 ln(1.8)^2 = 0.1728, k3 = 1.8 - ln 1.8 - 1 = 0.2122
    first = {e: kl_penalty(log_pi[:1], log_ref[:1], e).item() for e in KL_ESTIMATORS}
    assert first["k1"] == pytest.approx(-math.log(1.8), rel=1e-14)
    assert first["k2"] == pytest.approx(0.5 * math.log(1.8) ** 2, rel=1e-14)
    assert first["k3"] == pytest.approx(0.8 - math.log(1.8), rel=1e-12)


def _pair(scale, k=6):
    """pi = softmax(a), ref = softmax(a + scale * noise): scale sets how far apart they are."""
    a = torch.randn(k, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    b = a + scale * torch.randn(k, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    return torch.log_softmax(a, 0), torch.log_softmax(b, 0)


@pytest.mark.parametrize("scale", [0.1, 1.0, 3.0])
def test_k1_k3_exact_expectation_is_kl_k2_is_biased(scale):
    log_pi, log_ref = _pair(scale)
    kl = _exact_kl(log_pi, log_ref)
    for estimator in ("k1", "k3"):
        assert _moments(log_pi, log_ref, estimator)[0] == pytest.approx(kl, rel=1e-10, abs=1e-15)
    # k2 = (log r)^2 / 2 matches KL only to second order; measured E[k2] / KL =
    # 1.02 (scale 0.1), 1.26 (1.0), 1.90 (3.0).
    assert _moments(log_pi, log_ref, "k2")[0] > 1.01 * kl


def test_monte_carlo_unbiased_within_standard_error():
    # Sample M tokens from pi; k1 and k3 sample means must sit within 5 standard errors of
    # the exact KL. k2's mean is 5+ standard errors away from KL (biased) while within 5 of
    # its own exact expectation.
    m = 200_000
    log_pi, log_ref = _pair(1.0)
    kl = _exact_kl(log_pi, log_ref)
    actions = torch.multinomial(log_pi.exp(), m, replacement=True, generator=torch.Generator().manual_seed(7))
    lp, lr = log_pi[actions].reshape(1, m), log_ref[actions].reshape(1, m)  # [N=1, T=M]
    for estimator in KL_ESTIMATORS:
        samples = kl_penalty(lp, lr, estimator)
        mean, stderr = samples.mean().item(), samples.std().item() / math.sqrt(m)
        if estimator == "k2":
            assert abs(mean - _moments(log_pi, log_ref, "k2")[0]) < 5 * stderr
            assert mean - kl > 5 * stderr
        else:
            assert abs(mean - kl) < 5 * stderr, (estimator, mean, kl, stderr)
            assert 5 * stderr < 0.2 * kl  # the check can tell KL from, say, 0.8 KL


def test_k3_has_lower_variance_than_k1_for_close_distributions():
    # Measured (exact, by enumeration over K = 6 actions; _pair(0.1), KL = 3.83e-4):
    #   var(k1) = 7.83e-4, var(k2) = 1.10e-6, var(k3) = 1.03e-6   (k3 ~760x lower than k1)
    # For _pair(1.0) (KL = 0.0315): var(k1) = 0.0783, var(k3) = 0.00689 (11x lower).
    # Monte Carlo, 100k samples (seed 3): var(k1) = 7.80e-4, var(k2) = 1.09e-6, var(k3) = 1.02e-6.
    log_pi, log_ref = _pair(0.1)
    var = {e: _moments(log_pi, log_ref, e)[1] for e in KL_ESTIMATORS}
    assert var["k1"] == pytest.approx(7.83e-4, rel=1e-3)
    assert var["k3"] == pytest.approx(1.03e-6, rel=1e-2)
    assert var["k3"] < var["k1"] / 100

    m = 100_000
    actions = torch.multinomial(log_pi.exp(), m, replacement=True, generator=torch.Generator().manual_seed(3))
    lp, lr = log_pi[actions], log_ref[actions]
    mc_var = {e: kl_penalty(lp, lr, e).var().item() for e in ("k1", "k3")}
    assert mc_var["k1"] == pytest.approx(var["k1"], rel=0.05)
    assert mc_var["k3"] == pytest.approx(var["k3"], rel=0.05)
    assert mc_var["k3"] < mc_var["k1"] / 100


def test_k3_is_not_always_lower_variance():
    # The ordering is a near-pi property. pi = [0.9, 0.1], ref = [0.1, 0.9]: two-point
    # variances are 0.9 * 0.1 * (difference of the two values)^2:
    #   k1 values +-ln 9 = +-2.197             -> 0.09 * 4.394^2 = 1.738
    #   k3 values 1/9 + ln 9 - 1 = 1.308, 9 - ln 9 - 1 = 5.803 -> 0.09 * 4.495^2 = 1.818
    log_pi = torch.log(torch.tensor([0.9, 0.1], dtype=torch.float64))
    log_ref = torch.log(torch.tensor([0.1, 0.9], dtype=torch.float64))
    assert _moments(log_pi, log_ref, "k1")[1] == pytest.approx(0.09 * (2 * math.log(9)) ** 2, rel=1e-12)
    k3_gap = (9 - math.log(9) - 1) - (1 / 9 + math.log(9) - 1)
    assert _moments(log_pi, log_ref, "k3")[1] == pytest.approx(0.09 * k3_gap**2, rel=1e-12)
    assert _moments(log_pi, log_ref, "k3")[1] > _moments(log_pi, log_ref, "k1")[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_k3_is_never_negative(dtype):
    # exp(x) - x - 1 >= 0 for all x. Small |x| is where rounding bites: exp(x) - x - 1 in
    # float32 used to give -6e-8 for ~4% of x in [-5e-4, 5e-4].
    gen = torch.Generator().manual_seed(0)
    small = (torch.rand(200_000, generator=gen, dtype=dtype) - 0.5) * 1e-3
    wide = (torch.rand(200_000, generator=gen, dtype=dtype) - 0.5) * 60  # clamp at +-20 included
    for log_ratio in (small, wide):
        k3 = kl_penalty(torch.zeros_like(log_ratio), log_ratio, "k3")
        assert torch.isfinite(k3).all()
        assert (k3 >= 0).all()
    # Large log ratios are clamped at 20: finite, and equal to the value at 20.
    k3 = kl_penalty(torch.zeros(2, dtype=dtype), torch.tensor([30.0, 20.0], dtype=dtype), "k3")
    assert k3[0] == k3[1] and torch.isfinite(k3).all()


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_zero_when_policy_equals_reference(estimator):
    log_probs = torch.log_softmax(torch.randn(4, 7, generator=torch.Generator().manual_seed(2)), -1)
    assert torch.equal(kl_penalty(log_probs, log_probs.clone(), estimator), torch.zeros_like(log_probs))


def test_unknown_estimator():
    with pytest.raises(ValueError, match="allowed: k1, k2, k3"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")


# --- gradients: which divergence each estimator minimises as a loss term -------------
#
# With theta the logits of pi and a ~ pi, a per-token term k(a) has expected gradient
# E_pi[grad k(a)] = sum_a pi(a) grad k(a), pi held fixed (the sampling distribution does
# not carry gradient). With l = log pi(a), d = log pi(a) - log ref(a):
#   k1 = d:              E[grad l]             = 0 (score function)
#   k2 = d^2 / 2:        E[d grad l]           = grad KL(pi || ref)
#   k3 = e^-d + d - 1:   E[(1 - ref/pi) grad l] = -sum_a ref grad l = grad KL(ref || pi)
# and the straight-through forms k1+, k3+ take k2's gradient.


def _forward_kl(log_pi, log_ref):
    return (log_pi.exp() * (log_pi - log_ref)).sum()


def _reverse_kl(log_pi, log_ref):
    return (log_ref.exp() * (log_ref - log_pi)).sum()


GRADIENT_TARGET = {
    "k1": lambda log_pi, log_ref: 0.0 * log_pi.sum(),
    "k2": _forward_kl,
    "k3": _reverse_kl,
    "k1+": _forward_kl,
    "k3+": _forward_kl,
}


def _expected_gradient(theta, log_ref, estimator):
    """sum_a pi(a) grad k(a) over the K actions, exactly (pi detached: it is the sampler)."""
    log_pi = torch.log_softmax(theta, 0)
    values = kl_penalty(log_pi, log_ref, estimator)
    (grad,) = torch.autograd.grad((log_pi.exp().detach() * values).sum(), theta)
    return grad


@pytest.mark.parametrize("scale", [0.3, 1.0, 3.0])
@pytest.mark.parametrize("estimator", list(GRADIENT_TARGET))
def test_expected_gradient_is_the_gradient_of_its_divergence(estimator, scale):
    log_pi, log_ref = _pair(scale)
    theta = log_pi.clone().requires_grad_()  # softmax(theta) = pi
    (target,) = torch.autograd.grad(GRADIENT_TARGET[estimator](torch.log_softmax(theta, 0), log_ref), theta,
                                    allow_unused=True)
    torch.testing.assert_close(_expected_gradient(theta, log_ref, estimator), target, rtol=1e-10, atol=1e-12)
    # The check can tell the divergences apart: forward and reverse gradients differ by
    # a good fraction of their size, and neither is 0.
    (fwd,) = torch.autograd.grad(_forward_kl(torch.log_softmax(theta, 0), log_ref), theta)
    (rev,) = torch.autograd.grad(_reverse_kl(torch.log_softmax(theta, 0), log_ref), theta)
    assert (fwd - rev).norm() > 0.05 * fwd.norm() > 0


@pytest.mark.parametrize("plus, base", [("k1+", "k1"), ("k3+", "k3")])
def test_straight_through_forms_have_the_base_value_exactly(plus, base):
    log_pi, log_ref = _pair(1.0)
    log_pi = log_pi.clone().requires_grad_()
    assert torch.equal(kl_penalty(log_pi, log_ref, plus), kl_penalty(log_pi, log_ref, base))
    # ... and k2's per-token gradient: d k2 / d log pi = log pi - log ref.
    (grad,) = torch.autograd.grad(kl_penalty(log_pi, log_ref, plus).sum(), log_pi)
    torch.testing.assert_close(grad, (log_pi - log_ref).detach(), rtol=1e-14, atol=0)


def test_k1_refused_as_a_loss_term():
    log_pi, log_ref = _pair(1.0)
    with pytest.raises(ValueError, match="zero in expectation.*k1\\+"):
        kl_loss_term(log_pi, log_ref, "k1")
    for estimator in ("k1+", "k2", "k3", "k3+"):
        assert torch.equal(kl_loss_term(log_pi, log_ref, estimator), kl_penalty(log_pi, log_ref, estimator))
