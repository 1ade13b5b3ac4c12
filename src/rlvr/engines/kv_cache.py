"""A KV cache written in place, for ``HFEngine``: one copy per position, not one per step.

Shapes: B prompts, G responses per prompt, n = B*G rows (row ``b * G + g`` is response g of prompt b), H key/value
heads, P prompt tokens, L filled positions, D head size. The design: ``docs/explanation/engines.md``.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast


@functools.cache
def cache_name() -> str:
    """The KV cache's ``forward`` keyword and output field: ``cache`` from transformers 5.24 on, before it
    ``past_key_values`` (which 5.24 still takes, with a deprecation warning on every call)."""
    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def cache_of(out: Any) -> Any:
    """The KV cache a forward returned (``use_cache=True``)."""
    return out[cache_name()]


def rows_of(cache: Cache, rows: torch.Tensor) -> Cache:
    """A new cache of ``cache``'s ``rows`` [n] (repeats allowed), differentiable; ``cache`` itself unchanged."""
    selected = copy.copy(cache)
    selected.layers = [copy.copy(layer) for layer in cache.layers]
    selected.batch_select_indices(rows)
    return selected


# Positions a cache has room for past the prompt before it first doubles. Not all of P + max_new_tokens at once:
# slabs much longer than L cost cache misses (measured: 9% slower for ~18-token responses with room for 256).
INITIAL_HEADROOM = 16


class PreallocatedLayer(DynamicLayer):
    """One attention layer's keys and values in buffers [n, H, capacity, D], written in place.

    ``keys`` and ``values`` are views [n, H, L, D] of the filled part, so everything transformers reads from a
    ``DynamicLayer`` holds unchanged. A full buffer is replaced by one of twice the capacity (at most
    ``max_capacity``): amortised, each position is copied O(1) times instead of once per later step.
    """

    def __init__(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor, length: int, max_capacity: int):
        super().__init__()
        self.key_buffer, self.value_buffer = key_buffer, value_buffer  # [n, H, capacity, D]
        self.max_capacity = max_capacity
        self.dtype, self.device, self.is_initialized = key_buffer.dtype, key_buffer.device, True
        self._view(length)

    def _view(self, length: int) -> None:
        self.keys, self.values = self.key_buffer[:, :, :length], self.value_buffer[:, :, :length]

    def _move(self, rows: torch.Tensor | None, capacity: int) -> None:
        """New buffers of ``capacity`` positions holding the filled part of ``rows`` [m] (None: all)."""
        length = self.keys.shape[-2]
        moved = []
        for states in (self.keys, self.values):  # [n, H, L, D]
            n, h, _, d = states.shape
            buffer = states.new_empty((n if rows is None else rows.shape[0], h, capacity, d))
            if rows is None:
                buffer[:, :, :length] = states
            else:  # one pass, straight into the new buffer (states[rows] would copy twice)
                torch.index_select(states, 0, rows, out=buffer[:, :, :length])
            moved.append(buffer)
        self.key_buffer, self.value_buffer = moved
        self._view(length)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write key_states, value_states [n, H, q, D] after the filled part; return keys, values [n, H, L + q, D]."""
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self.key_buffer.shape[-2]:
            if end > self.max_capacity:
                raise RuntimeError(f"KV cache full: {end} positions asked of {self.max_capacity}")
            self._move(None, min(self.max_capacity, max(end, 2 * self.key_buffer.shape[-2])))
        self.key_buffer[:, :, start:end] = key_states
        self.value_buffer[:, :, start:end] = value_states
        self._view(end)
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices`` [m] only, in new buffers of the same capacity."""
        self._move(indices, self.key_buffer.shape[-2])

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("this cache is built at its final batch size")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("this cache only grows")


def preallocated_cache(prompt_cache: Cache, group_size: int, max_capacity: int,
                       headroom: int = INITIAL_HEADROOM) -> Cache | None:
    """The prefill cache of B prompts, each repeated G times, with room for ``headroom`` more positions, growing
    to ``max_capacity``; None when a layer is not a plain ``DynamicLayer`` (sliding window...)."""
    if not prompt_cache.layers or any(type(layer) is not DynamicLayer for layer in prompt_cache.layers):
        return None
    layers = []
    for layer in prompt_cache.layers:
        buffers = []
        for states in (layer.keys, layer.values):  # [B, H, P, D]
            b, h, length, d = states.shape
            capacity = min(max_capacity, length + headroom)
            buffer = states.new_empty((b * group_size, h, capacity, d))
            buffer.view(b, group_size, h, capacity, d)[:, :, :, :length] = states.unsqueeze(1)
            buffers.append(buffer)
        layers.append(PreallocatedLayer(*buffers, length, max_capacity))
    return Cache(layers=layers)
