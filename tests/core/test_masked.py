"""Masked reductions and entropy_from_logits against hand-derived values."""

import math

import pytest
import torch

from rlvr.core import entropy_from_logits, masked_mean, masked_normalize, masked_sum

NAN = float("nan")
# Padded entries hold NaN: any leak of a masked-out value turns the result NaN.
X = torch.tensor([[1.0, 2.0, NAN], [4.0, NAN, NAN], [NAN, NAN, NAN]], dtype=torch.float64)
MASK = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])


def test_masked_sum_by_hand():
    assert masked_sum(X, MASK).item() == 7.0  # 1 + 2 + 4
    torch.testing.assert_close(masked_sum(X, MASK, dim=-1), torch.tensor([3.0, 4.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(masked_sum(X, MASK, dim=0), torch.tensor([5.0, 2.0, 0.0], dtype=torch.float64))


def test_masked_mean_by_hand():
    assert masked_mean(X, MASK).item() == 7.0 / 3  # 3 tokens
    # Row means 3/2, 4/1, and 0 for the empty row (not NaN).
    torch.testing.assert_close(masked_mean(X, MASK, dim=-1), torch.tensor([1.5, 4.0, 0.0], dtype=torch.float64))
    assert masked_mean(X, torch.zeros_like(MASK)).item() == 0.0


def test_masked_mean_broadcast_mask():
    # A [N, 1] mask selects whole rows: rows 0 and 2 of [[1, 3], [5, 7], [9, 11]] -> mean 6.
    x = torch.tensor([[1.0, 3.0], [5.0, 7.0], [9.0, 11.0]])
    assert masked_mean(x, torch.tensor([[True], [False], [True]])).item() == 6.0


def test_masked_values_get_no_gradient_even_when_nan():
    x = X.clone().requires_grad_()
    masked_mean(x, MASK, dim=-1).sum().backward()
    # d/dx of row means: 1/2 on row 0's two tokens, 1 on row 1's token, 0 elsewhere.
    expected = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.equal(x.grad, expected)


def test_masked_normalize_by_hand():
    # Row sums 3, 4, 0 over a constant 4 (not the row length): 0.75, 1.0, 0.0.
    torch.testing.assert_close(
        masked_normalize(X, MASK, 4.0, dim=-1), torch.tensor([0.75, 1.0, 0.0], dtype=torch.float64)
    )
    assert masked_normalize(X, MASK, 2.0).item() == 3.5  # 7 / 2
    with pytest.raises(ValueError, match="normalizer must be positive"):
        masked_normalize(X, MASK, 0.0)


@pytest.mark.parametrize("vocab", [2, 7, 1000, 50_000])
def test_entropy_of_uniform_is_log_vocab(vocab):
    # Any constant logit row is uniform over V: H = log V.
    logits = torch.full((2, vocab), 3.7)
    torch.testing.assert_close(entropy_from_logits(logits), torch.full((2,), math.log(vocab)), rtol=1e-6, atol=0)


def test_entropy_by_hand():
    # p = [1/2, 1/4, 1/4]: H = 1/2 ln 2 + 2 * 1/4 ln 4 = 1.5 ln 2 = 1.0397; a one-hot-ish row
    # of logits [0, -1e4] has p = [1, e^-1e4 = 0] and H = 0.
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64))
    assert entropy_from_logits(logits).item() == pytest.approx(1.5 * math.log(2), rel=1e-14)
    assert entropy_from_logits(torch.tensor([0.0, -1e4])).item() == 0.0


def test_entropy_extreme_logits_are_finite():
    # [1e4, -1e4]: p = [1, 0], H = 0. [1e4, 1e4]: uniform over 2, H = ln 2. A naive
    # -sum p log p via softmax would give 0 * log 0 = NaN; exp(1e4) would overflow.
    logits = torch.tensor([[1e4, -1e4], [1e4, 1e4], [-1e4, -1e4]], requires_grad=True)
    entropy = entropy_from_logits(logits)
    torch.testing.assert_close(entropy, torch.tensor([0.0, math.log(2), math.log(2)]), rtol=1e-6, atol=1e-6)
    entropy.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_entropy_ignores_minus_inf_logits():
    # -inf marks an excluded token (probability 0): [0, 0, -inf] is uniform over 2, H = ln 2.
    # 0 * -inf used to make this NaN; the gradient must be finite too.
    logits = torch.tensor([[0.0, 0.0, -math.inf]], requires_grad=True)
    entropy = entropy_from_logits(logits)
    assert entropy.item() == pytest.approx(math.log(2), rel=1e-6)
    entropy.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_entropy_dtypes():
    assert entropy_from_logits(torch.zeros(3, 4, dtype=torch.float64)).dtype == torch.float64
    assert entropy_from_logits(torch.zeros(3, 4, dtype=torch.bfloat16)).dtype == torch.float32
    assert entropy_from_logits(torch.zeros(2, 3, 5)).shape == (2, 3)
