"""Run directories: their names, one run at a time, what may change on resume, a run that stopped before its
first checkpoint replaced by a rerun (a finished one never), filesystem errors."""

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rlvr.runs.checkpoint
from helpers import QUIET
from rlvr.cli import main
from rlvr.config import ConfigError, load_config
from rlvr.runs.checkpoint import list_checkpoints
from rlvr.runs.metrics import JsonlSink, read_records, without_timings

BASE = ["log.progress=false", "log.plot=false", "seed=3"]


FAIL_FIRST_EPOCH = ["rewards.strict=true", "rewards.timeout=null", "rewards.functions=['faulty_rewards:flaky']"]


def hold_lock(run_dir):
    """Another process that holds RUN_DIR/.lock until its stdin closes."""
    code = ("import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('locked', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run_dir / ".lock")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "locked\n"
    return proc


def test_a_run_directory_in_use_is_refused_and_free_once_its_holder_exits(tmp_path, capsys):
    out, fresh = tmp_path / "run", tmp_path / "fresh"
    assert main(["train", f"out_dir={out}", "algo.epochs=1", *BASE]) == 0
    count = len(read_records(out))
    fresh.mkdir()
    holders = [hold_lock(out), hold_lock(fresh)]
    try:
        assert main(["train", f"resume={out}", "algo.epochs=2"]) == 2
        assert f"run directory {out} is in use by another process" in capsys.readouterr().err
        assert main(["train", f"out_dir={fresh}", "algo.epochs=1", *BASE]) == 2
        assert f"run directory {fresh} is in use by another process" in capsys.readouterr().err
    finally:
        for proc in holders:
            proc.communicate("")
    assert len(read_records(out)) == count
    # flock dies with its process: nothing stale is left to clean up.
    assert main(["train", f"resume={out}", "algo.epochs=2"]) == 0


def test_concurrent_starts_with_the_default_name_get_different_directories(tmp_path, monkeypatch):
    # Two starts between claiming a directory and writing into it must not pick the same one.
    from rlvr.runs.directory import new_run_dir

    monkeypatch.chdir(tmp_path)
    config = load_config(None, ["name=x"])
    (tmp_path / "runs" / "x-2").mkdir(parents=True)
    (tmp_path / "runs" / "x-2" / "config.yaml").write_text("{}")  # taken: holds a run
    with new_run_dir(config) as first, new_run_dir(config) as second:
        assert (first, second) == (Path("runs/x"), Path("runs/x-3"))
    with new_run_dir(config) as again:  # released and still empty: free again
        assert again == Path("runs/x")


@pytest.mark.parametrize("overrides, run_dir", [
    ([], "runs/lecture"),
    (["algo.deltas=normalized"], "runs/lecture"),  # the sorting toy: the lecture's run
    (["task.name=sort_text", "policy.name=causal_lm", "policy.options.model=runs/tiny_lm"], "runs/sort_text-tiny_lm"),
    (["task.name=arithmetic", "policy.name=causal_lm", "policy.options.model=runs/s/sft/model/"],
     "runs/arithmetic-sft"),  # rlvr sft's RUN_DIR/model: the run's folder
    (["task.name=sort_text", "policy.name=causal_lm", "policy.options.model=Qwen/Qwen2.5-0.5B"],
     "runs/sort_text-Qwen2.5-0.5B"),
    (["name=mine", "task.name=sort_text", "policy.name=causal_lm", "policy.options.model=runs/tiny_lm"], "runs/mine"),
])
def test_a_run_is_named_after_its_task_and_model_unless_named(overrides, run_dir):
    config = load_config(None, overrides)
    assert str(config.run_dir) == run_dir
    assert load_config(None, [f"name={config.name}", *overrides]) == config  # the name written back loads alike


def test_what_may_change_on_resume():
    from rlvr.runs.resume import resume_changes

    stored = load_config(None, ["algo.epochs=10"])
    changed = load_config(None, ["algo.epochs=20", "log.progress=false", "rewards.timeout=2", "threads=2"])
    assert resume_changes(stored, changed) == {
        "threads": {"was": None, "now": 2},
        "rewards.timeout": {"was": 10.0, "now": 2.0},
        "algo.epochs": {"was": 10, "now": 20},
        "log.progress": {"was": True, "now": False},
    }
    refused = r"resume cannot change algo.group_size \(was 10, now 4\); allowed on resume: "
    with pytest.raises(ConfigError, match=refused):
        resume_changes(stored, load_config(None, ["algo.group_size=4"]))
    # A decaying learning rate is laid out over algo.epochs: its length cannot change.
    cosine = load_config(None, ["optim.schedule=cosine"])
    with pytest.raises(ConfigError, match="algo.epochs .* optim.schedule='cosine'"):
        resume_changes(cosine, load_config(None, ["optim.schedule=cosine", "algo.epochs=200"]))


def test_run_failing_in_its_first_epoch_resumes_with_a_fix(tmp_path, capsys):
    failed, straight = tmp_path / "failed", tmp_path / "straight"
    assert main(["train", f"out_dir={failed}", "algo.epochs=2", *QUIET, *FAIL_FIRST_EPOCH]) == 4
    assert not (failed / "checkpoints").exists()
    # No checkpoint: nothing was computed that a change could contradict, so any change goes.
    assert main(["train", f"resume={failed}", "rewards.strict=false"]) == 0
    assert main(["train", f"out_dir={straight}", "algo.epochs=2", *QUIET, *FAIL_FIRST_EPOCH,
                 "rewards.strict=false"]) == 0
    assert without_timings(read_records(failed)) == without_timings(read_records(straight))
    assert "strict: false" in (failed / "config.yaml").read_text()


def test_run_failing_in_its_first_epoch_is_replaced_by_a_rerun_under_its_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "name=x", "algo.epochs=1", *QUIET, *FAIL_FIRST_EPOCH]) == 4
    with pytest.warns(UserWarning, match="stopped before its first checkpoint"):
        assert main(["train", "name=x", "algo.epochs=1", *QUIET]) == 0
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["x"]  # not runs/x-2 beside a dead one
    assert "strict: false" in (tmp_path / "runs" / "x" / "config.yaml").read_text()
    # The same with an explicit out_dir.
    out = tmp_path / "out"
    assert main(["train", f"out_dir={out}", "algo.epochs=1", *QUIET, *FAIL_FIRST_EPOCH]) == 4
    with pytest.warns(UserWarning, match="stopped before its first checkpoint"):
        assert main(["train", f"out_dir={out}", "algo.epochs=1", *QUIET]) == 0
    assert len(list((out / "checkpoints").iterdir())) == 1


