"""A run's state: what changes while it trains, enough to resume it, and the error that ends training. The loop
(``rlvr.loop.trainer``), the step (``rlvr.loop.step``) and every learner (``rlvr.cluster.learners``) work on it."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import torch

from rlvr.batch.interfaces import Policy
from rlvr.batch.record import Record
from rlvr.batch.rollout import Rollout


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. too many consecutive non-finite steps)."""


@dataclass
class TrainState:
    """Everything that changes during a run: enough to resume it (``rlvr.runs.checkpoint`` turns it into a checkpoint
    and back)."""

    policy: Policy
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    scheduler: torch.optim.lr_scheduler.LambdaLR
    ref_module: torch.nn.Module | None = None
    epoch: int = 0
    step: int = 0
    bad_steps: int = 0  # consecutive optimizer steps skipped for non-finite values
    inner_step: int = 0  # next inner step of the current epoch
    rollout: Rollout | None = None  # the current epoch's batch (None between epochs)
    records: list[Record] = field(default_factory=list)
    stop_requested: bool = False  # set by a signal handler: stop after the current step
    # a one-process checkpoint's weights, optimizer state and reference, kept for the learners by a driver that holds no
    # weights (``rlvr.config.compose.driver_holds_weights``) until they take them
    handover: dict | None = None


def seed_everything(seed: int) -> torch.Generator:
    """Seed the global RNGs (python, numpy, torch); the run's own generator, seeded alike."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)
