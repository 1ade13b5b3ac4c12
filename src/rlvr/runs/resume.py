"""Resuming a run: what a resume may change, the data it must find unchanged, and the
records a checkpoint follows."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlvr.base.data import hash_file
from rlvr.base.errors import ConfigError, RunError
from rlvr.base.record import Record, json_safe
from rlvr.config import Config, LogConfig, load_config
from rlvr.runs.directory import DATA_FILES, write_atomically
from rlvr.runs.metrics import read_records

# What a resume may change: how long the run goes on and what it reports, not what it
# computes. ``log.*`` only observes the run; reward limits, workers and threads change
# how fast it goes (a call on the edge of its time limit aside, and threads may change
# the last bits of CPU sums).
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
    """What ``config`` changes from the run's ``stored`` config, ``{key: {"was", "now"}}``
    (``out_dir`` aside: the directory may have moved); ConfigError naming every change
    a resume cannot honour. ``restart``: the run has no checkpoint and starts again from
    the beginning, so nothing computed can disagree with a change: every one is allowed
    (a run that failed in its first epoch resumes with the fix, e.g. rewards.strict=false)."""
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
    """The run's first ``count`` records (those ``checkpoint`` follows), the file cut to
    them: records past the checkpoint and a torn last line (a kill mid-write) go."""
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
    """SHA-256 (hex) of every data file a task read, by path as given: a file's own, a
    folder's (``save_to_disk``) of each file in it."""
    out = {}
    for path in map(Path, paths):
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            out[str(file)] = hash_file(file).hexdigest()
    return out


def record_data_files(run_dir: Path, paths: Iterable[str | Path]) -> None:
    """Write the paths of the data files a run reads, and their fingerprints, into
    ``run_dir`` (``DATA_FILES``); a run that reads none has no such file."""
    paths = [str(p) for p in paths]
    if not paths:
        (run_dir / DATA_FILES).unlink(missing_ok=True)
        return
    record = {"paths": paths, "sha256": data_fingerprints(paths)}
    write_atomically(run_dir / DATA_FILES, json.dumps(record, indent=1) + "\n")


def data_file_changes(run_dir: Path, accept: bool = False) -> dict[str, dict[str, str | None]]:
    """How the data files the run read differ from their fingerprints in ``run_dir``,
    ``{file: {"was", "now"}}`` (a hash, or None: no such file); ConfigError naming them
    unless ``accept``. A changed file moves the held-out split and the order of the
    rows: the run would go on with other data than its checkpoints learned from. A run
    that recorded none (started before rlvr kept them) has nothing to compare."""
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
    """``resume_accept_data_change=true|false`` taken out of the command line's
    ``overrides``: (the others, its value; False when absent). It is no config key:
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
