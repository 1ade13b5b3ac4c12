"""Checkpoints: written atomically, verified by checksum, restored exactly.

``RUN_DIR/checkpoints/step-000000100/`` holds ``trainer.pt`` (plain data and tensors,
loaded with ``weights_only=True``), a ``model/`` folder for language models (or
``sharded/`` DCP files of data-parallel learners) and ``manifest.json`` with every file's
SHA-256. Written under a temporary name and renamed; one that fails its manifest is
skipped for the one before (docs/explanation/runs.md)."""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlvr.base.data import hash_file
from rlvr.base.errors import CheckpointError
from rlvr.batch.rollout import Rollout
from rlvr.policies import frozen_copy, holds_weights

if TYPE_CHECKING:
    from rlvr.loop.state import TrainState

PREFIX = "step-"
PAYLOAD_KEYS = frozenset((
    "policy", "optimizer", "scheduler", "reference", "generator", "rng",
    "epoch", "step", "bad_steps", "inner_step", "rollout", "num_records", "source"))
OPTIONAL_KEYS = frozenset(("source",))  # checkpoints written before it load without it
SHARDED_DIR = "sharded"  # the learners' DCP folder in a checkpoint
SHARDED_KEY = "@sharded"  # the manifest's entry naming it (no file: an rlvr without sharded checkpoints refuses it)


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())


def rng_state() -> dict[str, Any]:
    """The torch, python and numpy global RNG states as tensors and plain data."""
    version, internal, gauss = random.getstate()
    numpy_state = np.random.get_state(legacy=False)  # {"state": {"key": uint32 [624], "pos"}, ...}
    return {
        "torch": torch.get_rng_state(),
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "numpy": {"key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
                  "pos": int(numpy_state["state"]["pos"]),
                  "has_gauss": int(numpy_state["has_gauss"]), "gauss": float(numpy_state["gauss"])},
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    python = state["python"]
    random.setstate((python["version"], tuple(python["internal"]), python["gauss"]))
    numpy = state["numpy"]
    np.random.set_state({"bit_generator": "MT19937",
                         "state": {"key": numpy["key"].numpy().astype(np.uint32), "pos": numpy["pos"]},
                         "has_gauss": numpy["has_gauss"], "gauss": numpy["gauss"]})


def state_payload(st: TrainState, source: dict[str, Any] | None = None, sharded: bool = False) -> dict[str, Any]:
    """``st`` as tensors and plain data that load with ``weights_only=True``; keys PAYLOAD_KEYS. ``source``: the
    rollout source's ``state()``. ``sharded``: the learners write the policy and optimizer (None here)."""
    return {
        "policy": None if sharded else st.policy.module.state_dict(),
        "optimizer": None if sharded else st.optimizer.state_dict(),
        "scheduler": st.scheduler.state_dict(),
        "reference": None if st.ref_module is None else st.ref_module.state_dict(),
        "generator": st.generator.get_state(),
        "rng": rng_state(),
        "epoch": st.epoch,
        "step": st.step,
        "bad_steps": st.bad_steps,
        "inner_step": st.inner_step,
        "rollout": None if st.rollout is None else st.rollout.to_dict(),
        "num_records": len(st.records),
        "source": source,
    }


def restore_state(st: TrainState, payload: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """Continue ``st`` from ``payload`` and the run's ``records`` so far. A sharded checkpoint's weights (None in
    ``payload``) are loaded from its folder apart."""
    if not holds_weights(st.policy.module):  # the data-parallel learners take them (``st.handover``)
        if payload["policy"] is not None:
            st.handover = {"model": payload["policy"], "optimizer": payload["optimizer"],
                           "reference": payload["reference"]}
    else:
        if payload["policy"] is not None:
            st.policy.module.load_state_dict(payload["policy"])
            st.optimizer.load_state_dict(payload["optimizer"])
        if payload["reference"] is not None:
            st.ref_module = frozen_copy(st.policy.module)
            st.ref_module.load_state_dict(payload["reference"])
    st.scheduler.load_state_dict(payload["scheduler"])
    st.generator.set_state(payload["generator"])
    set_rng_state(payload["rng"])
    st.epoch, st.step, st.bad_steps = payload["epoch"], payload["step"], payload["bad_steps"]
    st.inner_step = payload["inner_step"]
    st.rollout = None if payload["rollout"] is None else Rollout.from_dict(payload["rollout"])
    st.records = list(records[: payload["num_records"]])


def save_pretrained(policy: Any, path: Path) -> bool:
    """Write a Hugging Face policy (model and tokenizer) for ``from_pretrained``; False for other policies."""
    module = getattr(policy, "module", None)
    if not hasattr(module, "save_pretrained"):
        return False
    module.save_pretrained(str(path))
    tokenizer = getattr(policy, "tokenizer", None)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))
    base = getattr(policy, "base_identity", None)
    if base is not None:  # adapters alone: which model they apply to (rlvr export merges them into it)
        from rlvr.policies.hf_model import BASE_MODEL_FILE

        (path / BASE_MODEL_FILE).write_text(json.dumps(base, indent=1))
    return True


