"""Policies: what samples responses and scores their log-probs (``rlvr.batch.interfaces.Policy``).

positional.py: the lecture's non-autoregressive sorting model; causal_lm.py: Hugging Face causal LMs (the ``lm``
extra, imported only when asked for).
"""

from __future__ import annotations

import copy

import torch


def frozen_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy that takes no gradient, in eval mode: the KL reference."""
    ref = copy.deepcopy(module)
    ref.requires_grad_(False)
    return ref.eval()


def holds_weights(module: torch.nn.Module) -> bool:
    """False for a module built without weights (its parameters on the meta device)."""
    return not any(p.is_meta for p in module.parameters())
