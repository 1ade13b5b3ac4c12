"""The batches the Ray rollout source submits to its workers: one ``Job`` per batch (or part of one), holding all
it takes to send it again, and the generator an asynchronously sampled batch starts from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlvr.batch.rollout import Grades, Samples


def epoch_generator_state(seed: int, epoch: int) -> torch.Tensor:
    """The generator state an asynchronously sampled batch of ``epoch`` starts from: seeded from (seed, epoch), so
    the batch does not depend on when it was sampled."""
    (derived,) = np.random.SeedSequence([seed, epoch]).generate_state(1, dtype=np.uint64)
    return torch.Generator().manual_seed(int(derived) & (2**63 - 1)).get_state()


@dataclass
class Job:
    """One epoch's batch, submitted to a worker: all it takes to send it again."""

    epoch: int
    worker: int
    version: int  # the optimizer step of the weights it samples with
    weights_epoch: int  # the epoch at whose start the driver held those weights
    weights: Any  # their ObjectRef
    generator_state: torch.Tensor | None
    prompts: Any = None  # this job's part of the epoch's prompts (cluster.split_batch), or None: the worker draws
    ref: Any = None  # the call's ObjectRef
    result: tuple[Samples, Grades, dict[str, float]] | None = None  # once answered (or restored from a checkpoint)
    new_state: torch.Tensor | None = None  # the worker's generator after the batch

    @property
    def size(self) -> int:
        assert self.result is not None
        return self.result[0].num_responses
