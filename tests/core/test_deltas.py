"""compute_deltas against hand-derived values, including the lecture's two-state example."""

import math

import pytest
import torch

from rlvr.core import DELTA_MODES, compute_deltas

EPS = 1e-6  # compute_deltas' default eps, written into the expected normalized values
NAN = float("nan")


def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


# Two groups (B=2, G=4), worked by hand:
#   group 0: r = [1, 2, 3, 6], mean 3, centered [-2, -1, 0, 3],
#            Bessel var (4 + 1 + 0 + 9) / 3 = 14/3, max 6 (one winner),
#            leave-one-out: 1 - (2+3+6)/3 = -8/3, 2 - (1+3+6)/3 = -4/3, 3 - (1+2+6)/3 = 0,
#            6 - (1+2+3)/3 = 4   (= 4/3 * centered, RLOO's G/(G-1) factor)
#   group 1: r = [-1, 5, 5, 3], mean 3, centered [-4, 2, 2, 0],
#            Bessel var (16 + 4 + 4 + 0) / 3 = 8, max 5 (a tie: both winners keep 5),
#            leave-one-out: -1 - 13/3 = -16/3, 5 - 7/3 = 8/3 (twice), 3 - 3 = 0
#   the batch: both group means are 3, so the 8 rewards and the 8 centered values have the
#            same std: Bessel var (4+1+0+9 + 16+4+4+0) / 7 = 38/7; batch_normalized and
#            reinforce_pp are both centered / sqrt(38/7) here (test_modern_deltas.py tells
#            them apart)
REWARDS = [[1.0, 2.0, 3.0, 6.0], [-1.0, 5.0, 5.0, 3.0]]
S0, S1, SB = math.sqrt(14 / 3), math.sqrt(8.0), math.sqrt(38 / 7)
BATCH_SCALED = [[c / (SB + EPS) for c in row] for row in [[-2.0, -1.0, 0.0, 3.0], [-4.0, 2.0, 2.0, 0.0]]]
EXPECTED = {
    "raw": REWARDS,
    "centered": [[-2.0, -1.0, 0.0, 3.0], [-4.0, 2.0, 2.0, 0.0]],
    "normalized": [
        [-2 / (S0 + EPS), -1 / (S0 + EPS), 0.0, 3 / (S0 + EPS)],
        [-4 / (S1 + EPS), 2 / (S1 + EPS), 2 / (S1 + EPS), 0.0],
    ],
    "max_only": [[0.0, 0.0, 0.0, 6.0], [0.0, 5.0, 5.0, 0.0]],
    "leave_one_out": [[-8 / 3, -4 / 3, 0.0, 4.0], [-16 / 3, 8 / 3, 8 / 3, 0.0]],
    "batch_normalized": BATCH_SCALED,
    "reinforce_pp": BATCH_SCALED,
}


@pytest.mark.parametrize("mode", DELTA_MODES)
def test_hand_derived_values(mode):
    deltas = compute_deltas(_t(REWARDS), mode)
    torch.testing.assert_close(deltas, _t(EXPECTED[mode]), rtol=1e-12, atol=1e-12)


def test_max_only_keeps_exactly_the_group_max():
    # Runner-ups a hair below the max get 0; with negative rewards the max member keeps its
    # (negative) reward: [-3, -1, -2] -> [0, -1, 0].
    rewards = _t([[0.5, 0.75, 0.7499], [-3.0, -1.0, -2.0]])
    expected = _t([[0.0, 0.75, 0.0], [0.0, -1.0, 0.0]])
    torch.testing.assert_close(compute_deltas(rewards, "max_only"), expected, rtol=0, atol=0)


def test_normalized_uses_bessel_std_like_torch_std():
    # The population std of group 0 would be sqrt(14/4) = 1.87, giving -2/1.87 = -1.069 for
    # the first entry; the Bessel std sqrt(14/3) = 2.160 gives -0.926. Pin the latter.
    first = compute_deltas(_t(REWARDS), "normalized")[0, 0].item()
    assert first == pytest.approx(-2 / (torch.tensor(REWARDS[0]).std().item() + EPS), rel=1e-6)
    assert first == pytest.approx(-0.9258200, abs=1e-6)


