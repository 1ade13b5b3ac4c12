"""A run on disk: its directory, resolved config, metrics, checkpoints, figure and
progress bar; starting a run and resuming one."""

from __future__ import annotations

import json
import os
import shutil
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tqdm import tqdm

from rlvr.checkpoint import PREFIX, load_latest, save_checkpoint
from rlvr.config import Config, ConfigError, load_config
from rlvr.metrics import ExperimentTrackerSink, JsonlSink, Record, TensorBoardSink, plot_runs, read_records, write_samples_markdown
from rlvr.trainer import TrainState, setup, train


class RunError(RuntimeError):
    """A run that cannot start or go on (its directory is taken, say)."""


def prepare_run_dir(config: Config) -> Path:
    """The run directory, created empty. ``runs/<name>`` gets a numeric suffix when taken;
    an explicit ``out_dir`` that already holds a run is an error (nothing is overwritten)."""
    run_dir = config.run_dir
    if run_dir.exists() and any(run_dir.iterdir()):
        if config.out_dir:
            raise RunError(
                f"run directory {run_dir} already holds files; choose another out_dir or resume={run_dir}"
            )
        k = 2
        while (run_dir.parent / f"{run_dir.name}-{k}").exists():
            k += 1
        run_dir = run_dir.parent / f"{run_dir.name}-{k}"
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


class Progress:
    """A progress bar over epochs showing the mean reward and solve rate."""

    def __init__(self, epochs: int, enabled: bool, desc: str, initial: int = 0):
        self.bar = tqdm(total=epochs, initial=initial, disable=not enabled, desc=desc,
                        dynamic_ncols=True, leave=True, mininterval=0.5)
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


@contextmanager
def stop_on_sigint(st: TrainState) -> Iterator[None]:
    """First Ctrl-C: finish the current step, checkpoint, stop. Second: stop at once."""

    def handler(signum, frame):
        if st.stop_requested:
            raise KeyboardInterrupt
        st.stop_requested = True
        print("\nrlvr: stopping after this step and writing a checkpoint (Ctrl-C again to abort)", flush=True)

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _checkpointer(config: Config, run_dir: Path):
    """Checkpoint every k epochs, at the end, and where a stop was requested (mid-epoch too)."""
    every = config.log.checkpoint_every

    def on_epoch_end(st: TrainState) -> None:
        boundary = st.inner_step == 0
        last = st.epoch == config.algo.epochs or st.stop_requested
        if last or (boundary and every and st.epoch % every == 0):
            save_checkpoint(run_dir, f"{PREFIX}{st.step:09d}", st.payload(), st.policy, config.log.keep_checkpoints)

    return on_epoch_end


def _truncate_metrics(path: Path, count: int) -> list[Record]:
    """Keep the first ``count`` records of a metrics file (those the checkpoint knows)."""
    records = read_records(path)[:count]
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return records


def run_training(
    config: Config, plot: bool | None = None, resume: str | Path | None = None
) -> tuple[list[Record], Path]:
    """Train with everything written to the run directory; returns (records, run_dir).

    The task, policy and optimizer are built before the directory is created, so a
    configuration that fails to build leaves nothing behind. With ``resume`` the run
    continues from the newest usable checkpoint of that directory.
    """
    state = setup(config)
    task, st = state
    if resume is not None:
        run_dir = Path(resume)
        _, payload = load_latest(run_dir)
        records = _truncate_metrics(run_dir / "metrics.jsonl", payload["num_records"])
        st.restore(payload, records)
    else:
        run_dir = prepare_run_dir(config)
        try:
            config.out_dir = str(run_dir)
            (run_dir / "config.yaml").write_text(config.to_yaml())
        except OSError:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
    sinks = [JsonlSink(run_dir / "metrics.jsonl")]
    if config.log.tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tensorboard"))
    if config.log.tracker:
        sinks.append(ExperimentTrackerSink(config.log.tracker, config.log.tracker_project, config.name, config.to_dict()))
    progress = Progress(config.algo.epochs, config.log.progress, config.name, initial=st.epoch)

    def on_record(record: Record) -> None:
        for sink in sinks:
            sink(record)
        if record["kind"] == "samples":
            write_samples_markdown(run_dir / "samples.md", record)
        progress(record)

    try:
        with stop_on_sigint(st):
            records = train(config, on_record=on_record, state=state, on_epoch_end=_checkpointer(config, run_dir))
    finally:
        progress.close()
        for sink in sinks:
            sink.close()
        close = getattr(task, "close", None)
        if close is not None:
            close()
    if st.stop_requested:
        raise KeyboardInterrupt(f"stopped at epoch {st.epoch}; continue with: rlvr train resume={run_dir}")
    if config.log.plot if plot is None else plot:
        plot_runs({config.name: records}, run_dir / "plot.png", config.name)
    return records, run_dir


def resume_config(run_dir: str | Path, overrides: list[str]) -> Config:
    """The config a run was started with (its ``config.yaml``), plus overrides."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"resume={run_dir}: no config.yaml there (not a run directory)")
    return load_config(run_dir / "config.yaml", overrides + [f"out_dir={run_dir}"])
