"""A run directory as ``rlvr report`` reads it: records of the shapes rlvr writes and its config, within bounds.
Everything here is data from a file: a record of another shape is left out and counted, never trusted."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.base.errors import ConfigError, RunError
from rlvr.batch.record import Record
from rlvr.config.settings import load_yaml
from rlvr.runs.metrics import read_records

MAX_METRICS_BYTES = 2**30  # a metrics.jsonl the report reads (a long LM run writes tens of MB)
MAX_CONFIG_BYTES = 2**20


@dataclass
class Run:
    """A run directory as the report reads it (``config``: None when config.yaml is missing or unreadable)."""

    label: str
    path: Path
    records: list[Record]
    config: dict | None
    unreadable: int = 0  # records left out: not of the shape rlvr writes


def load_run(path: Path, label: str) -> Run:
    """A run directory's records and config (None when missing, unreadable or over ``MAX_CONFIG_BYTES``)."""
    metrics = path / "metrics.jsonl" if path.is_dir() else path
    if metrics.is_file() and metrics.stat().st_size > MAX_METRICS_BYTES:
        raise RunError(f"{metrics}: {metrics.stat().st_size:,} bytes; the report reads at most {MAX_METRICS_BYTES:,}")
    try:
        records = read_records(path)
    except ValueError as err:  # a line that is not a record (a torn last line is skipped)
        raise RunError(str(err)) from err
    config = None
    config_path = path / "config.yaml"
    if config_path.is_file() and config_path.stat().st_size <= MAX_CONFIG_BYTES:
        try:
            config = load_yaml(config_path.read_text(encoding="utf-8"), str(config_path))
        except (ConfigError, UnicodeDecodeError):
            config = None
    usable = [r for r in map(readable_record, records) if r is not None]
    return Run(label, path, usable, config if isinstance(config, dict) else None, len(records) - len(usable))


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def readable_record(record: Record) -> Record | None:
    """``record`` as the report reads it, or None without a kind and integer step and epoch: train and eval
    records keep their numbers and nulls, samples their rows (mappings), prompts records their numeric shares."""
    kind = record.get("kind")
    if not isinstance(kind, str) or not _integer(record.get("step")) or not _integer(record.get("epoch")):
        return None
    head = {"kind": kind, "epoch": record["epoch"], "step": record["step"]}
    if kind in ("train", "eval"):
        return {**{k: v for k, v in record.items() if numeric(v) or v is None}, **head}
    if kind == "samples":
        rows = record.get("rows")
        return {**head, "rows": [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []}
    if kind == "prompts":
        solved = record.get("solved")
        solved = {k: v for k, v in solved.items() if numeric(v)} if isinstance(solved, dict) else {}
        return {**head, "solved": solved}
    return head
