"""The lecture's non-autoregressive positional model for the sorting task.

Embed each prompt token, encode every position with its own D x D matrix and sum over
positions into one state vector, decode one vector per response position with its own
D x D matrix, and read logits through the (tied) embedding. Response positions are
sampled independently given the prompt.

The math is written once, with an optional leading run axis R: one policy's weights have
none (``PositionalModel``, ``PositionalPolicy``), and ``rlvr.loop.batched`` trains R runs of
``rlvr compare`` with the same functions (``forward_pass``, ``backward_pass``) on [R, ...]
weights. R runs give each run the bits it gets alone: every operand the passes lay out is
laid out by ``aligned_empty`` and each matmul takes the way ``matmul_way`` found exact.

Shapes: R runs, M prompts (U distinct ones when scoring), n numbers per prompt (= response
length), D embedding size, V vocab, N responses, G responses per prompt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from rlvr.base.interfaces import Policy
from rlvr.base.rollout import Samples
from rlvr.policies.run_matmul import InexactMatmul, aligned_empty, laid_out, matmul_way, new_output, run_mm


class Buffers:
    """Where a pass's intermediate tensors live: new ones each pass (this class; autograd can
    follow them), or ``Workspace``'s. Each is named by its call site."""

    def mm(self, name: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``run_mm(a, b, out)``."""
        return run_mm(a, b, out)

    def rows(self, name: str, table: torch.Tensor, index: torch.Tensor, runs: tuple[int, ...], *shape: int
             ) -> torch.Tensor:
        """table [*R, V, D]'s rows at index [M, n], laid out as [*R, *shape] for a matmul."""
        return laid_out(table[:, index] if runs else table[index], runs, *shape)

    def laid_out(self, name: str, x: torch.Tensor, runs: tuple[int, ...], *shape: int) -> torch.Tensor:
        """``laid_out(x, runs, *shape)``."""
        return laid_out(x, runs, *shape)

    def like(self, name: str, x: torch.Tensor) -> torch.Tensor | None:
        """An aligned tensor shaped as x [*R, ...] for a matmul operand; None for one run (the
        operation allocates its own)."""
        return aligned_empty(*x.shape, dtype=x.dtype) if x.dim() == 3 else None


FRESH = Buffers()


class Workspace(Buffers):
    """Buffers reused from pass to pass by one caller (``naive_gradients``' every inner step):
    each call site's tensor allocated once per shape, operands aligned as ``aligned_empty``
    lays them out and matmul outputs as their way says, with each matmul's way
    (``matmul_way``) found once. One run's matmul outputs stay new tensors (cheaper than
    finding the buffer). What a pass returns is overwritten by the next pass. CPU tensors
    (as ``aligned_empty``'s); not for autograd (``out=`` writes)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._ways: dict[tuple, tuple[str, str] | None] = {}

    def _buffer(self, key: tuple, runs: tuple[int, ...], shape: tuple[int, ...], dtype: torch.dtype,
                output: str = "aligned") -> torch.Tensor:
        out = self._buffers.get(key)
        if out is None:
            out = self._buffers[key] = new_output(output, runs, shape, dtype)
        return out

    def mm(self, name: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if a.dim() == 2:  # one run: a new tensor costs less than finding the buffer
            return torch.mm(a, b, out=out)
        key = (name, a.shape, a.stride(), b.shape, b.stride(), a.dtype, None if out is None else out.stride())
        if key not in self._ways:
            self._ways[key] = matmul_way(a, b, out)
        way = self._ways[key]
        if way is None:
            raise InexactMatmul(a, b)
        if out is None:
            out = self._buffer(key, a.shape[:-2], (a.shape[-2], b.shape[-1]), a.dtype, way[1])
        return run_mm(a, b, out, way)

    def rows(self, name: str, table: torch.Tensor, index: torch.Tensor, runs: tuple[int, ...], *shape: int
             ) -> torch.Tensor:
        out = self._buffer((name, runs, shape, table.dtype), runs, shape, table.dtype)
        torch.index_select(table, -2, index.reshape(-1), out=out.view(*runs, index.numel(), table.shape[-1]))
        return out

    def laid_out(self, name: str, x: torch.Tensor, runs: tuple[int, ...], *shape: int) -> torch.Tensor:
        out = self._buffer((name, runs, shape, x.dtype), runs, shape, x.dtype)
        out.view(x.shape).copy_(x)
        return out

    def like(self, name: str, x: torch.Tensor) -> torch.Tensor:
        runs = x.shape[:1] if x.dim() == 3 else ()
        return self._buffer((name, x.shape, x.dtype), runs, x.shape[len(runs):], x.dtype)


@dataclass
class Activations:
    """One forward pass, kept for ``backward_pass`` (a leading run axis [R] when the weights
    have one): x [M, n*D] (embedded prompts), encode_flat [n*D, D], state [M, D],
    decode_flat [D, n*D], decoded [M*n, D], logits [M*n, V]."""

    x: torch.Tensor
    encode_flat: torch.Tensor
    state: torch.Tensor
    decode_flat: torch.Tensor
    decoded: torch.Tensor
    logits: torch.Tensor


def forward_pass(embedding: torch.Tensor, encode: torch.Tensor, decode: torch.Tensor, prompts: torch.Tensor,
                 buffers: Buffers | None = None) -> Activations:
    """Weights embedding [*R, V, D], encode and decode [*R, n, D, D] (one run, or R runs)
    on prompts [M, n] (the same for every run) -> Activations with logits [*R, M*n, V].
    ``buffers``: where its tensors live (default: new ones, which autograd can follow).

    Encoding each position with its own matrix and summing over positions is one matmul
    over the flattened (position, dim) axis, the same as einsum("bpd,pde->be"); decoding one
    vector per position, einsum("be,pef->bpf"), is another."""
    buffers = buffers or FRESH
    runs, (m, n), d = embedding.shape[:-2], prompts.shape, embedding.shape[-1]
    x = buffers.rows("x", embedding, prompts, runs, m, n * d)  # [*R, M, n*D]: the embedded prompts
    encode_flat = encode.reshape(*runs, n * d, d)  # [*R, n*D, D]
    state = buffers.mm("state", x, encode_flat)  # [*R, M, D]
    decode_flat = buffers.laid_out("decode_flat", decode.transpose(-3, -2), runs, d, n * d)  # [*R, D, n*D]
    decoded = buffers.mm("decoded", state, decode_flat).view(*runs, m * n, d)  # [*R, M*n, D]
    logits = buffers.mm("logits", decoded, embedding.transpose(-1, -2))  # [*R, M*n, V], tied output
    return Activations(x, encode_flat, state, decode_flat, decoded, logits)


def tempered_log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / tau) over the last (vocabulary) axis."""
    return torch.log_softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)


