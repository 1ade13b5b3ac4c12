"""dual_clip, gspo, cispo and the entropy bonus: hand values, the clipped stat, and gradient
checks against closed-form policy gradients on tiny categorical policies.

Policy (as in test_policy_gradient.py): logits theta [S, K], pi(a|s) = softmax(theta[s]),
states s ~ p(s), rewards R [S, K], J = sum_s p(s) sum_a pi(a|s) R(s, a), and
    dJ / dtheta[s, b] = p(s) pi(b|s) (R(s, b) - V(s)),   V(s) = sum_a pi(a|s) R(s, a).
A response is one (s, a) pair, one token; enumerating all S*K of them with weights
p(s) pi_sample(a|s) gives the expected gradient of a loss exactly.
"""

import math

import pytest
import torch

from rlvr.core import (
    LOSS_MODES,
    aggregate_loss,
    aggregation_weights,
    entropy_bonus,
    entropy_from_logits,
    policy_loss,
    weighted_sum,
)

E = math.e
S, K = 3, 4
NEW_MODES = ["dual_clip", "gspo", "cispo"]


def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def _problem():
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(S, K, generator=gen, dtype=torch.float64)
    rewards = _t([[1.0, 0.0, 0.0, 2.0], [0.0, 3.0, 1.0, 0.0], [-1.0, 0.0, 4.0, 1.0]])
    p_state = _t([0.5, 0.3, 0.2])
    return theta, rewards, p_state


def _old_theta(theta, scale):
    return theta + scale * torch.randn(S, K, generator=torch.Generator().manual_seed(5), dtype=torch.float64)


def closed_form_grad(theta, rewards, p_state):
    """dJ/dtheta written out, no autograd."""
    pi = torch.softmax(theta, dim=-1)
    value = (pi * rewards).sum(-1, keepdim=True)  # [S, 1]
    return p_state[:, None] * pi * (rewards - value)


def sampled_grad_formula(theta, old_theta, rewards, p_state, factor):
    """sum_(s,a) p(s) pi_old(a|s) factor(s, a) R(s, a) grad log pi(a|s), written out:
    grad log pi(a|s) on theta[s] is onehot(a) - pi(.|s). factor [S, K] is the loss's
    per-token weight on R * grad log pi (the ratio, a clipped ratio, 0 where clipped)."""
    pi, pi_old = torch.softmax(theta, -1), torch.softmax(old_theta, -1)
    coeff = p_state[:, None] * pi_old * factor * rewards  # [S, K]: one per (s, a)
    # sum_a coeff[s, a] (onehot(a)[b] - pi[s, b]) = coeff[s, b] - pi[s, b] sum_a coeff[s, a]
    return coeff - pi * coeff.sum(-1, keepdim=True)


def _enumerated(mode, theta, rewards, p_state, old_theta=None, **kwargs):
    """The exact expected gradient of ``mode``'s loss over all (s, a) one-token responses
    sampled from pi_old, and the loss's stats (ratio, clipped: [S*K, 1])."""
    theta = theta.clone().requires_grad_()
    log_probs = torch.log_softmax(theta, -1).reshape(S * K, 1)
    old = theta.detach() if old_theta is None else old_theta
    old_log_probs = torch.log_softmax(old, -1).reshape(S * K, 1)
    weights = (p_state[:, None] * old_log_probs.exp().reshape(S, K)).reshape(S * K, 1)
    mask = torch.ones(S * K, 1, dtype=torch.bool)
    per_token, stats = policy_loss(log_probs, rewards.reshape(S * K), mode, old_log_probs, response_mask=mask,
                                   **kwargs)
    (grad,) = torch.autograd.grad(weighted_sum(per_token, weights), theta)
    return grad, stats


# --- dual_clip --------------------------------------------------------------------------


