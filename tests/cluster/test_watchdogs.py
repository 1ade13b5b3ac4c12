"""Watchdogs: a learner or rollout worker that hangs (here: stopped with SIGSTOP, as a
wedged process is) ends the run within ``cluster.call_timeout`` with one line naming it,
what it was doing and for how long, and its Ray actors are ended (nothing left running)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from ray_actors import record_actors

from helpers import QUIET, rlvr_stderr
from rlvr.api import run_loop as train
from rlvr.cli import main
from rlvr.config import load_config
from rlvr.loop.state import TrainingError

pytestmark = pytest.mark.ray

RUN = QUIET + ["algo.epochs=3", "algo.inner_steps=2", "log.eval_every=3", "log.checkpoint_every=0",
               "cluster.call_timeout=2"]


def gone(pids, timeout=15.0):
    """Whether every process in ``pids`` has ended (Ray force-kills a stopped actor after a grace)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return True
        time.sleep(0.1)
    return False


def stop_after_epoch(epoch, pids_of, rank, stopped):
    """on_epoch_end: SIGSTOP process ``rank`` of ``pids_of()`` once ``epoch`` is done."""

    def on_epoch_end(st):
        if st.epoch == epoch and not stopped:
            pids = pids_of()
            os.kill(pids[rank], signal.SIGSTOP)
            stopped.extend(pids)

    return on_epoch_end


def resume_stopped(pids):
    for pid in pids:  # never leave a stopped process behind, whatever the test found
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_a_learner_that_hangs_in_its_step_ends_the_run_naming_it(ray_local, monkeypatch):
    built, stopped = record_actors(monkeypatch), []
    clock = time.monotonic()
    try:
        with pytest.raises(TrainingError) as caught:
            train(load_config(None, RUN + ["cluster.learners=2"]),
                  on_epoch_end=stop_after_epoch(1, lambda: built[-1].pids(), 1, stopped))
        waited = time.monotonic() - clock
        message = str(caught.value)
        assert "\n" not in message and message.startswith(
            "epoch 1, step 2: learner rank 1 hung while taking its optimizer step: no answer after 2."), message
        assert "rank 1 does not answer at all" in message and "rank 0 waits in the all-reduce" in message
        assert "checkpoints written before are intact" in message
        assert waited < 20  # the timeout (2 s) and the question to each learner (at most 5 s), not a hang
        assert gone(stopped)  # both learners ended, the stopped one included
    finally:
        resume_stopped(stopped)


def test_a_rollout_worker_that_hangs_ends_the_run_in_one_line(ray_local, monkeypatch, tmp_path, capsys):
    """No restart: a hang is no crash Ray sees, and the checkpoints are intact."""
    built, stopped = record_actors(monkeypatch), []
    import rlvr.runs.launch

    checkpointer = rlvr.runs.launch._checkpointer

    def stopping_checkpointer(*args):
        on_epoch_end, stop = checkpointer(*args), stop_after_epoch(1, lambda: built[-1].worker_pids(), 0, stopped)
        return lambda st: (on_epoch_end(st), stop(st))

    monkeypatch.setattr(rlvr.runs.launch, "_checkpointer", stopping_checkpointer)
    try:
        code = main(["train", *RUN, "log.checkpoint_every=1", "cluster.rollout_workers=1",
                     f"out_dir={tmp_path / 'run'}"])
        err = rlvr_stderr(capsys.readouterr().err)
        assert code == 2 and err.count("\n") == 0, err
        assert err.startswith("rlvr: error: epoch 1, step 2: rollout worker 0 gave no answer within 2 s "
                              "(cluster.call_timeout) while sampling and grading the batch of epoch 1 "
                              "(weights version 2). The run stops;"), err
        assert gone(stopped)
    finally:
        resume_stopped(stopped)


class Probe:
    """A learner's answer to ``activity`` as the fake Ray below gives it: a value, an error, or none."""

    def __init__(self, answer):
        self.answer = answer


class FakeLearner:
    def __init__(self, answer):
        self.activity, self.answer = self, answer

    def options(self, concurrency_group):
        assert concurrency_group == "watch"  # asked beside the call in progress, not queued behind it
        return self

    def remote(self):
        return Probe(self.answer)


class FakeRay:
    def wait(self, refs, num_returns, timeout):
        return refs, []

    def get(self, probe, timeout=None):
        from ray.exceptions import GetTimeoutError

        if probe.answer is None:
            raise GetTimeoutError("no answer")
        if isinstance(probe.answer, BaseException):
            raise probe.answer
        return probe.answer


def learners(*answers):
    return [FakeLearner(answer) for answer in answers]


def test_the_watchdog_names_the_learner_its_peers_wait_for():
    """Busy outside a collective (a Python-level hang in its backward pass), silent, dead, or
    all waiting in a collective: each case names the right rank, in one line."""
    from ray.exceptions import RayActorError

    from rlvr.cluster.watch import diagnose

    doing = "taking its optimizer step"
    waiting = ("the all-reduce of the gradients", 3.0, True)
    busy = diagnose(FakeRay(), learners(waiting, ("computing its share's gradients", 3.5, False)), doing, 3.0)
    assert busy == ("learner rank 1 hung while taking its optimizer step: no answer after 3.0 s; rank 1 has been "
                    "computing its share's gradients for 3.5 s; rank 0 waits in the all-reduce of the gradients")
    silent = diagnose(FakeRay(), learners(None, ("idle", 0.1, False), waiting), doing, 3.0)
    assert silent.startswith("learner rank 0 hung while taking its optimizer step: no answer after 3.0 s; rank 0 "
                             "does not answer at all") and silent.endswith("rank 2 waits in the all-reduce of the "
                                                                          "gradients")
    dead = diagnose(FakeRay(), learners(waiting, RayActorError()), doing, 0.2, failed=(0, RuntimeError("reset")))
    assert dead == ("learner rank 1 died while taking its optimizer step, after 0.2 s (The actor experienced an "
                    "error before finishing this task.)")
    failed = diagnose(FakeRay(), learners(("idle", 0.0, False), ("idle", 0.0, False)), doing, 0.5,
                      failed=(1, RuntimeError("CUDA out of memory\nmore lines")))
    assert failed == "learner rank 1 failed while taking its optimizer step, after 0.5 s: CUDA out of memory"
    stuck = diagnose(FakeRay(), learners(waiting, waiting), doing, 3.0)
    assert stuck == ("learner ranks 0, 1 hung in the all-reduce of the gradients while taking its optimizer step: "
                     "no answer after 3.0 s")
