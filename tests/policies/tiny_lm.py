"""What the causal-LM policy tests share: prompts, a policy maker."""

from __future__ import annotations

import torch

from rlvr.modeling import load_model_and_tokenizer
from rlvr.policies.causal_lm import CausalLMPolicy

PROMPTS = ["123456>", "98>", "5"]


def make_policy(path, **settings) -> CausalLMPolicy:
    model, tokenizer = load_model_and_tokenizer(path)
    return CausalLMPolicy(model, tokenizer, **{"max_new_tokens": 12, **settings})


def saved_bytes(model: torch.nn.Module, ids: torch.Tensor, **inputs) -> tuple[torch.Tensor, int]:
    """(logits, bytes of every tensor autograd keeps for backward) of one forward."""
    kept = {}

    def pack(tensor):
        kept[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = model(input_ids=ids, **inputs).logits
    return logits, sum(kept.values())