# clip_eps = 0.2 ([0.8, 1.2]), c = 3. Five tokens (log-ratio -> ratio, delta):
#   ratio e = 2.718,     delta -1: min(-e, -1.2) = -e; floor -3 < -e, not binding -> loss e,   grad e
#   ratio e^1.5 = 4.48,  delta -1: min(-4.48, -1.2) = -4.48 < floor -3        -> loss 3,   grad 0
#   ratio e^1.5,         delta +1: min(4.48, 1.2) = 1.2 (no floor: delta > 0) -> loss -1.2, grad 0
#   ratio 1/e = 0.368,   delta -1: min(-0.368, -0.8) = -0.8, floor -3 below    -> loss 0.8, grad 0
#   ratio 1,             delta -2: min(-2, -2) = -2, floor -6                 -> loss 2,   grad -delta*ratio = 2
def test_dual_clip_by_hand():
    old = torch.zeros(5, 1, dtype=torch.float64)
    log_probs = _t([[1.0], [1.5], [1.5], [-1.0], [0.0]]).requires_grad_()
    deltas = _t([-1.0, -1.0, 1.0, -1.0, -2.0])
    loss, stats = policy_loss(log_probs, deltas, "dual_clip", old, clip_eps=0.2, clip_ratio_c=3.0)
    torch.testing.assert_close(loss, _t([[E], [3.0], [-1.2], [0.8], [2.0]]), rtol=1e-15, atol=0)
    assert stats["clipped"].flatten().tolist() == [False, True, True, True, False]
    (grad,) = torch.autograd.grad(loss.sum(), log_probs)
    torch.testing.assert_close(grad, _t([[E], [0.0], [0.0], [0.0], [2.0]]), rtol=1e-15, atol=0)
    # The plain clip leaves the second token's loss unbounded: e^1.5 = 4.48, gradient 4.48.
    plain, _ = policy_loss(log_probs, deltas, "clipped", old, clip_eps=0.2)
    assert plain[1].item() == pytest.approx(math.exp(1.5), rel=1e-15)
    # With c = 5 > e^1.5 the floor binds nowhere: dual_clip equals the plain clip.
    wide, _ = policy_loss(log_probs, deltas, "dual_clip", old, clip_eps=0.2, clip_ratio_c=5.0)
    assert torch.equal(wide, plain)


@pytest.mark.parametrize("c", [1.0, 0.5, -3.0])
def test_dual_clip_needs_c_above_one(c):
    with pytest.raises(ValueError, match="clip_ratio_c > 1"):
        policy_loss(torch.zeros(1, 1), torch.ones(1), "dual_clip", torch.zeros(1, 1), clip_ratio_c=c)


# --- gspo -------------------------------------------------------------------------------


# clip_eps = 0.2 ([0.8, 1.2]). Three responses, T = 3, the third token of row 1 is padding
# (its log-prob 50 must not enter the mean):
#   row 0: log-ratios [0.3, -0.1, 0.1], mean 0.1, s = e^0.1 = 1.105, delta +1: inside -> loss -1.105
#   row 1: log-ratios [0.6, 0.4, pad],  mean 0.5, s = e^0.5 = 1.649, delta +2: min(3.30, 2.4) -> loss -2.4
#   row 2: log-ratios [-0.5] * 3,       mean -0.5, s = 0.607, delta -1: min(-0.607, -0.8) -> loss 0.8
# Gradient at token t: -delta * s on rows kept (row 0: -1.105 each), 0 on clipped rows.
def test_gspo_by_hand():
    old = torch.zeros(3, 3, dtype=torch.float64)
    log_probs = _t([[0.3, -0.1, 0.1], [0.6, 0.4, 50.0], [-0.5, -0.5, -0.5]]).requires_grad_()
    mask = torch.tensor([[True, True, True], [True, True, False], [True, True, True]])
    deltas = _t([1.0, 2.0, -1.0])
    loss, stats = policy_loss(log_probs, deltas, "gspo", old, clip_eps=0.2, response_mask=mask)
    s0, s1, s2 = math.exp(0.1), math.exp(0.5), math.exp(-0.5)
    torch.testing.assert_close(stats["ratio"], _t([[s0] * 3, [s1] * 3, [s2] * 3]), rtol=1e-15, atol=0)
    torch.testing.assert_close(loss, _t([[-s0] * 3, [-2.4] * 3, [0.8] * 3]), rtol=1e-15, atol=0)
    assert stats["clipped"].tolist() == [[False] * 3, [True] * 3, [True] * 3]
    (grad,) = torch.autograd.grad(loss.sum(), log_probs)
    torch.testing.assert_close(grad, _t([[-s0] * 3, [0.0] * 3, [0.0] * 3]), rtol=1e-15, atol=0)
    # Token-level PPO clips row 0's first token (ratio e^0.3 = 1.35 > 1.2, delta > 0);
    # GSPO judges the response as a whole and keeps it.
    _, token_stats = policy_loss(log_probs, deltas, "clipped", old, clip_eps=0.2)
    assert token_stats["clipped"][0].tolist() == [True, False, False]


