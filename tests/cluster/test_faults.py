"""How a cluster run ends when something fails: a signal to the driver (stop after the
step, checkpoint, exit 143, resume equal), a rollout worker, a learner or Ray itself gone
(one line, the checkpoints intact), an asynchronous run resumed; and no Ray session folder
left behind by the private Ray a run starts."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from ray_actors import record_actors

from helpers import QUIET, comparable, rlvr_stderr, sigkill_mid_run
from rlvr.api import run_loop as train
from rlvr.base.errors import RunError
from rlvr.cli import main
from rlvr.config import load_config
from rlvr.loop.state import TrainingError
from rlvr.runs.checkpoint import list_checkpoints, verify
from rlvr.runs.launch import run_training
from rlvr.runs.metrics import read_records, without_timings
from rlvr.runs.resume import resume_config

pytestmark = pytest.mark.ray

SORTING = QUIET + ["algo.inner_steps=2", "log.eval_every=2"]



def wait_for_train_record(path: Path, process: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if path.is_file() and '"kind": "train"' in path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"no train record within {timeout} s (exit code {process.poll()})")


def test_sigterm_to_a_cluster_run_checkpoints_exits_143_and_resumes_equal(ray_local, tmp_path):
    """The run starts a private Ray of its own (a subprocess: no Ray in it yet), whose
    ray.init installs a SIGTERM handler that would end the process at once."""
    run_dir = tmp_path / "run"
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths have a length limit
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "rlvr", "train", *SORTING, "algo.epochs=100000", "log.checkpoint_every=0",
               "cluster.rollout_workers=1", f"out_dir={run_dir}"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_train_record(run_dir / "metrics.jsonl", process)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
        sessions = list(Path(ray_tmp, "ray").glob("session_*"))
    finally:
        process.kill()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert process.returncode == 143, err
    assert "stopped by SIGTERM" in err and "checkpoint written" in err
    checkpoints = list_checkpoints(run_dir)
    assert len(checkpoints) == 1 and verify(checkpoints[0]) is None
    assert not sessions  # the run's own Ray session folder went with it
    stopped = read_records(run_dir)
    epochs = max(r["epoch"] for r in stopped) + 2  # the epoch it stopped in, and one more
    # resumed here, on the test's Ray, to the same records as a straight run of as many epochs
    records, _ = run_training(resume_config(run_dir, [f"algo.epochs={epochs}"]), resume=run_dir)
    straight = train(load_config(None, [*SORTING, f"algo.epochs={epochs}", "log.checkpoint_every=0"]))
    assert comparable(records) == comparable(straight)


def kill_worker_after_epoch(epoch, monkeypatch):
    """The CLI's checkpointer, followed by a SIGKILL to rollout worker 0 after ``epoch``."""
    import rlvr.runs.launch

    built = record_actors(monkeypatch)

    checkpointer = rlvr.runs.launch._checkpointer

    def killing_checkpointer(*args):
        on_epoch_end = checkpointer(*args)

        def then_kill(st):
            on_epoch_end(st)
            if st.epoch == epoch and st.inner_step == 0:
                os.kill(built[-1].worker_pids()[0], signal.SIGKILL)

        return then_kill

    monkeypatch.setattr(rlvr.runs.launch, "_checkpointer", killing_checkpointer)


def test_a_worker_killed_under_collective_weights_ends_the_run_in_one_line(ray_local, tmp_path, monkeypatch,
                                                                          capsys):
    kill_worker_after_epoch(1, monkeypatch)
    code = main(["train", *SORTING, "algo.epochs=3", "log.checkpoint_every=1", "cluster.rollout_workers=1",
                 "cluster.weight_sync=collective", f"out_dir={tmp_path / 'run'}"])
    err = rlvr_stderr(capsys.readouterr().err)
    assert code == 2
    assert err.count("\n") == 0 and err.startswith("rlvr: error: epoch 1, step 2: "), err
    assert "weight_sync=collective cannot take a restarted worker" in err and "checkpoints written before" in err
    checkpoints = list_checkpoints(tmp_path / "run")  # the one after epoch 0 (step 2), intact
    assert len(checkpoints) == 1 and checkpoints[0].name.endswith("000000002") and verify(checkpoints[0]) is None


def test_a_learner_killed_after_its_last_step_of_an_epoch_stops_the_run_by_name(ray_local, monkeypatch):
    """inner_steps=1: the kill comes between the step and the driver's pull of the weights."""
    from rlvr.cluster.learners import LearnerGroup

    step = LearnerGroup.optimizer_step

    def step_then_kill(self, st, rollout, *args, **kwargs):
        record = step(self, st, rollout, *args, **kwargs)
        if st.step == 1:
            os.kill(self.pids()[1], signal.SIGKILL)
        return record

    monkeypatch.setattr(LearnerGroup, "optimizer_step", step_then_kill)
    config = load_config(None, [*QUIET, "algo.epochs=3", "algo.inner_steps=1", "cluster.learners=2"])
    message = r"^epoch 0, step 1: learner rank 1 died while handing its state over, after \d+\.\d s \("
    with pytest.raises(TrainingError, match=message) as caught:
        train(config)
    assert "\n" not in str(caught.value) and "checkpoints written before are intact" in str(caught.value)