def log_softmax_backward(grad_log_probs: torch.Tensor, probs: torch.Tensor, temperature: float,
                         grad_entropy: torch.Tensor | None = None, all_log_probs: torch.Tensor | None = None,
                         entropy: torch.Tensor | None = None, grad_sums: torch.Tensor | None = None,
                         buffers: Buffers | None = None) -> torch.Tensor:
    """The gradient on the logits [*R, M*n, V] from the gradient on every log-prob [*R, M*n, V]
    (and on each position's entropy [*R, M*n, 1]): g - softmax * sum(g), minus
    dH/dz = -p (log p + H) times the entropy's gradient, then 1 / tau. Aligned for R runs.
    ``grad_sums``: sum(g) over the vocabulary [*R, M*n, 1], where the caller holds it."""
    out = (buffers or FRESH).like("grad_logits", probs)
    if grad_sums is None:
        grad_sums = grad_log_probs.sum(dim=-1, keepdim=True)
    grad_logits = torch.sub(grad_log_probs, probs * grad_sums, out=out)
    if grad_entropy is not None:
        grad_logits = grad_logits - grad_entropy * probs * (all_log_probs + entropy)
    if temperature != 1.0:
        grad_logits = grad_logits / temperature if out is None else grad_logits.div_(temperature)
    return grad_logits


def backward_pass(a: Activations, embedding: torch.Tensor, prompts: torch.Tensor, grad_logits: torch.Tensor,
                  grads: dict[str, torch.Tensor] | None = None, buffers: Buffers | None = None
                  ) -> dict[str, torch.Tensor]:
    """The gradients of embedding [*R, V, D], encode and decode [*R, n, D, D] from the
    gradient on the logits [*R, U*n, V] of ``forward_pass`` on prompts [U, n], by hand
    (about ten matmuls). ``grads``: tensors to write them into (aligned); default new ones.
    ``buffers``: where the intermediate tensors live, as ``forward_pass``."""
    buffers = buffers or FRESH
    runs, (u, n), d = embedding.shape[:-2], prompts.shape, embedding.shape[-1]
    into = grads or {}
    grad_embedding = buffers.mm("grad_embedding", grad_logits.transpose(-1, -2), a.decoded,
                                out=into.get("embedding"))  # [*R, V, D], the output side of the tied weights
    grad_out = buffers.mm("grad_out", grad_logits, embedding).view(*runs, u, n * d)  # [*R, U, n*D]
    grad_decode = buffers.mm("grad_decode", a.state.transpose(-1, -2), grad_out).view(*runs, d, n, d).transpose(-3, -2)
    if "decode" in into:
        grad_decode = into["decode"].copy_(grad_decode)  # [*R, n, D, D]
    grad_state = buffers.mm("grad_state", grad_out, a.decode_flat.transpose(-1, -2))  # [*R, U, D]
    encode_out = into["encode"].view(*runs, n * d, d) if "encode" in into else None
    grad_encode = buffers.mm("grad_encode", a.x.transpose(-1, -2), grad_state, out=encode_out).view(*runs, n, d, d)
    grad_x = buffers.mm("grad_x", grad_state, a.encode_flat.transpose(-1, -2))  # [*R, U, n*D]
    grad_embedding.index_add_(-2, prompts.reshape(-1), grad_x.view(*runs, u * n, d))  # the input side
    return {"embedding": grad_embedding, "encode": grad_encode, "decode": grad_decode}


