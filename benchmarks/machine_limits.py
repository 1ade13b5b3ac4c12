"""What this machine can do for a decoder model's GRPO step: the update's FLOPs counted from the
model's shapes and the time the same matmuls take here, and decoding's bytes per step against
the measured copy bandwidth (``grpo_step.py --limits``).

The update's useful work is the forward and backward (twice the forward) of every linear layer
at each real token (each prompt once, as rlvr shares it across its group, and every response
token up to its end), the LM head at the response tokens only, and causal attention. Its limit
is those matmuls timed here at the same thread count and the same shapes, each product the faster
of torch's own ``linear`` and oneDNN's on an operand reordered beforehand (reordering not timed;
rlvr samples with oneDNN's: ``rlvr.engines.packed_linear``), attention, a small share, at
the linear layers' measured rate. Decoding's limit, at each generated position, is the larger
of one read of the weights and of every active row's KV cache at the measured copy bandwidth,
and the forward matmuls of the rows still going.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from rlvr.engines.packed_linear import available, reorder, reordered_linear


@dataclass(frozen=True)
class Shapes:
    """A decoder's sizes, read from its config."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    parameters: int  # every parameter, the tied head counted once
    bytes_per_parameter: int

    @classmethod
    def of(cls, model: torch.nn.Module) -> Shapes:
        c = model.config
        heads = c.num_attention_heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        first = next(model.parameters())
        return cls(c.hidden_size, c.intermediate_size, c.num_hidden_layers, heads,
                   getattr(c, "num_key_value_heads", None) or heads, head_dim, c.vocab_size,
                   sum(p.numel() for p in model.parameters()), first.element_size())

    def linears(self) -> list[tuple[int, int, int]]:
        """(in, out, count) of every linear layer of the body."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return [(self.hidden, q, self.layers), (self.hidden, kv, 2 * self.layers), (q, self.hidden, self.layers),
                (self.hidden, self.intermediate, 2 * self.layers), (self.intermediate, self.hidden, self.layers)]


@dataclass(frozen=True)
class StepTokens:
    """One step's real tokens: each distinct prompt's length (once) and each response's length."""

    prompt_lengths: list[int]
    response_lengths: list[int]
    prompt_of_row: list[int]  # each response's index into prompt_lengths


def update_flops(shapes: Shapes, tokens: StepTokens) -> dict[str, float]:
    """Forward + backward FLOPs of the update's useful work: {"linear", "head", "attention"}."""
    body_tokens = sum(tokens.prompt_lengths) + sum(tokens.response_lengths)
    per_token = sum(2 * i * o * n for i, o, n in shapes.linears())
    head = 2 * shapes.hidden * shapes.vocab * sum(tokens.response_lengths)
    pairs = sum(p * (p + 1) // 2 for p in tokens.prompt_lengths)  # causal (query, key) pairs
    for length, prompt in zip(tokens.response_lengths, tokens.prompt_of_row):
        p = tokens.prompt_lengths[prompt]
        pairs += sum(p + t + 1 for t in range(length))
    attention = 4 * pairs * shapes.heads * shapes.head_dim * shapes.layers  # scores and values
    return {"linear": 3 * per_token * body_tokens, "head": 3 * head, "attention": 3 * attention}


def _best_seconds(run, repeats: int = 2) -> float:
    run()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def _product_seconds(rows: torch.Tensor, weight: torch.Tensor, repeats: int = 2) -> float:
    """Wall seconds of rows [m, k] times weight [n, k]^T, the faster of torch's ``linear`` and oneDNN's on the
    weight reordered beforehand (``rlvr.engines.packed_linear``)."""
    best = _best_seconds(lambda: torch.nn.functional.linear(rows, weight), repeats)
    if available():
        reordered = reorder(weight, rows.shape[0])
        best = min(best, _best_seconds(lambda: reordered_linear(rows, reordered, None), repeats))
    return best


def matmul_seconds(rows: int, n_in: int, n_out: int) -> float:
    """Wall seconds of a linear layer's forward and backward matmuls at ``rows`` tokens, here, now:
    y = x W^T, dx = dy W, dW = dy^T x (float32, the threads set), each by ``_product_seconds``."""
    x, w, dy = torch.randn(rows, n_in), torch.randn(n_out, n_in), torch.randn(rows, n_out)
    return (_product_seconds(x, w) + _product_seconds(dy, w.t().contiguous())
            + _product_seconds(dy.t().contiguous(), x.t().contiguous()))


def update_limit(shapes: Shapes, tokens: StepTokens) -> dict[str, float]:
    """The update's useful FLOPs and the seconds their matmuls take here: {"flops", "seconds", "flops_per_s"}."""
    flops = update_flops(shapes, tokens)
    body_tokens = sum(tokens.prompt_lengths) + sum(tokens.response_lengths)
    linear = sum(n * matmul_seconds(body_tokens, i, o) for i, o, n in shapes.linears())
    head = matmul_seconds(sum(tokens.response_lengths), shapes.hidden, shapes.vocab)
    rate = flops["linear"] / linear
    seconds = linear + head + flops["attention"] / rate
    total = sum(flops.values())
    return {"flops": total, "seconds": seconds, "flops_per_s": total / seconds}


def copy_bandwidth(megabytes: int = 256) -> float:
    """Bytes per second a tensor copy moves here (read and written), at the threads set."""
    source = torch.empty(megabytes * 2**20 // 4).normal_()
    target = torch.empty_like(source)
    return 2 * source.numel() * 4 / _best_seconds(lambda: target.copy_(source), repeats=3)


def forward_seconds(rows: int, n_in: int, n_out: int) -> float:
    """Wall seconds of a linear layer's forward matmul at ``rows`` tokens, here, now (``_product_seconds``)."""
    return _product_seconds(torch.randn(rows, n_in), torch.randn(n_out, n_in), repeats=5)


def decode_limit(shapes: Shapes, tokens: StepTokens, bandwidth: float) -> dict[str, float]:
    """Decoding's bounds, position by position: the bytes read (the weights once, the embedding
    table's rows aside: the tied head reads it whole, and the KV cache of every row still going)
    over the copy bandwidth, and the forward matmuls of the rows still going at the rate measured
    here for all rows at once. {"bandwidth_seconds", "compute_seconds", "seconds" (the larger of
    the two at each position), "tokens_per_s" (at that bound)}."""
    kv_per_position = 2 * shapes.layers * shapes.kv_heads * shapes.head_dim * shapes.bytes_per_parameter
    weights = shapes.parameters * shapes.bytes_per_parameter
    rows = len(tokens.response_lengths)
    all_rows = (sum(n * forward_seconds(rows, i, o) for i, o, n in shapes.linears())
                + forward_seconds(rows, shapes.hidden, shapes.vocab))
    memory = compute = bound = 0.0
    for t in range(max(tokens.response_lengths, default=0)):
        going = [prompt for length, prompt in zip(tokens.response_lengths, tokens.prompt_of_row) if length > t]
        context = sum(tokens.prompt_lengths[prompt] + t for prompt in going)
        read = (weights + kv_per_position * context) / bandwidth
        run = all_rows * len(going) / rows
        memory, compute, bound = memory + read, compute + run, bound + max(read, run)
    return {"bandwidth_seconds": memory, "compute_seconds": compute, "seconds": bound,
            "tokens_per_s": sum(tokens.response_lengths) / bound}
