"""Selections: dynamic-sampling groups, overlong filtering and penalty, top-entropy tokens."""

import math

import pytest
import torch

from rlvr.core import (
    aggregation_weights,
    compute_deltas,
    nonzero_delta_groups,
    overlong_mask,
    overlong_penalty,
    policy_loss,
    top_entropy_mask,
    weighted_sum,
)

NAN = float("nan")


def test_nonzero_delta_groups_by_hand():
    # Centered deltas of four groups of three:
    #   [1, 1, 1]        constant: all 0              -> dropped
    #   [0, 1, 0]        one solved: -1/3, 2/3, -1/3  -> kept
    #   [NaN, 2, NaN]    one valid member: 0          -> dropped
    #   [0.1, 0.1, 0.1]  constant (exactly 0, no rounding residue) -> dropped
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [NAN, 2.0, NAN], [0.1, 0.1, 0.1]])
    deltas = compute_deltas(rewards, "centered").reshape(-1)  # [N = 12]
    assert nonzero_delta_groups(deltas, 3).tolist() == [False, True, False, False]
    # raw deltas keep a group of equal nonzero rewards (it still has a gradient).
    raw = compute_deltas(rewards, "raw").reshape(-1)
    assert nonzero_delta_groups(raw, 3).tolist() == [True, True, True, True]


def test_nonzero_delta_groups_bad_inputs():
    with pytest.raises(ValueError, match="multiple of group_size=4"):
        nonzero_delta_groups(torch.zeros(6), 4)
    with pytest.raises(ValueError, match=r"must be \[N\]"):
        nonzero_delta_groups(torch.zeros(2, 3), 3)
    with pytest.raises(ValueError, match="group_size must be positive"):
        nonzero_delta_groups(torch.zeros(6), 0)


def test_overlong_mask_removes_truncated_rows_from_the_loss():
    response_mask = torch.tensor([[True, True, True], [True, False, False], [True, True, True]])
    truncated = torch.tensor([False, False, True])
    keep = overlong_mask(truncated, response_mask)
    assert keep.tolist() == [[True, True, True], [True, False, False], [False, False, False]]
    # Applied before the weights, the truncated row leaves the token_mean denominator too:
    # 4 tokens remain, 1/4 each (not 1/7).
    weights = aggregation_weights(keep, "token_mean", dtype=torch.float64)
    assert weights[keep].tolist() == [0.25] * 4 and (weights[~keep] == 0).all()
    with pytest.raises(ValueError, match=r"truncated must be \[N\]"):
        overlong_mask(torch.tensor([True]), response_mask)