def save_checkpoint(run_dir: Path, name: str, payload: dict[str, Any], policy: Any = None, keep: int = 2,
                    write_sharded: Callable[[Path], None] | None = None) -> Path:
    """Write ``payload`` and the policy's pretrained folder atomically, keep the newest ``keep`` checkpoints, and
    return the new one. ``write_sharded`` writes the weights and optimizer state into the folder it is given."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    tmp = root / f".tmp-{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        torch.save(payload, tmp / "trainer.pt")
        if policy is not None:
            save_pretrained(policy, tmp / "model")
        if write_sharded is not None:
            write_sharded(tmp / SHARDED_DIR)
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        manifest = {str(p.relative_to(tmp)): hash_file(p).hexdigest() for p in files}
        if write_sharded is not None:
            manifest[SHARDED_KEY] = SHARDED_DIR
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
        _fsync_tree(tmp)
    except BaseException:  # a full disk, or a second Ctrl-C: no half-written folder stays
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)  # atomic: readers see the old set or the new, never half
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Finished checkpoints, oldest first (temporary folders are ignored)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def verify(checkpoint: Path) -> str | None:
    """None if every file matches the manifest, else what is wrong."""
    manifest_path = checkpoint / "manifest.json"
    if not manifest_path.is_file():
        return "no manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError:
        return "manifest.json is not valid JSON"
    if not isinstance(manifest, dict):
        return "manifest.json is not an object of files"
    link = next((p for p in sorted(checkpoint.rglob("*")) if p.is_symlink()), None)
    if link is not None:  # a checkpoint is the files rlvr wrote; a link would reach outside it
        return f"{link.relative_to(checkpoint)} is a symbolic link"
    for rel, digest in manifest.items():
        if rel == SHARDED_KEY:
            if not isinstance(digest, str) or not _inside(checkpoint, digest) or not (checkpoint / digest).is_dir():
                return f"its sharded folder {digest} is missing"
            continue
        path = checkpoint / rel
        if not _inside(checkpoint, rel):
            return f"{rel} lies outside the checkpoint"
        if not path.is_file():
            return f"{rel} is missing"
        if hash_file(path).hexdigest() != digest:
            return f"{rel} does not match its checksum"
    return None


def _inside(checkpoint: Path, rel: str) -> bool:
    return (checkpoint / rel).resolve().is_relative_to(checkpoint.resolve()) and not Path(rel).is_absolute()


def manifest_files(checkpoint: Path, folder: str) -> list[str]:
    """The files of a verified checkpoint's manifest under ``folder``, relative to it."""
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    return sorted(str(Path(rel).relative_to(folder)) for rel in manifest
                  if rel != SHARDED_KEY and Path(rel).is_relative_to(folder))


def sharded_folder(checkpoint: Path) -> Path | None:
    """A verified checkpoint's sharded weights and optimizer folder; None where ``trainer.pt`` holds them."""
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    return checkpoint / manifest[SHARDED_KEY] if SHARDED_KEY in manifest else None


def load_payload(path: Path, keys: frozenset[str] | None = None) -> dict[str, Any]:
    """``trainer.pt`` loaded as tensors and plain data only; with ``keys``, exactly those
    keys (those of OPTIONAL_KEYS may be missing). Raises CheckpointError saying what is wrong."""
    try:
        payload = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as err:
        named = re.search(r"GLOBAL (\S+)", str(err))
        raise CheckpointError(
            f"{path.name} holds objects other than tensors and plain data"
            f"{f' (it names {named.group(1)})' if named else ''}; refused, as loading it could run code"
        ) from err
    except Exception as err:  # a damaged archive can raise many types
        raise CheckpointError(f"{path.name} does not load ({type(err).__name__}: {err})") from err
    if keys is not None:
        found = set(payload) if isinstance(payload, dict) else set()
        if not keys - OPTIONAL_KEYS <= found <= keys:
            missing, extra = sorted(keys - OPTIONAL_KEYS - found), sorted(found - keys)
            raise CheckpointError(f"{path.name} is not an rlvr trainer checkpoint "
                                  f"(missing keys: {missing or 'none'}; unexpected keys: {extra or 'none'})")
    return payload


def load_latest(run_dir: Path, keys: frozenset[str] | None = None) -> tuple[Path, dict[str, Any]]:
    """The newest checkpoint that verifies and loads (with ``keys``: exactly those keys);
    older ones are tried in turn, each skipped one with a warning."""
    candidates = list_checkpoints(run_dir)
    root = Path(run_dir) / "checkpoints"
    if not candidates:
        raise CheckpointError(f"no checkpoint in {root}")
    problems = []
    for checkpoint in reversed(candidates):
        problem = verify(checkpoint)
        if problem is None:
            try:
                return checkpoint, load_payload(checkpoint / "trainer.pt", keys)
            except CheckpointError as err:
                problem = str(err)
        warnings.warn(f"skipping checkpoint {checkpoint}: {problem}", stacklevel=2)
        problems.append(f"{checkpoint.name}: {problem}")
    raise CheckpointError(f"no usable checkpoint in {root}: {'; '.join(problems)}")