def test_a_finished_run_is_never_replaced(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "name=x", "algo.epochs=1", *QUIET]) == 0
    with pytest.warns(UserWarning, match="runs/x holds another run; this one writes runs/x-2"):
        assert main(["train", "name=x", "algo.epochs=1", *QUIET]) == 0
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["x", "x-2"]


def test_sft_run_again_suggests_what_sft_accepts(tmp_path, capsys):
    out = tmp_path / "sft"
    (out / "model").mkdir(parents=True)
    (out / "sft_metrics.jsonl").write_text("")
    assert main(["sft", f"out_dir={out}", "task.name=sort_text", "policy.name=causal_lm",
                 f"policy.options={{model: {tmp_path / 'base'}}}"]) == 2
    err = capsys.readouterr().err
    assert "resume=" not in err  # sft has no resume
    assert "another out_dir" in err and "sft" in err


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_an_out_dir_that_cannot_be_a_directory_is_one_clear_line(tmp_path, capsys, where):
    file = tmp_path / "file"
    file.write_text("not a directory")
    out = file if where == "a file" else file / "run"
    assert main(["train", f"out_dir={out}", "algo.epochs=1", *BASE]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rlvr: error: cannot create run directory {out}: ") and err.count("\n") == 1
    assert file.read_text() == "not a directory"


def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_while_checkpointing_leaves_no_partial_checkpoint_and_resumes(tmp_path, capsys, monkeypatch):
    straight, out = tmp_path / "straight", tmp_path / "run"
    args = ["algo.epochs=3", "log.checkpoint_every=1", *BASE]
    assert main(["train", f"out_dir={straight}", *args]) == 0
    save, calls = rlvr.runs.checkpoint.torch.save, []

    def full_on_the_second(payload, path):
        calls.append(path)
        if len(calls) == 2:
            Path(path).write_bytes(b"half a file")
            disk_full()
        save(payload, path)

    monkeypatch.setattr(rlvr.runs.checkpoint.torch, "save", full_on_the_second)
    assert main(["train", f"out_dir={out}", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlvr: error: cannot write a checkpoint") and "No space left on device" in err
    assert err.count("\n") == 1
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-000000010"]  # no .tmp-step-*
    monkeypatch.setattr(rlvr.runs.checkpoint.torch, "save", save)
    assert main(["train", f"resume={out}"]) == 0
    assert without_timings(read_records(out)) == without_timings(read_records(straight))
    assert [p.name for p in list_checkpoints(out)] == ["step-000000020", "step-000000030"]


def test_a_full_disk_while_writing_metrics_is_one_clear_line(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setattr(JsonlSink, "__call__", disk_full)
    assert main(["train", f"out_dir={out}", "algo.epochs=1", *BASE]) == 2
    err = capsys.readouterr().err
    assert err == f"rlvr: error: cannot write {out / 'metrics.jsonl'}: No space left on device\n"


def test_a_second_signal_while_the_runs_parts_close_lets_them_close(tmp_path, capsys):
    """A second SIGTERM soon after the first (a Ray run shutting down its Ray) does not abort
    the parts' closing halfway (which left Ray's session folder); the run stops after it."""
    import contextlib
    import os
    import signal
    import types

    from rlvr.runs.stops import stop_on_signals

    closed = []

    @contextlib.contextmanager
    def parts():
        yield "parts"
        os.kill(os.getpid(), signal.SIGTERM)  # the second signal, in the middle of closing
        closed.append("ray shut down, session folder removed")

    st = types.SimpleNamespace(stop_requested=False)
    with stop_on_signals(st, tmp_path) as stops, stops.shielded(parts()) as value:
        assert value == "parts"
        os.kill(os.getpid(), signal.SIGTERM)  # the first: stop after this step
        assert st.stop_requested
    assert closed == ["ray shut down, session folder removed"]
    assert stops.received == [signal.SIGTERM, signal.SIGTERM]
    assert "it stops once they are closed" in capsys.readouterr().out
