"""Batched matmuls of R runs that give each run the bits of its own single ``mm``.

``rlvr.loop.batched`` trains R runs of the positional toy with a leading run axis and records
equal to the runs alone. A CPU GEMM's rounding can depend on the operands' layout (where
each run's block starts) and PyTorch's ``bmm`` takes other code for small matrices, so
each batched matmul takes the fastest way (``matmul_way``) found, once per layout, to give
the bits of the single calls; operands are laid out by ``aligned_empty`` (each run's block
64-byte aligned, as a new tensor of one run is).
"""

from __future__ import annotations

import math
from functools import cache

import torch

ALIGN = 16  # floats per 64 bytes: each run's block of an ``aligned_empty`` tensor starts on this boundary


def aligned_empty(runs: int, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised ``[runs, *shape]`` tensor whose run blocks each start on a 64-byte
    boundary (the CPU allocator aligns the storage to 64 bytes; each run's block is padded
    to a multiple of 16 floats). Each ``t[r]`` is contiguous."""
    size = math.prod(shape)
    stride = -(-size // ALIGN) * ALIGN
    return torch.empty(runs, stride, dtype=dtype)[:, :size].view(runs, *shape)


def aligned_copy(x: torch.Tensor) -> torch.Tensor:
    """``x`` [R, ...] copied into an ``aligned_empty`` tensor."""
    return aligned_empty(*x.shape, dtype=x.dtype).copy_(x)


def laid_out(x: torch.Tensor, runs: tuple[int, ...], *shape: int) -> torch.Tensor:
    """``x`` [*runs, ...] as [*runs, *shape] for a matmul: one run (``runs`` empty) reshapes;
    R runs copy into ``aligned_empty``."""
    if not runs:
        return x.reshape(shape)
    out = aligned_empty(*runs, *shape, dtype=x.dtype)
    out.view(x.shape).copy_(x)
    return out


Layout = tuple  # (shape, strides, storage offset mod ALIGN, dtype): what decides a matmul's way on a CPU


def layout(x: torch.Tensor) -> Layout:
    """x's layout as a matmul's way depends on it (values aside)."""
    return tuple(x.shape), x.stride(), x.storage_offset() % ALIGN, x.dtype


class InexactMatmul(RuntimeError):
    """No way of a batched matmul gives each run the bits of its single ``mm`` on this machine."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
        super().__init__(f"[R, m, k] @ [R, k, n] = {list(a.shape)} @ {list(b.shape)}, strides "
                         f"{a.stride()} @ {b.stride()}")


# The ways R runs' matmul can take, fastest first: (call, output). "bmm" is one batched
# call: into a contiguous output CPU torch hands all runs to one batched GEMM (~3 us for 15
# tiny matrices); into any other it calls the GEMM run by run (~20 us). "loop" is one ``mm``
# per run. "copy" copies each run's operands into new tensors first and its product into the
# output, as a single run computes it on its own tensors: the slowest, and the one that holds
# where a GEMM's rounding depends on its operands' addresses (seen on AMD EPYC, where no other
# way did). output: "contiguous" or "aligned" (``aligned_empty``) for a new one, "given" for
# the caller's. Small matrices take a plain loop in ``bmm`` that rounds differently, and a
# GEMM's rounding may depend on where each run's block starts, hence the check.
NEW_OUTPUT_WAYS = (("bmm", "contiguous"), ("bmm", "aligned"), ("loop", "aligned"), ("copy", "aligned"))
GIVEN_OUTPUT_WAYS = (("bmm", "given"), ("loop", "given"), ("copy", "given"))


def matmul_way(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> tuple[str, str] | None:
    """How a [R, m, k] @ b [R, k, n] (into ``out``, or a new output) gives the bits of R
    single ``mm`` calls on freshly allocated operands, as one run computes them on this
    machine (and torch's thread count): the first of the ways above that does, checked on
    ``TRIALS`` draws of random numbers laid out as a, b and out; None if none does."""
    return _matmul_way(layout(a), layout(b), None if out is None else layout(out), torch.get_num_threads())


TRIALS = 4  # random operands each way is checked on: one draw can hide a way's other rounding


@cache
def _matmul_way(a: Layout, b: Layout, out: Layout | None, threads: int) -> tuple[str, str] | None:
    gen = torch.Generator().manual_seed(sum(a[0]) * 1000 + sum(b[0]))
    trials = []
    for _ in range(TRIALS):
        x, y = _random_laid_out(a, gen), _random_laid_out(b, gen)
        trials.append((x, y, torch.stack([_own(x[r]) @ _own(y[r]) for r in range(a[0][0])])))
    for way in NEW_OUTPUT_WAYS if out is None else GIVEN_OUTPUT_WAYS:
        if all(torch.equal(run_mm(x, y, None if out is None else _random_laid_out(out, gen), way), single)
               for x, y, single in trials):
            return way
    return None


def _random_laid_out(lay: Layout, gen: torch.Generator) -> torch.Tensor:
    """Random numbers in a new tensor laid out as ``lay`` (the storage starts 64-byte aligned,
    as the CPU allocator's does)."""
    shape, stride, offset, dtype = lay
    size = offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride))
    x = torch.empty(size, dtype=dtype).as_strided(shape, stride, offset)
    return x.copy_(torch.randn(shape, generator=gen, dtype=dtype))


def new_output(output: str, runs: tuple[int, ...], shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A new [*runs, *shape] matmul output laid out as a way's ``output`` says: "contiguous", or
    "aligned" (``aligned_empty``; one run's is a run block too)."""
    if output == "contiguous":
        return torch.empty(*runs, *shape, dtype=dtype)
    out = aligned_empty(*(runs or (1,)), *shape, dtype=dtype)
    return out if runs else out[0]


def run_mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, way: tuple[str, str] | None = None
           ) -> torch.Tensor:
    """a [*R, m, k] @ b [*R, k, n] -> [*R, m, n]: one run's ``mm``, or R runs' each as a
    single run computes it (``matmul_way``, found here when not given; InexactMatmul if
    there is none). ``out``: where to write (default: a new tensor, laid out as the way says)."""
    if a.dim() == 2:
        return torch.mm(a, b, out=out)
    if way is None:
        way = matmul_way(a, b, out)
        if way is None:
            raise InexactMatmul(a, b)
    call, output = way
    if out is None:
        out = new_output(output, a.shape[:1], (a.shape[1], b.shape[2]), a.dtype)
    if call == "bmm":
        return torch.bmm(a, b, out=out)
    for r in range(a.shape[0]):
        if call == "loop":
            torch.mm(a[r], b[r], out=out[r])
        else:
            out[r].copy_(_own(a[r]) @ _own(b[r]))
    return out


def _own(x: torch.Tensor) -> torch.Tensor:
    """x in a new tensor with x's strides, as a single run holds its operand."""
    return x.clone(memory_format=torch.preserve_format)
