"""Sharded checkpoints: a policy's weights and optimizer state written by the data-parallel
learners themselves with ``torch.distributed.checkpoint`` (DCP), and read back by any number
of learners, or by one process.

The state is ``get_state_dict(module, optimizer)``'s: the weights and the optimizer state
keyed by parameter name (the sharded DTensors under FSDP, whole tensors on replicas), and the
KL reference's weights (``reference``) when there is one. Every
learner of the group calls ``save_sharded`` (a collective): under FSDP each writes its
shards; replicas write the same tensors, and DCP writes each once. ``load_sharded`` in a
group of any size reads the parts each learner holds (the checkpoint resharded to the
group); with no process group it reads the whole state into this process.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# DCP's note that, with no process group, it reads in one process: the intent here
NO_GROUP = "torch.distributed is disabled, unavailable or uninitialized"


def _state(module: torch.nn.Module, optimizer: torch.optim.Optimizer, reference: torch.nn.Module | None = None
           ) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    model, optim = get_state_dict(module, optimizer)  # optimizer state keyed by parameter name, not position
    state = {"model": model, "optimizer": optim}
    if reference is not None:
        state["reference"] = get_model_state_dict(reference)
    return state


def save_sharded(module: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path,
                 reference: torch.nn.Module | None = None) -> None:
    """Write the weights, optimizer state and ``reference`` (if any) into ``folder`` (every rank calls it)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_state(module, optimizer, reference), checkpoint_id=str(folder))


def has_reference(folder: Path) -> bool:
    """Whether ``save_sharded`` wrote a reference into ``folder``."""
    from torch.distributed.checkpoint import FileSystemReader

    saved = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    return any(key.startswith("reference.") for key in saved)


def load_sharded(module: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path,
                 new_reference: Callable[[], torch.nn.Module] | None = None) -> torch.nn.Module | None:
    """``save_sharded``'s ``folder`` into ``module`` and ``optimizer``: this rank's parts in a
    process group (every rank calls it), the whole state without one. A reference in the
    folder is read into ``new_reference()`` (a module shaped, and sharded, as ``module``),
    which is returned; None: the folder has none."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    reference = new_reference() if new_reference is not None and has_reference(folder) else None
    state = _state(module, optimizer, reference)  # the shapes and placements to read into
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=NO_GROUP)
        dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    if reference is not None:
        set_model_state_dict(reference, state["reference"])
    return reference


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
