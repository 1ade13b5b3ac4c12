"""Batched matmuls that keep each run's bits: the way taken, and the refusal."""

import pytest
import torch

import rlvr
from rlvr.base.errors import ConfigError
from rlvr.loop.batched import train_batched
from rlvr.policies import run_matmul
from rlvr.policies.run_matmul import InexactMatmul, aligned_copy, matmul_way, run_mm


def test_a_batched_matmul_that_rounds_differently_is_not_taken(monkeypatch):
    # matmul_way checks each way against single mm calls: with torch.bmm made to round
    # differently (one ulp up), R runs go one mm per run, and still get each run's bits
    gen = torch.Generator().manual_seed(2)
    a, b = aligned_copy(torch.randn(4, 6, 20, generator=gen)), aligned_copy(torch.randn(4, 20, 8, generator=gen))
    want = torch.stack([a[r].clone() @ b[r].clone() for r in range(4)])
    run_matmul._matmul_way.cache_clear()
    assert matmul_way(a, b) == ("bmm", "contiguous")  # this machine's batched GEMM: exact at this shape
    bmm = torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda x, y, out: torch.nextafter(bmm(x, y, out=out), torch.tensor(1e9),
                                                                        out=out))
    run_matmul._matmul_way.cache_clear()
    try:
        assert matmul_way(a, b) == ("loop", "aligned")
        assert torch.equal(run_mm(a, b), want)
    finally:
        run_matmul._matmul_way.cache_clear()


def test_no_exact_matmul_is_refused_before_any_work(monkeypatch):
    # where no way gives each run its bits, train_batched refuses with the shapes, before
    # any record is made; run_mm raises rather than compute other bits
    monkeypatch.setattr(run_matmul, "_matmul_way", lambda *layouts: None)
    with pytest.raises(InexactMatmul, match=r"\[2, 3, 4\] @ \[2, 4, 5\]"):
        run_mm(torch.randn(2, 3, 4), torch.randn(2, 4, 5))
    configs = [rlvr.load_config(None, ["log.progress=false", "algo.epochs=1", f"seed={s}"]) for s in (0, 1)]
    seen = []
    with pytest.raises(ConfigError, match=r"rounds differently from the single one at \[R, m, k\] @ \[R, k, n\]"):
        train_batched(configs, on_record=[seen.append] * 2)
    assert seen == []


@pytest.mark.parametrize("transposed", [False, True])
def test_the_way_found_gives_each_runs_bits_on_every_draw(transposed):
    # the toy's layouts ([2, 3, 30] run blocks padded to 96 floats): a batched GEMM can agree
    # with the single mm on one draw of numbers and not on the next (seen on AMD EPYC, where
    # bmm agreed on the one draw the check made and on 7 of 300 others), so the way is
    # checked on several draws and must hold on each of 100 new ones
    gen = torch.Generator().manual_seed(5)
    a = aligned_copy(torch.randn(2, 3, 30, generator=gen))
    b = aligned_copy(torch.randn(2, 10, 30, generator=gen)).transpose(1, 2) if transposed else \
        aligned_copy(torch.randn(2, 30, 10, generator=gen))
    run_matmul._matmul_way.cache_clear()
    way = matmul_way(a, b)
    for _ in range(100):
        a.copy_(torch.randn(a.shape, generator=gen))
        b.copy_(torch.randn(b.shape, generator=gen))
        want = torch.stack([a[r].clone(memory_format=torch.preserve_format)
                            @ b[r].clone(memory_format=torch.preserve_format) for r in range(2)])
        assert torch.equal(run_mm(a, b, way=way), want), way
