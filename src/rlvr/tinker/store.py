"""Training runs and their checkpoints under the server's state folder, named by ``tinker://`` paths.

    STATE/runs/<run id>/run.json                      the run's base model, adapters, seed, metadata
    STATE/runs/<run id>/weights/<name>/               a training checkpoint (weights and Adam state)
    STATE/runs/<run id>/sampler_weights/<name>/       a sampler checkpoint (weights only)

``tinker://<run id>/weights/<name>`` names the second, ``tinker://<run id>/sampler_weights/<name>`` the third. A run
id and a name are the client's words: they are checked against ``NAME`` before they touch a path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")
KINDS = {"weights": "training", "sampler_weights": "sampler"}  # path segment -> the API's checkpoint_type


class StoreError(ValueError):
    """A ``tinker://`` path or checkpoint name that is malformed, or names nothing here."""


def checked_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name) or ".." in name:
        raise StoreError(f"{what} {name!r} is not a valid name (letters, digits and ._:- only, at most 200)")
    return name


@dataclass(frozen=True)
class CheckpointPath:
    run_id: str
    kind: str  # "weights" or "sampler_weights"
    name: str

    @classmethod
    def parse(cls, path: str) -> CheckpointPath:
        if not isinstance(path, str) or not path.startswith("tinker://"):
            raise StoreError(f"checkpoint path {path!r} is not a tinker:// path")
        parts = path[len("tinker://"):].split("/")
        if len(parts) != 3 or parts[1] not in KINDS:
            raise StoreError(f"checkpoint path {path!r} is not tinker://<run id>/weights/<name> or "
                             "tinker://<run id>/sampler_weights/<name>")
        return cls(checked_name(parts[0], "run id"), parts[1], checked_name(parts[2], "checkpoint name"))

    def __str__(self) -> str:
        return f"tinker://{self.run_id}/{self.kind}/{self.name}"


class Store:
    """The runs and checkpoints under ``root``."""

    def __init__(self, root: Path):
        self.root = Path(root)
        (self.root / "runs").mkdir(parents=True, exist_ok=True)

    def run_folder(self, run_id: str) -> Path:
        return self.root / "runs" / checked_name(run_id, "run id")

    def folder(self, path: CheckpointPath) -> Path:
        return self.run_folder(path.run_id) / path.kind / path.name

    def existing(self, path: CheckpointPath) -> Path:
        """The folder of a checkpoint that was saved; StoreError naming the path when there is none."""
        folder = self.folder(path)
        if not (folder / "model.json").is_file():
            raise StoreError(f"no checkpoint {path} on this server (its state folder is {self.root})")
        return folder

    def write_run(self, run_id: str, record: dict) -> None:
        folder = self.run_folder(run_id)
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".run.json.{os.getpid()}"
        partial.write_text(json.dumps(record))
        os.replace(partial, folder / "run.json")

    def read_run(self, run_id: str) -> dict:
        try:
            record = json.loads((self.run_folder(run_id) / "run.json").read_text())
        except (OSError, ValueError) as err:
            raise StoreError(f"no training run {run_id!r} on this server ({type(err).__name__})") from None
        if not isinstance(record, dict) or not isinstance(record.get("base_model"), str):
            raise StoreError(f"training run {run_id!r}: its run.json is damaged")
        return record

    def run_ids(self) -> list[str]:
        return sorted(p.name for p in (self.root / "runs").iterdir() if (p / "run.json").is_file())

    def checkpoints(self, run_id: str) -> list[dict]:
        """The run's checkpoints as the API lists them (oldest first)."""
        found = []
        for kind, checkpoint_type in KINDS.items():
            kind_folder = self.run_folder(run_id) / kind
            if not kind_folder.is_dir():
                continue
            for folder in kind_folder.iterdir():
                if not (folder / "model.json").is_file() or not NAME.fullmatch(folder.name):
                    continue
                stat = (folder / "model.json").stat()
                size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
                found.append({"checkpoint_id": f"{kind}/{folder.name}", "checkpoint_type": checkpoint_type,
                              "time": _iso(stat.st_mtime), "tinker_path": str(CheckpointPath(run_id, kind,
                                                                                              folder.name)),
                              "size_bytes": size, "public": False})
        return sorted(found, key=lambda c: c["time"])

    def delete(self, path: CheckpointPath) -> None:
        shutil.rmtree(self.existing(path))

    def partial(self, path: CheckpointPath) -> Path:
        """A fresh folder to write ``path``'s checkpoint in, made final by ``publish``."""
        folder = self.folder(path)
        partial = folder.parent / f".{folder.name}.{os.getpid()}.{time.monotonic_ns()}.partial"
        partial.mkdir(parents=True)
        return partial

    def publish(self, partial: Path, path: CheckpointPath, overwrite: bool) -> None:
        folder = self.folder(path)
        if folder.exists():
            if not overwrite:
                shutil.rmtree(partial)
                raise StoreError(f"checkpoint {path} exists (save with another name, or overwrite=True)")
            shutil.rmtree(folder)
        os.replace(partial, folder)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat().replace("+00:00", "Z")
