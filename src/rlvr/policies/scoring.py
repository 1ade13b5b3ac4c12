"""Scoring a causal LM's responses: the model's outputs (logits, or final hidden states) at the positions that
predict each response token, and the entropy of the policy there.

Shapes: n rows (a prompt's rows consecutive), P prompt tokens (left-padded), T response tokens (right-padded), V
vocabulary, H hidden size, D either (what ``forward`` returns), u distinct prompts, M real response tokens.
``forward(keep, **inputs)``: ``logits_forward`` or ``hidden_forward`` (docs/explanation/policies.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlvr.batch.rollout import Samples
from rlvr.core import entropy_from_logits
from rlvr.core.logprobs import row_chunks

Forward = Callable[..., tuple[torch.Tensor, Any]]


def logits_forward(call: Callable[..., Any]) -> Forward:
    """``forward`` of a whole causal LM ``call`` (a transformers model's forward): D = V."""
    from rlvr.engines import kv_cache  # imports transformers, like the model it runs

    def forward(keep: int, **inputs: Any) -> tuple[torch.Tensor, Any]:
        out = call(**inputs, logits_to_keep=keep)
        return out.logits, kv_cache.cache_of(out) if inputs.get("use_cache") else None

    return forward


def hidden_forward(call: Callable[..., Any]) -> Forward:
    """``forward`` of a causal LM's body ``call`` (its decoder, ``split_head``): D = H."""
    from rlvr.engines import kv_cache

    def forward(keep: int, **inputs: Any) -> tuple[torch.Tensor, Any]:
        out = call(**inputs)
        return out.last_hidden_state[:, -keep:], kv_cache.cache_of(out) if inputs.get("use_cache") else None

    return forward


@torch.no_grad()
def split_head(module: torch.nn.Module, probe: torch.Tensor) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(body, head) of causal LM ``module`` when its logits are exactly ``head(body(...).last_hidden_state)``,
    checked bit for bit on ``probe`` [1, L] in eval mode; None when not (a model that scales or caps its logits)."""
    try:
        body, head = module.get_decoder(), module.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if body is None or head is None:
        return None
    was_training = module.training
    module.eval()
    try:
        whole = module(input_ids=probe, use_cache=False).logits
        parts = head(body(input_ids=probe, use_cache=False).last_hidden_state)
    except Exception:  # a body that takes other inputs: the whole model's logits, as before
        return None
    finally:
        module.train(was_training)
    return (body, head) if torch.equal(whole, parts) else None


MAX_BUCKETS = 4  # at most this many forward passes of responses of like width
MIN_SAVING = 0.25  # split only when that leaves out at least this share of the positions
MAX_WIDTHS = 64  # widths are rounded up to at most this many distinct values before the split


def length_buckets(widths: torch.Tensor, bucket_cost: int) -> list[torch.Tensor]:
    """Rows [k] (ascending) of each bucket of rows whose responses end at ``widths`` [n], each bucket to be scored
    narrowed to its widest row.

    The split (contiguous ranges of width, at most ``MAX_BUCKETS``) minimises the positions run, sum over buckets
    of rows * widest + ``bucket_cost`` (one more pass's prompts); one bucket unless that saves ``MIN_SAVING``.
    Rows keep their order within a bucket, so a prompt's rows stay consecutive (prompt sharing).
    """
    n = widths.shape[0]
    top = int(widths.max()) if n else 0
    step = max(1, -(-top // MAX_WIDTHS))
    rounded = (widths + step - 1) // step * step  # [n], at most MAX_WIDTHS distinct values
    values, counts = torch.unique(rounded, return_counts=True)  # ascending
    values, counts = values.tolist(), counts.tolist()
    if len(values) == 1:
        return [torch.arange(n)]
    below = [0]
    for c in counts:
        below.append(below[-1] + c)  # rows of width < values[j] is below[j]
    inf = float("inf")
    d = len(values)
    # best[k][j]: the least positions for the rows of the j narrowest widths in k buckets;
    # cut[k][j]: the width index where the last of those buckets starts
    best = [[inf] * (d + 1) for _ in range(MAX_BUCKETS + 1)]
    cut = [[0] * (d + 1) for _ in range(MAX_BUCKETS + 1)]
    best[0][0] = 0
    for k in range(1, MAX_BUCKETS + 1):
        for j in range(1, d + 1):
            for i in range(k - 1, j):
                cost = best[k - 1][i] + (below[j] - below[i]) * values[j - 1] + bucket_cost
                if cost < best[k][j]:
                    best[k][j], cut[k][j] = cost, i
    k = min(range(1, MAX_BUCKETS + 1), key=lambda b: best[b][d])
    if best[k][d] > (1 - MIN_SAVING) * best[1][d]:
        return [torch.arange(n)]
    bounds, j = [], d
    while k > 0:
        i = cut[k][j]
        bounds.append((values[i - 1] if i > 0 else -1, values[j - 1]))
        j, k = i, k - 1
    return [torch.nonzero((rounded > low) & (rounded <= high)).squeeze(1) for low, high in reversed(bounds)]


@dataclass(frozen=True)
class EncodedPrompts:
    """A batch's u distinct prompts encoded once: the output at each prompt's last position [u, 1, D] (it predicts
    response token 0), their KV cache, each row's prompt ``inverse`` [n] and the prompts' mask [u, P]."""

    last: torch.Tensor
    cache: Any
    inverse: torch.Tensor
    mask: torch.Tensor


def encode_prompts(forward: Forward, samples: Samples) -> EncodedPrompts | None:
    """The distinct prompts of ``samples`` encoded once, for ``response_outputs`` of any of its rows; None when no
    prompt repeats (nothing to share)."""
    prompt_key = torch.cat([samples.prompt_ids, samples.prompt_mask.long()], dim=1)  # [n, 2P]
    _, inverse, counts = torch.unique_consecutive(prompt_key, dim=0, return_inverse=True, return_counts=True)
    if len(counts) == len(inverse):
        return None
    first_rows = counts.cumsum(0) - counts  # [u]: one row per distinct prompt
    prompt_ids, prompt_mask = samples.prompt_ids[first_rows], samples.prompt_mask[first_rows].long()  # [u, P]
    last, cache = forward(1, input_ids=prompt_ids, attention_mask=prompt_mask,
                          position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0), use_cache=True)
    return EncodedPrompts(last[:, -1:], cache, inverse, prompt_mask)


def response_outputs(forward: Forward, samples: Samples, prompts: EncodedPrompts | None = None,
                     rows: torch.Tensor | None = None) -> torch.Tensor:
    """Outputs [n, T, D] at the positions that predict each response token (positions counted over real tokens).
    With ``prompts`` (``encode_prompts`` of the batch whose ``rows`` [n] ``samples`` holds; default: all of them),
    each row's prompt is not encoded again: its KV cache is the shared one (same values up to float rounding)."""
    if prompts is None:
        response_ids, response_mask = samples.response_ids, samples.response_mask  # [n, T]
        input_ids = torch.cat([samples.prompt_ids, response_ids], dim=1)  # [n, P + T]
        attention = torch.cat([samples.prompt_mask, response_mask], dim=1).long()
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        return forward(response_ids.shape[1] + 1, input_ids=input_ids, attention_mask=attention,
                       position_ids=positions, use_cache=False)[0][:, :-1]
    from rlvr.engines import kv_cache  # imports transformers, like the model it runs

    inverse = prompts.inverse if rows is None else prompts.inverse[rows]  # [n]: each row's prompt
    first_outputs = prompts.last[inverse]  # [n, 1, D]: predicts response token 0
    num_tokens = samples.response_ids.shape[1]
    if num_tokens == 1:
        return first_outputs
    cache = kv_cache.rows_of(prompts.cache, inverse)  # [u, ...] -> [n, ...], differentiable
    inputs = samples.response_ids[:, :-1]  # [n, T - 1]: token t predicts token t + 1
    attention = torch.cat([prompts.mask[inverse], samples.response_mask[:, :-1].long()], dim=1)
    positions = prompts.mask.sum(-1)[inverse].unsqueeze(-1) + torch.arange(num_tokens - 1, device=inputs.device)
    rest, _ = forward(num_tokens - 1, input_ids=inputs, attention_mask=attention, position_ids=positions,
                      use_cache=True, **{kv_cache.cache_name(): cache})  # [n, T - 1, D]
    return torch.cat([first_outputs, rest], dim=1)


def chunked_entropy(logits: torch.Tensor, temperature: float, chunk_elements: int) -> torch.Tensor:
    """Entropy [n, T] of softmax(logits [n, T, V] / tau), ``chunk_elements`` float32 logits at a time;
    differentiable (the entropy bonus)."""
    return torch.cat([entropy_from_logits(logits[rows].float() / temperature)
                      for rows in row_chunks(logits, chunk_elements)])
