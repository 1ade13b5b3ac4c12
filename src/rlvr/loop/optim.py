"""The optimizer and its learning-rate schedule, built from the ``optim`` section."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.optim import optimizer as base

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
    """Learning-rate multiplier per optimizer step: linear warm-up over ``optim.warmup_steps``, then constant, linear
    decay to 0 or cosine decay to 0 at ``total_steps``."""
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


def clear_grads(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.zero_grad(set_to_none=True)`` without its wrappers (the profiler label, the dynamo guard), which cost
    the toy's step more than its Adam kernel: every parameter's ``.grad`` None."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = None


_KERNELS = {False: torch._fused_adam_, True: torch._fused_adamw_}  # by decoupled weight decay


@dataclass
class _Direct:
    """What ``optimizer_update`` keeps of an optimizer between steps: the step counts of its parameters with a gradient
    as 0-dim views of one tensor (one add counts them all), and those views, to check that each entry still holds its
    own."""

    steps: torch.Tensor
    views: list[torch.Tensor]


_DIRECT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> _Direct


def optimizer_update(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()``: for the fused Adam and AdamW that ``build_optimizer`` makes, their kernel called directly
    on the same lists with the same arguments (the same arithmetic, bit for bit: ``tests/test_optim.py``). The toy's
    step is per-call overhead, and ``step()``'s own Python (grouping, checks, the profiler label, one add per step
    count) costs several times the kernel there. Whatever the direct call does not cover goes through ``step()``: state
    not made yet (the first step), hooks, several groups, amsgrad, maximize, a tensor learning rate, gradient scaling, a
    scheduler that has not seen a step."""
    direct = _direct_adam(optimizer)
    if direct is None:
        optimizer.step()
        return
    params, entries, steps = direct
    group = optimizer.param_groups[0]
    steps.add_(1)
    beta1, beta2 = group["betas"]
    _KERNELS[bool(group["decoupled_weight_decay"])](
        params, [p.grad for p in params], [e["exp_avg"] for e in entries], [e["exp_avg_sq"] for e in entries], [],
        [e["step"] for e in entries], amsgrad=False, lr=group["lr"], beta1=beta1, beta2=beta2,
        weight_decay=group["weight_decay"], eps=group["eps"], maximize=False, grad_scale=None, found_inf=None)


def _direct_adam(optimizer: torch.optim.Optimizer
                 ) -> tuple[list[torch.Tensor], list[dict], torch.Tensor] | None:
    """The parameters with a gradient, their state entries and their step counts as one tensor, where
    ``optimizer_update`` may call the kernel itself; None where it must call ``step()``. Each entry is looked up every
    step (state cleared, replaced or loaded is seen)."""
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW) or len(optimizer.param_groups) != 1:
        return None
    group = optimizer.param_groups[0]
    if (not group.get("fused") or group["amsgrad"] or group["maximize"] or group["capturable"]
            or group["differentiable"] or isinstance(group["lr"], torch.Tensor)
            or any(isinstance(b, torch.Tensor) for b in group["betas"])):
        return None
    if (optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks
            or base._global_optimizer_pre_hooks or base._global_optimizer_post_hooks
            or getattr(optimizer, "grad_scale", None) is not None or getattr(optimizer, "found_inf", None) is not None
            or (hasattr(optimizer.step, "_wrapped_by_lr_sched") and not getattr(optimizer, "_opt_called", False))):
        # a scheduler made since checks at its first step that step() has run
        return None
    params = [p for p in group["params"] if p.grad is not None]
    entries = [optimizer.state.get(p) for p in params]
    if not params or any(e is None or "step" not in e for e in entries):
        return None  # nothing to do, or state to make: step() does both
    direct = _DIRECT.get(optimizer)
    if direct is None or len(direct.views) != len(entries) or any(
            e["step"] is not view for e, view in zip(entries, direct.views)):
        # other parameters with a gradient, or state made or loaded since: count their steps anew
        if len({(p.device, p.dtype) for p in params}) > 1:
            return None  # step() groups the tensors by device and dtype; one kernel call takes one
        steps = torch.stack([e["step"] for e in entries])
        for i, e in enumerate(entries):
            e["step"] = steps[i]
        _DIRECT[optimizer] = direct = _Direct(steps, [e["step"] for e in entries])
    return params, entries, direct.steps
