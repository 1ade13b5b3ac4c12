"""Resuming a run: what a resume may change, the data it must find unchanged, and the records a checkpoint follows."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlvr.base.data import hash_file
from rlvr.base.errors import ConfigError, RunError
from rlvr.batch.record import Record, json_safe
from rlvr.config import Config, LogConfig, load_config
from rlvr.runs.directory import DATA_FILES, write_atomically
from rlvr.runs.metrics import read_records

# What a resume may change: how long the run goes on, what it reports and how fast it goes, not what it computes
# (a call on the edge of its time limit aside; threads may change the last bits of CPU sums).
RESUMABLE = ("algo.epochs", "name", "threads", "rewards.timeout", "rewards.num_workers",
             # where the work runs, not what it computes (cluster.max_staleness does change it)
             "cluster.rollout_workers", "cluster.learners", "cluster.address", "cluster.weight_sync",
             "cluster.learner_strategy", "cluster.call_timeout",
             *(f"log.{f.name}" for f in dataclasses.fields(LogConfig)))


def _flat(config: Any, prefix: str = "") -> dict[str, Any]:
    """``{"algo.epochs": 100, "policy.options.embedding_dim": 10, ...}``: every field of every section."""
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            out.update(_flat(value, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = value
    return out


def resume_changes(stored: Config, config: Config, restart: bool = False) -> dict[str, dict[str, Any]]:
    """What ``config`` changes from ``stored``, ``{key: {"was", "now"}}`` (``out_dir`` aside); ConfigError naming
    every change a resume cannot honour. ``restart`` (no checkpoint: the run starts again) allows every change."""
    was, now = _flat(stored), _flat(config)
    changes = {key: {"was": was[key], "now": now[key]} for key in now if key != "out_dir" and now[key] != was[key]}
    if restart:
        return changes
    refused = [f"{key} (was {c['was']!r}, now {c['now']!r})" for key, c in changes.items() if key not in RESUMABLE]
    if refused:
        raise ConfigError(f"resume cannot change {', '.join(refused)}; allowed on resume: {', '.join(RESUMABLE)}")
    if "algo.epochs" in changes and stored.optim.schedule != "constant":
        c = changes["algo.epochs"]
        raise ConfigError(f"resume cannot change algo.epochs (was {c['was']}, now {c['now']}) with "
                          f"optim.schedule={stored.optim.schedule!r}: the learning rate decays over the epochs")
    return changes


def records_at_checkpoint(path: Path, count: int, checkpoint: Path) -> list[Record]:
    """The run's first ``count`` records (those ``checkpoint`` follows), the file cut to them."""
    try:
        records = read_records(path) if path.is_file() else []
    except ValueError as err:
        raise RunError(str(err)) from err
    if len(records) < count:
        raise RunError(f"{path} holds {len(records)} records but checkpoint {checkpoint.name} follows {count}: "
                       "the file was cut short or replaced, and resuming would lose records")
    records = records[:count]
    write_atomically(path, "".join(json.dumps(json_safe(record), allow_nan=False) + "\n" for record in records))
    return records


def resume_config(run_dir: str | Path, overrides: list[str]) -> Config:
    """The config a run was started with (its ``config.yaml``), plus overrides."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"resume={run_dir}: no config.yaml there (not a run directory)")
    return load_config(run_dir / "config.yaml", overrides + [f"out_dir={run_dir}"])


# ---------------------------------------------------------------- the data a run read

ACCEPT_DATA_CHANGE = "resume_accept_data_change"  # the key (beside resume=) that accepts changed data files


def data_fingerprints(paths: Iterable[str | Path]) -> dict[str, str]:
    """SHA-256 (hex) of every data file a task read, by path as given (a folder's: of each file in it)."""
    out = {}
    for path in map(Path, paths):
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            out[str(file)] = hash_file(file).hexdigest()
    return out


def record_data_files(run_dir: Path, paths: Iterable[str | Path]) -> None:
    """Write the data files a run reads and their fingerprints to ``DATA_FILES`` (none: no file)."""
    paths = [str(p) for p in paths]
    if not paths:
        (run_dir / DATA_FILES).unlink(missing_ok=True)
        return
    record = {"paths": paths, "sha256": data_fingerprints(paths)}
    write_atomically(run_dir / DATA_FILES, json.dumps(record, indent=1) + "\n")


def data_file_changes(run_dir: Path, accept: bool = False) -> dict[str, dict[str, str | None]]:
    """How the run's data files differ from their recorded fingerprints, ``{file: {"was", "now"}}`` (None: no such
    file); ConfigError naming them unless ``accept``: a changed file moves the held-out split and the row order."""
    recorded = run_dir / DATA_FILES
    if not recorded.is_file():
        return {}
    try:
        record = json.loads(recorded.read_text(encoding="utf-8"))
        paths, was = list(record["paths"]), dict(record["sha256"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise RunError(f"{recorded}: unreadable ({err}); it records the fingerprints of the run's data") from err
    now = data_fingerprints(p for p in paths if Path(p).exists())
    changes = {file: {"was": was.get(file), "now": now.get(file)}
               for file in sorted(set(was) | set(now)) if was.get(file) != now.get(file)}
    if changes and not accept:
        named = "; ".join(f"{file} {_how(c)}" for file, c in changes.items())
        raise ConfigError(f"resume: the run's data changed since it started: {named}; the held-out split and the "
                          "order of the rows follow the data, so the run cannot go on as it was: restore the data, "
                          f"or accept the change with {ACCEPT_DATA_CHANGE}=true")
    return changes


def take_accept_data_change(overrides: list[str], resuming: bool) -> tuple[list[str], bool]:
    """(the other ``overrides``, the value of ``resume_accept_data_change``; False when absent). No config key:
    it accepts one resume's changed data, and the next resume checks again."""
    key = f"{ACCEPT_DATA_CHANGE}="
    given = [o[len(key):] for o in overrides if o.startswith(key)]
    rest = [o for o in overrides if not o.startswith(key)]
    if not given:
        return rest, False
    if not resuming:
        raise ConfigError(f"{ACCEPT_DATA_CHANGE} goes with resume=RUN_DIR: a new run has no data to compare")
    value = given[-1].strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"{ACCEPT_DATA_CHANGE}={given[-1]!r} is not allowed; give true or false")
    return rest, value == "true"


def _how(change: dict[str, str | None]) -> str:
    if change["now"] is None:
        return "is gone"
    if change["was"] is None:
        return "is new"
    return f"changed (sha256 {change['was'][:12]}... now {change['now'][:12]}...)"
