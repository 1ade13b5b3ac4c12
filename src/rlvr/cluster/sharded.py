"""Sharded checkpoints: a policy's weights and optimizer state written by the data-parallel
learners themselves with ``torch.distributed.checkpoint`` (DCP), and read back by any number
of learners, or by one process.

The state is ``get_state_dict(module, optimizer)``'s: the weights and the optimizer state
keyed by parameter name (the sharded DTensors under FSDP, whole tensors on replicas). Every
learner of the group calls ``save_sharded`` (a collective): under FSDP each writes its
shards; replicas write the same tensors, and DCP writes each once. ``load_sharded`` in a
group of any size reads the parts each learner holds (the checkpoint resharded to the
group); with no process group it reads the whole state into this process.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

# DCP's note that, with no process group, it reads in one process: the intent here
NO_GROUP = "torch.distributed is disabled, unavailable or uninitialized"


def _state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optim = get_state_dict(module, optimizer)  # optimizer state keyed by parameter name, not position
    return {"model": model, "optimizer": optim}


def save_sharded(module: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Write the weights and optimizer state into ``folder`` (every rank calls it)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_state(module, optimizer), checkpoint_id=str(folder))


def load_sharded(module: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """``save_sharded``'s ``folder`` into ``module`` and ``optimizer``: this rank's parts in a
    process group (every rank calls it), the whole state without one."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _state(module, optimizer)  # the shapes and placements to read into
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=NO_GROUP)
        dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def load_sharded_weights(module: torch.nn.Module, folder: Path) -> None:
    """The weights alone of ``save_sharded``'s ``folder`` into ``module``, whole, in this
    process (no process group): what ``rlvr export`` writes."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    state = {"model": get_model_state_dict(module)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=NO_GROUP)
        dcp.load(state, checkpoint_id=str(folder))
    set_model_state_dict(module, state["model"])
