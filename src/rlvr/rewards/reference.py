"""The run's frozen reference model as a judge: a judge reward with ``base_url: reference``.

    rewards:
      functions:
        - function: rlvr.rewards.judge:judge
          options: {base_url: reference, scale: 10}

The model the run starts from (``policy.options.model`` loaded once more, without a LoRA
adapter, on the hf engine, never trained) is served on loopback for the run's length by an
endpoint with open routes (``rlvr.agents.server``); each such judge's options get its URL,
model name and key (a fresh secret, never written to the run directory). Its requests are
batched as agents' are, each sampled at its own temperature (0 unless the judge sets one).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlvr.agents.server import Endpoint
    from rlvr.config import PolicyConfig

REFERENCE = "reference"
MODEL_NAME = "rlvr-reference"


def asks_reference(item: Any) -> bool:
    """Is this ``rewards.functions`` item a function whose options say ``base_url: reference``?"""
    return isinstance(item, dict) and isinstance(item.get("options"), dict) and \
        item["options"].get("base_url") == REFERENCE


def serve_reference(functions: Sequence[Any], policy: PolicyConfig) -> tuple[list[Any], Endpoint | None]:
    """``functions`` with each reference judge pointed at the served reference, and that
    endpoint (started; None when no function asks for it: nothing is loaded)."""
    if not any(asks_reference(item) for item in functions):
        return list(functions), None
    from rlvr.agents.server import Endpoint
    from rlvr.compose import build_causal_lm_policy
    from rlvr.errors import ConfigError
    from rlvr.extras import AGENT_MODULES, require

    require("rewards.functions: a judge with base_url 'reference'", AGENT_MODULES)
    if policy.name != "causal_lm":
        raise ConfigError("rewards.functions: a judge with base_url 'reference' needs a language model "
                          f"(policy.name: causal_lm), not policy.name={policy.name!r}")
    options = dataclasses.replace(policy.options, lora=None, engine="hf", engine_options={}, compile=False,
                                  gradient_checkpointing=False)
    model = build_causal_lm_policy(dataclasses.replace(policy, options=options))
    model.module.requires_grad_(False)
    endpoint = Endpoint(model, model_name=MODEL_NAME, open_routes=True)
    endpoint.start()
    served = []
    for item in functions:
        if asks_reference(item):
            item = copy.deepcopy(item)
            item["options"].update(base_url=f"http://{endpoint.host}:{endpoint.port}/v1", model=MODEL_NAME,
                                   api_key=endpoint.api_key)
        served.append(item)
    return served, endpoint
