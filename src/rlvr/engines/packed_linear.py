"""Linear layers run by oneDNN on weights reordered once, while an engine samples on the CPU.

torch's float32 ``linear`` on the CPU calls MKL, which runs decoding's shapes (a few dozen rows against weights read
from memory) well below the machine's matmul rate; oneDNN, on weights reordered into its blocked layout, runs them
near it (measured on SmolLM2: docs/reference/measured.md). Only outside autograd: the training step keeps torch's own
``linear``. The numbers differ from MKL's in float32 rounding (a different order of the same sums).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def available() -> bool:
    """Does this torch build have oneDNN's linear on reordered weights?"""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and hasattr(ops, "_linear_pointwise") and hasattr(
        ops, "_reorder_linear_weight")


def reorder(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """weight [out, in] in oneDNN's blocked layout for products of about ``rows`` rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows)


def reordered_linear(x: torch.Tensor, reordered: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] times a ``reorder``ed weight, plus bias -> [..., out], by oneDNN."""
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), reordered, bias, "none", [], "")
    return out.view(*x.shape[:-1], out.shape[-1])


class _PackedForward:
    """A ``nn.Linear``'s forward: oneDNN on the weight reordered for ``rows`` rows (reordered again whenever the
    weight changes in place, e.g. new weights loaded mid-generation); torch's own ``linear`` where autograd records
    or the input is not float32."""

    def __init__(self, layer: torch.nn.Linear, rows: int):
        self.layer, self.rows = layer, rows
        self.key: tuple[int, int] | None = None  # (data pointer, version) of the weight last reordered
        self.packed: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.layer.weight, self.layer.bias
        if torch.is_grad_enabled() or x.dtype != torch.float32:
            return torch.nn.functional.linear(x, weight, bias)
        key = (weight.data_ptr(), weight._version)
        if key != self.key:
            self.packed, self.key = reorder(weight, self.rows), key
        return reordered_linear(x, self.packed, bias)


def packable(layer: torch.nn.Module) -> bool:
    """A plain ``nn.Linear`` with plain (not sharded) float32 weights on the CPU (a peft layer's ``base_layer`` is
    one)."""
    return (type(layer) is torch.nn.Linear and type(layer.weight.data) is torch.Tensor
            and layer.weight.dtype == torch.float32 and layer.weight.device.type == "cpu"
            and "forward" not in vars(layer))


@contextlib.contextmanager
def packed_linears(module: torch.nn.Module, rows: int) -> Iterator[int]:
    """Within: every ``packable`` linear layer of ``module`` runs ``_PackedForward`` (its weight reordered at its
    first call); yields how many. The reordered copies (as large as the weights) are freed on exit."""
    layers = [layer for layer in module.modules() if packable(layer)] if available() else []
    for layer in layers:
        layer.forward = _PackedForward(layer, rows)
    try:
        yield len(layers)
    finally:
        for layer in layers:
            del layer.forward
