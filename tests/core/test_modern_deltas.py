"""What goes into the deltas: batch-scaled baselines (reinforce_pp, batch_normalized),
scale_rewards, and the KL penalty in the reward; hand values and gradient checks."""

import math

import pytest
import torch

from rlvr.core import (
    DELTA_MODES,
    REWARD_SCALES,
    compute_deltas,
    kl_reward_penalty,
    policy_loss,
    scale_rewards,
    weighted_sum,
)

EPS = 1e-6
NAN = float("nan")


def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


# Two groups of two, worked by hand:
#   group means 1 and 12; centered [-1, 1], [-2, 2].
#   reinforce_pp: the 4 centered values have mean 0, Bessel var (1 + 1 + 4 + 4) / 3 = 10/3.
#   batch_normalized: the 4 rewards 0, 2, 10, 14 have mean 6.5, deviations -6.5, -4.5, 3.5,
#     7.5, Bessel var (42.25 + 20.25 + 12.25 + 56.25) / 3 = 131/3 (the gap between the
#     group means counts here).
#   normalized (group std): std [0, 2] = sqrt(2), std [10, 14] = sqrt(8): +-1/sqrt(2) in both
#     groups, the 2:1 spread between the groups is gone; both batch scales keep it.
REWARDS = [[0.0, 2.0], [10.0, 14.0]]
CENTERED = [[-1.0, 1.0], [-2.0, 2.0]]
SD_CENTERED, SD_REWARDS = math.sqrt(10 / 3), math.sqrt(131 / 3)


def _scaled(scale):
    return [[c / (scale + EPS) for c in row] for row in CENTERED]


def test_batch_scaled_modes_by_hand():
    rewards = _t(REWARDS)
    torch.testing.assert_close(compute_deltas(rewards, "reinforce_pp"), _t(_scaled(SD_CENTERED)), rtol=1e-14, atol=0)
    torch.testing.assert_close(compute_deltas(rewards, "batch_normalized"), _t(_scaled(SD_REWARDS)), rtol=1e-14,
                               atol=0)
    g0, g1 = 1 / (math.sqrt(2) + EPS), 2 / (math.sqrt(8) + EPS)  # c / (group std + eps), both ~0.7071
    torch.testing.assert_close(compute_deltas(rewards, "normalized"), _t([[-g0, g0], [-g1, g1]]), rtol=1e-14, atol=0)
    assert {"reinforce_pp", "batch_normalized"} <= set(DELTA_MODES)


def test_reinforce_pp_whitens_over_tokens_by_hand():
    """verl's reinforce_plus_plus_baseline: group-center, then whiten over the batch's tokens.
    rewards [[1, 0], [2, 0]] -> c = [[0.5, -0.5], [1, -1]]; lengths [[1, 3], [2, 2]], 8 tokens:
    m = (0.5 - 1.5 + 2 - 2) / 8 = -1/8; c - m = [[5/8, -3/8], [9/8, -7/8]];
    s^2 = (25/64 + 3 * 9/64 + 2 * 81/64 + 2 * 49/64) / 7 = (312/64) / 7 = 39/56."""
    rewards = torch.tensor([[1.0, 0.0], [2.0, 0.0]], dtype=torch.float64)
    lengths = torch.tensor([[1, 3], [2, 2]])
    expected = torch.tensor([[5 / 8, -3 / 8], [9 / 8, -7 / 8]], dtype=torch.float64) / (math.sqrt(39 / 56) + 1e-6)
    torch.testing.assert_close(compute_deltas(rewards, "reinforce_pp", lengths=lengths), expected, rtol=1e-14, atol=0)
    # equal lengths: the token mean is exactly 0, the std over the 4 n tokens (Bessel over tokens)
    equal = compute_deltas(rewards, "reinforce_pp", lengths=torch.full((2, 2), 3))
    c = torch.tensor([[0.5, -0.5], [1.0, -1.0]], dtype=torch.float64)
    torch.testing.assert_close(equal, c / (math.sqrt(3 * 2.5 / 11) + 1e-6), rtol=1e-14, atol=0)
    constant = compute_deltas(torch.tensor([[1.0, 1.0], [2.0, 0.0]]), "reinforce_pp", lengths=torch.full((2, 2), 3))
    assert (constant[0] == 0).all()  # a constant group stays exactly 0 with equal lengths


@pytest.mark.parametrize("mode", ["reinforce_pp", "batch_normalized"])
def test_batch_scaled_modes_abstain(mode):
    # A NaN reward and a valid=False reward (1000, which would dominate the batch std)
    # leave the statistics: the others get the hand values above, the abstainers 0.
    with_nan = compute_deltas(_t([[0.0, NAN, 2.0], [10.0, 14.0, 1000.0]]), mode,
                              valid=torch.tensor([[True, True, True], [True, True, False]]))
    expected = _scaled(SD_CENTERED if mode == "reinforce_pp" else SD_REWARDS)
    torch.testing.assert_close(with_nan, _t([[expected[0][0], 0.0, expected[0][1]], expected[1] + [0.0]]),
                               rtol=1e-14, atol=0)
    # One valid reward in the whole batch: no std (N' = 1) and a zero centered value: 0.
    assert torch.equal(compute_deltas(_t([[NAN, 3.0], [NAN, NAN]]), mode), torch.zeros(2, 2, dtype=torch.float64))


