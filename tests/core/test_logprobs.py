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


def head_inputs(bias: bool, seed: int = 2):
    generator = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(6, 9, bias=bias)
    with torch.no_grad():
        head.weight.copy_(torch.randn(9, 6, generator=generator))
        if bias:
            head.bias.copy_(torch.randn(9, generator=generator))
    hidden = torch.randn(11, 6, generator=generator, requires_grad=True)
    tokens = torch.randint(0, 9, (11,), generator=generator)
    weights = torch.randn(11, generator=generator)
    return head, hidden, tokens, weights


def grads_of(loss, *tensors):
    grads = torch.autograd.grad(loss, tensors)
    return grads


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_the_head_in_one_chunk_gives_the_numbers_of_head_then_log_probs(bias, with_entropy):
    from rlvr.core.logprobs import head_token_log_probs, token_log_probs_and_entropy

    head, hidden, tokens, weights = head_inputs(bias)
    params = [hidden, head.weight] + ([head.bias] if bias else [])
    got, got_entropy = head_token_log_probs(hidden, head, tokens, 0.7, 10**9, with_entropy)
    got_grads = grads_of((got * weights).sum(), *params)
    logits = head(hidden).unsqueeze(1)  # [M, 1, V]: the path without the fused head
    if with_entropy:
        expected, expected_entropy = token_log_probs_and_entropy(logits, tokens[:, None], 0.7, 10**9)
        assert torch.equal(got_entropy, expected_entropy[:, 0]) and not got_entropy.requires_grad
    else:
        expected = token_log_probs(logits, tokens[:, None], 0.7, 10**9)
        assert got_entropy is None
    expected_grads = grads_of((expected[:, 0] * weights).sum(), *params)
    assert torch.equal(got, expected[:, 0])
    for a, b in zip(got_grads, expected_grads, strict=True):  # bit for bit, the weight's gradient included
        assert torch.equal(a, b)


@pytest.mark.parametrize("chunk_elements", [1, 20, 45])
def test_the_head_in_chunks_equals_it_whole_within_rounding(chunk_elements):
    from rlvr.core.logprobs import head_token_log_probs

    head, hidden, tokens, weights = head_inputs(bias=True, seed=3)
    params = [hidden, head.weight, head.bias]
    whole, whole_entropy = head_token_log_probs(hidden, head, tokens, 1.3, 10**9, True)
    whole_grads = grads_of((whole * weights).sum(), *params)
    got, entropy = head_token_log_probs(hidden, head, tokens, 1.3, chunk_elements, True)
    got_grads = grads_of((got * weights).sum(), *params)
    torch.testing.assert_close(got, whole, atol=1e-6, rtol=0)
    torch.testing.assert_close(entropy, whole_entropy, atol=1e-6, rtol=0)
    for a, b in zip(got_grads, whole_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-6)
    # and against float64 autograd through the plain formula
    z = torch.nn.functional.linear(hidden.double(), head.weight.double(), head.bias.double()) / 1.3
    exact = torch.log_softmax(z, -1).gather(-1, tokens[:, None])[:, 0]
    torch.testing.assert_close(got.double(), exact, atol=1e-5, rtol=0)
