"""What the causal-LM policy tests share: tiny model sizes, prompts, a policy maker."""

from __future__ import annotations

from rlvr.base.modeling import load_model_and_tokenizer
from rlvr.policies.causal_lm import CausalLMPolicy

PROMPTS = ["123456>", "98>", "5"]
TINY = dict(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, max_positions=64)


def make_policy(path, **settings) -> CausalLMPolicy:
    model, tokenizer = load_model_and_tokenizer(path)
    return CausalLMPolicy(model, tokenizer, **{"max_new_tokens": 12, **settings})