@pytest.mark.parametrize("mode", ["reinforce_pp", "batch_normalized"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_constant_group_in_a_varied_batch_gets_exactly_zero(mode, dtype):
    # Group 1 is constant (0.1 seven times); group 0 is not, so the batch std is not 0.
    rewards = torch.tensor([[0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0], [0.1] * 7], dtype=dtype)
    deltas = compute_deltas(rewards, mode)
    assert torch.equal(deltas[1], torch.zeros(7, dtype=dtype))
    assert (deltas[0] != 0).all()


@pytest.mark.parametrize("scale", ["none", "group", "batch"])
def test_scale_rewards_selects_a_centered_mode(scale):
    rewards = _t([[1.0, 2.0, 3.0, 6.0], [-1.0, 5.0, NAN, 3.0]])
    mode = {"none": "centered", "group": "normalized", "batch": "batch_normalized"}[scale]
    assert REWARD_SCALES[scale] == mode
    assert torch.equal(scale_rewards(rewards, scale), compute_deltas(rewards, mode))
    # By hand, none is r - group mean: group 0 mean 3; group 1's valid -1, 5, 3 have mean 7/3.
    if scale == "none":
        torch.testing.assert_close(scale_rewards(rewards, "none"),
                                   _t([[-2.0, -1.0, 0.0, 3.0], [-10 / 3, 8 / 3, 0.0, 2 / 3]]), rtol=0, atol=1e-15)


def test_scale_rewards_unknown_scale():
    with pytest.raises(ValueError, match="^unknown reward scale 'std'; allowed: none, group, batch$"):
        scale_rewards(torch.zeros(2, 2), "std")


# --- gradient checks: a batch scale keeps the direction of the policy gradient ----------------

S, K = 3, 4


def _problem():
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(S, K, generator=gen, dtype=torch.float64)
    rewards = _t([[1.0, 0.0, 0.0, 2.0], [0.0, 3.0, 1.0, 0.0], [-1.0, 0.0, 4.0, 1.0]])
    return theta, rewards, _t([0.5, 0.3, 0.2])


def closed_form_grad(theta, rewards, p_state):
    """dJ/dtheta[s, b] = p(s) pi(b|s) (R(s, b) - V(s)), written out."""
    pi = torch.softmax(theta, dim=-1)
    return p_state[:, None] * pi * (rewards - (pi * rewards).sum(-1, keepdim=True))


def _naive_enumerated_grad(deltas, theta, p_state):
    """Exact expected gradient of the naive loss over all one-token (s, a) responses."""
    theta = theta.clone().requires_grad_()
    log_probs = torch.log_softmax(theta, -1).reshape(S * K, 1)
    weights = (p_state[:, None] * log_probs.detach().exp().reshape(S, K)).reshape(S * K, 1)
    per_token, _ = policy_loss(log_probs, deltas.reshape(S * K), "naive")
    (grad,) = torch.autograd.grad(weighted_sum(per_token, weights), theta)
    return grad


@pytest.mark.parametrize("mode", ["reinforce_pp", "batch_normalized"])
def test_batch_scaled_gradient_is_the_policy_gradient_over_one_scale(mode):
    # Groups = states, members = actions. The group mean is a state baseline (no change to the
    # expected gradient); the batch std sigma is one constant, so the gradient is
    # -dJ/dtheta / (sigma + eps), sigma computed here with torch.std on its own.
    theta, rewards, p_state = _problem()
    centered = rewards - rewards.mean(1, keepdim=True)
    sigma = (centered if mode == "reinforce_pp" else rewards).flatten().std()
    grad = _naive_enumerated_grad(compute_deltas(rewards, mode), theta, p_state)
    target = closed_form_grad(theta, rewards, p_state)
    torch.testing.assert_close(grad, -target / (sigma + EPS), rtol=1e-12, atol=1e-15)
    # A per-group scale (GRPO's normalized) reweights the states: not parallel to dJ/dtheta.
    group = _naive_enumerated_grad(compute_deltas(rewards, "normalized"), theta, p_state)
    cosine = torch.nn.functional.cosine_similarity(group.flatten(), -target.flatten(), dim=0)
    assert cosine < 0.99


# --- the KL penalty in the reward -------------------------------------------------------------


def test_kl_reward_penalty_by_hand():
    # Row 0: k1 = log pi - log ref = [-1 + 1.5, -2 + 1] = [0.5, -1] on the two real tokens
    #        (the padding, 0 vs 5, is left out): sum -0.5, times 0.1 -> -0.05.
    # Row 1: three tokens of k1 = 0.5: sum 1.5 -> 0.15.
    log_probs = _t([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]]).requires_grad_()
    ref = _t([[-1.5, -1.0, 5.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    penalty = kl_reward_penalty(log_probs, ref, mask, 0.1)
    torch.testing.assert_close(penalty, _t([-0.05, 0.15]), rtol=1e-14, atol=0)
    assert not penalty.requires_grad  # a reward is a constant of the step
    # Subtracted from the rewards: an abstaining (NaN) reward stays an abstention.
    shaped = _t([1.0, NAN]) - penalty
    assert shaped[0].item() == pytest.approx(1.05, rel=1e-14) and math.isnan(shaped[1].item())


def test_kl_reward_penalty_bad_inputs():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="coef must be >= 0"):
        kl_reward_penalty(x, x, x.bool(), -1.0)
    with pytest.raises(ValueError, match="must have one shape"):
        kl_reward_penalty(x, torch.zeros(2, 4), x.bool(), 0.1)


def test_kl_in_the_reward_gives_the_gradient_of_the_penalised_objective():
    # J_beta = sum_s p(s) [sum_a pi R - beta KL(pi(.|s) || ref(.|s))]. By hand,
    # dKL/dtheta[s, b] = pi_b (log(pi_b / ref_b) - KL(s)), so
    #   dJ_beta/dtheta[s, b] = p(s) pi_b [(R_b - V(s)) - beta (log(pi_b / ref_b) - KL(s))].
    # The naive loss with rewards R - kl_reward_penalty (one-token responses) has that gradient.
    theta, rewards, p_state = _problem()
    beta = 0.7
    log_ref = torch.log_softmax(torch.randn(S, K, generator=torch.Generator().manual_seed(4), dtype=torch.float64), -1)
    log_pi = torch.log_softmax(theta, -1)
    mask = torch.ones(S * K, 1, dtype=torch.bool)
    penalty = kl_reward_penalty(log_pi.reshape(S * K, 1), log_ref.reshape(S * K, 1), mask, beta).reshape(S, K)
    grad = _naive_enumerated_grad(rewards - penalty, theta, p_state)
    pi = log_pi.exp()
    kl = (pi * (log_pi - log_ref)).sum(-1, keepdim=True)
    target = closed_form_grad(theta, rewards, p_state) - beta * p_state[:, None] * pi * (log_pi - log_ref - kl)
    assert (beta * p_state[:, None] * pi * (log_pi - log_ref - kl)).abs().max() > 0.01  # the KL part matters
    torch.testing.assert_close(grad, -target, rtol=1e-10, atol=1e-12)


def test_kl_in_the_reward_sums_over_the_tokens_of_a_response():
    # Two-token responses y = (y0, y1) from independent positions, pi(y) = pi0(y0) pi1(y1),
    # ref likewise: KL over responses = KL_0 + KL_1. By hand, as above per position,
    #   dJ_beta/dtheta[t, b] = pi_t(b) (E[R | y_t = b] - E[R]) - beta pi_t(b) (log(pi_t(b)/ref_t(b)) - KL_t).
    # All K^2 responses enumerated, weight pi(y) on each token: the naive loss's gradient is
    # -sum_y pi(y) delta_y grad log pi(y). A per-token mean in the penalty would halve the KL part.
    gen = torch.Generator().manual_seed(11)
    theta = torch.randn(2, K, generator=gen, dtype=torch.float64)
    log_ref = torch.log_softmax(torch.randn(2, K, generator=gen, dtype=torch.float64), -1)
    rewards = torch.randn(K, K, generator=gen, dtype=torch.float64)
    beta = 0.5
    y0, y1 = torch.meshgrid(torch.arange(K), torch.arange(K), indexing="ij")
    y0, y1 = y0.flatten(), y1.flatten()

    def per_token(table):  # [2, K] -> [K*K, 2]
        return torch.stack([table[0, y0], table[1, y1]], dim=-1)

    theta_var = theta.clone().requires_grad_()
    log_probs = per_token(torch.log_softmax(theta_var, -1))
    mask = torch.ones(K * K, 2, dtype=torch.bool)
    penalty = kl_reward_penalty(log_probs, per_token(log_ref), mask, beta)  # [K*K]
    loss, _ = policy_loss(log_probs, rewards.flatten() - penalty, "naive")
    weights = log_probs.detach().sum(-1, keepdim=True).exp().expand(-1, 2)  # pi(y) on each token
    (grad,) = torch.autograd.grad(weighted_sum(loss, weights), theta_var)

    pi, log_pi = torch.softmax(theta, -1), torch.log_softmax(theta, -1)
    value = (pi[0][:, None] * pi[1][None, :] * rewards).sum()
    given = torch.stack([(pi[1][None, :] * rewards).sum(1), (pi[0][:, None] * rewards).sum(0)])  # E[R | y_t = b]
    kl = (pi * (log_pi - log_ref)).sum(-1, keepdim=True)  # [2, 1]
    target = pi * (given - value) - beta * pi * (log_pi - log_ref - kl)
    torch.testing.assert_close(grad, -target, rtol=1e-10, atol=1e-12)