def test_binary_group_pushes_wrong_answers_down():
    # Lecture: one correct answer (1) among ten, mean 0.1: the nine zeros become -0.1, so
    # wrong answers get a negative update without re-scoring them as -1.
    rewards = _t([[1.0] + [0.0] * 9])
    deltas = compute_deltas(rewards, "centered")
    torch.testing.assert_close(deltas, _t([[0.9] + [-0.1] * 9]), rtol=0, atol=1e-15)


@pytest.mark.parametrize("value", [5.0, 0.1, 0.3, 0.7, -123.456])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_constant_group_abstains(value, dtype):
    # All rewards equal: no relative signal, so centered / normalized / leave-one-out are
    # exactly 0 (not rounding noise: 0.1 seven times in float32 used to give a normalized
    # delta of -0.007, a spurious uniform push on the whole group).
    rewards = torch.full((2, 7), value, dtype=dtype)
    for mode in ("centered", "normalized", "leave_one_out"):
        assert torch.equal(compute_deltas(rewards, mode), torch.zeros_like(rewards)), mode
    # raw keeps the reward; every member ties for the max, so max_only keeps it too.
    assert torch.equal(compute_deltas(rewards, "raw"), rewards)
    assert torch.equal(compute_deltas(rewards, "max_only"), rewards)


def test_normalized_is_scale_invariant_centered_is_not():
    rewards = _t(REWARDS)
    small, big = compute_deltas(rewards, "normalized"), compute_deltas(100 * rewards, "normalized")
    # delta = c / (s + eps) vs 100c / (100s + eps) = c / (s + eps/100): relative gap
    # 0.99 eps / s < 1e-6 for s >= 2.16, so rtol 1e-6 holds and a missing division by the
    # std (a gap of 100x) cannot pass.
    torch.testing.assert_close(big, small, rtol=1e-6, atol=0)
    torch.testing.assert_close(
        compute_deltas(100 * rewards, "centered"), 100 * compute_deltas(rewards, "centered"), rtol=1e-12, atol=0
    )


def test_lecture_two_state_baseline_example():
    # S1: A1 -> 11, A2 -> 9;  S2: A1 -> 0, A2 -> 2; uniform policy, so the four rewards are
    # equally likely samples. Groups = states, members = actions.
    rewards = _t([[11.0, 9.0], [0.0, 2.0]])
    # Baselines b(S1) = 10, b(S2) = 1 are the group means, so centered deltas are the
    # residuals {1, -1, -1, 1} exactly.
    residuals = compute_deltas(rewards, "centered")
    assert torch.equal(residuals, _t([[1.0, -1.0], [-1.0, 1.0]]))

    flat, res = rewards.flatten(), residuals.flatten()
    # Lecture quotes "5.3 -> 1.1". Mean 5.5, squared deviations 30.25 + 12.25 + 30.25 + 12.25
    # = 85. Bessel (divide by 4 - 1): sqrt(85/3) = 5.3229 -> "5.3"; residuals sqrt(4/3) = 1.1547 -> "1.1".
    # Population (divide by 4): sqrt(85/4) = 4.6098 and sqrt(4/4) = 1.0 would be quoted "4.6 -> 1.0".
    # So the lecture's numbers are torch.std's default (Bessel) standard deviations.
    assert round(flat.std(unbiased=True).item(), 2) == 5.32
    assert round(res.std(unbiased=True).item(), 2) == 1.15
    assert round(flat.std(unbiased=False).item(), 2) == 4.61
    assert round(res.std(unbiased=False).item(), 2) == 1.00
    assert flat.std().item() == pytest.approx(math.sqrt(85 / 3), rel=1e-12)
    assert res.std().item() == pytest.approx(math.sqrt(4 / 3), rel=1e-12)
    # GRPO on 2-member groups: std of [1, -1] is sqrt(2), so deltas are +-1/sqrt(2).
    torch.testing.assert_close(
        compute_deltas(rewards, "normalized"), residuals / (math.sqrt(2) + EPS), rtol=1e-12, atol=0
    )


