"""Metric sinks (JSONL on disk, optional TensorBoard) and plots of a run."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from rlvr.batch.record import Record, json_safe, plain_text, prompt_text, response_text


class JsonlSink:
    """Appends one JSON object per record to ``path``, flushed line by line (non-finite numbers as null)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file = self.path.open("a", encoding="utf-8")

    def __call__(self, record: Record) -> None:
        self._file.write(json.dumps(json_safe(record), allow_nan=False) + "\n")
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

    noted = any(row.get("note") for row in record["rows"])  # a column for what rewards said (a judge's reply)
    lines = [f"\n## epoch {record['epoch']} (step {record['step']})\n",
             "| prompt | response | reward | correct |" + " note |" * noted,
             "| --- | --- | ---: | :---: |" + " --- |" * noted]
    for row in record["rows"]:
        mark = "yes" if row["correct"] else "no"
        reward = row["reward"]
        reward = f"{reward:.3f}" if isinstance(reward, (int, float)) and math.isfinite(reward) else "-"
        prompt, response = cell(prompt_text(row["prompt"])), cell(response_text(row["response"]))
        note = f" {cell(row.get('note', ''))} |" if noted else ""
        lines.append(f"| {prompt} | {response} | {reward} | {mark} |{note}")
    with Path(path).open("a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def scalars(record: Record) -> dict[str, float]:
    """A train or eval record's numbers as a tracker logs them, ``kind/key``; {} for other records."""
    kind = record.get("kind")
    if kind not in ("train", "eval"):
        return {}
    return {f"{kind}/{k}": v for k, v in record.items()
            if k not in ("kind", "epoch", "step") and isinstance(v, (int, float))}


class TensorBoardSink:
    """Scalars of train and eval records to TensorBoard (the ``tensorboard`` extra)."""

    def __init__(self, log_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise RuntimeError("log.tensorboard=true needs: pip install 'rlvr[tensorboard]'") from err
        self.writer = SummaryWriter(str(log_dir))

    def __call__(self, record: Record) -> None:
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, record["step"])

    def close(self) -> None:
        self.writer.close()


TIMING_PREFIXES = ("time/", "tokens_per_sec")
MAX_RECORD_LINE = 16 * 2**20  # characters of one metrics.jsonl line


def without_timings(records: Iterable[Record]) -> list[Record]:
    """Records minus wall-clock fields: what two runs with the same seed must agree on."""
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in records]


class ExperimentTrackerSink:
    """Scalars to the experiment tracker module ``backend`` (wandb, trackio: ``init / log / finish``)."""

    def __init__(self, backend: str, project: str, name: str, config: dict):
        import importlib

        from rlvr.base.extras import missing_package

        try:
            self.module = importlib.import_module(backend)
        except ImportError as err:
            raise RuntimeError(f"log.tracker={backend!r}: {missing_package(backend) or err}") from err
        self.run = self.module.init(project=project, name=name, config=config)

    def __call__(self, record: Record) -> None:
        if record.get("kind") in ("train", "eval"):
            self.module.log(scalars(record), step=record["step"])

    def close(self) -> None:
        self.module.finish()


