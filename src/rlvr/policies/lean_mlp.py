"""A gated MLP that keeps two of its four wide activations for backward.

``down(silu(gate(x)) * up(x))`` (Llama, Qwen, Mistral...) under autograd keeps gate(x), silu(gate(x)), up(x) and the
product, four [tokens, intermediate] tensors a layer: about half of a SmolLM2 update's activations. Here the tail
``down(silu(g) * u)`` is one autograd function that keeps g and u and remakes the product in backward (an element-wise
pass, no matmul); its gradients are the ones autograd gives the layers themselves, bit for bit (tested).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


class _SiluGateDown(torch.autograd.Function):
    """down(silu(gate) * up) of gate, up [..., I] and down's weight [H, I] and bias [H] or None -> [..., H]."""

    @staticmethod
    def forward(ctx, gate, up, weight, bias):
        ctx.save_for_backward(gate, up, weight)
        ctx.has_bias = bias is not None
        return F.linear(F.silu(gate) * up, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        gate, up, weight = ctx.saved_tensors
        act = F.silu(gate)
        grad_flat = grad_out.reshape(-1, grad_out.shape[-1])  # [M, H]
        # linear's backward as autograd runs it on a folded input: grad @ W, and grad^T @ input
        grad_hidden = grad_flat.mm(weight).view(up.shape)
        grad_weight = grad_flat.t().mm((act * up).reshape(-1, up.shape[-1])) if ctx.needs_input_grad[2] else None
        grad_bias = grad_flat.sum(0) if ctx.has_bias and ctx.needs_input_grad[3] else None
        grad_gate = torch.ops.aten.silu_backward(grad_hidden * up, gate)
        return grad_gate, grad_hidden * act, grad_weight, grad_bias


def _silu(module: torch.nn.Module) -> bool:
    return type(module) is torch.nn.SiLU or type(module).__name__ == "SiLUActivation"


def _lean_forward(mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The MLP's own forward, but through ``_SiluGateDown`` where autograd records, the down projection is a plain
    linear layer (not a peft one) and no autocast is on."""
    if not torch.is_grad_enabled() or type(mlp.down_proj) is not torch.nn.Linear or torch.is_autocast_enabled(
            x.device.type):
        return type(mlp).forward(mlp, x)
    down = mlp.down_proj
    return _SiluGateDown.apply(mlp.gate_proj(x), mlp.up_proj(x), down.weight, down.bias)


def lean_mlps(module: torch.nn.Module) -> int:
    """Give every gated SiLU MLP of ``module`` (``gate_proj``, ``up_proj``, ``down_proj``, ``act_fn``) the lean
    forward; returns how many."""
    count = 0
    for mlp in module.modules():
        if all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj")) and _silu(
                getattr(mlp, "act_fn", None)) and "forward" not in vars(mlp):
            mlp.forward = _lean_forward.__get__(mlp)
            count += 1
    return count
