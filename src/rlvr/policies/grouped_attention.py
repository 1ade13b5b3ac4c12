"""Attention that reads grouped keys and values as they are, with no copy per query head.

transformers' "sdpa" attention, given an attention mask on the CPU, repeats each key/value head for every query head
of its group, and autograd keeps the repeated copies for backward: on SmolLM2 (9 query heads, 3 key/value heads)
three times each layer's keys and values, copied in forward and summed back in backward. ``rlvr_sdpa`` asks torch's
``scaled_dot_product_attention`` for the grouped heads instead (``enable_gqa``); every other case (no mask, one query
position, CUDA, position biases...) is transformers' own function.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

NAME = "rlvr_sdpa"


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' attention-function signature: query [b, h, q, d], key and value [b, h_kv, k, d] -> ([b, q, h, d],
    None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grouped = (getattr(module, "num_key_value_groups", 1) > 1 and attention_mask is not None and query.shape[2] > 1
               and query.device.type == "cpu" and not kwargs.get("output_attentions")
               and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
               and type(kwargs.get("cache")).__name__ != "PagedAttentionCache")
    if not grouped:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def grouped_attention(model: torch.nn.Module) -> bool:
    """Switch a transformers model from "sdpa" attention to ``rlvr_sdpa`` (registered with transformers the first
    time); False, and nothing changed, for a model on any other attention."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
    config = getattr(base, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(base, "set_attn_implementation"):
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks sdpa gets
    base.set_attn_implementation(NAME)
    return True
