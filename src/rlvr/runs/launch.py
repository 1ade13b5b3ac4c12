"""Running a run on disk: its sinks, checkpoints and stop signals (``rlvr.runs.stops``); starting a run and resuming one
(directory and lock: ``rlvr.runs.directory``; what a resume may change: ``rlvr.runs.resume``); the supervised warm
start's run."""

from __future__ import annotations

import datetime
import json
import shutil
import signal
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any

from rlvr.base.errors import ConfigError, RunError, Stopped, os_reason
from rlvr.batch.record import Record
from rlvr.cluster.learners import LearnerGroup
from rlvr.cluster.session import loop_parts, trained_policy
from rlvr.cluster.sharded import load_sharded
from rlvr.config import Config, load_config
from rlvr.loop.evaluation import eval_prompts_label
from rlvr.loop.seams import Learner, RolloutSource
from rlvr.loop.sft import train_sft
from rlvr.loop.state import TrainState
from rlvr.loop.trainer import setup, train
from rlvr.policies import frozen_copy
from rlvr.runs.checkpoint import (
    PAYLOAD_KEYS,
    PREFIX,
    list_checkpoints,
    load_latest,
    restore_state,
    save_checkpoint,
    save_pretrained,
    sharded_folder,
    state_payload,
)
from rlvr.runs.directory import discard_partial_outputs, locked_run_dir, new_run_dir, write_atomically
from rlvr.runs.metrics import (
    ExperimentTrackerSink,
    JsonlSink,
    TensorBoardSink,
    plot_runs,
    read_records,
    write_samples_markdown,
)
from rlvr.runs.resume import data_file_changes, record_data_files, records_at_checkpoint, resume_changes
from rlvr.runs.stops import Progress, stop_on_signals


def _checkpointer(config: Config, run_dir: Path, metrics: JsonlSink, source: RolloutSource, learner: Learner):
    """Checkpoint every k epochs, at the end, and where a stop was requested (mid-epoch too); with the rollout
    ``source``'s state (batches it sampled ahead of the trainer). Data-parallel learners write the weights and optimizer
    state themselves, sharded; the driver the rest."""
    every = config.log.checkpoint_every
    group = learner if isinstance(learner, LearnerGroup) else None

    def on_epoch_end(st: TrainState) -> None:
        boundary = st.inner_step == 0
        last = st.epoch == config.algo.epochs or st.stop_requested
        if not (last or (boundary and every and st.epoch % every == 0)):
            return
        try:
            metrics.sync()  # the records the checkpoint counts reach the disk before it
            payload = state_payload(st, source.state(), sharded=group is not None)
            save_checkpoint(run_dir, f"{PREFIX}{st.step:09d}", payload, None if group else st.policy,
                            config.log.keep_checkpoints, None if group is None else group.save_sharded)
        except OSError as err:
            raise RunError(f"cannot write a checkpoint in {run_dir / 'checkpoints'}: {os_reason(err)}; the previous "
                           f"one is intact (rlvr train resume={run_dir} continues from it)") from err

    return on_epoch_end


# ---------------------------------------------------------------- resuming


class RunFinished(RunError):
    """A resume of a run that has run all its epochs: there is nothing to do."""


def _check_unfinished(stored: Config, config: Config, run_dir: Path, epoch: int) -> None:
    """RunFinished when the run has reached ``config.algo.epochs``: a resume would train nothing, and saying so beats
    exiting 0 having done nothing."""
    if config.algo.epochs > epoch:
        return
    if epoch < stored.algo.epochs:
        raise ConfigError(f"algo.epochs={config.algo.epochs} is not above epoch {epoch}, which run {run_dir} has "
                          f"reached (of algo.epochs={stored.algo.epochs}): nothing would be trained; leave "
                          "algo.epochs out to finish the run")
    asked = "" if config.algo.epochs == stored.algo.epochs else f" (asked now: algo.epochs={config.algo.epochs})"
    raise RunFinished(f"run {run_dir} is finished: it has run epoch {epoch} of algo.epochs={stored.algo.epochs}"
                      f"{asked}, so there is nothing to resume; to train on, raise algo.epochs: "
                      f"rlvr train resume={run_dir} algo.epochs={2 * epoch}")


