"""policy_loss and aggregation: hand values, the clip, the no_grad lesson, micro-batching."""

import math

import pytest
import torch

from rlvr.core import AGGREGATIONS, aggregate_loss, aggregation_weights, policy_loss, weighted_sum

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
    n, t = 64, 16
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 3
    # log-ratios in [-0.6, 0.6]: ratios 0.55..1.82, so both sides of [0.8, 1.2] are hit.
    log_probs = (old + (torch.rand(n, t, generator=gen, dtype=torch.float64) - 0.5) * 1.2).requires_grad_()
    deltas = torch.randn(n, generator=gen, dtype=torch.float64)
    deltas = deltas + 0.1 * torch.sign(deltas)  # |delta| >= 0.1: no zero-delta tokens
    loss, stats = policy_loss(log_probs, deltas, "clipped", old_log_probs=old, clip_eps_high=clip_eps_high)
    (grad,) = torch.autograd.grad(loss.sum(), log_probs)
    clipped = stats["clipped"]
    assert 0.1 < clipped.double().mean().item() < 0.9  # both kinds of token are present
    assert torch.equal(grad == 0, clipped)
    # Where not clipped, the gradient is the ratio-loss gradient -delta * ratio.
    kept = ~clipped
    expected = (-deltas.unsqueeze(-1) * stats["ratio"]).expand(n, t)
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


# --- aggregation -------------------------------------------------------------------------

# Three responses, T = 4, lengths 4, 2, 1. Padded entries hold 100 so a leak shows.
LOSS = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 100.0, 100.0], [7.0, 100.0, 100.0, 100.0]]
MASK = [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]
# seq_mean_token_mean: row means 10/4 = 2.5, 11/2 = 5.5, 7 -> (2.5 + 5.5 + 7) / 3 = 5
# token_mean:          (1+2+3+4+5+6+7) / 7 tokens = 28 / 7 = 4
# seq_mean_token_sum:  row sums 10, 11, 7 over T = 4 -> 2.5, 2.75, 1.75 -> mean 7/3;
#                      with normalizer 2: 5, 5.5, 3.5 -> mean 14/3
AGG_EXPECTED = [
    ("seq_mean_token_mean", None, 5.0),
    ("token_mean", None, 4.0),
    ("seq_mean_token_sum", None, 7 / 3),
    ("seq_mean_token_sum", 2.0, 14 / 3),
]


@pytest.mark.parametrize("mode,normalizer,expected", AGG_EXPECTED)
def test_aggregate_loss_by_hand(mode, normalizer, expected):
    loss, mask = _t(LOSS), torch.tensor(MASK, dtype=torch.bool)
    assert aggregate_loss(loss, mask, mode, normalizer).item() == pytest.approx(expected, rel=1e-14)
    # The weights reproduce the same scalar as sum(w * x).
    weights = aggregation_weights(mask, mode, normalizer, dtype=torch.float64)
    assert weighted_sum(loss, weights).item() == pytest.approx(expected, rel=1e-14)


def test_aggregation_weights_by_hand():
    mask = torch.tensor(MASK, dtype=torch.bool)
    # seq_mean_token_mean: 1 / (length * N): row 0 1/12, row 1 1/6, row 2 1/3.
    w = aggregation_weights(mask, "seq_mean_token_mean", dtype=torch.float64)
    torch.testing.assert_close(w[:, 0], _t([1 / 12, 1 / 6, 1 / 3]), rtol=1e-15, atol=0)
    assert (w[~mask] == 0).all()
    # token_mean: 1/7 on each of the 7 tokens.
    w = aggregation_weights(mask, "token_mean", dtype=torch.float64)
    torch.testing.assert_close(w, mask.double() / 7, rtol=1e-15, atol=0)


def test_fully_masked_row_counts_as_a_zero_response():
    # seq_mean_token_mean over [row mean 3, fully masked row]: (3 + 0) / 2 = 1.5.
    loss = _t([[2.0, 4.0], [9.0, 9.0]])
    mask = torch.tensor([[True, True], [False, False]])
    assert aggregate_loss(loss, mask, "seq_mean_token_mean").item() == 1.5
    assert aggregate_loss(loss, mask, "token_mean").item() == 3.0  # (2 + 4) / 2 tokens


@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize("normalizer", [None, 5.0])
def test_micro_batching_gives_the_full_batch_gradient(mode, normalizer):
    # A tiny token policy: logits [N, T, V]; clipped loss on sampled tokens, so the
    # micro-batch gradient must match through log_softmax, the ratio and the clip.
    gen = torch.Generator().manual_seed(1)
    n, t, v = 8, 6, 5
    logits = torch.randn(n, t, v, generator=gen, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(v, (n, t, 1), generator=gen)
    old = torch.log_softmax(logits.detach() + 0.3 * torch.randn(n, t, v, generator=gen, dtype=torch.float64), -1)
    old = old.gather(-1, tokens).squeeze(-1)
    deltas = torch.randn(n, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([6, 3, 1, 0, 6, 2, 5, 4])  # includes an empty response
    mask = torch.arange(t) < lengths.unsqueeze(-1)  # [N, T]

    def per_token(rows):
        lp = torch.log_softmax(logits[rows], -1).gather(-1, tokens[rows]).squeeze(-1)
        return policy_loss(lp, deltas[rows], "clipped", old_log_probs=old[rows])[0]

    full = aggregate_loss(per_token(slice(None)), mask, mode, normalizer)
    (full_grad,) = torch.autograd.grad(full, logits)
    assert full_grad.abs().max() > 1e-3
    weights = aggregation_weights(mask, mode, normalizer, dtype=torch.float64)
    for n_micro in (1, 4):
        logits.grad = None
        total = 0.0
        for rows in torch.arange(n).chunk(n_micro):
            mb_loss = weighted_sum(per_token(rows), weights[rows])
            mb_loss.backward()
            total += mb_loss.item()
        assert total == pytest.approx(full.item(), rel=1e-13)
        torch.testing.assert_close(logits.grad, full_grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0)])
def test_empty_batches_aggregate_to_zero(mode, shape):
    loss = torch.zeros(shape, requires_grad=True)
    mask = torch.ones(shape, dtype=torch.bool)
    out = aggregate_loss(loss, mask, mode)
    assert out.item() == 0.0  # not NaN (mean of an empty tensor)
    out.backward()
    assert aggregation_weights(mask, mode).shape == shape


def test_aggregation_bad_inputs():
    loss, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="allowed: seq_mean_token_mean"):
        aggregate_loss(loss, mask, "sum")
    with pytest.raises(ValueError, match="allowed: seq_mean_token_mean"):
        aggregation_weights(mask, "sum")
    with pytest.raises(ValueError, match="mask shape"):
        aggregate_loss(loss, mask[:, :2], "token_mean")
    with pytest.raises(ValueError, match="normalizer must be positive"):
        aggregate_loss(loss, mask, "seq_mean_token_sum", normalizer=0.0)
    with pytest.raises(ValueError, match="normalizer must be positive"):
        aggregation_weights(mask, "seq_mean_token_sum", normalizer=-1.0)
