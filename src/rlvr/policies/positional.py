"""The lecture's non-autoregressive positional model for the sorting task.

Embed each prompt token, encode every position with its own D x D matrix and sum over
positions into one state vector, decode one vector per response position with its own
D x D matrix, and read logits through the (tied) embedding. Response positions are
sampled independently given the prompt.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from rlvr.rollout import Samples


class PositionalModel(nn.Module):
    """prompts [B, n] -> logits [B, n, V]."""

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
        b, n = prompts.shape
        d = self.embedding.embedding_dim
        x = self.embedding(prompts)  # [B, n, D]
        # Encode each position with its own matrix and sum over positions: one matmul
        # over the flattened (position, dim) axis, the same as einsum("bpd,pde->be").
        state = x.reshape(b, n * d) @ self.encode.reshape(n * d, d)  # [B, D]
        # Decode one vector per position: einsum("be,pef->bpf") as one matmul.
        decode = self.decode.transpose(0, 1).reshape(d, n * d)  # [D, n*D]
        out = (state @ decode).reshape(b * n, d)  # [B*n, D]
        return (out @ self.embedding.weight.T).reshape(b, n, -1)  # [B, n, V], tied output


class _PositionalLogProbs(torch.autograd.Function):
    """Log-probs of chosen tokens through the whole model, with a hand-written backward.

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
        d = embedding.shape[1]
        x = embedding[prompts].reshape(u, n * d)  # [U, n*D]
        encode_flat = encode.reshape(n * d, d)  # [n*D, D]
        state = x @ encode_flat  # [U, D]
        decode_flat = decode.transpose(0, 1).reshape(d, n * d)  # [D, n*D]
        out = (state @ decode_flat).reshape(u * n, d)  # [U*n, D]
        logits = out @ embedding.T  # [U*n, V]
        if temperature != 1.0:
            logits = logits / temperature
        all_log_probs = torch.log_softmax(logits, dim=-1)  # [U*n, V]
        probs = all_log_probs.exp()
        distinct_entropy = -(probs * all_log_probs).sum(dim=-1)  # [U*n]
        entropy = distinct_entropy.reshape(u, n)[row_prompt]  # [N, n]
        positions = torch.arange(n, device=prompts.device)
        chosen = ((row_prompt.unsqueeze(1) * n + positions) * probs.shape[1] + responses)  # [N, n] flat index
        log_probs = all_log_probs.take(chosen)  # [N, n]
        ctx.save_for_backward(prompts, chosen, embedding, encode_flat, decode_flat, x, state, out, probs,
                              row_prompt, all_log_probs, distinct_entropy)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)  # an unused entropy (a metric) sends None, not zeros
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        (prompts, chosen, embedding, encode_flat, decode_flat, x, state, out, probs, row_prompt, all_log_probs,
         distinct_entropy) = ctx.saved_tensors
        u, n = prompts.shape
        d = embedding.shape[1]
        # Gradient on the chosen log-probs, summed over the responses sharing a prompt.
        grad_chosen = torch.zeros_like(probs)
        if grad_log_probs is not None:
            grad_chosen.view(-1).scatter_add_(0, chosen.reshape(-1), grad_log_probs.reshape(-1))
        # Through log_softmax: d logits = g - softmax * sum(g), then 1 / tau.
        grad_logits = grad_chosen - probs * grad_chosen.sum(dim=-1, keepdim=True)  # [U*n, V]
        if grad_entropy is not None:  # the entropy bonus: dH/dz = -p (log p + H), per distinct prompt
            grad_h = torch.zeros(u, n, dtype=probs.dtype, device=probs.device)
            grad_h.index_add_(0, row_prompt, grad_entropy)  # [U, n]
            grad_logits = grad_logits - grad_h.reshape(-1, 1) * probs * (all_log_probs + distinct_entropy[:, None])
        if ctx.temperature != 1.0:
            grad_logits = grad_logits / ctx.temperature
        grad_embedding = grad_logits.T @ out  # [V, D], the output side of the tied weights
        grad_out = (grad_logits @ embedding).reshape(u, n * d)  # [U, n*D]
        grad_decode = (state.T @ grad_out).reshape(d, n, d).transpose(0, 1)  # [n, D, D]
        grad_state = grad_out @ decode_flat.T  # [U, D]
        grad_encode = (x.T @ grad_state).reshape(n, d, d)  # [n, D, D]
        grad_x = (grad_state @ encode_flat.T).reshape(u * n, d)  # [U*n, D]
        grad_embedding.index_add_(0, prompts.reshape(-1), grad_x)  # the input side
        return None, None, None, None, grad_embedding, grad_encode, grad_decode


def consecutive_groups(prompt_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs of equal consecutive rows: prompt_ids [N, n] -> (one row per run [U, n], run of each row [N]).

    The rows of a group are consecutive and share their prompt, so the model runs once
    per prompt. Same result as ``torch.unique_consecutive(dim=0, return_inverse=True)``,
    which is ~30x slower here.
    """
    starts = torch.ones(prompt_ids.shape[0], dtype=torch.bool, device=prompt_ids.device)
    starts[1:] = (prompt_ids[1:] != prompt_ids[:-1]).any(dim=1)
    return prompt_ids[starts], starts.cumsum(0) - 1


class PositionalPolicy:
    """Policy over fixed-length responses of n tokens; see ``rlvr.rollout.Policy``."""

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
        logits = self.module(prompts) / temperature  # [B, n, V]
        log_probs = torch.log_softmax(logits, dim=-1)
        flat = log_probs.exp().reshape(b * n, -1)  # [B*n, V]
        tokens = torch.multinomial(flat, group_size, replacement=True, generator=generator)  # [B*n, G]
        responses = tokens.reshape(b, n, group_size).transpose(1, 2).contiguous()  # [B, G, n]
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
