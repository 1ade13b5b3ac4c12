"""What the causal-LM policy tests share: prompts, a policy maker."""

from __future__ import annotations

from rlvr.modeling import load_model_and_tokenizer
from rlvr.policies.causal_lm import CausalLMPolicy

PROMPTS = ["123456>", "98>", "5"]


def make_policy(path, **settings) -> CausalLMPolicy:
    model, tokenizer = load_model_and_tokenizer(path)
    return CausalLMPolicy(model, tokenizer, **{"max_new_tokens": 12, **settings})
