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


@pytest.mark.parametrize("chunk_elements", [1, 50, 10**9])
def test_the_entropy_from_the_same_pass_equals_the_entropy_of_the_logits(chunk_elements):
    from rlvr.core import entropy_from_logits
    from rlvr.core.logprobs import token_log_probs_and_entropy

    generator = torch.Generator().manual_seed(1)
    logits = 4 * torch.randn(5, 4, 7, generator=generator)
    logits[0, 0, :3] = float("-inf")  # masked vocabulary entries: probability 0, no NaN
    logits[1] += 1e4  # large logits: the log-softmax does not cancel
    tokens = torch.randint(3, 7, (5, 4), generator=generator)
    log_probs, entropy = token_log_probs_and_entropy(logits.requires_grad_(), tokens, 0.7, chunk_elements)
    z = (logits.detach() / 0.7).double()  # what both see: float32 logits / tau, then exact arithmetic
    expected = torch.log_softmax(z, -1).gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(log_probs, expected.float(), atol=2e-6, rtol=0)
    torch.testing.assert_close(entropy, entropy_from_logits(z).float(), atol=2e-6, rtol=0)
    weights = torch.randn(5, 4, generator=generator)
    (log_probs * weights).sum().backward()
    grad, logits.grad = logits.grad.clone(), None
    (token_log_probs(logits, tokens, 0.7, chunk_elements) * weights).sum().backward()
    assert torch.equal(grad, logits.grad)  # the same backward
    assert not entropy.requires_grad and log_probs.requires_grad
