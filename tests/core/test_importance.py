"""Truncated importance weights and the sampler-trainer mismatch, against hand values."""

import math

import pytest
import torch

from rlvr.core import (
    LOSS_MODES,
    max_abs_log_prob_gap,
    mismatch_k3,
    policy_loss,
    tis_truncated_frac,
    tis_weights,
)

LN2 = math.log(2.0)


def gap_pair(log_ratios):
    """(old_log_probs, sample_log_probs) [1, T] with old - sample = ``log_ratios``, both < 0."""
    sample = torch.full((1, len(log_ratios)), -3.0, dtype=torch.float64)
    return sample + torch.tensor([log_ratios], dtype=torch.float64), sample


def test_tis_weights_are_the_ratio_capped_at_c():
    # ratios pi_old / pi_sampler = 1/2, 1, 2, 4 with C = 3: the last is capped, the rest pass.
    old, sample = gap_pair([-LN2, 0.0, LN2, 2 * LN2])
    w = tis_weights(old, sample, cap=3.0)
    assert torch.allclose(w, torch.tensor([[0.5, 1.0, 2.0, 3.0]], dtype=torch.float64), rtol=1e-15, atol=0)


def test_tis_weights_of_a_huge_ratio_are_c_not_inf_and_carry_no_gradient():
    # log ratio 1000: exp would overflow, but the min is taken in log space first.
    old = torch.tensor([[1000.0, 0.0]], requires_grad=True)
    sample = torch.zeros(1, 2, requires_grad=True)
    w = tis_weights(old, sample, cap=2.0)
    assert w.tolist() == [[pytest.approx(2.0, rel=1e-6), 1.0]] and not w.requires_grad


def test_tis_weights_of_equal_log_probs_are_exactly_one():
    lp = torch.randn(4, 6, generator=torch.Generator().manual_seed(0)) - 2.0
    assert torch.equal(tis_weights(lp, lp.clone(), cap=1.0), torch.ones(4, 6))


def test_tis_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="cap must be >= 1"):
        tis_weights(torch.zeros(1, 1), torch.zeros(1, 1), cap=0.5)


def test_truncated_fraction_counts_response_tokens_above_the_cap():
    old, sample = gap_pair([-LN2, 0.0, LN2, 2 * LN2])  # ratios 1/2, 1, 2, 4
    mask = torch.ones(1, 4, dtype=torch.bool)
    assert tis_truncated_frac(old, sample, 3.0, mask).item() == 0.25  # only 4 > 3
    assert tis_truncated_frac(old, sample, 1.5, mask).item() == 0.5  # 2 and 4 > 1.5
    assert tis_truncated_frac(old, sample, 4.5, mask).item() == 0.0
    mask[0, 3] = False  # the token with ratio 4 is padding: 0 of 3 response tokens
    assert tis_truncated_frac(old, sample, 3.0, mask).item() == 0.0
    # No cap (C = inf): nothing is ever truncated.
    assert tis_truncated_frac(old, sample, math.inf, mask.fill_(True)).item() == 0.0


def test_k3_mismatch_is_zero_for_identical_log_probs():
    lp = torch.randn(3, 5, generator=torch.Generator().manual_seed(1)) - 1.0
    mask = torch.rand(3, 5, generator=torch.Generator().manual_seed(2)) > 0.3
    assert mismatch_k3(lp, lp.clone(), mask).item() == 0.0
    assert max_abs_log_prob_gap(lp, lp.clone(), mask).item() == 0.0


def test_k3_mismatch_hand_values():
    # r = 2: k3 = 2 - ln 2 - 1; r = 1/2: k3 = 1/2 + ln 2 - 1; their sum is exactly 1/2,
    # so the mean over the two response tokens is 1/4 (the third token is padding: its
    # huge gap is left out of both the mean and the max).
    old, sample = gap_pair([LN2, -LN2, 50.0])
    mask = torch.tensor([[True, True, False]])
    assert mismatch_k3(old, sample, mask).item() == pytest.approx(0.25, rel=1e-12)
    assert max_abs_log_prob_gap(old, sample, mask).item() == pytest.approx(LN2, rel=1e-12)
    assert mismatch_k3(old, sample, mask).item() > 0


def test_k3_mismatch_is_kl_sampler_to_trainer_by_exact_enumeration():
    # Tokens drawn from p = (1/2, 1/4, 1/4) are listed in proportion 2:1:1, so the mean
    # over these four tokens is E_p[k3] exactly; with r = q / p that is
    # sum_a q(a) - sum_a p(a) log(q(a)/p(a)) - 1 = KL(p || q) (sum q = 1).
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    tokens = torch.tensor([[0, 0, 1, 2]])
    old, sample = q.log()[tokens], p.log()[tokens]  # trainer q, sampler p
    kl_p_q = (p * (p / q).log()).sum().item()
    assert mismatch_k3(old, sample, torch.ones(1, 4, dtype=torch.bool)).item() == pytest.approx(kl_p_q, rel=1e-12)


@pytest.mark.parametrize("mode", list(LOSS_MODES))
def test_tis_weighted_loss_gradient_is_w_times_the_per_token_gradient(mode):
    # Each token's loss carries gradient through its own log-prob only (gspo too: its
    # sequence ratio enters each token detached), so d(sum w * loss)/d log_prob_t must be
    # w_t * d loss_t / d log_prob_t, with w a constant (even though the old log-probs it is
    # built from require grad here).
    g = torch.Generator().manual_seed(3)
    log_probs = (torch.randn(4, 5, generator=g) * 0.3 - 1.0).requires_grad_(True)
    old = (log_probs.detach() + 0.4 * torch.randn(4, 5, generator=g)).requires_grad_(True)
    sample = old.detach() + 0.8 * torch.randn(4, 5, generator=g)
    deltas = torch.randn(4, generator=g)
    w = tis_weights(old, sample, cap=1.5)
    assert (w <= 1.5 * (1 + 1e-6)).all() and torch.isclose(w, torch.tensor(1.5)).any() and (w < 1.0).any()
    response_mask = torch.ones(4, 5, dtype=torch.bool)  # gspo's mean is over the response's tokens
    per_token, _ = policy_loss(log_probs, deltas, mode, old, clip_eps=0.2, response_mask=response_mask)
    (unweighted,) = torch.autograd.grad(per_token.sum(), log_probs, retain_graph=True)
    (weighted,) = torch.autograd.grad((w * per_token).sum(), log_probs)
    assert (unweighted != 0).any()  # not vacuous: some tokens carry gradient
    assert torch.allclose(weighted, w * unweighted, rtol=1e-6, atol=0)
    assert old.grad is None and not w.requires_grad