def test_ray_failing_under_the_rollout_workers_is_one_line(monkeypatch):
    """A raylet killed makes Ray raise ActorUnavailableError from wherever the driver waits:
    at the rollout source's boundary it becomes a ClusterError (a RunError: exit 2)."""
    from ray.exceptions import ActorUnavailableError

    from rlvr.cluster import ClusterError
    from rlvr.cluster.rollout import RayRolloutSource

    def unavailable(self, st, task):
        raise ActorUnavailableError("The actor is temporarily unavailable: RpcError: failed to connect to raylet\n"
                                    "(many lines of Ray's detail)", None)

    monkeypatch.setattr(RayRolloutSource, "_sample_and_grade", unavailable)
    source = RayRolloutSource.__new__(RayRolloutSource)
    with pytest.raises(ClusterError) as caught:
        source.sample_and_grade(SimpleNamespace(epoch=3, step=6), None)
    message = str(caught.value)
    assert isinstance(caught.value, RunError) and "\n" not in message
    assert message.startswith("epoch 3, step 6: Ray failed: ActorUnavailableError: ")
    assert "failed to connect to raylet. The run stops;" in message and "many lines" not in message


def test_an_asynchronous_run_resumes_with_the_staleness_it_used_and_needs_its_workers(ray_local, tmp_path, capsys):
    """max_staleness=1: a finished run has no batch in flight (none is sampled past its last
    epoch), so extended it samples its next batch with the weights it resumed with (staleness
    0, where a longer straight run had 1) and records what it used. Without workers it is
    refused in one line."""
    async_run = [*SORTING, "log.checkpoint_every=2", "cluster.rollout_workers=1", "cluster.max_staleness=1",
                 "algo.tis_cap=2", f"out_dir={tmp_path / 'run'}"]
    first, run_dir = run_training(load_config(None, [*async_run, "algo.epochs=2"]))
    records, _ = run_training(resume_config(run_dir, ["algo.epochs=4"]), resume=run_dir)
    firsts = [r for r in records if r["kind"] == "train" and r["step"] % 2 == 0]  # each epoch's first step
    assert [r["cluster/staleness"] for r in firsts] == [0.0, 1.0, 0.0, 1.0]
    assert [r["cluster/weights_version"] for r in firsts] == [0.0, 0.0, 4.0, 4.0]
    assert records[:len(first)] == first
    # the run's Ray was this test's: its session folder stays
    context = ray_local.get_runtime_context()
    assert Path(context.get_temp_dir(), context.get_session_name()).is_dir()
    assert main(["train", f"resume={run_dir}", "algo.epochs=6", "cluster.rollout_workers=0"]) == 2
    err = rlvr_stderr(capsys.readouterr().err)
    assert err.count("\n") == 0 and "cluster.max_staleness" in err, err
    assert len(read_records(run_dir)) == len(records)  # nothing ran


def test_an_asynchronous_run_killed_mid_run_resumes_to_the_straight_runs_records(ray_local, tmp_path, monkeypatch):
    """max_staleness=1: every checkpoint but the last falls where the next epoch's batch is in
    flight, sampled with the weights one version old. The checkpoint keeps that batch, so the
    resumed run trains on it (not on one resampled with the newer weights) and its records,
    cluster/staleness and cluster/weights_version included, are the straight run's."""
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # the killed run's private Ray: its folder goes here
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    args = [*QUIET, "algo.inner_steps=2", "log.eval_every=10", "algo.epochs=60", "log.checkpoint_every=1",
            "cluster.rollout_workers=1", "cluster.max_staleness=1", "algo.tis_cap=2"]
    killed = tmp_path / "killed"
    try:
        sigkill_mid_run([f"out_dir={killed}", *args], killed)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    resumed_from = list_checkpoints(killed)[-1].name
    assert main(["train", f"resume={killed}"]) == 0  # here, on the test's Ray
    straight = train(load_config(None, args))
    assert without_timings(read_records(killed)) == without_timings(straight), resumed_from
    firsts = [r for r in straight if r["kind"] == "train" and r["step"] % 2 == 0]
    assert [r["cluster/staleness"] for r in firsts[:3]] == [0.0, 1.0, 1.0]  # the batches were in flight


_WATCH_SIGTERM = r"""
import ctypes, signal, sys, threading, time
from pathlib import Path
from rlvr.cluster.session import Cluster
from rlvr.config import load_config

libc = ctypes.CDLL(None)
class Action(ctypes.Structure):
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                ("restorer", ctypes.c_void_p)]

def c_handler():  # the kernel's view: what a SIGTERM does now, whatever Python believes
    action = Action()
    libc.sigaction(signal.SIGTERM, None, ctypes.byref(action))
    return action.handler

signal.signal(signal.SIGTERM, lambda signum, frame: None)
cluster = Cluster(load_config(None, ["cluster.rollout_workers=1", "cluster.address=null"]), None)
cluster.rollouts = None  # no actors: Ray itself is what this watches
session = cluster.session_dir
seen, done = set(), False
def watch():
    while not done:
        seen.add(c_handler())
        time.sleep(0.0005)
watcher = threading.Thread(target=watch)
watcher.start()
cluster.close()
done = True
watcher.join()
print("default" if None in seen else "handled", "left" if session.exists() else "removed")
"""


def test_a_runs_own_ray_leaves_its_stop_handler_in_place_while_it_shuts_down(tmp_path):
    """Ray's crash handler set SIGTERM to the default action midway through ray.shutdown, so a
    second stop signal then killed the run (-15) and left its session folder."""
    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="rt", dir="/tmp"),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", None)
    try:
        done = subprocess.run([sys.executable, "-c", _WATCH_SIGTERM], env=env, capture_output=True, text=True,
                              timeout=120)
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    assert done.stdout.split() == ["handled", "removed"], done.stderr[-2000:]
