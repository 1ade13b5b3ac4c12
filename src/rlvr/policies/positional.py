"""The lecture's non-autoregressive positional model for the sorting task.

Embed each prompt token, encode every position with its own D x D matrix and sum over positions into one state vector,
decode one vector per response position with its own D x D matrix, and read logits through the (tied) embedding.
Response positions are sampled independently given the prompt.

Shapes: M prompts (U distinct ones when scoring), n numbers per prompt (= response length), D embedding size, V vocab, N
responses, G responses per prompt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from rlvr.batch.interfaces import Policy
from rlvr.batch.rollout import Samples


@dataclass
class Activations:
    """One forward pass, kept for ``backward_pass``: x [M, n*D] (embedded prompts), encode_flat [n*D, D], state [M, D],
    decode_flat [D, n*D], decoded [M*n, D], logits [M*n, V]."""

    x: torch.Tensor
    encode_flat: torch.Tensor
    state: torch.Tensor
    decode_flat: torch.Tensor
    decoded: torch.Tensor
    logits: torch.Tensor


def forward_pass(embedding: torch.Tensor, encode: torch.Tensor, decode: torch.Tensor, prompts: torch.Tensor
                 ) -> Activations:
    """Weights embedding [V, D], encode and decode [n, D, D] on prompts [M, n] -> Activations with logits [M*n, V].

    Encoding each position with its own matrix and summing over positions is one matmul over the flattened (position,
    dim) axis, the same as einsum("bpd,pde->be"); decoding one vector per position, einsum("be,pef->bpf"), is
    another."""
    (m, n), d = prompts.shape, embedding.shape[-1]
    x = embedding[prompts].reshape(m, n * d)  # [M, n*D]: the embedded prompts
    encode_flat = encode.reshape(n * d, d)  # [n*D, D]
    state = torch.mm(x, encode_flat)  # [M, D]
    decode_flat = decode.transpose(0, 1).reshape(d, n * d)  # [D, n*D]
    decoded = torch.mm(state, decode_flat).view(m * n, d)  # [M*n, D]
    logits = torch.mm(decoded, embedding.t())  # [M*n, V], tied output
    return Activations(x, encode_flat, state, decode_flat, decoded, logits)


def tempered_log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / tau) over the last (vocabulary) axis."""
    return torch.log_softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)


def log_softmax_backward(grad_log_probs: torch.Tensor, probs: torch.Tensor, temperature: float,
                         grad_entropy: torch.Tensor | None = None, all_log_probs: torch.Tensor | None = None,
                         entropy: torch.Tensor | None = None) -> torch.Tensor:
    """The gradient on the logits [M*n, V] from the gradient on every log-prob [M*n, V] (and on each position's entropy
    [M*n, 1]): g - softmax * sum(g), minus dH/dz = -p (log p + H) times the entropy's gradient, then 1 / tau."""
    grad_logits = grad_log_probs - probs * grad_log_probs.sum(dim=-1, keepdim=True)
    if grad_entropy is not None:
        grad_logits = grad_logits - grad_entropy * probs * (all_log_probs + entropy)
    if temperature != 1.0:
        grad_logits = grad_logits / temperature
    return grad_logits


def backward_pass(a: Activations, embedding: torch.Tensor, prompts: torch.Tensor, grad_logits: torch.Tensor
                  ) -> dict[str, torch.Tensor]:
    """The gradients of embedding [V, D], encode and decode [n, D, D] from the gradient on the logits [U*n, V] of
    ``forward_pass`` on prompts [U, n], by hand (about ten matmuls)."""
    (u, n), d = prompts.shape, embedding.shape[-1]
    grad_embedding = torch.mm(grad_logits.t(), a.decoded)  # [V, D], the output side of the tied weights
    grad_out = torch.mm(grad_logits, embedding).view(u, n * d)  # [U, n*D]
    grad_decode = torch.mm(a.state.t(), grad_out).view(d, n, d).transpose(0, 1)  # [n, D, D]
    grad_state = torch.mm(grad_out, a.decode_flat.t())  # [U, D]
    grad_encode = torch.mm(a.x.t(), grad_state).view(n, d, d)
    grad_x = torch.mm(grad_state, a.encode_flat.t())  # [U, n*D]
    grad_embedding.index_add_(0, prompts.reshape(-1), grad_x.view(u * n, d))  # the input side
    return {"embedding": grad_embedding, "encode": grad_encode, "decode": grad_decode}


