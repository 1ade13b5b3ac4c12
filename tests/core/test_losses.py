"""policy_loss: hand values, the clip, the no_grad lesson."""

import math

import pytest
import torch

from rlvr.core import policy_loss

E = math.e


def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


# --- policy_loss by hand ------------------------------------------------------------


def test_naive_loss_by_hand():
    log_probs = _t([[-1.0, -2.0, -0.5]]).requires_grad_()
    loss, stats = policy_loss(log_probs, _t([2.0]), "naive")
    # -delta * log_prob = -2 * [-1, -2, -0.5] = [2, 4, 1]; d/d log_prob = -delta = -2.
    torch.testing.assert_close(loss, _t([[2.0, 4.0, 1.0]]), rtol=0, atol=0)
    (grad,) = torch.autograd.grad(loss.sum(), log_probs)
    torch.testing.assert_close(grad, _t([[-2.0, -2.0, -2.0]]), rtol=0, atol=0)
    assert torch.equal(stats["ratio"], torch.ones(1, 3, dtype=torch.float64))
    assert not stats["clipped"].any()


def test_ratio_loss_by_hand():
    old = _t([[-1.0, -3.0], [-0.5, -2.0]])
    log_probs = (old + 1.0).requires_grad_()
    deltas = _t([[2.0], [-1.0]])
    loss, stats = policy_loss(log_probs, deltas, "ratio", old_log_probs=old)
    # log_probs - old = 1 everywhere, so ratio = pi / pi_old = e for every token;
    # loss = -delta * e = [-2e, -2e], [e, e]; gradient -delta * ratio = the same numbers.
    torch.testing.assert_close(stats["ratio"], torch.full((2, 2), E, dtype=torch.float64), rtol=1e-15, atol=0)
    expected = _t([[-2 * E, -2 * E], [E, E]])
    torch.testing.assert_close(loss, expected, rtol=1e-15, atol=0)
    (grad,) = torch.autograd.grad(loss.sum(), log_probs)
    torch.testing.assert_close(grad, expected, rtol=1e-15, atol=0)


# Clipped, clip_eps = 0.2 (range [0.8, 1.2]). Four tokens: log-ratio +1 (ratio e) or -1
# (ratio 1/e = 0.368), delta +1 or -1.
#   ratio e,    delta +1: min(e, 1.2)        = 1.2   -> loss -1.2,  clipped, grad 0
#   ratio e,    delta -1: min(-e, -1.2)      = -e    -> loss e,     kept,    grad -delta*ratio = e
#   ratio 1/e,  delta +1: min(1/e, 0.8)      = 1/e   -> loss -1/e,  kept,    grad -1/e
#   ratio 1/e,  delta -1: min(-1/e, -0.8)    = -0.8  -> loss 0.8,   clipped, grad 0
def test_clipped_loss_by_hand():
    old = torch.zeros(4, 1, dtype=torch.float64)
    log_probs = _t([[1.0], [1.0], [-1.0], [-1.0]]).requires_grad_()
    deltas = _t([1.0, -1.0, 1.0, -1.0])
    loss, stats = policy_loss(log_probs, deltas, "clipped", old_log_probs=old, clip_eps=0.2)
    torch.testing.assert_close(loss, _t([[-1.2], [E], [-1 / E], [0.8]]), rtol=1e-15, atol=0)
    assert stats["clipped"].flatten().tolist() == [True, False, False, True]
    (grad,) = torch.autograd.grad(loss.sum(), log_probs)
    torch.testing.assert_close(grad, _t([[0.0], [E], [-1 / E], [0.0]]), rtol=1e-15, atol=0)


