"""Resuming a run: what a resume may change, and the records a checkpoint follows."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from rlvr.config import Config, LogConfig, load_config
from rlvr.errors import ConfigError, RunError
from rlvr.metrics import Record, read_records
from rlvr.run_dir import write_atomically

# What a resume may change: how long the run goes on and what it reports, not what it
# computes. ``log.*`` only observes the run; reward limits, workers and threads change
# how fast it goes (a call on the edge of its time limit aside, and threads may change
# the last bits of CPU sums).
RESUMABLE = ("algo.epochs", "name", "threads", "rewards.timeout", "rewards.num_workers",
             # where the work runs, not what it computes (cluster.max_staleness does change it)
             "cluster.rollout_workers", "cluster.learners", "cluster.address", "cluster.weight_sync",
             "cluster.learner_strategy",
             *(f"log.{f.name}" for f in dataclasses.fields(LogConfig)))


def _flat(config: Config) -> dict[str, Any]:
    """``{"algo.epochs": 100, ...}``: every field of every section, and the top-level ones."""
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            out.update({f"{f.name}.{g.name}": getattr(value, g.name) for g in dataclasses.fields(value)})
        else:
            out[f.name] = value
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
    write_atomically(path, "".join(json.dumps(record) + "\n" for record in records))
    return records


def resume_config(run_dir: str | Path, overrides: list[str]) -> Config:
    """The config a run was started with (its ``config.yaml``), plus overrides."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"resume={run_dir}: no config.yaml there (not a run directory)")
    return load_config(run_dir / "config.yaml", overrides + [f"out_dir={run_dir}"])