def _resume(config: Config, run_dir: Path, stack: ExitStack, accept_data_change: bool = False
            ) -> tuple[tuple[Any, TrainState], dict[str, Any] | None, Path | None]:
    """The state to continue ``run_dir`` from, the rollout source's state the checkpoint kept and the folder of its
    sharded weights and optimizer state (None: none), once ``resume_changes`` and ``data_file_changes`` accepted what
    changed; a run killed before its first checkpoint starts again. A finished run is a RunFinished. The accepted
    changes go into ``config.yaml`` (and the data files' fingerprints) and a line of ``resumes.jsonl``."""
    stored = load_config(run_dir / "config.yaml")
    checkpoint, data_changes, source_state, sharded = None, {}, None, None
    if not list_checkpoints(run_dir):
        changes = resume_changes(stored, config, restart=True)
        discard_partial_outputs(run_dir)
        task, st = state = _setup(config, stack)
        record_data_files(run_dir, task.data_files)  # the new config may read other files
    else:
        changes = resume_changes(stored, config)
        data_changes = data_file_changes(run_dir, accept_data_change)
        checkpoint, payload = load_latest(run_dir, PAYLOAD_KEYS)
        _check_unfinished(stored, config, run_dir, payload["epoch"])
        # every check of the directory before _setup imports the reward modules its config.yaml names
        records = records_at_checkpoint(run_dir / "metrics.jsonl", payload["num_records"], checkpoint)
        task, st = state = _setup(config, stack)
        restore_state(st, payload, records)
        source_state, sharded = payload.get("source"), sharded_folder(checkpoint)
        if data_changes:
            record_data_files(run_dir, task.data_files)
    entry = {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "checkpoint": checkpoint and checkpoint.name, "epoch": st.epoch, "step": st.step, "changes": changes}
    if data_changes:
        entry["data_changes"] = data_changes
    with (run_dir / "resumes.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
    if changes:
        config.out_dir = str(run_dir)
        write_atomically(run_dir / "config.yaml", config.to_yaml())
    return state, source_state, sharded


def _load_sharded(learner: Learner, st: TrainState, folder: Path | None) -> None:
    """A sharded checkpoint's weights, optimizer state and reference (in ``folder``; None: none): each data-parallel
    learner reads its part, resharded to their number, and hands the state to the driver; without learners this process
    reads it whole."""
    if folder is None:
        return
    if isinstance(learner, LearnerGroup):
        learner.load_sharded(st, folder)
    else:
        reference = load_sharded(st.policy.module, st.optimizer, folder, partial(frozen_copy, st.policy.module))
        st.ref_module = reference or st.ref_module


# ---------------------------------------------------------------- running


def _setup(config: Config, stack: ExitStack) -> tuple[Any, TrainState]:
    """``setup``, with the task closed (its reward workers stopped) when the run ends."""
    task, st = setup(config)
    stack.callback(task.close)
    return task, st


def _start(config: Config, stack: ExitStack) -> tuple[Path, tuple[Any, TrainState]]:
    """A new run: built first, so a configuration that fails to build leaves nothing behind, then its directory (locked)
    with ``config.yaml``."""
    state = _setup(config, stack)
    run_dir = stack.enter_context(new_run_dir(config))
    config.out_dir = str(run_dir)
    try:
        write_atomically(run_dir / "config.yaml", config.to_yaml())
        record_data_files(run_dir, state[0].data_files)  # a resume checks them
    except OSError as err:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise RunError(f"cannot write {run_dir / 'config.yaml'}: {os_reason(err)}") from err
    return run_dir, state


@contextmanager
def _writer(config: Config, run_dir: Path, metrics: JsonlSink, initial_epoch: int) -> Iterator[Callable]:
    """``on_record`` for the run: every record to the sinks (metrics.jsonl first), the samples table to samples.md, the
    progress bar; a failed write is a RunError naming the file. Closes the sinks and the bar at the end of the block."""
    sinks = [metrics]
    if config.log.tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tensorboard"))
    if config.log.tracker:
        sinks.append(ExperimentTrackerSink(config.log.tracker, config.log.tracker_project, config.name,
                                           config.to_dict()))
    progress = Progress(config.algo.epochs, config.log.progress, config.name, initial=initial_epoch)

    def on_record(record: Record) -> None:
        writers = [(getattr(sink, "path", run_dir), sink) for sink in sinks]
        if record["kind"] == "samples":
            writers.append((run_dir / "samples.md", partial(write_samples_markdown, run_dir / "samples.md")))
        for path, write in writers:
            try:
                write(record)
            except OSError as err:
                raise RunError(f"cannot write {path}: {os_reason(err)}") from err
        progress(record)

    try:
        yield on_record
    finally:
        progress.close()
        for sink in sinks:
            with suppress(OSError):  # a close that fails follows a write that failed, reported then
                sink.close()


def run_training(
    config: Config, plot: bool | None = None, resume: str | Path | None = None, accept_data_change: bool = False
) -> tuple[list[Record], Path]:
    """``train_in_run_dir`` without the trained policy: (records, run_dir)."""
    records, run_dir, _ = train_in_run_dir(config, plot, resume, accept_data_change, with_policy=False)
    return records, run_dir


def train_in_run_dir(
    config: Config, plot: bool | None = None, resume: str | Path | None = None, accept_data_change: bool = False,
    with_policy: bool = True,
) -> tuple[list[Record], Path, Any]:
    """Train with everything written to the run directory, locked while the run lasts; returns (records, run_dir, the
    trained policy or None without ``with_policy``). ``resume``: that directory's run continued (``_resume``). SIGINT
    and SIGTERM stop after the current step with a checkpoint (``Stopped``); a failed write is a RunError naming it.
    """
    with ExitStack() as stack:
        source_state = sharded = None
        if resume is None:
            run_dir, state = _start(config, stack)
        else:
            if not (Path(resume) / "config.yaml").is_file():
                raise ConfigError(f"resume={resume}: no config.yaml there (not a run directory)")
            run_dir = stack.enter_context(locked_run_dir(Path(resume)))
            state, source_state, sharded = _resume(config, run_dir, stack, accept_data_change)
        st = state[1]
        metrics = JsonlSink(run_dir / "metrics.jsonl")
        on_record = stack.enter_context(_writer(config, run_dir, metrics, initial_epoch=st.epoch))
        with stop_on_signals(st, run_dir) as stops, stops.shielded(loop_parts(config, st)) as (source, learner):
            _load_sharded(learner, st, sharded)
            source.restore(source_state)  # the batches sampled ahead before the checkpoint: trained on as they are
            records = train(config, on_record=on_record, state=state, source=source, learner=learner,
                            on_epoch_end=_checkpointer(config, run_dir, metrics, source, learner))
            policy = trained_policy(config, state[0], st, learner) if with_policy else None
    if st.stop_requested:
        signum = stops.received[0] if stops.received else signal.SIGINT
        raise Stopped(f"stopped by {signal.Signals(signum).name} at epoch {st.epoch} (step {st.step}), checkpoint "
                      f"written; continue with: rlvr train resume={run_dir}", signum)
    if config.log.plot if plot is None else plot:
        plot_runs({config.name: records}, run_dir / "plot.png", f"{run_dir.name} (seed {config.seed})",
                  eval_prompts_label(config))
    return records, run_dir, policy


def start_or_continue(config: Config) -> tuple[list[Record], Path, str]:
    """``run_training`` in ``config.run_dir`` without a figure, or the run already there continued (``rlvr compare`` run
    again): (records, run_dir, what was done). A run there with other settings is refused by ``resume_changes``."""
    run_dir = config.run_dir
    if not (run_dir / "config.yaml").is_file():
        return *run_training(config, plot=False), "started"
    what = "resumed" if list_checkpoints(run_dir) else "started again"
    try:
        return *run_training(config, plot=False, resume=run_dir), what
    except RunFinished:
        return read_records(run_dir), run_dir, "finished, records reused"


def run_sft(config: Config, run_dir: Path, on_record: Callable[[Record], None] | None = None) -> Path:
    """The supervised warm start (``rlvr.loop.sft``) in ``run_dir``: its records in ``sft_metrics.jsonl``, the trained
    model saved to ``run_dir/model``."""
    sink = JsonlSink(run_dir / "sft_metrics.jsonl")

    def keep(record: Record) -> None:
        sink(record)
        if on_record is not None:
            on_record(record)

    try:
        policy = train_sft(config, keep)
    finally:
        sink.close()
    out = run_dir / "model"
    save_pretrained(policy, out)
    return out
