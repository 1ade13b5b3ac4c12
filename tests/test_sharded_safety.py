"""Sharded checkpoints read without a process group: data only, and state kept as it was."""

from __future__ import annotations

import pickle

import pytest
import torch

from rlvr.cluster.sharded import has_reference, load_sharded, load_sharded_weights, save_sharded
from rlvr.runs.checkpoint import CheckpointError

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Opens:
    """An object whose unpickling creates ``marker``: code run by a load."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))


def _trained():
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_a_saved_state_loads_back_whole_in_one_process(tmp_path):
    model, optimizer = _trained()
    save_sharded(model, optimizer, tmp_path / "sharded")
    fresh = _model()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.5)
    load_sharded(fresh, fresh_optimizer, tmp_path / "sharded")
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)
    assert fresh_optimizer.param_groups[0]["lr"] == 0.01
    steps = [state["step"].item() for state in fresh_optimizer.state.values()]
    assert steps == [1.0] * 4


def test_metadata_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    model, optimizer = _trained()
    folder = tmp_path / "sharded"
    save_sharded(model, optimizer, folder)
    marker = tmp_path / "ran"
    (folder / ".metadata").write_bytes(pickle.dumps(Opens(marker)))
    for read in (lambda: has_reference(folder), lambda: load_sharded(model, optimizer, folder),
                 lambda: load_sharded_weights(_model(), folder)):
        with pytest.raises(CheckpointError, match=r"\.metadata: refused, io\.open is not checkpoint data"):
            read()
    assert not marker.exists()


def test_a_byte_item_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optimizer = _trained()
    folder = tmp_path / "sharded"
    weights, optim = get_state_dict(model, optimizer)
    marker = tmp_path / "ran"
    optim["param_groups"][0]["lr"] = Opens(marker)
    dcp.save({"model": weights, "optimizer": optim}, checkpoint_id=str(folder))
    assert not marker.exists()
    fresh = _model()
    with pytest.raises(CheckpointError, match=r"param_groups\.0\.lr: refused, io\.open is not checkpoint data"):
        load_sharded(fresh, torch.optim.AdamW(fresh.parameters()), folder)
    assert not marker.exists()


def test_saving_before_any_step_leaves_the_optimizer_as_it_was_and_loads_fresh(tmp_path):
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.1)
    save_sharded(model, optimizer, tmp_path / "sharded")
    assert not optimizer.state  # no step count, no moments from the weight decay
    fresh = _model()
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.5, weight_decay=0.1)
    load_sharded(fresh, fresh_optimizer, tmp_path / "sharded")
    assert not fresh_optimizer.state and fresh_optimizer.param_groups[0]["lr"] == 0.01


def test_a_parameter_that_never_had_a_gradient_saves_and_loads_without_state(tmp_path):
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model[0](torch.ones(2, 3)).sum().backward()  # the second layer takes no part
    optimizer.step()
    save_sharded(model, optimizer, tmp_path / "sharded")
    fresh = _model()
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.5)
    load_sharded(fresh, fresh_optimizer, tmp_path / "sharded")
    saved = {id(p): name for name, p in fresh.named_parameters()}
    assert sorted(saved[id(p)] for p in fresh_optimizer.state) == ["0.bias", "0.weight"]
    for a, b in zip(optimizer.state.values(), fresh_optimizer.state.values(), strict=True):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and a["step"] == b["step"]
