"""Log-probabilities of chosen tokens under pi_tau = softmax(logits / tau), chunked.

Shapes: N rows (responses), T tokens per row, V vocabulary.

    log pi_tau(token) = z[token] - logsumexp(z),   z = logits / tau

A float32 log-softmax over [N, T, V] can be gigabytes; here rows are processed in chunks of about ``chunk_elements``
float32 logits, and backward keeps only the logits and logsumexp [N, T], so the extra memory is bounded whatever N, T
and V are. The entropy of pi_tau (a metric, detached) can come from the same pass over each chunk:

    H = -sum_v p_v log p_v,   log p = z - logsumexp(z)

(the log-softmax itself, so no cancellation at large logits; -inf logits add 0).

``head_token_log_probs`` takes the hidden states and a linear LM head instead of the logits: the logits then exist one
chunk at a time, in forward and again (recomputed) in backward, so the whole [M, V] is never held.
"""

from __future__ import annotations

import torch

# float32 elements of one chunk of logits turned into log-probs: the log-softmax's extra memory (64 MiB at 2**24)
DEFAULT_CHUNK_ELEMENTS = 2**24


def row_chunks(logits: torch.Tensor, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> list[slice]:
    """Slices of the rows of logits [N, T, V], each about ``chunk_elements`` logits (at least one row)."""
    return _slices(logits.shape[0], logits.shape[1] * logits.shape[2], chunk_elements)


def _slices(num_rows: int, per_row: int, chunk_elements: int) -> list[slice]:
    """Slices of ``num_rows`` rows of ``per_row`` elements each, about ``chunk_elements`` a slice (at least a row)."""
    chunk_rows = max(1, chunk_elements // max(1, per_row))
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
            log_z[rows], log_probs[rows], chunk_entropy = _log_probs_of_chunk(z, tokens[rows], with_entropy)
            if with_entropy:
                entropy[rows] = chunk_entropy
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
            grad = _grad_of_chunk(logits[rows], tokens[rows], log_z[rows], grad_log_probs[rows], ctx.temperature)
            grad_logits[rows] = grad.to(logits.dtype)
        return grad_logits, None, None, None, None


def _log_probs_of_chunk(z: torch.Tensor, tokens: torch.Tensor, with_entropy: bool,
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(logsumexp, log-prob at ``tokens``, entropy or None) of z [..., V] = logits / tau, a chunk's own copy
    (overwritten), tokens [...]."""
    if not with_entropy:
        log_z = torch.logsumexp(z, dim=-1)
        return log_z, z.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - log_z, None
    top = z.amax(dim=-1, keepdim=True)  # shifted by the max first: log p exact to float32 at any logit scale
    top = top.masked_fill_(top == float("-inf"), 0.0)  # a row of -inf stays -inf, not NaN
    log_p = z.sub_(top)
    shifted_log_z = torch.logsumexp(log_p, dim=-1)
    log_prob = log_p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - shifted_log_z
    log_p = log_p.sub_(shifted_log_z.unsqueeze(-1))
    p = log_p.exp()
    entropy = -(p * log_p.masked_fill_(p == 0, 0.0)).sum(dim=-1)
    return top.squeeze(-1) + shifted_log_z, log_prob, entropy


def _grad_of_chunk(logits: torch.Tensor, tokens: torch.Tensor, log_z: torch.Tensor, grad: torch.Tensor,
                   temperature: float) -> torch.Tensor:
    """d log-prob / d logits of a chunk times ``grad``: (onehot(token) - softmax(z)) * grad / tau, in float32."""
    grad = grad.unsqueeze(-1)
    probs = torch.exp(logits.float() / temperature - log_z.unsqueeze(-1))
    return (-probs * grad).scatter_add_(-1, tokens.unsqueeze(-1), grad) / temperature


class _HeadTokenLogProbs(torch.autograd.Function):
    """``_TokenLogProbs`` of ``linear(hidden, weight, bias)`` [M, V], the logits made chunk by chunk over the M rows
    and made again in backward: only hidden [M, D] and logsumexp [M] are kept. With one chunk, every number (the
    weight's gradient included) is the one the head's own autograd gives; with more, the weight's gradient is summed
    over the chunks (float32 rounding)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature, chunks, with_entropy):
        # hidden [M, D], weight [V, D], bias [V] or None, tokens [M] -> log-probs [M], entropy [M] (or [0])
        log_z = torch.empty(tokens.shape, dtype=torch.float32, device=hidden.device)
        log_probs = torch.empty_like(log_z)
        entropy = torch.empty_like(log_z) if with_entropy else log_z.new_empty(0)
        for rows in chunks:
            z = torch.nn.functional.linear(hidden[rows], weight, bias).float() / temperature
            log_z[rows], log_probs[rows], chunk_entropy = _log_probs_of_chunk(z, tokens[rows], with_entropy)
            if with_entropy:
                entropy[rows] = chunk_entropy
        ctx.save_for_backward(hidden, weight, bias, tokens, log_z)
        ctx.temperature, ctx.chunks = temperature, chunks
        ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, _grad_entropy):
        hidden, weight, bias, tokens, log_z = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = grad_bias = None
        for rows in ctx.chunks:
            logits = torch.nn.functional.linear(hidden[rows], weight, bias)
            grad = _grad_of_chunk(logits, tokens[rows], log_z[rows], grad_log_probs[rows], ctx.temperature)
            grad = grad.to(logits.dtype)  # [c, V]
            if need_hidden:
                grad_hidden[rows] = grad.mm(weight)
            if need_weight:
                part = grad.t().mm(hidden[rows])  # [V, D], as linear's own backward makes it
                grad_weight = part if grad_weight is None else grad_weight.add_(part)
            if need_bias:
                part = grad.sum(0)
                grad_bias = part if grad_bias is None else grad_bias.add_(part)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def head_token_log_probs(hidden: torch.Tensor, head: torch.nn.Linear, tokens: torch.Tensor, temperature: float,
                         chunk_elements: int = DEFAULT_CHUNK_ELEMENTS, with_entropy: bool = False,
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(head(hidden) / temperature) at ``tokens`` and, with ``with_entropy``, the entropy (detached):
    hidden [M, D], tokens [M] -> [M] float32 each, differentiable in ``hidden`` and the head's parameters, the
    logits made about ``chunk_elements`` at a time (forward, and again in backward)."""
    chunks = _slices(hidden.shape[0], head.out_features, chunk_elements)
    log_probs, entropy = _HeadTokenLogProbs.apply(hidden, head.weight, head.bias, tokens, temperature, chunks,
                                                  with_entropy)
    return log_probs, entropy if with_entropy else None


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
