"""Scoring a causal LM's responses: the logits at the positions that predict each response
token, and the entropy of the policy there.

Shapes: n rows (response b * G + g of prompt b, a prompt's rows consecutive), P prompt
tokens (left-padded), T response tokens (right-padded), V vocabulary, u distinct prompts.

``forward`` is the model's forward pass as the policy runs it (its module or the frozen
reference, under the policy's autocast setting): keyword inputs in, a transformers output
with ``logits`` out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rlvr.core import entropy_from_logits
from rlvr.core.logprobs import row_chunks
from rlvr.rollout import Samples

Forward = Callable[..., Any]


def response_logits(forward: Forward, samples: Samples, share_prompts: bool) -> torch.Tensor:
    """Logits [n, T, V] at the positions that predict each response token.

    Positions are counted over real tokens only; logits are kept only at the T positions
    that predict response tokens. With ``share_prompts``, when prompts repeat, each is
    encoded once and its KV cache shared by its rows (same values up to float rounding,
    fewer tokens through the model); the caller passes False under gradient checkpointing,
    which drops caches in training.
    """
    prompt_key = torch.cat([samples.prompt_ids, samples.prompt_mask.long()], dim=1)  # [n, 2P]
    _, inverse, counts = torch.unique_consecutive(prompt_key, dim=0, return_inverse=True, return_counts=True)
    if share_prompts and len(counts) < len(inverse):
        first_rows = counts.cumsum(0) - counts  # [u]: one row per distinct prompt
        return shared_prompt_logits(forward, samples, first_rows, inverse)
    response_ids, response_mask = samples.response_ids, samples.response_mask  # [n, T]
    input_ids = torch.cat([samples.prompt_ids, response_ids], dim=1)  # [n, P + T]
    attention = torch.cat([samples.prompt_mask, response_mask], dim=1).long()
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    return forward(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                   use_cache=False, logits_to_keep=response_ids.shape[1] + 1).logits[:, :-1]


def shared_prompt_logits(forward: Forward, samples: Samples, first_rows: torch.Tensor,
                         inverse: torch.Tensor) -> torch.Tensor:
    """Response logits [n, T, V]: u distinct prompts [u, P] encoded once, then all n responses.

    first_rows [u] picks one row per prompt; inverse [n] maps each row to its prompt.
    """
    from rlvr.engines import kv_cache  # imports transformers, like the model it runs

    prompt_ids, prompt_mask = samples.prompt_ids[first_rows], samples.prompt_mask[first_rows].long()  # [u, P]
    out = forward(input_ids=prompt_ids, attention_mask=prompt_mask,
                  position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0), use_cache=True, logits_to_keep=1)
    first_logits = out.logits[:, -1:][inverse]  # [n, 1, V]: predicts response token 0
    num_tokens = samples.response_ids.shape[1]
    if num_tokens == 1:
        return first_logits
    cache = kv_cache.cache_of(out)
    cache.batch_select_indices(inverse)  # [u, ...] -> [n, ...], differentiable
    inputs = samples.response_ids[:, :-1]  # [n, T - 1]: token t predicts token t + 1
    attention = torch.cat([prompt_mask[inverse], samples.response_mask[:, :-1].long()], dim=1)
    positions = prompt_mask.sum(-1)[inverse].unsqueeze(-1) + torch.arange(num_tokens - 1, device=inputs.device)
    rest = forward(input_ids=inputs, attention_mask=attention, position_ids=positions,
                   use_cache=True, **{kv_cache.cache_name(): cache}).logits  # [n, T - 1, V]
    return torch.cat([first_logits, rest], dim=1)


def masked_entropy(logits: torch.Tensor, temperature: float, response_mask: torch.Tensor,
                   chunk_elements: int) -> torch.Tensor:
    """Entropy [n, T] of softmax(logits / tau), logits [n, T, V], 0 where response_mask [n, T]
    is False; ``chunk_elements`` float32 logits at a time, like the log-probs."""
    entropy = torch.cat([entropy_from_logits(logits[rows].float() / temperature)
                         for rows in row_chunks(logits, chunk_elements)])
    return entropy.masked_fill(~response_mask, 0.0)