def test_gspo_needs_the_response_mask():
    with pytest.raises(ValueError, match="'gspo' needs response_mask"):
        policy_loss(torch.zeros(2, 3), torch.ones(2), "gspo", torch.zeros(2, 3))
    with pytest.raises(ValueError, match="response_mask shape"):
        policy_loss(torch.zeros(2, 3), torch.ones(2), "gspo", torch.zeros(2, 3),
                    response_mask=torch.ones(2, 4, dtype=torch.bool))


def _random_batch(seed, n=6, t=5, spread=0.3):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 3
    log_probs = old + (torch.rand(n, t, generator=gen, dtype=torch.float64) - 0.5) * 2 * spread
    lengths = torch.tensor([5, 3, 1, 4, 5, 2][:n])
    mask = torch.arange(t) < lengths[:, None]  # [n, t]
    deltas = torch.randn(n, generator=gen, dtype=torch.float64)
    return log_probs, old, mask, deltas


def _sequence_level_gspo(log_probs, old, mask, deltas, low, high):
    """The paper's per-response objective, written with the sequence ratio itself:
    min(s_i delta_i, clip(s_i) delta_i), s_i = exp(masked mean of (log_prob - old)); [N]."""
    lengths = mask.sum(-1)
    seq_ratio = torch.exp(torch.where(mask, log_probs - old, 0.0).sum(-1) / lengths)  # [N]
    return torch.minimum(seq_ratio * deltas, seq_ratio.clamp(low, high) * deltas)


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean"])
def test_gspo_token_form_has_the_sequence_level_gradient(aggregation):
    # With weights constant over each response's tokens, the per-token form's gradient is
    # that of sum_i (sum_t w_i,t) * seq_objective_i. Token log-ratios within +-0.6 and a clip
    # of 0.05: some rows clip, some do not.
    log_probs, old, mask, deltas = _random_batch(seed=0, spread=0.6)
    weights = aggregation_weights(mask, aggregation, dtype=torch.float64)  # [N, T]
    lp = log_probs.clone().requires_grad_()
    per_token, stats = policy_loss(lp, deltas, "gspo", old, clip_eps=0.05, response_mask=mask)
    (grad,) = torch.autograd.grad(weighted_sum(per_token, weights), lp)
    lp_ref = log_probs.clone().requires_grad_()
    reference = -(weights.sum(-1) * _sequence_level_gspo(lp_ref, old, mask, deltas, 0.95, 1.05)).sum()
    (grad_ref,) = torch.autograd.grad(reference, lp_ref)
    clipped_rows = stats["clipped"][:, 0]
    assert clipped_rows.any() and not clipped_rows.all()  # both kinds of response are present
    assert weighted_sum(per_token.detach(), weights).item() == pytest.approx(reference.item(), rel=1e-14)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-12, atol=1e-15)


def test_gspo_token_weights_act_on_their_own_token():
    # A per-token weight w (TIS, a token selection) scales only its own token's gradient:
    # d(sum w * loss) / d log_prob_t = -w_t * delta_i * s_i on rows the clip keeps.
    log_probs, old, mask, deltas = _random_batch(seed=2)
    w = torch.rand(log_probs.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64) * mask
    lp = log_probs.clone().requires_grad_()
    per_token, stats = policy_loss(lp, deltas, "gspo", old, clip_eps=0.5, response_mask=mask)
    (grad,) = torch.autograd.grad(weighted_sum(per_token, w), lp)
    assert not stats["clipped"].any()
    torch.testing.assert_close(grad, -w * deltas[:, None] * stats["ratio"], rtol=1e-14, atol=0)


def _two_token_problem():
    """Two-token responses y = (y0, y1) from independent positions: pi(y) = pi0(y0) pi1(y1),
    logits theta [2, K]; all K*K responses enumerated, rewards R [K, K]."""
    gen = torch.Generator().manual_seed(11)
    theta = torch.randn(2, K, generator=gen, dtype=torch.float64)
    rewards = torch.randn(K, K, generator=gen, dtype=torch.float64)
    y0, y1 = torch.meshgrid(torch.arange(K), torch.arange(K), indexing="ij")
    tokens = torch.stack([y0.flatten(), y1.flatten()], dim=-1)  # [K*K, 2]
    return theta, rewards, tokens


def _two_token_log_probs(theta, tokens):
    log_pi = torch.log_softmax(theta, -1)  # [2, K]
    return torch.stack([log_pi[0, tokens[:, 0]], log_pi[1, tokens[:, 1]]], dim=-1)  # [K*K, 2]


