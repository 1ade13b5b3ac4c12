"""aggregate_loss and aggregation_weights: hand values, empty batches, micro-batching."""

import pytest
import torch

from rlvr.core import AGGREGATIONS, aggregate_loss, aggregation_weights, policy_loss, weighted_sum


def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


# Three responses, T = 4, lengths 4, 2, 1. Padded entries hold 100 so a leak shows.
LOSS = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 100.0, 100.0], [7.0, 100.0, 100.0, 100.0]]
RESPONSE_MASK = [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]
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
    loss, response_mask = _t(LOSS), torch.tensor(RESPONSE_MASK, dtype=torch.bool)
    assert aggregate_loss(loss, response_mask, mode, normalizer).item() == pytest.approx(expected, rel=1e-14)
    # The weights reproduce the same scalar as sum(w * x).
    weights = aggregation_weights(response_mask, mode, normalizer, dtype=torch.float64)
    assert weighted_sum(loss, weights).item() == pytest.approx(expected, rel=1e-14)


def test_aggregation_weights_by_hand():
    response_mask = torch.tensor(RESPONSE_MASK, dtype=torch.bool)
    # seq_mean_token_mean: 1 / (length * N): row 0 1/12, row 1 1/6, row 2 1/3.
    w = aggregation_weights(response_mask, "seq_mean_token_mean", dtype=torch.float64)
    torch.testing.assert_close(w[:, 0], _t([1 / 12, 1 / 6, 1 / 3]), rtol=1e-15, atol=0)
    assert (w[~response_mask] == 0).all()
    # token_mean: 1/7 on each of the 7 tokens.
    w = aggregation_weights(response_mask, "token_mean", dtype=torch.float64)
    torch.testing.assert_close(w, response_mask.double() / 7, rtol=1e-15, atol=0)


def test_fully_masked_row_counts_as_a_zero_response():
    # seq_mean_token_mean over [row mean 3, fully masked row]: (3 + 0) / 2 = 1.5.
    loss = _t([[2.0, 4.0], [9.0, 9.0]])
    response_mask = torch.tensor([[True, True], [False, False]])
    assert aggregate_loss(loss, response_mask, "seq_mean_token_mean").item() == 1.5
    assert aggregate_loss(loss, response_mask, "token_mean").item() == 3.0  # (2 + 4) / 2 tokens


@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize("normalizer", [None, 5.0])
def test_micro_batching_gives_the_full_batch_gradient(mode, normalizer):
    # A tiny token policy: logits [N, T, V]; clipped loss on sampled tokens, so the
    # micro-batch gradient must match through log_softmax, the ratio and the clip.
    gen = torch.Generator().manual_seed(1)
    N, T, V = 8, 6, 5
    logits = torch.randn(N, T, V, generator=gen, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(V, (N, T, 1), generator=gen)
    old = torch.log_softmax(logits.detach() + 0.3 * torch.randn(N, T, V, generator=gen, dtype=torch.float64), -1)
    old = old.gather(-1, tokens).squeeze(-1)
    deltas = torch.randn(N, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([6, 3, 1, 0, 6, 2, 5, 4])  # includes an empty response
    response_mask = torch.arange(T) < lengths.unsqueeze(-1)  # [N, T]

    def per_token(rows):
        lp = torch.log_softmax(logits[rows], -1).gather(-1, tokens[rows]).squeeze(-1)
        return policy_loss(lp, deltas[rows], "clipped", old_log_probs=old[rows])[0]

    full = aggregate_loss(per_token(slice(None)), response_mask=response_mask, mode=mode, normalizer=normalizer)
    (full_grad,) = torch.autograd.grad(full, logits)
    assert full_grad.abs().max() > 1e-3
    weights = aggregation_weights(response_mask=response_mask, mode=mode, normalizer=normalizer, dtype=torch.float64)
    for num_micro_batches in (1, 4):
        logits.grad = None
        total = 0.0
        for rows in torch.arange(N).chunk(num_micro_batches):
            mb_loss = weighted_sum(per_token(rows), weights[rows])
            mb_loss.backward()
            total += mb_loss.item()
        assert total == pytest.approx(full.item(), rel=1e-13)
        torch.testing.assert_close(logits.grad, full_grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0)])
def test_empty_batches_aggregate_to_zero(mode, shape):
    loss = torch.zeros(shape, requires_grad=True)
    response_mask = torch.ones(shape, dtype=torch.bool)
    out = aggregate_loss(loss, response_mask, mode)
    assert out.item() == 0.0  # not NaN (mean of an empty tensor)
    out.backward()
    assert aggregation_weights(response_mask, mode).shape == shape


def test_aggregation_bad_inputs():
    loss, response_mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="allowed: seq_mean_token_mean"):
        aggregate_loss(loss, response_mask, "sum")
    with pytest.raises(ValueError, match="allowed: seq_mean_token_mean"):
        aggregation_weights(response_mask, "sum")
    with pytest.raises(ValueError, match="response_mask shape"):
        aggregate_loss(loss, response_mask[:, :2], "token_mean")
    with pytest.raises(ValueError, match="normalizer must be positive"):
        aggregate_loss(loss, response_mask, "seq_mean_token_sum", normalizer=0.0)
    with pytest.raises(ValueError, match="normalizer must be positive"):
        aggregation_weights(response_mask, "seq_mean_token_sum", normalizer=-1.0)
