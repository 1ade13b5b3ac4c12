"""Sharded checkpoints: a policy's weights and optimizer state written by the data-parallel learners with
``torch.distributed.checkpoint`` (DCP), and read back by any number of learners, or by one process.

A checkpoint is data, never code: DCP's metadata is unpickled with only its own classes allowed and byte items are
read with ``weights_only=True`` (docs/explanation/cluster.md)."""

from __future__ import annotations

import pickle
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlvr.base.errors import CheckpointError

# DCP's note that, with no process group, it reads in one process: the intent here
NO_GROUP = "torch.distributed is disabled, unavailable or uninitialized"


# What DCP's ``.metadata`` pickle may name (torch's dtypes aside); anything else is refused.
_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
        "BytesStorageMetadata", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}


class UnsafeCheckpoint(CheckpointError):
    """A sharded checkpoint's metadata names something that is not checkpoint data."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpoint(f"{module}.{name} is not checkpoint data")


def safe_reader(folder: Path):
    """A DCP reader of ``folder`` whose ``.metadata`` may hold only checkpoint data."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as stream:
                try:
                    metadata = _MetadataUnpickler(stream).load()
                except UnsafeCheckpoint as error:
                    raise UnsafeCheckpoint(f"{path}: refused, {error}") from None
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(folder))


def safe_planner():
    """DCP's load planner with byte items (param-group values) read as weights only."""
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value) -> None:  # DefaultLoadPlanner's, weights only
            fqn = read_item.dest_index.fqn
            try:
                item = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as error:
                found = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
                what = f"{found.group(1)} is not" if found else "not"
                raise UnsafeCheckpoint(f"{fqn}: refused, {what} checkpoint data") from None
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], item)
            else:
                self.state_dict[fqn] = item

    return SafePlanner()


def _load(state: dict[str, Any], folder: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    reader = safe_reader(folder)
    reader.read_metadata()  # refused here, whole, rather than inside DCP's collective
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=NO_GROUP)
            dcp.load(state, storage_reader=reader, planner=safe_planner())
    except CheckpointException as error:  # DCP wraps each rank's failure
        for failure, _trace in error.failures.values():
            if isinstance(failure, UnsafeCheckpoint):
                raise failure from None
        raise


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

    fresh = not optimizer.state  # DCP fills a fresh optimizer's state by a step of zero gradients
    state = _state(module, optimizer, reference)
    if fresh:  # saved and left as it was: no state (a step count of 1 would change the next update)
        state["optimizer"]["state"] = {}
        optimizer.state.clear()
    dcp.save(state, checkpoint_id=str(folder))


def has_reference(folder: Path) -> bool:
    """Whether ``save_sharded`` wrote a reference into ``folder``."""
    saved = safe_reader(folder).read_metadata().state_dict_metadata
    return any(key.startswith("reference.") for key in saved)


def load_sharded(module: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path,
                 new_reference: Callable[[], torch.nn.Module] | None = None) -> torch.nn.Module | None:
    """``save_sharded``'s ``folder`` into ``module`` and ``optimizer``: this rank's parts in a process group, the
    whole state without one. A reference in the folder is read into ``new_reference()`` (shaped and sharded as
    ``module``) and returned; None: the folder has none."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_state_dict

    reference = new_reference() if new_reference is not None and has_reference(folder) else None
    state = _state(module, optimizer, reference)  # the shapes and placements to read into
    # a parameter that never had a gradient has no optimizer state saved, and gets none back
    saved = safe_reader(folder).read_metadata().state_dict_metadata
    state["optimizer"]["state"] = {name: entry for name, entry in state["optimizer"]["state"].items()
                                   if any(key.startswith(f"optimizer.state.{name}.") for key in saved)}
    _load(state, folder)
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=StateDictOptions(strict=False))
    if reference is not None:
        set_model_state_dict(reference, state["reference"])
    return reference


def load_sharded_weights(module: torch.nn.Module, folder: Path) -> None:
    """The weights alone of ``save_sharded``'s ``folder`` into ``module``, whole, with no process group."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    state = {"model": get_model_state_dict(module)}
    _load(state, folder)
    set_model_state_dict(module, state["model"])
