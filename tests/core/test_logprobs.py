"""token_log_probs: chunked log softmax(logits / tau) at tokens, against plain autograd."""

import pytest
import torch

from rlvr.core import token_log_probs
from rlvr.core.logprobs import row_chunks


@pytest.mark.parametrize("chunk_elements", [1, 50, 10**9])
def test_token_log_probs_value_and_gradient(chunk_elements):
    # against autograd through a plain log_softmax + gather, in float64
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 4, 7, dtype=torch.float64, generator=generator, requires_grad=True)
    tokens = torch.randint(0, 7, (5, 4), generator=generator)
    weights = torch.randn(5, 4, dtype=torch.float64, generator=generator)
    got = token_log_probs(logits, tokens, 0.6, chunk_elements)
    (got.double() * weights).sum().backward()
    grad_got, logits.grad = logits.grad.clone(), None
    expected = torch.log_softmax(logits / 0.6, -1).gather(-1, tokens[..., None])[..., 0]
    (expected * weights).sum().backward()
    torch.testing.assert_close(got, expected.float(), atol=1e-6, rtol=0)
    torch.testing.assert_close(grad_got, logits.grad, atol=1e-6, rtol=0)


def test_row_chunks_cover_the_rows_once():
    logits = torch.zeros(5, 4, 7)  # 28 logits per row
    # 60 elements fit 2 rows (56), so chunks of 2 rows, the last one short
    assert row_chunks(logits, 60) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    # fewer elements than one row still make progress: one row per chunk
    assert row_chunks(logits, 1) == [slice(i, i + 1) for i in range(5)]
    assert row_chunks(logits, 10**9) == [slice(0, 5)]