def chosen_index(row_prompt: torch.Tensor, responses: torch.Tensor, distinct: int, vocab: int) -> torch.Tensor:
    """The flat index [*R, N, n] of each response token's log-prob in the [*R, U*n, V]
    log-softmax: row_prompt [N] each response's distinct prompt (of U), responses [*R, N, n]."""
    n = responses.shape[-1]
    positions = torch.arange(n, device=responses.device)
    index = (row_prompt.unsqueeze(1) * n + positions) * vocab + responses  # [*R, N, n]
    if responses.dim() == 3:  # run r's block starts at r * U*n*V
        runs = responses.shape[0]
        index = index + (torch.arange(runs, device=responses.device) * (distinct * n * vocab)).view(runs, 1, 1)
    return index


def sample_tokens(probs: torch.Tensor, prompts: int, group_size: int, generator: torch.Generator) -> torch.Tensor:
    """G responses per prompt, each position drawn independently: probs [M*n, V] -> [M, G, n]."""
    tokens = torch.multinomial(probs, group_size, replacement=True, generator=generator)  # [M*n, G]
    return tokens.reshape(prompts, -1, group_size).transpose(1, 2).contiguous()


class PositionalModel(nn.Module):
    """prompts [B, n] -> logits [B, n, V]: ``forward_pass`` of one run."""

    def __init__(self, vocab_size: int, embedding_dim: int, num_numbers: int, embedding_std: float = 1.0):
        super().__init__()
        d = embedding_dim
        self.embedding = nn.Embedding(vocab_size, d)
        # std 1 is nn.Embedding's default (the lecture's); logits scale with its square,
        # so smaller values start the policy closer to uniform (more exploration).
        nn.init.normal_(self.embedding.weight, std=embedding_std)
        self.encode = nn.Parameter(torch.randn(num_numbers, d, d) / math.sqrt(d))  # [n, D, D]
        self.decode = nn.Parameter(torch.randn(num_numbers, d, d) / math.sqrt(d))  # [n, D, D]

    def forward(self, prompts: torch.Tensor) -> torch.Tensor:
        logits = forward_pass(self.embedding.weight, self.encode, self.decode, prompts).logits
        return logits.view(*prompts.shape, -1)  # [B, n, V]


class _PositionalLogProbs(torch.autograd.Function):
    """Log-probs of chosen tokens through the whole model, with the hand-written backward
    (``backward_pass``).

    The toy's step cost is per-operation overhead, not arithmetic: one autograd node
    with a closed-form backward (about ten matmuls) replaces about twenty nodes. The
    model runs once per distinct prompt (U of them), not once per response: the G
    responses of a group share their prompt's logits. Equal to
    ``log_softmax(model(prompts) / tau)[responses]`` (tested against autograd). Also
    returns the per-position entropy H = -sum_v p_v log p_v, with its gradient
    dH/dz_v = -p_v (log p_v + H) when a loss uses it (the entropy bonus).
    """

    @staticmethod
    def forward(ctx, prompts, row_prompt, responses, temperature, embedding, encode, decode):
        # prompts [U, n] distinct prompts; row_prompt [N] each response's prompt;
        # responses [N, n]; embedding [V, D]; encode, decode [n, D, D]
        u, n = prompts.shape
        activations = forward_pass(embedding, encode, decode, prompts)
        all_log_probs = tempered_log_softmax(activations.logits, temperature)  # [U*n, V]
        probs = all_log_probs.exp()
        distinct_entropy = -(probs * all_log_probs).sum(dim=-1)  # [U*n]
        entropy = distinct_entropy.reshape(u, n)[row_prompt]  # [N, n]
        chosen = chosen_index(row_prompt, responses, u, probs.shape[-1])  # [N, n]
        log_probs = all_log_probs.take(chosen)  # [N, n]
        ctx.save_for_backward(prompts, chosen, row_prompt, probs, all_log_probs, distinct_entropy, embedding)
        ctx.activations, ctx.temperature = activations, temperature
        ctx.set_materialize_grads(False)  # an unused entropy (a metric) sends None, not zeros
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        prompts, chosen, row_prompt, probs, all_log_probs, distinct_entropy, embedding = ctx.saved_tensors
        u, n = prompts.shape
        # Gradient on the chosen log-probs, summed over the responses sharing a prompt.
        grad_chosen = torch.zeros_like(probs)
        if grad_log_probs is not None:
            grad_chosen.view(-1).scatter_add_(0, chosen.reshape(-1), grad_log_probs.reshape(-1))
        entropy_args = {}
        if grad_entropy is not None:  # the entropy bonus, per distinct prompt
            grad_h = torch.zeros(u, n, dtype=probs.dtype, device=probs.device)
            grad_h.index_add_(0, row_prompt, grad_entropy)  # [U, n]
            entropy_args = {"grad_entropy": grad_h.reshape(-1, 1), "all_log_probs": all_log_probs,
                            "entropy": distinct_entropy[:, None]}
        grad_logits = log_softmax_backward(grad_chosen, probs, ctx.temperature, **entropy_args)
        grads = backward_pass(ctx.activations, embedding, prompts, grad_logits)
        return None, None, None, None, grads["embedding"], grads["encode"], grads["decode"]