def _sequence_grad_formula(theta, old_theta, rewards, factor):
    """sum_y pi_old(y) factor(y) R(y) sum_t grad log pi_t(y_t), written out: on theta[t, b]
    grad log pi_t(y_t) is 1[y_t = b] - pi_t(b). factor [K, K]."""
    pi, pi_old = torch.softmax(theta, -1), torch.softmax(old_theta, -1)
    coeff = pi_old[0][:, None] * pi_old[1][None, :] * factor * rewards  # [K, K], one per y
    marginals = torch.stack([coeff.sum(1), coeff.sum(0)])  # [2, K]: sum over y with y_t = b
    return marginals - pi * coeff.sum()


@pytest.mark.parametrize("off_policy", [False, True])
def test_gspo_expected_gradient_two_token_responses(off_policy):
    # Enumerate all K^2 responses with weight pi_old(y) / 2 per token (seq_mean_token_mean
    # for length 2). The expected gradient is sum_y pi_old(y) R(y) s(y) (1/2) grad log pi(y)
    # with s(y) = (pi(y) / pi_old(y))^(1/2) (clip wide open). On-policy s = 1: half the policy
    # gradient dJ/dtheta, the length normalisation of the sequence ratio.
    theta, rewards, tokens = _two_token_problem()
    old_theta = theta + 0.4 * torch.randn(2, K, generator=torch.Generator().manual_seed(3), dtype=torch.float64) \
        if off_policy else theta
    theta_var = theta.clone().requires_grad_()
    log_probs = _two_token_log_probs(theta_var, tokens)
    old = _two_token_log_probs(old_theta, tokens)
    weights = old.sum(-1, keepdim=True).exp().expand(-1, 2) / 2  # pi_old(y) / 2 on each token
    mask = torch.ones_like(log_probs, dtype=torch.bool)
    per_token, stats = policy_loss(log_probs, rewards.flatten(), "gspo", old, clip_eps=0.99, clip_eps_high=100.0,
                                   response_mask=mask)
    (grad,) = torch.autograd.grad(weighted_sum(per_token, weights), theta_var)
    seq_ratio = ((log_probs - old).sum(-1) / 2).exp().detach().reshape(K, K)
    target = 0.5 * _sequence_grad_formula(theta, old_theta, rewards, seq_ratio)
    assert not stats["clipped"].any() and target.abs().max() > 0.05
    torch.testing.assert_close(grad, -target, rtol=1e-10, atol=1e-12)
    if not off_policy:  # s = 1: the formula is the policy gradient, pi_t(b) (E[R | y_t = b] - E[R])
        pi = torch.softmax(theta, -1)
        joint = pi[0][:, None] * pi[1][None, :]
        value = (joint * rewards).sum()
        given = torch.stack([(pi[1][None, :] * rewards).sum(1), (pi[0][:, None] * rewards).sum(0)])  # E[R|y_t=b]
        torch.testing.assert_close(grad, -0.5 * pi * (given - value), rtol=1e-10, atol=1e-12)


# --- cispo ------------------------------------------------------------------------------


# clip_eps = 0.2, clip_eps_high = 0.28: weights clip(ratio, 0.8, 1.28), constants.
#   log_prob 1 (ratio e),    delta +1: w 1.28 -> loss -1.28 * 1 * 1 = -1.28,  grad -w delta = -1.28
#   log_prob 1 (ratio e),    delta -1: w 1.28 -> loss 1.28,                   grad 1.28
#   log_prob -1 (ratio 1/e), delta +1: w 0.8  -> loss -0.8 * 1 * -1 = 0.8,    grad -0.8
#   log_prob 0 (ratio 1),    delta +2: w 1    -> loss 0,                      grad -2
# Every token keeps a gradient; PPO's clip zeroes the first (ratio e > 1.28 with delta > 0).
def test_cispo_by_hand():
    old = torch.zeros(4, 1, dtype=torch.float64)
    log_probs = _t([[1.0], [1.0], [-1.0], [0.0]]).requires_grad_()
    deltas = _t([1.0, -1.0, 1.0, 2.0])
    loss, stats = policy_loss(log_probs, deltas, "cispo", old, clip_eps=0.2, clip_eps_high=0.28)
    torch.testing.assert_close(loss, _t([[-1.28], [1.28], [0.8], [0.0]]), rtol=1e-15, atol=0)
    assert stats["clipped"].flatten().tolist() == [True, True, True, False]
    torch.testing.assert_close(stats["ratio"], _t([[E], [E], [1 / E], [1.0]]), rtol=1e-15, atol=0)
    (grad,) = torch.autograd.grad(loss.sum(), log_probs)
    torch.testing.assert_close(grad, _t([[-1.28], [1.28], [-0.8], [-2.0]]), rtol=1e-15, atol=0)
    _, ppo = policy_loss(log_probs, deltas, "clipped", old, clip_eps=0.2, clip_eps_high=0.28)
    assert ppo["clipped"].flatten().tolist() == [True, False, False, False]