# Abstentions: group 0 of REWARDS with a NaN inserted; the valid rewards [1, 2, 6] give
# mean 3, centered [-2, -1, 3], Bessel var (4+1+9)/2 = 7, leave-one-out
# 1 - 4 = -3, 2 - 3.5 = -1.5, 6 - 1.5 = 4.5 (= 3/2 * centered), max 6. One group: the
# batch's std is the group's, so batch_normalized and reinforce_pp equal normalized.
S_ABST = math.sqrt(7.0)
ABSTAIN_EXPECTED = {
    "raw": [1.0, 0.0, 2.0, 6.0],
    "centered": [-2.0, 0.0, -1.0, 3.0],
    "normalized": [-2 / (S_ABST + EPS), 0.0, -1 / (S_ABST + EPS), 3 / (S_ABST + EPS)],
    "max_only": [0.0, 0.0, 0.0, 6.0],
    "leave_one_out": [-3.0, 0.0, -1.5, 4.5],
}
ABSTAIN_EXPECTED["batch_normalized"] = ABSTAIN_EXPECTED["reinforce_pp"] = ABSTAIN_EXPECTED["normalized"]


@pytest.mark.parametrize("mode", DELTA_MODES)
def test_nan_reward_abstains(mode):
    with_nan = compute_deltas(_t([[1.0, NAN, 2.0, 6.0]]), mode)
    torch.testing.assert_close(with_nan, _t([ABSTAIN_EXPECTED[mode]]), rtol=1e-12, atol=1e-12)
    # Same deltas on the rest as the group without the abstaining member.
    without = compute_deltas(_t([[1.0, 2.0, 6.0]]), mode)
    torch.testing.assert_close(with_nan[:, [0, 2, 3]], without, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", DELTA_MODES)
def test_valid_false_abstains_like_nan(mode):
    # A finite reward (100, which would dominate every statistic) marked invalid is ignored.
    rewards = _t([[1.0, 100.0, 2.0, 6.0]])
    valid = torch.tensor([[True, False, True, True]])
    deltas = compute_deltas(rewards, mode, valid=valid)
    torch.testing.assert_close(deltas, _t([ABSTAIN_EXPECTED[mode]]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", DELTA_MODES)
def test_single_valid_member_and_all_abstaining_group(mode):
    # Group 0: only 4.0 is valid (G' = 1): no baseline can be formed from the others, so the
    # relative modes give 0; raw and max_only (4 is its own max) keep 4.
    # Group 1: every member abstains: all deltas 0.
    rewards = _t([[NAN, 4.0, NAN], [NAN, NAN, NAN]])
    deltas = compute_deltas(rewards, mode)
    keeps = mode in ("raw", "max_only")
    torch.testing.assert_close(deltas, _t([[0.0, 4.0 if keeps else 0.0, 0.0], [0.0, 0.0, 0.0]]), rtol=0, atol=0)


def test_infinite_reward_counts_as_abstention():
    deltas = compute_deltas(_t([[1.0, float("inf"), 2.0, 6.0]]), "centered")
    torch.testing.assert_close(deltas, _t([ABSTAIN_EXPECTED["centered"]]), rtol=1e-12, atol=1e-12)


def test_group_size_one_gives_zero_relative_deltas():
    rewards = _t([[3.0], [-2.0]])
    for mode in ("centered", "normalized", "leave_one_out"):
        assert torch.equal(compute_deltas(rewards, mode), torch.zeros_like(rewards)), mode
    assert torch.equal(compute_deltas(rewards, "max_only"), rewards)


@pytest.mark.parametrize("mode", DELTA_MODES)
@pytest.mark.parametrize("shape", [(0, 4), (3, 0), (0, 0)])
def test_empty_batch_or_group(mode, shape):
    deltas = compute_deltas(torch.zeros(shape), mode)
    assert deltas.shape == shape


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match=r"\[B, G\]"):
        compute_deltas(torch.zeros(4), "raw")
    with pytest.raises(ValueError, match="allowed: raw, centered"):
        compute_deltas(torch.zeros(2, 3), "grpo")
    with pytest.raises(ValueError, match="valid shape"):
        compute_deltas(torch.zeros(3, 3), "centered", valid=torch.ones(3, dtype=torch.bool))