def chosen_index(row_prompt: torch.Tensor, responses: torch.Tensor, vocab: int) -> torch.Tensor:
    """The flat index [N, n] of each response token's log-prob in the [U*n, V] log-softmax: row_prompt [N] each
    response's distinct prompt, responses [N, n]."""
    n = responses.shape[-1]
    positions = torch.arange(n, device=responses.device)
    return (row_prompt.unsqueeze(1) * n + positions) * vocab + responses


def sample_tokens(probs: torch.Tensor, prompts: int, group_size: int, generator: torch.Generator) -> torch.Tensor:
    """G responses per prompt, each position drawn independently: probs [M*n, V] -> [M, G, n]."""
    tokens = torch.multinomial(probs, group_size, replacement=True, generator=generator)  # [M*n, G]
    return tokens.reshape(prompts, -1, group_size).transpose(1, 2).contiguous()


class PositionalModel(nn.Module):
    """prompts [B, n] -> logits [B, n, V]: ``forward_pass``."""

    def __init__(self, vocab_size: int, embedding_dim: int, num_numbers: int, embedding_std: float = 1.0):
        super().__init__()
        d = embedding_dim
        self.embedding = nn.Embedding(vocab_size, d)
        # std 1 is nn.Embedding's default (the lecture's); logits scale with its square, so smaller values start the
        # policy closer to uniform (more exploration).
        nn.init.normal_(self.embedding.weight, std=embedding_std)
        self.encode = nn.Parameter(torch.randn(num_numbers, d, d) / math.sqrt(d))  # [n, D, D]
        self.decode = nn.Parameter(torch.randn(num_numbers, d, d) / math.sqrt(d))  # [n, D, D]

    def forward(self, prompts: torch.Tensor) -> torch.Tensor:
        logits = forward_pass(self.embedding.weight, self.encode, self.decode, prompts).logits
        return logits.view(*prompts.shape, -1)  # [B, n, V]


class _PositionalLogProbs(torch.autograd.Function):
    """Log-probs of chosen tokens and the per-position entropy through the whole model, with the hand-written backward
    (``backward_pass``): the toy's step cost is per-operation overhead, and one node with a closed-form backward (about
    ten matmuls) replaces about twenty. The model runs once per distinct prompt (U), the G responses of a group sharing
    its logits. Equal to ``log_softmax(model(prompts) / tau)[responses]`` (tested against autograd).
    """

    @staticmethod
    def forward(ctx, prompts, row_prompt, responses, temperature, embedding, encode, decode):
        # prompts [U, n] distinct prompts; row_prompt [N] each response's prompt; responses [N, n]; embedding [V, D];
        # encode, decode [n, D, D]
        u, n = prompts.shape
        activations = forward_pass(embedding, encode, decode, prompts)
        all_log_probs = tempered_log_softmax(activations.logits, temperature)  # [U*n, V]
        probs = all_log_probs.exp()
        distinct_entropy = -(probs * all_log_probs).sum(dim=-1)  # [U*n]
        entropy = distinct_entropy.reshape(u, n)[row_prompt]  # [N, n]
        chosen = chosen_index(row_prompt, responses, probs.shape[-1])  # [N, n]
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

    The rows of a group are consecutive and share their prompt, so the model runs once per prompt. Same result as
    ``torch.unique_consecutive(dim=0, return_inverse=True)``, which is ~30x slower here.
    """
    starts = torch.ones(prompt_ids.shape[0], dtype=torch.bool, device=prompt_ids.device)
    starts[1:] = (prompt_ids[1:] != prompt_ids[:-1]).any(dim=1)
    return prompt_ids[starts], starts.cumsum(0) - 1


class PositionalPolicy(Policy):
    """Policy over fixed-length responses of n tokens; see ``rlvr.batch.interfaces.Policy``."""

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
        """log pi(response_t | prompt) [N, n], and per-position entropy if asked; ``module``: these weights (the frozen
        reference). The entropy always carries its gradient, which costs nothing unless a loss uses it."""
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
