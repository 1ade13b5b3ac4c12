"""Gradient checks on a tiny categorical policy against the closed-form policy gradient.

Policy: logits theta [S, K], pi(a|s) = softmax(theta[s])[a], states s ~ p(s), rewards R [S, K].
J(theta) = sum_s p(s) sum_a pi(a|s) R(s, a). Since d log pi(a|s) / d theta[s, b] = 1[a=b] - pi(b|s),
    dJ / dtheta[s, b] = p(s) pi(b|s) (R(s, b) - V(s)),   V(s) = sum_a pi(a|s) R(s, a).
Each loss's gradient must be -dJ/dtheta (losses are minimized).
"""

import math

import pytest
import torch

from rlvr.core import aggregate_loss, compute_deltas, policy_loss, weighted_sum

S, K = 3, 4


def _problem():
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(S, K, generator=gen, dtype=torch.float64)
    rewards = torch.tensor(
        [[1.0, 0.0, 0.0, 2.0], [0.0, 3.0, 1.0, 0.0], [-1.0, 0.0, 4.0, 1.0]], dtype=torch.float64
    )
    p_state = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    return theta, rewards, p_state


def closed_form_grad(theta, rewards, p_state):
    """dJ/dtheta written out, no autograd."""
    pi = torch.softmax(theta, dim=-1)
    value = (pi * rewards).sum(-1, keepdim=True)  # [S, 1]
    return p_state[:, None] * pi * (rewards - value)


def test_closed_form_by_hand():
    # One state, two actions, uniform policy, R = [1, 0]: V = 0.5, so
    # dJ/dtheta = 0.5 * (1 - 0.5), 0.5 * (0 - 0.5) = [0.25, -0.25].
    theta = torch.zeros(1, 2, dtype=torch.float64)
    rewards = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    grad = closed_form_grad(theta, rewards, torch.ones(1, dtype=torch.float64))
    torch.testing.assert_close(grad, torch.tensor([[0.25, -0.25]], dtype=torch.float64), rtol=0, atol=1e-16)


def test_closed_form_matches_autograd_of_expected_reward():
    theta, rewards, p_state = _problem()
    theta = theta.requires_grad_()
    expected_reward = (p_state[:, None] * torch.softmax(theta, -1) * rewards).sum()
    (grad,) = torch.autograd.grad(expected_reward, theta)
    torch.testing.assert_close(grad, closed_form_grad(theta.detach(), rewards, p_state), rtol=1e-13, atol=1e-15)


def _enumerated_loss_grad(mode, deltas, theta, p_state, old_theta=None):
    """Every (s, a) pair as a one-token response [S*K, 1], weighted by p(s) pi_sample(a|s)."""
    theta = theta.clone().requires_grad_()
    log_probs = torch.log_softmax(theta, -1).reshape(S * K, 1)
    sample_theta = theta.detach() if old_theta is None else old_theta
    old_log_probs = torch.log_softmax(sample_theta, -1).reshape(S * K, 1)
    weights = (p_state[:, None] * old_log_probs.exp().reshape(S, K)).reshape(S * K, 1)
    per_token, _ = policy_loss(log_probs, deltas.reshape(S * K), mode, old_log_probs=old_log_probs)
    (grad,) = torch.autograd.grad(weighted_sum(per_token, weights), theta)
    return grad


@pytest.mark.parametrize("mode", ["naive", "ratio", "clipped"])
def test_enumerated_loss_gradient_is_the_policy_gradient(mode):
    # At old = current (ratio 1, nothing clipped) all three losses give exactly -dJ/dtheta.
    theta, rewards, p_state = _problem()
    grad = _enumerated_loss_grad(mode, rewards, theta, p_state)
    target = closed_form_grad(theta, rewards, p_state)
    assert target.abs().max() > 0.05
    torch.testing.assert_close(grad, -target, rtol=1e-12, atol=1e-15)


def test_state_baseline_leaves_the_gradient_unchanged():
    # Any b(s) is legal: sum_a pi(a|s) b(s) grad log pi(a|s) = b(s) grad sum_a pi = 0.
    # compute_deltas' centered mode uses the unweighted mean over actions as b(s).
    theta, rewards, p_state = _problem()
    centered = compute_deltas(rewards, "centered")  # groups = states, members = actions
    grad = _enumerated_loss_grad("naive", centered, theta, p_state)
    torch.testing.assert_close(grad, -closed_form_grad(theta, rewards, p_state), rtol=1e-12, atol=1e-15)


