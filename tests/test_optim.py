"""``rlvr.loop.optim.optimizer_update``: fused Adam's kernel called directly takes the same steps
as ``optimizer.step()``, bit for bit, and leaves to ``step()`` what it does not cover."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from rlvr.config import OptimConfig
from rlvr.loop.optim import _direct_adam, build_optimizer, build_scheduler, optimizer_update


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    # sizes with and without a tail past a multiple of 16, and a parameter that gets no gradient
    return [torch.nn.Parameter(torch.randn(*shape, generator=g)) for shape in ((3, 10, 10), (5, 10), (7,), (4,))]


def _run(update, name: str, weight_decay: float, steps: int = 6, edit=None) -> tuple[list[torch.Tensor], dict]:
    params = _params(0)
    optim = OptimConfig(name=name, lr=0.05, weight_decay=weight_decay, warmup_steps=3, schedule="cosine")
    optimizer = build_optimizer(optim, params)
    scheduler = build_scheduler(optim, optimizer, steps)
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        for p in params[:-1]:  # the last never gets a gradient: skipped, no state
            p.grad = torch.randn(p.shape, generator=g)
        if step == 3:  # a parameter without a gradient for one step keeps its state and count
            params[1].grad = None
        if step == 4:  # state loaded from a copy: the entries are looked up again
            optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
        if step == 2 and edit is not None:
            edit(optimizer, params)
        update(optimizer)
        scheduler.step()
    return [p.detach().clone() for p in params], optimizer.state_dict()


def assert_same_as_step(name: str, weight_decay: float, edit=None) -> None:
    """The parameters and the optimizer state of ``_run`` equal, direct update against step()."""
    direct, direct_state = _run(optimizer_update, name, weight_decay, edit=edit)
    stepped, step_state = _run(lambda o: o.step(), name, weight_decay, edit=edit)
    for a, b in zip(direct, stepped):
        assert torch.equal(a, b)
    assert direct_state["state"].keys() == step_state["state"].keys() == {0, 1, 2}
    for key, s in step_state["state"].items():
        for field, value in s.items():
            assert torch.equal(direct_state["state"][key][field], value), (key, field)


@pytest.mark.parametrize("name,weight_decay", [("adam", 0.0), ("adam", 0.1), ("adamw", 0.1)])
def test_direct_update_equals_step(name, weight_decay):
    assert_same_as_step(name, weight_decay)


def test_direct_update_takes_the_kernel_once_state_exists():
    params = _params(0)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer = build_optimizer(OptimConfig(lr=0.1), params)
    assert _direct_adam(optimizer) is None  # no state yet: step() makes it
    optimizer_update(optimizer)
    assert _direct_adam(optimizer) is not None
    before = params[0].detach().clone()
    optimizer_update(optimizer)
    assert not torch.equal(params[0], before)
    assert optimizer.state[params[0]]["step"].item() == 2
    params[1].grad = None
    optimizer_update(optimizer)
    assert [optimizer.state[p]["step"].item() for p in params] == [3, 2, 3, 3]


def test_hooks_and_other_optimizers_go_through_step():
    params = _params(0)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer = build_optimizer(OptimConfig(lr=0.1), params)
    optimizer.step()
    calls = []
    handle = optimizer.register_step_pre_hook(lambda *args: calls.append(1))
    optimizer_update(optimizer)
    assert calls == [1]  # the hook ran: step() took it
    handle.remove()
    optimizer_update(optimizer)
    assert calls == [1]
    sgd = torch.optim.SGD(params, lr=0.1)
    assert _direct_adam(sgd) is None
    unfused = torch.optim.Adam(params, lr=0.1, foreach=True)
    unfused.step()
    assert _direct_adam(unfused) is None


@pytest.mark.parametrize("edit", [
    lambda optimizer, params: optimizer.state.clear(),  # a reset: step() makes the state again
    lambda optimizer, params: optimizer.state.pop(params[0]),
    lambda optimizer, params: optimizer.state.__setitem__(params[0], copy.deepcopy(optimizer.state[params[0]])),
    lambda optimizer, params: optimizer.state[params[1]].__setitem__("step", torch.tensor(0.0)),
])
def test_state_changed_in_place_is_seen(edit):
    # the direct update looks every entry up each step: state cleared, replaced or edited
    # between steps gives step()'s numbers, and step()'s state
    assert_same_as_step("adamw", 0.1, edit=edit)


def test_a_new_scheduler_sees_step_run_first():
    # a scheduler made over an optimizer with state (a resumed run) checks at its first step
    # that step() has run: the first update goes through step(), and no warning is given
    params = _params(0)
    for p in params:
        p.grad = torch.ones_like(p)
    optim = OptimConfig(lr=0.1)
    optimizer = build_optimizer(optim, params)
    optimizer.step()
    scheduler = build_scheduler(optim, optimizer, 10)
    assert _direct_adam(optimizer) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optimizer_update(optimizer)
        scheduler.step()
    assert _direct_adam(optimizer) is not None