def test_overlong_penalty_by_hand():
    # max_len 20, cache 4: 0 up to 16, then -(L - 16) / 4: 17 -> -0.25, 18 -> -0.5, 20 -> -1,
    # and -1 beyond (a response can only reach it if the limit is larger than max_len).
    lengths = torch.tensor([0, 16, 17, 18, 20, 25])
    expected = [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    assert overlong_penalty(lengths, max_len=20, cache_len=4, factor=1.0).tolist() == expected
    half = overlong_penalty(lengths, max_len=20, cache_len=4, factor=0.5, dtype=torch.float64)
    assert half.dtype == torch.float64 and half.tolist() == [v / 2 for v in expected]
    # cache_len = max_len: the penalty grows from the first token, -L / max_len.
    assert overlong_penalty(torch.tensor([5]), 20, 20, 1.0).tolist() == [-0.25]


@pytest.mark.parametrize("max_len,cache_len,factor,match", [
    (20, 0, 1.0, "0 < cache_len <= max_len"),
    (20, 21, 1.0, "0 < cache_len <= max_len"),
    (20, 4, -1.0, "factor must be >= 0"),
])
def test_overlong_penalty_bad_inputs(max_len, cache_len, factor, match):
    with pytest.raises(ValueError, match=match):
        overlong_penalty(torch.tensor([3]), max_len, cache_len, factor)


# Two responses, T = 4; the last token of row 0 is padding with a huge entropy (7) that must
# never be picked. n = 7 response tokens, by entropy:
#   0.9 (0,0), 0.8 (1,1), 0.5 (0,2), 0.5 (1,0), 0.5 (1,2), 0.2 (1,3), 0.1 (0,1)
# q = 0.5 keeps ceil(3.5) = 4: three tokens tie at 0.5 for the last two places, and position
# decides: (0,2) and (1,0) stay, (1,2) goes.
ENTROPY = [[0.9, 0.1, 0.5, 7.0], [0.5, 0.8, 0.5, 0.2]]
MASK = [[True, True, True, False], [True, True, True, True]]


def test_top_entropy_mask_by_hand():
    entropy, mask = torch.tensor(ENTROPY), torch.tensor(MASK)
    assert top_entropy_mask(entropy, mask, 0.5).tolist() == [[True, False, True, False], [True, True, False, False]]
    # q = 1/7 keeps one token, q = 1 all seven response tokens (never the padding).
    assert top_entropy_mask(entropy, mask, 1 / 7).tolist() == [[True, False, False, False], [False] * 4]
    assert torch.equal(top_entropy_mask(entropy, mask, 1.0), mask)


def test_top_entropy_mask_count_has_no_rounding_slip():
    # 0.07 * 100 = 7.000000000000001 in floating point; the top 7% of 100 tokens is 7 tokens.
    entropy = torch.arange(100, dtype=torch.float32).reshape(4, 25)
    keep = top_entropy_mask(entropy, torch.ones(4, 25, dtype=torch.bool), 0.07)
    assert keep.sum().item() == 7 and keep.flatten()[-7:].all()


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("q", [0.2, 0.5, 0.93])
def test_top_entropy_mask_keeps_the_top_ceil_qn(seed, q):
    # Entropies on a coarse grid (many ties): ceil(q n) tokens kept, all inside the mask, and
    # none of the dropped response tokens has a higher entropy than a kept one.
    gen = torch.Generator().manual_seed(seed)
    entropy = torch.randint(0, 5, (6, 9), generator=gen).float() / 4
    mask = torch.rand(6, 9, generator=gen) < 0.7
    keep = top_entropy_mask(entropy, mask, q)
    n = mask.sum().item()
    assert keep.sum().item() == math.ceil(q * n)
    assert not (keep & ~mask).any()
    dropped = mask & ~keep
    assert entropy[keep].min() >= entropy[dropped].max()


def test_top_entropy_mask_selects_the_gradient():
    # Multiplied into the weights: only the selected tokens carry gradient, each with its
    # usual weight.
    entropy, mask = torch.tensor(ENTROPY, dtype=torch.float64), torch.tensor(MASK)
    keep = top_entropy_mask(entropy, mask, 0.5)
    log_probs = torch.full((2, 4), -1.0, dtype=torch.float64, requires_grad=True)
    weights = aggregation_weights(mask, "token_mean", dtype=torch.float64) * keep
    loss, _ = policy_loss(log_probs, torch.tensor([1.0, 2.0], dtype=torch.float64), "naive")
    (grad,) = torch.autograd.grad(weighted_sum(loss, weights), log_probs)
    # token_mean over 7 tokens: -delta / 7 on the kept tokens, 0 elsewhere.
    expected = torch.where(keep, -torch.tensor([[1.0], [2.0]], dtype=torch.float64) / 7, 0.0)
    torch.testing.assert_close(grad, expected, rtol=1e-15, atol=0)


def test_top_entropy_mask_bad_inputs():
    entropy, mask = torch.tensor(ENTROPY), torch.tensor(MASK)
    for q in (0.0, 1.5, -0.2):
        with pytest.raises(ValueError, match=r"q must be in \(0, 1\]"):
            top_entropy_mask(entropy, mask, q)
    with pytest.raises(ValueError, match="one shape"):
        top_entropy_mask(entropy, mask[:, :3], 0.5)
    # No response tokens at all: nothing selected.
    assert not top_entropy_mask(entropy, torch.zeros_like(mask), 0.5).any()