def test_clip_eps_high_is_asymmetric():
    # Ratios 1.25 and 1.3 with delta +1, ratio 0.75 with delta -1.
    old = torch.zeros(3, 1, dtype=torch.float64)
    log_probs = torch.log(_t([[1.25], [1.3], [0.75]]))
    deltas = _t([1.0, 1.0, -1.0])
    sym, sym_stats = policy_loss(log_probs, deltas, "clipped", old_log_probs=old, clip_eps=0.2)
    asym, asym_stats = policy_loss(
        log_probs, deltas, "clipped", old_log_probs=old, clip_eps=0.2, clip_eps_high=0.28
    )
    # Symmetric [0.8, 1.2]: 1.25 and 1.3 cap at 1.2 (loss -1.2); 0.75 < 0.8 with delta -1:
    # min(-0.75, -0.8) = -0.8, loss 0.8.
    torch.testing.assert_close(sym, _t([[-1.2], [-1.2], [0.8]]), rtol=1e-12, atol=0)
    assert sym_stats["clipped"].flatten().tolist() == [True, True, True]
    # Clip-higher [0.8, 1.28]: 1.25 now passes (loss -1.25), 1.3 caps at 1.28; the low side
    # is unchanged.
    torch.testing.assert_close(asym, _t([[-1.25], [-1.28], [0.8]]), rtol=1e-12, atol=0)
    assert asym_stats["clipped"].flatten().tolist() == [False, True, True]


@pytest.mark.parametrize("clip_eps_high", [None, 0.28])
def test_clipped_stat_marks_exactly_the_zero_gradient_tokens(clip_eps_high):
    gen = torch.Generator().manual_seed(0)
    N, T = 64, 16
    old = -torch.rand(N, T, generator=gen, dtype=torch.float64) * 3
    # log-ratios in [-0.6, 0.6]: ratios 0.55..1.82, so both sides of [0.8, 1.2] are hit.
    log_probs = (old + (torch.rand(N, T, generator=gen, dtype=torch.float64) - 0.5) * 1.2).requires_grad_()
    deltas = torch.randn(N, generator=gen, dtype=torch.float64)
    deltas = deltas + 0.1 * torch.sign(deltas)  # |delta| >= 0.1: no zero-delta tokens
    loss, stats = policy_loss(log_probs, deltas, "clipped", old_log_probs=old, clip_eps_high=clip_eps_high)
    (grad,) = torch.autograd.grad(loss.sum(), log_probs)
    clipped = stats["clipped"]
    assert 0.1 < clipped.double().mean().item() < 0.9  # both kinds of token are present
    assert torch.equal(grad == 0, clipped)
    # Where not clipped, the gradient is the ratio-loss gradient -delta * ratio.
    kept = ~clipped
    expected = (-deltas.unsqueeze(-1) * stats["ratio"]).expand(N, T)
    torch.testing.assert_close(grad[kept], expected[kept], rtol=1e-14, atol=0)


# --- the no_grad lesson ----------------------------------------------------------------


def _policy():
    """One state, three actions, logits theta; the sampled tokens are actions [0, 2, 1]."""
    theta = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64, requires_grad=True)
    actions = torch.tensor([[0, 2, 1]])
    deltas = torch.tensor([1.5], dtype=torch.float64)

    def log_probs():
        return torch.log_softmax(theta, dim=-1)[actions]  # [1, 3]

    return theta, log_probs, deltas


def test_detached_old_log_probs_give_the_naive_gradient_at_ratio_one():
    theta, log_probs, deltas = _policy()
    (naive_grad,) = torch.autograd.grad(policy_loss(log_probs(), deltas, "naive")[0].sum(), theta)
    lp = log_probs()
    with torch.no_grad():
        old = log_probs()
    ratio_loss, stats = policy_loss(lp, deltas, "ratio", old_log_probs=old)
    (ratio_grad,) = torch.autograd.grad(ratio_loss.sum(), theta)
    # At ratio 1, grad(pi/pi_old) = grad log pi, so both losses give -delta * grad log pi.
    assert torch.equal(stats["ratio"], torch.ones_like(lp))
    assert naive_grad.abs().max() > 0.1
    torch.testing.assert_close(ratio_grad, naive_grad, rtol=1e-14, atol=1e-15)


def test_old_log_probs_from_the_same_graph_kill_the_gradient():
    theta, log_probs, deltas = _policy()
    lp = log_probs()
    old_in_graph = log_probs()  # "pi_old computed without no_grad": same parameters, same graph
    # The mistake written out: ratio = exp(lp - lp_old) is identically 1 as a function of
    # theta, so its gradient is exactly 0 and training silently does nothing.
    bad_ratio = torch.exp(lp - old_in_graph)
    (bad_grad,) = torch.autograd.grad((-(bad_ratio * deltas)).sum(), theta)
    assert torch.equal(bad_grad, torch.zeros_like(theta))
    # policy_loss detaches old_log_probs itself, so the same inputs give the real gradient.
    lp, old_in_graph = log_probs(), log_probs()
    good_loss, _ = policy_loss(lp, deltas, "ratio", old_log_probs=old_in_graph)
    (good_grad,) = torch.autograd.grad(good_loss.sum(), theta)
    (naive_grad,) = torch.autograd.grad(policy_loss(log_probs(), deltas, "naive")[0].sum(), theta)
    torch.testing.assert_close(good_grad, naive_grad, rtol=1e-14, atol=1e-15)


