"""Policies: what samples responses and scores their log-probs (``rlvr.rollout.Policy``).

positional.py: the lecture's non-autoregressive sorting model; causal_lm.py: Hugging
Face causal LMs (the ``lm`` extra, imported only when asked for).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch

from rlvr.errors import ConfigError
from rlvr.policies.positional import PositionalPolicy

if TYPE_CHECKING:
    from rlvr.config import Config
    from rlvr.rollout import Policy


def build_policy(config: Config) -> Policy:
    """The policy of ``config.policy`` (the positional model sized by ``config.task``)."""
    p = config.policy
    if p.name == "positional":
        return PositionalPolicy(config.task.vocab_size, p.embedding_dim, config.task.num_numbers, p.embedding_std)
    from rlvr.policies.causal_lm import build_causal_lm_policy  # transformers: an optional extra

    try:
        return build_causal_lm_policy(p)
    except (ValueError, TypeError, OSError) as err:  # bad options or a model that is not there
        raise ConfigError(f"policy.options: {err}") from err


def frozen_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy that takes no gradient, in eval mode: the KL reference."""
    ref = copy.deepcopy(module)
    ref.requires_grad_(False)
    return ref.eval()