def test_ratio_loss_corrects_for_sampling_from_pi_old():
    # Sampling from pi_old and weighting by pi / pi_old: E_old[R pi/pi_old grad log pi]
    # = sum_a pi R grad log pi, the gradient at the current theta. The naive loss on the
    # same pi_old samples gives the gradient at the wrong policy.
    theta, rewards, p_state = _problem()
    old_theta = theta + 0.5 * torch.randn(S, K, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    target = closed_form_grad(theta, rewards, p_state)
    ratio_grad = _enumerated_loss_grad("ratio", rewards, theta, p_state, old_theta=old_theta)
    torch.testing.assert_close(ratio_grad, -target, rtol=1e-12, atol=1e-15)
    naive_grad = _enumerated_loss_grad("naive", rewards, theta, p_state, old_theta=old_theta)
    assert (naive_grad + target).abs().max() > 0.01


def test_lecture_example_baseline_cuts_gradient_variance_100x():
    # Two states, uniform state and policy, R = [[11, 9], [0, 2]]. grad log pi(a|s) on
    # theta[s] is +-0.5 (1 - 0.5 on the taken action, -0.5 on the other).
    # Per-sample gradients of the naive surrogate R * log pi (each sample has prob 1/4):
    #   (s1,a1) 11*( .5,-.5, 0, 0)  (s1,a2) 9*(-.5,.5, 0, 0)  (s2,a1) 0  (s2,a2) 2*(0,0,-.5,.5)
    # mean (0.25, -0.25, -0.25, 0.25) = dJ/dtheta. Variances per coordinate:
    #   theta[s1]: (5.5^2 + 4.5^2)/4 - 0.25^2 = 12.5625;  theta[s2]: 1/4 - 1/16 = 0.1875
    #   total 2 * 12.5625 + 2 * 0.1875 = 25.5.
    # With b(s1) = 10, b(s2) = 1 (deltas +-1) every sample gives (.5,-.5,0,0) or (0,0,-.5,.5):
    #   per coordinate 0.5^2/2 - 0.25^2 = 0.0625, total 0.25.
    theta = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    rewards = torch.tensor([[11.0, 9.0], [0.0, 2.0]], dtype=torch.float64)
    samples = [(0, 0), (0, 1), (1, 0), (1, 1)]

    def per_sample_grads(deltas):
        grads = []
        for s, a in samples:
            log_prob = torch.log_softmax(theta, -1)[s, a].reshape(1, 1)
            loss, _ = policy_loss(log_prob, deltas[s, a].reshape(1), "naive")
            grads.append(-torch.autograd.grad(loss.sum(), theta)[0].flatten())
        return torch.stack(grads)  # [4 samples, 4 coordinates]

    raw = per_sample_grads(compute_deltas(rewards, "raw"))
    base = per_sample_grads(compute_deltas(rewards, "centered"))
    target = torch.tensor([0.25, -0.25, -0.25, 0.25], dtype=torch.float64)
    torch.testing.assert_close(raw.mean(0), target, rtol=0, atol=1e-15)
    torch.testing.assert_close(base.mean(0), target, rtol=0, atol=1e-15)
    assert raw.var(0, unbiased=False).sum().item() == pytest.approx(25.5, rel=1e-12)
    assert base.var(0, unbiased=False).sum().item() == pytest.approx(0.25, rel=1e-12)


@pytest.mark.parametrize("delta_mode", ["raw", "centered"])
def test_monte_carlo_sampled_loss_gradient(delta_mode):
    # Sample M (s, a) pairs from p(s) pi(a|s), one-token responses, token_mean aggregation:
    # the gradient is -(1/M) sum_i delta_i grad log pi(a_i|s_i), an unbiased estimate of
    # -dJ/dtheta. Tolerance: 5 standard errors per coordinate, the standard error taken from
    # the per-sample gradients delta_i (onehot(a_i) - pi(.|s_i)) on row s_i.
    m = 20_000
    theta, rewards, p_state = _problem()
    if delta_mode == "centered":  # b(s) = mean over actions: still unbiased
        rewards_used = compute_deltas(rewards, "centered")
    else:
        rewards_used = rewards
    gen = torch.Generator().manual_seed(123)
    pi = torch.softmax(theta, -1)
    states = torch.multinomial(p_state, m, replacement=True, generator=gen)
    actions = torch.multinomial(pi[states], 1, generator=gen).squeeze(-1)

    theta_var = theta.clone().requires_grad_()
    log_probs = torch.log_softmax(theta_var, -1)[states, actions].unsqueeze(-1)  # [M, 1]
    per_token, _ = policy_loss(log_probs, rewards_used[states, actions], "naive")
    loss = aggregate_loss(per_token, torch.ones_like(per_token, dtype=torch.bool), "token_mean")
    (grad,) = torch.autograd.grad(loss, theta_var)

    per_sample = torch.zeros(m, S, K, dtype=torch.float64)
    per_sample[torch.arange(m), states] = rewards_used[states, actions, None] * (
        torch.nn.functional.one_hot(actions, K).double() - pi[states]
    )
    stderr = per_sample.std(0) / math.sqrt(m)
    target = closed_form_grad(theta, rewards, p_state)
    # The check has power: 5 standard errors are well below the gradient's size.
    assert 5 * stderr.max() < 0.3 * target.abs().max()
    assert ((-grad - target).abs() <= 5 * stderr).all(), ((-grad - target).abs() / stderr).max()
