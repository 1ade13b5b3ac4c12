"""Metric sinks (JSONL on disk, optional TensorBoard) and plots of a run."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

Record = dict[str, Any]


class JsonlSink:
    """Appends one JSON object per record to ``path``, flushed line by line."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file = self.path.open("a", encoding="utf-8")

    def __call__(self, record: Record) -> None:
        self._file.write(json.dumps(record, allow_nan=True) + "\n")
        self._file.flush()

    def sync(self) -> None:
        """Force the records written so far onto the disk (before a checkpoint counts them)."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def write_samples_markdown(path: Path, record: Record) -> None:
    """Append a "samples" record to a Markdown file as a table (prompt, response, reward)."""

    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", "\\n")

    lines = [f"\n## epoch {record['epoch']} (step {record['step']})\n",
             "| prompt | response | reward | correct |", "| --- | --- | ---: | :---: |"]
    for row in record["rows"]:
        mark = "yes" if row["correct"] else "no"
        lines.append(f"| {cell(row['prompt'])} | {cell(row['response'])} | {row['reward']:.3f} | {mark} |")
    with Path(path).open("a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


class TensorBoardSink:
    """Scalars of train and eval records to TensorBoard (the ``tensorboard`` extra)."""

    def __init__(self, log_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise RuntimeError("log.tensorboard=true needs: pip install 'rlvr[tensorboard]'") from err
        self.writer = SummaryWriter(str(log_dir))

    def __call__(self, record: Record) -> None:
        kind = record.get("kind")
        if kind not in ("train", "eval"):
            return
        for key, value in record.items():
            if key not in ("kind", "epoch", "step") and isinstance(value, (int, float)):
                self.writer.add_scalar(f"{kind}/{key}", value, record["step"])

    def close(self) -> None:
        self.writer.close()


TIMING_PREFIXES = ("time/", "tokens_per_sec")


def without_timings(records: Iterable[Record]) -> list[Record]:
    """Records minus wall-clock fields: what two runs with the same seed must agree on."""
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in records]


class ExperimentTrackerSink:
    """Scalars to an experiment tracker with the ``init / log / finish`` API that wandb and
    trackio share (each an optional install). ``backend`` is the module name."""

    def __init__(self, backend: str, project: str, name: str, config: dict):
        import importlib

        try:
            self.module = importlib.import_module(backend)
        except ImportError as err:
            raise RuntimeError(f"log.tracker={backend!r} needs: pip install {backend}") from err
        self.run = self.module.init(project=project, name=name, config=config)

    def __call__(self, record: Record) -> None:
        kind = record.get("kind")
        if kind not in ("train", "eval"):
            return
        scalars = {f"{kind}/{k}": v for k, v in record.items()
                   if k not in ("kind", "epoch", "step") and isinstance(v, (int, float))}
        self.module.log(scalars, step=record["step"])

    def close(self) -> None:
        self.module.finish()


def read_records(path: Path) -> list[Record]:
    """Records from a ``metrics.jsonl`` file (or a run directory holding one).

    A torn last line (no newline, not JSON: a kill in the middle of a write) is left
    out; any other line that is not a JSON record is a ValueError naming it.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}")
    with path.open(encoding="utf-8") as f:
        lines = f.readlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            if number == len(lines) and not line.endswith("\n"):
                break  # torn
            raise ValueError(f"{path}:{number}: not a JSON record ({err.msg})") from err
    return records


def series(records: Iterable[Record], kind: str, key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key`` over the records of ``kind`` that have it."""
    xs, ys = [], []
    for r in records:
        if r.get("kind") == kind and key in r and r[key] is not None:
            xs.append(r["step"])
            ys.append(r[key])
    return xs, ys


def summary(records: list[Record]) -> dict[str, float]:
    """Start and end of the headline numbers of a run."""
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    out: dict[str, float] = {}
    if train:
        out["reward_start"] = train[0]["reward_mean"]
        out["reward_end"] = train[-1]["reward_mean"]
        out["solve_rate_end"] = train[-1]["solve_rate"]
        out["frac_zero_delta_groups_end"] = train[-1]["frac_zero_delta_groups"]
    if evals:
        out["eval_greedy_solve_rate"] = evals[-1]["greedy_solve_rate"]
        out["eval_sampled_solve_rate"] = evals[-1]["sampled_solve_rate"]
    return out


PANELS = (
    ("train", "loss", "train loss"),
    ("train", "reward_mean", "mean reward"),
    ("eval", "greedy_solve_rate", "held-out greedy solve rate"),
)


def plot_runs(runs: dict[str, list[Record] | list[list[Record]]], path: Path, title: str = "") -> Path:
    """The lecture's two panels (train loss, mean reward vs step) plus held-out solve rate.

    ``runs`` maps a label to its records, or to several runs' records (seeds): those are
    drawn as their mean with a band from the lowest to the highest seed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 3.8))
    for ax, (kind, key, label) in zip(axes, PANELS):
        for name, records in runs.items():
            seeds = records if records and isinstance(records[0], list) else [records]
            curves = [series(r, kind, key) for r in seeds]
            xs = curves[0][0]
            values = np.array([[y if y is not None and math.isfinite(y) else np.nan for y in ys[: len(xs)]]
                               for _, ys in curves if len(ys) >= len(xs)])
            marker = "o" if kind == "eval" else None
            line = ax.plot(xs, values.mean(axis=0), label=name, marker=marker, markersize=3)[0]
            if len(values) > 1:
                ax.fill_between(xs, values.min(axis=0), values.max(axis=0), color=line.get_color(), alpha=0.2)
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