def consecutive_groups(prompt_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs of equal consecutive rows: prompt_ids [N, n] -> (one row per run [U, n], run of each row [N]).

    The rows of a group are consecutive and share their prompt, so the model runs once
    per prompt. Same result as ``torch.unique_consecutive(dim=0, return_inverse=True)``,
    which is ~30x slower here.
    """
    starts = torch.ones(prompt_ids.shape[0], dtype=torch.bool, device=prompt_ids.device)
    starts[1:] = (prompt_ids[1:] != prompt_ids[:-1]).any(dim=1)
    return prompt_ids[starts], starts.cumsum(0) - 1


class PositionalPolicy(Policy):
    """Policy over fixed-length responses of n tokens; see ``rlvr.base.interfaces.Policy``."""

    def __init__(self, vocab_size: int, embedding_dim: int, num_numbers: int, embedding_std: float = 1.0):
        self.module = PositionalModel(vocab_size, embedding_dim, num_numbers, embedding_std)
        self.max_response_length = num_numbers  # every response has exactly n tokens
        self._groups: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @torch.no_grad()
    def sample(
        self, prompts: torch.Tensor, group_size: int, temperature: float, generator: torch.Generator
    ) -> Samples:
        """G responses per prompt: prompts [B, n] -> Samples with responses [B, G, n]."""
        b, n = prompts.shape
        log_probs = tempered_log_softmax(self.module(prompts), temperature)  # [B, n, V]
        responses = sample_tokens(log_probs.exp().reshape(b * n, -1), b, group_size, generator)  # [B, G, n]
        response_ids = responses.reshape(b * group_size, n)  # [N, n]
        sample_lp = log_probs.unsqueeze(1).expand(b, group_size, n, -1)  # [B, G, n, V]
        sample_lp = sample_lp.gather(-1, responses.unsqueeze(-1)).squeeze(-1).reshape(b * group_size, n)
        prompt_ids = prompts.repeat_interleave(group_size, dim=0)  # [N, n]
        mask = torch.ones_like(response_ids, dtype=torch.bool)
        return Samples(responses, response_ids, mask, prompt_ids, mask.clone(), sample_lp)

    def log_probs(
        self, samples: Samples, temperature: float = 1.0, with_entropy: bool = False,
        module: PositionalModel | None = None, entropy_grad: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log pi(response_t | prompt) [n_rows, n], and per-position entropy if asked.

        ``module``: score with these weights instead of the policy's (the frozen reference).
        The entropy always carries its gradient (``entropy_grad`` is accepted for the
        ``Policy`` interface): it costs nothing unless a loss uses it.
        """
        m = self.module if module is None else module
        # Every inner step scores the same rollout: find its groups once.
        if self._groups is None or self._groups[0] is not samples.prompt_ids:
            self._groups = (samples.prompt_ids, *consecutive_groups(samples.prompt_ids))
        _, prompts, row_prompt = self._groups
        log_probs, entropy = _PositionalLogProbs.apply(
            prompts, row_prompt, samples.response_ids, temperature, m.embedding.weight, m.encode, m.decode
        )
        return log_probs, entropy if with_entropy else None

    @torch.no_grad()
    def greedy(self, prompts: torch.Tensor) -> torch.Tensor:
        """The argmax response per prompt: [B, n] -> [B, 1, n]."""
        return self.module(prompts).argmax(dim=-1).unsqueeze(1)
