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
            z = _as_scaled(logits[rows], temperature, own=False)  # [c, T, V]
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
            z = _as_scaled(logits[rows], ctx.temperature, own=False)
            grad = _grad_of_chunk(z, tokens[rows], log_z[rows], grad_log_probs[rows], ctx.temperature)
            grad_logits[rows] = grad.to(logits.dtype)
        return grad_logits, None, None, None, None


def _as_scaled(logits: torch.Tensor, temperature: float, own: bool) -> torch.Tensor:
    """z = logits / tau in float32, a tensor the caller may overwrite: ``logits`` itself when ``own`` (a chunk just
    made) and already float32, else a copy; at tau = 1 no division (x / 1 is x)."""
    z = logits.float() if own else logits.to(torch.float32, copy=True)
    return z if temperature == 1.0 else z.div_(temperature)


def _log_probs_of_chunk(z: torch.Tensor, tokens: torch.Tensor, with_entropy: bool,
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(logsumexp, log-prob at ``tokens``, entropy or None) of z [..., V] = logits / tau, a chunk's own copy
    (overwritten), tokens [...]. Shifted by the max first (log p exact to float32 at any logit scale), then

        Z = sum_v exp(z_v),   H = log Z - sum_v exp(z_v) z_v / Z

    one exp and three reductions over the chunk (a -inf logit adds 0 to both sums)."""
    top = z.amax(dim=-1, keepdim=True)
    top = top.masked_fill_(top == float("-inf"), 0.0)  # a row of -inf stays -inf, not NaN
    shifted = z.sub_(top)
    exp = shifted.exp()
    total = exp.sum(dim=-1)
    shifted_log_z = total.log()
    log_prob = shifted.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - shifted_log_z
    entropy = None
    if with_entropy:
        weighted = torch.linalg.vecdot(exp, shifted)  # sum_v exp(z_v) z_v; NaN in a row with a -inf logit (0 * -inf)
        if weighted.isnan().any():
            weighted = torch.linalg.vecdot(exp, shifted.masked_fill_(exp == 0, 0.0))
        entropy = shifted_log_z - weighted / total
    return top.squeeze(-1) + shifted_log_z, log_prob, entropy


def _grad_of_chunk(z: torch.Tensor, tokens: torch.Tensor, log_z: torch.Tensor, grad: torch.Tensor,
                   temperature: float) -> torch.Tensor:
    """d log-prob / d logits of a chunk times ``grad``: (onehot(token) - softmax(z)) * grad / tau, in float32, made in
    z [..., V] = logits / tau, a chunk's own copy (``_as_scaled``)."""
    grad = grad.unsqueeze(-1)
    probs = z.sub_(log_z.unsqueeze(-1)).exp_()
    out = probs.mul_(grad.neg()).scatter_add_(-1, tokens.unsqueeze(-1), grad)
    return out if temperature == 1.0 else out.div_(temperature)


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
            z = _as_scaled(torch.nn.functional.linear(hidden[rows], weight, bias), temperature, own=True)
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
            grad = _grad_of_chunk(_as_scaled(logits, ctx.temperature, own=True), tokens[rows], log_z[rows],
                                  grad_log_probs[rows], ctx.temperature).to(logits.dtype)  # [c, V]
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
