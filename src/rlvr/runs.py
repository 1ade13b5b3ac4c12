"""A run on disk: its directory, resolved config, metrics, figure and progress bar."""

from __future__ import annotations

import shutil
from pathlib import Path

from tqdm import tqdm

from rlvr.config import Config
from rlvr.metrics import JsonlSink, Record, plot_runs
from rlvr.trainer import setup, train


class RunError(RuntimeError):
    """A run that cannot start (its directory is taken, say)."""


def prepare_run_dir(config: Config) -> Path:
    """The run directory, created empty. ``runs/<name>`` gets a numeric suffix when taken;
    an explicit ``out_dir`` that already holds a run is an error (nothing is overwritten)."""
    run_dir = config.run_dir
    if run_dir.exists() and any(run_dir.iterdir()):
        if config.out_dir:
            raise RunError(f"run directory {run_dir} already holds files; choose another out_dir")
        k = 2
        while (run_dir.parent / f"{run_dir.name}-{k}").exists():
            k += 1
        run_dir = run_dir.parent / f"{run_dir.name}-{k}"
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


class Progress:
    """A progress bar over epochs showing the mean reward and solve rate."""

    def __init__(self, epochs: int, enabled: bool, desc: str):
        self.bar = tqdm(total=epochs, disable=not enabled, desc=desc, dynamic_ncols=True, leave=True, mininterval=0.5)
        self.epoch = -1

    def __call__(self, record: Record) -> None:
        if record["kind"] == "train" and record["epoch"] != self.epoch:
            self.epoch = record["epoch"]
            self.bar.update(1)
            self.bar.set_postfix(reward=f"{record['reward_mean']:.3f}", solve=f"{record['solve_rate']:.2f}")
        elif record["kind"] == "eval":
            self.bar.set_postfix(eval_greedy=f"{record['greedy_solve_rate']:.2f}")

    def close(self) -> None:
        self.bar.close()


def run_training(config: Config, plot: bool | None = None) -> tuple[list[Record], Path]:
    """Train with everything written to the run directory; returns (records, run_dir).

    The task, policy and optimizer are built before the directory is created, so a
    configuration that fails to build leaves nothing behind.
    """
    state = setup(config)
    run_dir = prepare_run_dir(config)
    try:
        (run_dir / "config.yaml").write_text(config.to_yaml())
        sink = JsonlSink(run_dir / "metrics.jsonl")
    except OSError:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    progress = Progress(config.algo.epochs, config.log.progress, config.name)

    def on_record(record: Record) -> None:
        sink(record)
        progress(record)

    try:
        records = train(config, on_record=on_record, state=state)
    finally:
        progress.close()
        sink.close()
    if config.log.plot if plot is None else plot:
        plot_runs({config.name: records}, run_dir / "plot.png", config.name)
    return records, run_dir
