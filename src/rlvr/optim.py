"""The optimizer and its learning-rate schedule, built from the ``optim`` section."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rlvr.config import OptimConfig


def build_optimizer(
    optim: OptimConfig, params: list[torch.nn.Parameter], lr: float | None = None
) -> torch.optim.Optimizer:
    """The configured Adam/AdamW over ``params`` (``lr`` overrides optim.lr)."""
    cls = torch.optim.Adam if optim.name == "adam" else torch.optim.AdamW
    # fused: one kernel for all parameters; the per-step cost of the toy is mostly overhead.
    fused = all(p.dtype in (torch.float32, torch.float64) for p in params)
    return cls(params, lr=optim.lr if lr is None else lr, betas=tuple(optim.betas),
               weight_decay=optim.weight_decay, fused=fused or None)


def build_scheduler(
    optim: OptimConfig, optimizer: torch.optim.Optimizer, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Learning-rate multiplier per optimizer step: linear warm-up over
    ``optim.warmup_steps``, then constant, linear decay to 0 or cosine decay to 0 at
    ``total_steps``."""
    warmup, schedule = optim.warmup_steps, optim.schedule

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if schedule == "linear":
            return 1.0 - progress
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
