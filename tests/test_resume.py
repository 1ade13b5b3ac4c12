"""Checkpoints and resume: exact continuation, kills, corruption, Ctrl-C."""

import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from rlvr.checkpoint import list_checkpoints, load_latest
from rlvr.cli import main
from rlvr.metrics import read_records, without_timings

BASE = ["log.progress=false", "log.plot=false", "algo.loss=clipped", "algo.kl_coef=0.05",
        "algo.ref_update_every=3", "log.eval_every=2", "seed=5"]


def final_weights(run_dir):
    _, payload = load_latest(run_dir)
    return payload["policy"]


def assert_same_run(a, b):
    assert without_timings(read_records(a)) == without_timings(read_records(b))
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


def test_resume_after_k_epochs_equals_straight_run(tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["train", f"out_dir={straight}", "algo.epochs=12", *BASE]) == 0
    assert main(["train", f"out_dir={split}", "algo.epochs=6", *BASE]) == 0
    assert main(["train", f"resume={split}", "algo.epochs=12"]) == 0
    assert_same_run(straight, split)


def test_sigkill_at_a_random_point_then_resume(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    args = ["algo.epochs=300", "log.checkpoint_every=1", *BASE]
    assert main(["train", f"out_dir={straight}", *args]) == 0
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.cli", "train", f"out_dir={killed}", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Wait until training is under way, then kill at a random moment.
    deadline = time.time() + 60
    while not list_checkpoints(killed) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    time.sleep(random.Random(os.getpid()).uniform(0.0, 0.3))
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL  # killed mid-run, not finished
    assert main(["train", f"resume={killed}"]) == 0
    assert_same_run(straight, killed)


def test_corrupted_checkpoint_falls_back_to_the_previous(tmp_path):
    out = tmp_path / "run"
    assert main(["train", f"out_dir={out}", "algo.epochs=4", "log.checkpoint_every=2", *BASE]) == 0
    older, newest = list_checkpoints(out)
    data = (newest / "trainer.pt").read_bytes()
    (newest / "trainer.pt").write_bytes(data[: len(data) // 2])  # truncated
    with pytest.warns(UserWarning, match="does not match its checksum"):
        checkpoint, payload = load_latest(out)
    assert checkpoint == older and payload["epoch"] == 2


def test_half_written_checkpoint_is_ignored(tmp_path):
    out = tmp_path / "run"
    assert main(["train", f"out_dir={out}", "algo.epochs=2", *BASE]) == 0
    (out / "checkpoints" / ".tmp-step-000000030").mkdir()  # a kill during a write leaves this
    checkpoint, payload = load_latest(out)
    assert checkpoint.name == "step-000000020" and payload["epoch"] == 2


def test_sigint_stops_after_the_step_with_a_checkpoint_and_resumes_exactly(tmp_path):
    straight, out = tmp_path / "straight", tmp_path / "run"
    args = ["algo.epochs=400", "algo.inner_steps=7", "log.checkpoint_every=1000", *BASE]
    assert main(["train", f"out_dir={straight}", *args]) == 0
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.cli", "train", f"out_dir={out}", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 60
    # Signal as soon as training is under way (a few records written), well before the end.
    while (not metrics.exists() or metrics.read_text().count("\n") < 5) and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "resume=" in err
    (checkpoint,) = list_checkpoints(out)
    _, payload = load_latest(out)
    train_records = [r for r in read_records(out) if r["kind"] == "train"]
    assert len(read_records(out)) == payload["num_records"]
    assert checkpoint.name == f"step-{payload['step']:09d}" and len(train_records) == payload["step"] < 400 * 7
    assert main(["train", f"resume={out}"]) == 0
    assert_same_run(straight, out)


def test_resume_from_the_middle_of_an_epoch(tmp_path):
    # A checkpoint written mid-epoch carries that epoch's batch: resuming takes the
    # remaining inner steps on the same responses.
    from rlvr.config import load_config
    from rlvr.runs import run_training

    straight, split = tmp_path / "straight", tmp_path / "split"
    args = ["algo.epochs=4", "algo.inner_steps=5", *BASE]
    assert main(["train", f"out_dir={straight}", *args]) == 0
    config = load_config(None, args + [f"out_dir={split}"])
    import rlvr.trainer as trainer

    original = trainer.inner_step
    calls = {"n": 0}

    def stop_after_eight(config, st, rollout):
        record = original(config, st, rollout)
        calls["n"] += 1
        if calls["n"] == 8:  # epoch 1, inner step 3 of 5
            st.stop_requested = True
        return record

    trainer.inner_step = stop_after_eight
    try:
        with pytest.raises(KeyboardInterrupt):
            run_training(config)
    finally:
        trainer.inner_step = original
    _, payload = load_latest(split)
    assert (payload["epoch"], payload["inner_step"], payload["step"]) == (1, 3, 8)
    assert payload["rollout"] is not None
    assert main(["train", f"resume={split}"]) == 0
    assert_same_run(straight, split)


def test_resume_of_a_directory_without_a_run_is_a_clear_error(tmp_path, capsys):
    assert main(["train", f"resume={tmp_path}"]) == 2
    assert "no config.yaml" in capsys.readouterr().err