def read_records(path: Path, max_line: int = MAX_RECORD_LINE) -> list[Record]:
    """Records from a ``metrics.jsonl`` file (or a run directory holding one).

    A torn last line (a kill in the middle of a write) is left out; any other line that is not a JSON object, or
    is longer than ``max_line`` characters (a file made to exhaust memory), is a ValueError naming it. NaN and
    Infinity (older files) are read as numbers.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}")
    records = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(iter(lambda: f.readline(max_line + 1), ""), 1):
            if len(line) > max_line:
                raise ValueError(f"{path}:{number}: a line longer than {max_line:,} characters (not a record)")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as err:
                if not line.endswith("\n") and not f.read(1):
                    break  # torn
                reason = err.msg if isinstance(err, json.JSONDecodeError) else "nested too deeply"
                raise ValueError(f"{path}:{number}: not a JSON record ({reason})") from err
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{number}: not a JSON record (a {type(record).__name__}, not an object)")
            records.append(record)
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
    """Start and end of the headline numbers of a run (NaN for a value recorded as null)."""
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    out: dict[str, float] = {}

    def number(record: Record, key: str) -> float:
        value = record[key]
        return math.nan if value is None else value

    if train:
        out["reward_start"] = number(train[0], "reward_mean")
        out["reward_end"] = number(train[-1], "reward_mean")
        out["solve_rate_end"] = number(train[-1], "solve_rate")
        out["frac_zero_delta_groups_end"] = number(train[-1], "frac_zero_delta_groups")
    if evals:
        out["eval_greedy_solve_rate"] = number(evals[-1], "greedy_solve_rate")
        out["eval_sampled_solve_rate"] = number(evals[-1], "sampled_solve_rate")
    return out


PANELS = (  # (kind, key, title, y-axis label); the eval title names the prompts evaluated
    ("train", "loss", "train loss", "loss (epoch mean; faint: per step)"),
    ("train", "reward_mean", "mean reward", "mean reward of the epoch's batch"),
    ("eval", "greedy_solve_rate", "greedy solve rate", "solve rate"),
)
# drawn when some run measured it (log.grad_noise_every), on a log scale (a stalled run's zero variance drops out)
NOISE_PANEL = ("train", "grad/trace_cov", "policy-gradient variance", "tr(Sigma) of one prompt's gradient")
RATES = ("greedy_solve_rate",)  # drawn on [0, 1]
# Each run its own colour, line style and marker: curves that coincide stay visible as dashes over a solid line.
LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "x")


def per_epoch(records: Iterable[Record], key: str) -> tuple[list[float], list[float]]:
    """(step of each epoch's first inner step, mean of ``key`` over the epoch's finite values; NaN when none).
    The loss of K inner steps on one batch reads as a comb per step, as a curve per epoch."""
    steps: dict[int, int] = {}
    values: dict[int, list[float]] = {}
    for r in records:
        if r.get("kind") == "train" and r.get(key) is not None:
            steps.setdefault(r["epoch"], r["step"])
            values.setdefault(r["epoch"], []).extend([r[key]] if math.isfinite(r[key]) else [])
    means = [sum(v) / len(v) if v else math.nan for v in values.values()]
    return list(steps.values()), means


def _seed_curves(seeds: list[list[Record]], kind: str, key: str) -> tuple[list[float], np.ndarray]:
    """(xs, values [S, X]): each seed's curve (train: per epoch), cut to the shortest."""
    curves = [per_epoch(r, key) if kind == "train" else series(r, kind, key) for r in seeds]
    length = min(len(xs) for xs, _ in curves)
    values = np.array([[y if y is not None and math.isfinite(y) else np.nan for y in ys[:length]] for _, ys in curves])
    return curves[0][0][:length], values.reshape(len(curves), length)


def draw_runs(runs: dict[str, list[Record] | list[list[Record]]], title: str = "",
              eval_label: str = "held-out prompts") -> Any:
    """The figure of ``plot_runs`` (a matplotlib Figure; the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    every = [r for records in runs.values() for seed in (records if records and isinstance(records[0], list)
                                                          else [records]) for r in seed]
    panels = PANELS + ((NOISE_PANEL,) if any(NOISE_PANEL[1] in r for r in every) else ())
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8))
    for ax, (kind, key, panel, ylabel) in zip(axes, panels):
        for i, (name, records) in enumerate(runs.items()):
            seeds = records if records and isinstance(records[0], list) else [records]
            xs, values = _seed_curves(seeds, kind, key)
            # earlier runs drawn wider, with larger hollow markers: a later run on the same values sits inside them
            wider = len(runs) - 1 - i
            style = {"color": f"C{i % 10}", "linestyle": LINE_STYLES[i % len(LINE_STYLES)],
                     "linewidth": 1.3 + 0.9 * wider, "marker": MARKERS[i % len(MARKERS)],
                     "markevery": max(1, len(xs) // 10), "markersize": 4 + 2.5 * wider, "markerfacecolor": "none"}
            if kind == "train" and key == "loss":
                for seed in seeds[:1]:  # one seed's per-step loss, faint, behind the mean
                    step_xs, step_ys = series(seed, kind, key)
                    ax.plot(step_xs, step_ys, color=style["color"], alpha=0.2, linewidth=0.7, label=f"_{name} raw")
            ax.plot(xs, np.nanmean(values, axis=0) if len(xs) else [], label=plain_text(name), **style)
            if len(values) > 1 and len(xs):
                low, high = np.nanmin(values, axis=0), np.nanmax(values, axis=0)
                ax.fill_between(xs, low, high, color=style["color"], alpha=0.12, linewidth=0)
                for edge in (low, high):  # the band's edges in the run's line style: overlapping bands stay apart
                    ax.plot(xs, edge, color=style["color"], linestyle=style["linestyle"], linewidth=0.6,
                            alpha=0.6, label=f"_{name} band")
        if key == NOISE_PANEL[1]:
            ax.set_yscale("log")
        if key in RATES:  # a rate's whole range: a constant 0 reads as 0, not as noise around it
            ax.set_ylim(-0.03, 1.03)
        ax.set_title(plain_text(f"{panel} on the {eval_label}") if kind == "eval" else panel)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=9, frameon=False)
    if title:
        fig.suptitle(plain_text(title))
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def plot_runs(runs: dict[str, list[Record] | list[list[Record]]], path: Path, title: str = "",
              eval_label: str = "held-out prompts") -> Path:
    """Train loss, mean reward and the greedy solve rate on the ``eval_label`` prompts vs step, written to ``path``.

    ``runs`` maps a label to its records, or to several seeds' records, drawn as their mean with a band from the
    lowest to the highest seed.
    """
    import matplotlib.pyplot as plt

    fig = draw_runs(runs, title, eval_label)
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