def test_cispo_weight_is_detached():
    # Differentiating the weight would give d(-r delta log pi)/d log pi = -delta r (1 + log pi):
    # at log pi = -2, r = e^-1 (inside a wide clip) that is -delta r * (-1) = +delta/e, not -delta/e.
    log_probs = _t([[-2.0]]).requires_grad_()
    (grad,) = torch.autograd.grad(policy_loss(log_probs, _t([1.0]), "cispo", _t([[-1.0]]), clip_eps=0.9)[0].sum(),
                                  log_probs)
    assert grad.item() == pytest.approx(-1 / E, rel=1e-15)


def test_cispo_can_leave_the_lower_clip_open():
    # ratio 0.1 keeps its weight 0.1 with no lower clip; ratio 3 is capped at 1 + 0.5.
    log_probs = torch.log(torch.tensor([[0.1, 3.0]], dtype=torch.float64)).requires_grad_()
    old = torch.zeros(1, 2, dtype=torch.float64)
    loss, stats = policy_loss(log_probs, torch.tensor([1.0], dtype=torch.float64), "cispo", old, None, 0.5)
    (grad,) = torch.autograd.grad(loss.sum(), log_probs)
    torch.testing.assert_close(grad, torch.tensor([[-0.1, -1.5]], dtype=torch.float64), rtol=1e-14, atol=0)
    assert stats["clipped"].tolist() == [[False, True]]


# --- gradient checks against the closed form ------------------------------------------------


