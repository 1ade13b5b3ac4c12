"""A policy's engine handed the trainer's weights, and the check that it holds them.

An engine with its own copy of the weights scores a fixed probe sequence after each copy; its log-probs must agree
with the trainer's within the engine's ``probe_tolerance``, else ``WeightSyncError``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from rlvr.core import token_log_probs
from rlvr.engines import WeightSyncError

# A fixed token sequence both the engine and the trainer score after each weight copy.
PROBE_LENGTH, PROBE_STRIDE = 24, 7919  # token i is i * stride mod the vocabulary (a prime stride)


def sync_engine(policy: Any, version: int | None = None) -> dict[str, float]:
    """Hand the engine the trainer's current weights; the numbers for the record.

    ``version``: the trainer's optimizer step count, so that ``weights_version`` names the weights the same in a
    resumed run as in a straight one (None: one more than the engine's last). A copying engine is then probed
    (``engine/probe_gap``, and ``time/engine_sync`` for the copy and the probe).
    """
    clock = time.perf_counter()
    policy.engine.load_weights(policy.module)
    if version is not None:
        policy.engine.weights_version = version
    stats = {"engine/weights_version": float(policy.engine.weights_version)}
    if not hasattr(policy.engine, "prompt_log_probs"):  # no probe: the engine shares the trainer's module
        return stats
    gap = probe_gap(policy)
    stats.update({"engine/probe_gap": gap, "time/engine_sync": time.perf_counter() - clock})
    tolerance = policy.engine.probe_tolerance
    if not gap <= tolerance:  # NaN included
        raise WeightSyncError(
            f"the generation engine does not hold the trainer's weights (version "
            f"{policy.engine.weights_version}) after a weight sync: its log-probs of a fixed {PROBE_LENGTH}-token "
            f"probe differ from the trainer's by up to {gap:.3g} "
            f"(policy.options.engine_options.probe_tolerance={tolerance:g})")
    return stats


def probe_ids(policy: Any) -> list[int]:
    """The fixed probe sequence: ``PROBE_LENGTH`` token ids spread over the vocabulary."""
    vocab = min(len(policy.tokenizer), policy.module.get_output_embeddings().weight.shape[0])
    return [(i * PROBE_STRIDE) % vocab for i in range(1, PROBE_LENGTH + 1)]


@torch.no_grad()
def probe_gap(policy: Any) -> float:
    """max over the probe's tokens of |engine - trainer| log pi_1(token | tokens before it)."""
    ids = probe_ids(policy)
    engine_log_probs = policy.engine.prompt_log_probs(ids)  # [L - 1]
    input_ids = torch.tensor([ids], device=policy.device)  # [1, L]
    was_training = policy.module.training
    policy.module.eval()  # as when sampling
    try:
        logits = policy.forward(input_ids=input_ids, use_cache=False).logits[:, :-1]  # [1, L - 1, V]
    finally:
        policy.module.train(was_training)
    log_probs = token_log_probs(logits, input_ids[:, 1:], 1.0, policy.chunk_elements)[0]  # [L - 1]
    return (engine_log_probs.to(log_probs) - log_probs).abs().max().item()