def test_lecture_quotient_of_log_probs_is_not_the_ratio():
    # pi / pi_old = exp(lp - old); for lp = -1, old = -2 that is exp(1) = e = 2.718.
    # The lecture reference code's log_probs / old_log_probs gives (-1) / (-2) = 0.5: it even
    # moves the wrong way (pi went up, the "ratio" says it went down).
    lp, old = _t([[-1.0]]), _t([[-2.0]])
    quotient = (lp / old).item()
    ours = policy_loss(lp, _t([1.0]), "ratio", old_log_probs=old)[1]["ratio"].item()
    assert quotient == 0.5
    assert ours == pytest.approx(E, rel=1e-15)
    assert ours == pytest.approx(math.exp(-1.0) / math.exp(-2.0), rel=1e-15)


@pytest.mark.parametrize("mode", ["naive", "ratio", "clipped"])
def test_deltas_are_constants(mode):
    # Deltas that carry a graph (e.g. from a learned baseline) must not be trained by the
    # policy loss: no gradient reaches them.
    log_probs = _t([[-1.0, -0.5]]).requires_grad_()
    deltas = _t([2.0]).requires_grad_()
    loss, _ = policy_loss(log_probs, deltas * 1.0, mode, old_log_probs=log_probs.detach() - 0.1)
    grads = torch.autograd.grad(loss.sum(), (log_probs, deltas), allow_unused=True)
    assert grads[1] is None
    assert grads[0].abs().min() > 0


def test_policy_loss_bad_inputs():
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="allowed: naive, ratio, clipped"):
        policy_loss(lp, torch.zeros(2), "ppo")
    with pytest.raises(ValueError, match="needs old_log_probs"):
        policy_loss(lp, torch.zeros(2), "ratio")
    with pytest.raises(ValueError, match="old_log_probs shape"):
        policy_loss(lp, torch.zeros(2), "clipped", old_log_probs=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="deltas must be"):
        policy_loss(lp, torch.zeros(3), "naive")


@pytest.mark.parametrize("mode", ["naive", "ratio", "clipped", "dual_clip", "gspo", "cispo"])
def test_per_token_deltas_equal_to_the_row_delta_change_nothing(mode):
    torch.manual_seed(0)
    lp = torch.randn(3, 5)
    old = lp + 0.3 * torch.randn(3, 5)
    mask = torch.ones(3, 5, dtype=torch.bool)
    deltas = torch.tensor([1.5, -0.7, 0.2])
    by_row, _ = policy_loss(lp, deltas, mode, old, 0.2, response_mask=mask)
    by_token, _ = policy_loss(lp, deltas.unsqueeze(-1).expand(3, 5), mode, old, 0.2, response_mask=mask)
    torch.testing.assert_close(by_token, by_row, rtol=0, atol=0)


def test_per_token_deltas_weigh_their_own_token():
    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.0, -0.5]])
    deltas = torch.tensor([[2.0, -1.0, 0.0]])
    loss, _ = policy_loss(lp, deltas, "clipped", old, 0.2)
    ratio = torch.exp(lp.detach() - old)
    expected = -torch.minimum(ratio * deltas, ratio.clamp(0.8, 1.2) * deltas)
    torch.testing.assert_close(loss.detach(), expected)
    loss.sum().backward()
    # token 0: ratio e^0.1 < 1.2, unclipped: d/dlp = -ratio * 2; token 1: ratio e^-1 < 0.8 with delta < 0: clipped
    # branch is the min, flat: gradient 0; token 2: delta 0
    torch.testing.assert_close(lp.grad, torch.tensor([[-2.0 * math.exp(0.1), 0.0, 0.0]]))