@pytest.mark.parametrize("mode", NEW_MODES)
def test_on_policy_gradient_is_the_policy_gradient(mode):
    # At pi_old = pi every ratio is 1: nothing clipped, and each loss's gradient is -dJ/dtheta.
    theta, rewards, p_state = _problem()
    grad, stats = _enumerated(mode, theta, rewards, p_state)
    target = closed_form_grad(theta, rewards, p_state)
    assert target.abs().max() > 0.05 and not stats["clipped"].any()
    torch.testing.assert_close(grad, -target, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", NEW_MODES)
def test_off_policy_gradient_unclipped_is_the_gradient_at_pi(mode):
    # Sampling from pi_old with a clip that never binds: each corrects by pi / pi_old (for
    # one-token responses GSPO's sequence ratio is the token ratio), so the gradient is
    # dJ/dtheta at the current pi; the naive loss on the same samples is not.
    theta, rewards, p_state = _problem()
    old_theta = _old_theta(theta, 0.5)
    grad, stats = _enumerated(mode, theta, rewards, p_state, old_theta, clip_eps=0.99, clip_eps_high=100.0,
                              clip_ratio_c=200.0)
    target = closed_form_grad(theta, rewards, p_state)
    assert not stats["clipped"].any()
    torch.testing.assert_close(grad, -target, rtol=1e-10, atol=1e-12)
    naive, _ = _enumerated("naive", theta, rewards, p_state, old_theta)
    assert (naive + target).abs().max() > 0.01


def _clip_factor(mode, ratio, rewards, low, high, c):
    """Each mode's per-(s, a) weight on R grad log pi, written out from its definition:
    dual_clip and gspo (one-token responses): ratio, or 0 where the clip (or the floor)
    takes over; cispo: clip(ratio), never 0."""
    if mode == "cispo":
        return ratio.clamp(low, high)
    flat_high = (rewards > 0) & (ratio > high)  # min picks the capped branch
    flat_low = (rewards < 0) & (ratio < low)
    floor = (rewards < 0) & (ratio > c) if mode == "dual_clip" else torch.zeros_like(flat_high)
    return torch.where(flat_high | flat_low | floor, 0.0, ratio)


@pytest.mark.parametrize("mode", NEW_MODES)
def test_off_policy_clipped_gradient_matches_the_formula(mode):
    # pi_old 0.7 logit-std away: ratios from 0.19 to 2.2, so the low and high clips, and a
    # floor at c = 1.5, all bind somewhere, and some ratios stay inside [0.8, 1.28].
    theta, rewards, p_state = _problem()
    old_theta = _old_theta(theta, 0.7)
    rewards = rewards - 1.0  # negative rewards too, for the low clip and the floor
    low, high, c = 0.8, 1.28, 1.5
    grad, stats = _enumerated(mode, theta, rewards, p_state, old_theta, clip_eps=0.2, clip_eps_high=0.28,
                              clip_ratio_c=c)
    ratio = stats["ratio"].reshape(S, K)
    factor = _clip_factor(mode, ratio, rewards, low, high, c)
    torch.testing.assert_close(grad, -sampled_grad_formula(theta, old_theta, rewards, p_state, factor),
                               rtol=1e-10, atol=1e-12)
    # The clipped stat is where the factor differs from the ratio (cispo: weight changed),
    # and the case is not vacuous: some (s, a) clip, some do not, and dual_clip floors one.
    assert torch.equal(stats["clipped"].reshape(S, K), factor != ratio)
    assert 0 < stats["clipped"].sum() < S * K
    if mode == "dual_clip":
        assert ((rewards < 0) & (ratio > c)).any()


# --- every new mode on degenerate batches -------------------------------------------------


@pytest.mark.parametrize("mode", NEW_MODES)
@pytest.mark.parametrize("n,t", [(0, 3), (3, 0), (4, 6)])
def test_new_modes_finite_on_degenerate_batches(mode, n, t):
    # Empty batches, a fully masked row, ratios up to e^40 in float32: finite loss and grads.
    gen = torch.Generator().manual_seed(n * 10 + t)
    log_probs = (-torch.rand(n, t, generator=gen) * 40).requires_grad_()
    old = -torch.rand(n, t, generator=gen) * 40
    mask = torch.rand(n, t, generator=gen) < 0.5
    if n:
        mask[0] = False
    per_token, stats = policy_loss(log_probs, torch.randn(n, generator=gen), mode, old, response_mask=mask)
    assert per_token.shape == stats["ratio"].shape == stats["clipped"].shape == (n, t)
    loss = aggregate_loss(per_token, mask, "token_mean")
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(log_probs.grad).all()


def test_new_modes_are_registered():
    assert {"dual_clip", "gspo", "cispo"} <= set(LOSS_MODES)


# --- entropy bonus ----------------------------------------------------------------------------


def test_entropy_bonus_by_hand():
    # -coef * H: H = [ln 2, 0] at coef 0.01 -> [-0.01 ln 2, 0].
    entropy = _t([[math.log(2), 0.0]])
    torch.testing.assert_close(entropy_bonus(entropy, 0.01), _t([[-0.01 * math.log(2), 0.0]]), rtol=1e-15, atol=0)
    with pytest.raises(ValueError, match="coef must be >= 0"):
        entropy_bonus(entropy, -0.1)


def test_entropy_bonus_gradient_matches_the_closed_form():
    # H(s) = -sum_a pi log pi, dH/dtheta[s, b] = -pi_b (log pi_b + H(s)) (by hand: d pi_a / d theta_b
    # = pi_a (1[a=b] - pi_b)). The loss sum_s p(s) * (-coef H(s)) has gradient
    # coef p(s) pi_b (log pi_b + H(s)).
    theta, _, p_state = _problem()
    coef = 0.05
    theta_var = theta.clone().requires_grad_()
    entropy = entropy_from_logits(theta_var).unsqueeze(-1)  # [S, 1]: one token per state
    loss = weighted_sum(entropy_bonus(entropy, coef), p_state[:, None])
    (grad,) = torch.autograd.grad(loss, theta_var)
    pi = torch.softmax(theta, -1)
    h = -(pi * pi.log()).sum(-1, keepdim=True)
    target = coef * p_state[:, None] * pi * (pi.log() + h)
    assert target.abs().max() > 1e-3
    torch.testing.assert_close(grad, target, rtol=1e-10, atol=1e-14)
    # At the uniform policy (maximal entropy) log pi_b + H = -ln K + ln K = 0: no gradient.
    uniform = torch.zeros(1, K, dtype=torch.float64, requires_grad=True)
    (flat,) = torch.autograd.grad(entropy_bonus(entropy_from_logits(uniform), coef).sum(), uniform)
    torch.testing.assert_close(flat, torch.zeros_like(flat), rtol=0, atol=1e-16)
