"""A policy's engine handed the trainer's weights, and the check that it holds them.

``sync_engine`` copies a ``CausalLMPolicy``'s weights to its engine (an engine sharing the
policy's module copies nothing) and scores a fixed probe sequence (``probe_ids``:
``PROBE_LENGTH`` tokens spread over the vocabulary) with the engine and with the trainer:
their log-probs must agree within the engine's ``probe_tolerance`` (``probe_gap``), else
``WeightSyncError``.
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

    The trainer calls this once per epoch, after the optimizer steps and before
    sampling, and before each evaluation, with ``version`` its optimizer step count:
    the engine's ``weights_version`` then names the weights it samples with, the same
    in a resumed run as in a straight one (None: one more than the engine's last).

    An engine that shares ``module`` (hf) copies nothing. One with its own copy
    (vllm) gets the weights copied (LoRA merged), then checked: the probe's log-probs,
    scored by the engine and by the trainer, must agree within the engine's
    ``probe_tolerance``, else WeightSyncError. Returns ``engine/weights_version``, and
    for a copying engine ``engine/probe_gap`` and ``time/engine_sync`` (seconds for the
    copy and the probe; ``time/`` marks wall-clock numbers, see ``without_timings``).
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
