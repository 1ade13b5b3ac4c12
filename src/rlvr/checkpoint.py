"""Checkpoints: written atomically, verified by checksum, restored exactly.

A checkpoint is a directory ``RUN_DIR/checkpoints/step-000000100/`` (named by the
optimizer steps taken; it may fall inside an epoch, with that epoch's batch) holding
``trainer.pt`` (policy, optimizer, reference, RNG and loop state), for language
models a ``model/`` folder that ``from_pretrained`` loads directly, and
``manifest.json`` with the SHA-256 of every file. It is written under a temporary
name, flushed to disk and renamed, so a kill at any moment leaves the previous
checkpoint whole; a checkpoint whose files do not match their manifest is skipped
with a warning and the one before it is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

PREFIX = "step-"


class CheckpointError(RuntimeError):
    """No usable checkpoint."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def save_pretrained(policy: Any, path: Path) -> bool:
    """Write a Hugging Face policy as a folder ``from_pretrained`` loads (model and
    tokenizer); False for policies that are not Hugging Face models."""
    module = getattr(policy, "module", None)
    if not hasattr(module, "save_pretrained"):
        return False
    module.save_pretrained(str(path))
    tokenizer = getattr(policy, "tokenizer", None)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))
    return True


def save_checkpoint(run_dir: Path, name: str, payload: dict[str, Any], policy: Any = None, keep: int = 2) -> Path:
    """Write ``payload`` (torch-serialisable) and the policy's pretrained folder atomically.

    Keeps the newest ``keep`` checkpoints. Returns the checkpoint directory.
    """
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    tmp = root / f".tmp-{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(payload, tmp / "trainer.pt")
    if policy is not None:
        save_pretrained(policy, tmp / "model")
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    manifest = {str(p.relative_to(tmp)): _sha256(p) for p in files}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    _fsync_tree(tmp)
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
    for rel, digest in manifest.items():
        path = checkpoint / rel
        if not path.is_file():
            return f"{rel} is missing"
        if _sha256(path) != digest:
            return f"{rel} does not match its checksum"
    return None


def load_latest(run_dir: Path) -> tuple[Path, dict[str, Any]]:
    """The newest checkpoint that verifies and loads; older ones are tried in turn."""
    candidates = list_checkpoints(run_dir)
    if not candidates:
        raise CheckpointError(f"no checkpoint in {Path(run_dir) / 'checkpoints'}")
    for checkpoint in reversed(candidates):
        problem = verify(checkpoint)
        if problem is None:
            try:
                return checkpoint, torch.load(checkpoint / "trainer.pt", weights_only=False)
            except Exception as err:  # a corrupt pickle can raise many types
                problem = f"trainer.pt does not load ({type(err).__name__}: {err})"
        warnings.warn(f"skipping checkpoint {checkpoint}: {problem}", stacklevel=2)
    raise CheckpointError(f"no usable checkpoint in {Path(run_dir) / 'checkpoints'} (all failed verification)")
