"""Log-probabilities of chosen tokens under pi_tau = softmax(logits / tau), chunked.

Shapes: N rows (responses), T tokens per row, V vocabulary.

    log pi_tau(token) = z[token] - logsumexp(z),   z = logits / tau

A float32 log-softmax over [N, T, V] can be gigabytes; here rows are processed in chunks of about ``chunk_elements``
float32 logits, and backward keeps only the logits and logsumexp [N, T], so the extra memory is bounded whatever N, T
and V are. The entropy of pi_tau (a metric, detached) can come from the same pass over each chunk:

    H = -sum_v p_v log p_v,   log p = z - logsumexp(z)

(the log-softmax itself, so no cancellation at large logits; -inf logits add 0).
"""

from __future__ import annotations

import torch

# float32 elements of one chunk of logits turned into log-probs: the log-softmax's extra memory (1 GiB at 2**28)
DEFAULT_CHUNK_ELEMENTS = 2**28


def row_chunks(logits: torch.Tensor, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> list[slice]:
    """Slices of the rows of logits [N, T, V], each about ``chunk_elements`` logits (at least one row)."""
    num_rows = logits.shape[0]
    chunk_rows = max(1, chunk_elements // max(1, logits.shape[1] * logits.shape[2]))
    return [slice(start, min(start + chunk_rows, num_rows)) for start in range(0, num_rows, chunk_rows)]


class _TokenLogProbs(torch.autograd.Function):
    """log softmax(logits / tau)[token] chunk by chunk over rows, and with ``with_entropy`` the entropy (detached).

    Forward: ``z[token] - logsumexp(z)`` with ``z = logits.float() / tau``; backward: ``(onehot(token) - softmax(z)) *
    grad / tau``. Only the logits (in their own dtype) and logsumexp [N, T] are kept for backward.
    """

    @staticmethod
    def forward(ctx, logits, tokens, temperature, chunks, with_entropy):
        # logits [N, T, V], tokens [N, T], chunks: slices of the N rows
        # -> log-probs [N, T] float32, entropy [N, T] float32 (empty [0] without with_entropy)
        log_z = torch.empty(tokens.shape, dtype=torch.float32, device=logits.device)
        log_probs = torch.empty_like(log_z)
        entropy = torch.empty_like(log_z) if with_entropy else log_z.new_empty(0)
        for rows in chunks:
            z = logits[rows].float() / temperature  # [c, T, V], this chunk's own copy
            if with_entropy:  # shifted by the max first: log p exact to float32 at any logit scale
                top = z.amax(dim=-1, keepdim=True)
                top = top.masked_fill_(top == float("-inf"), 0.0)  # a row of -inf stays -inf, not NaN
                log_p = z.sub_(top)
                shifted_log_z = torch.logsumexp(log_p, dim=-1)
                log_z[rows] = top.squeeze(-1) + shifted_log_z
                log_probs[rows] = log_p.gather(-1, tokens[rows].unsqueeze(-1)).squeeze(-1) - shifted_log_z
                log_p = log_p.sub_(shifted_log_z.unsqueeze(-1))
                p = log_p.exp()
                entropy[rows] = -(p * log_p.masked_fill_(p == 0, 0.0)).sum(dim=-1)
            else:
                log_z[rows] = torch.logsumexp(z, dim=-1)
                log_probs[rows] = z.gather(-1, tokens[rows].unsqueeze(-1)).squeeze(-1) - log_z[rows]
        ctx.save_for_backward(logits, tokens, log_z)
        ctx.temperature = temperature
        ctx.chunks = chunks
        ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, _grad_entropy):
        logits, tokens, log_z = ctx.saved_tensors
        grad_logits = torch.empty_like(logits)
        for rows in ctx.chunks:
            grad = grad_log_probs[rows].unsqueeze(-1)  # [c, T, 1]
            probs = torch.exp(logits[rows].float() / ctx.temperature - log_z[rows].unsqueeze(-1))
            chunk = (-probs * grad).scatter_add_(-1, tokens[rows].unsqueeze(-1), grad)
            grad_logits[rows] = (chunk / ctx.temperature).to(logits.dtype)
        return grad_logits, None, None, None, None


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float,
                    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> torch.Tensor:
    """log softmax(logits / temperature) at ``tokens``, differentiable in ``logits``: logits [N, T, V], tokens [N, T]
    -> [N, T] float32."""
    return _TokenLogProbs.apply(logits, tokens, temperature, row_chunks(logits, chunk_elements), False)[0]


def token_log_probs_and_entropy(logits: torch.Tensor, tokens: torch.Tensor, temperature: float,
                                chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_log_probs`` (equal within float32 rounding: here the logits are shifted by their max first) and the
    entropy [N, T] float32 of softmax(logits / temperature) from the same pass, detached (a metric)."""
    return _TokenLogProbs.apply(logits, tokens, temperature, row_chunks(logits, chunk_elements), True)
