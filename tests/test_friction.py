"""Friction found by using the CLI (issue 11): re-running compare, runs that fail before
their first checkpoint, sft re-runs, hub names offline, finished runs resumed, what the
evaluation is labelled, output when stderr is not a terminal, the figures, GSM8K skips."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from rlvr.cli import main
from rlvr.metrics import read_records, without_timings

QUIET = ["log.progress=false", "log.plot=false"]
FAIL_FIRST_EPOCH = ["rewards.strict=true", "rewards.timeout=null", "rewards.functions=['rlvr.rewards.faults:flaky']"]


def cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """``rlvr ARGS`` in a child process, stdout and stderr captured (pipes: not a terminal)."""
    return subprocess.run([sys.executable, "-m", "rlvr.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


# ---------------------------------------------------------------- a. compare run again


def test_compare_run_again_reuses_finished_runs_and_resumes_shorter_ones(tmp_path, capsys):
    # eval every epoch: the 1-epoch run evaluates at its end, as the 2-epoch one then does too
    args = ["--modes", "raw", "--seeds", "0,1", "log.eval_every=1", *QUIET]
    again, straight = tmp_path / "again", tmp_path / "straight"
    assert main(["compare", *args, f"out_dir={again}", "algo.epochs=1"]) == 0
    (again / "raw-seed1" / "checkpoints").rename(tmp_path / "gone")  # seed 1 as if killed before its checkpoint
    capsys.readouterr()
    assert main(["compare", *args, f"out_dir={again}", "algo.epochs=2"]) == 0  # 2 epochs now: both go on
    out = capsys.readouterr().out
    assert "raw-seed0: resumed" in out and "raw-seed1: started again" in out
    assert main(["compare", *args, f"out_dir={straight}", "algo.epochs=2"]) == 0
    for name in ("raw-seed0", "raw-seed1"):
        assert without_timings(read_records(again / name)) == without_timings(read_records(straight / name))
    capsys.readouterr()
    # A third time with the same settings: nothing to do, the records are reused as they are.
    before = (again / "raw-seed0" / "metrics.jsonl").read_bytes()
    assert main(["compare", *args, f"out_dir={again}", "algo.epochs=2"]) == 0
    assert "raw-seed0: finished, records reused" in capsys.readouterr().out
    assert (again / "raw-seed0" / "metrics.jsonl").read_bytes() == before
    # Other settings than the stored run's: refused by name, not silently mixed.
    assert main(["compare", *args, f"out_dir={again}", "algo.epochs=2", "optim.lr=0.01"]) == 2
    assert "optim.lr" in capsys.readouterr().err


def test_compare_help_says_what_a_second_run_does(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    assert "finished runs are reused" in " ".join(capsys.readouterr().out.split())


# ---------------------------------------------------------------- b. a run that fails in its first epoch


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


# ---------------------------------------------------------------- c. sft run again


def test_sft_run_again_suggests_what_sft_accepts(tmp_path, capsys):
    out = tmp_path / "sft"
    (out / "model").mkdir(parents=True)
    (out / "sft_metrics.jsonl").write_text("")
    assert main(["sft", f"out_dir={out}", "task.name=sort_text", "policy.name=causal_lm",
                 f"policy.options={{model: {tmp_path / 'base'}}}"]) == 2
    err = capsys.readouterr().err
    assert "resume=" not in err  # sft has no resume
    assert "another out_dir" in err and "sft" in err


# ---------------------------------------------------------------- d. a hub name offline


def _offline_env(tmp_path: Path) -> dict:
    """No network to the hub (a port that refuses at once) and an empty or given cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    return env


def test_hub_name_not_available_offline_fails_fast_naming_the_model(tmp_path):
    start = time.monotonic()
    proc = cli("train", f"out_dir={tmp_path / 'run'}", "task.name=sort_text", "policy.name=causal_lm",
               "policy.options={model: nobody/no-such-model}", *QUIET, env=_offline_env(tmp_path), timeout=40)
    seconds = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr
    assert "nobody/no-such-model" in proc.stderr and "policy.options.model" in proc.stderr
    assert "Retrying" not in proc.stderr
    assert seconds < 15  # python start and imports; before: 5 retries, ~50 s
    assert not (tmp_path / "run").exists()


def test_locate_model_offline(tmp_path, tiny_model):
    from rlvr.policies.hf_model import locate_model

    code = ("import sys; from rlvr.policies.hf_model import locate_model\n"
            "try:\n    print(locate_model(sys.argv[1]))\nexcept FileNotFoundError as err:\n"
            "    print('error:', err); sys.exit(2)\n")
    env = _offline_env(tmp_path)
    start = time.monotonic()
    missing = subprocess.run([sys.executable, "-c", code, "nobody/no-such-model"], env=env, capture_output=True,
                             text=True, timeout=30)
    assert missing.returncode == 2 and "nobody/no-such-model" in missing.stdout
    assert "cannot be reached" in missing.stdout and time.monotonic() - start < 10
    # A model in the hub cache loads offline from its snapshot folder.
    repo = tmp_path / "hf" / "hub" / "models--somebody--tiny"
    shutil.copytree(tiny_model, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    cached = subprocess.run([sys.executable, "-c", code, "somebody/tiny"], env=env, capture_output=True, text=True,
                            timeout=30)
    assert cached.returncode == 0, cached.stdout + cached.stderr
    assert Path(cached.stdout.strip()) == repo / "snapshots" / "abc123"
    # A local folder is itself; a path that is not there is an error naming it, with no hub call.
    assert locate_model(str(tiny_model)) == str(tiny_model)
    with pytest.raises(FileNotFoundError, match="no folder"):
        locate_model(str(tmp_path / "nothing" / "here"))


# ---------------------------------------------------------------- e. resume of a finished run


@pytest.mark.parametrize("epochs", [[], ["algo.epochs=1"]])
def test_resume_of_a_finished_run_says_so(tmp_path, capsys, epochs):
    out = tmp_path / "run"
    assert main(["train", f"out_dir={out}", "algo.epochs=2", *QUIET]) == 0
    before = (out / "metrics.jsonl").read_bytes()
    assert main(["train", f"resume={out}", *epochs]) == 2
    err = capsys.readouterr().err
    assert "is finished" in err and "algo.epochs=2" in err and "raise algo.epochs" in err
    assert (out / "metrics.jsonl").read_bytes() == before and not (out / "resumes.jsonl").exists()


# ---------------------------------------------------------------- f. what the evaluation is on


def test_summary_says_the_lecture_evaluates_its_training_prompts(tmp_path, capsys):
    assert main(["train", f"out_dir={tmp_path / 'a'}", "algo.epochs=1", *QUIET]) == 0
    out = capsys.readouterr().out
    assert "held-out" not in out and "training prompts" in out
    assert main(["train", f"out_dir={tmp_path / 'b'}", "algo.epochs=1", "task.prompts=null", "task.eval_size=4",
                 *QUIET]) == 0
    assert "held-out" in capsys.readouterr().out


def test_eval_prompts_label():
    from rlvr.config import load_config
    from rlvr.evaluation import eval_prompts_label

    assert eval_prompts_label(load_config(None, [])) == "training prompts"
    assert eval_prompts_label(load_config(None, ["task.prompts=null"])) == "held-out prompts"
    assert eval_prompts_label(load_config(None, ["task.name=sort_text", "policy.name=causal_lm"])) == \
        "held-out prompts"  # task.prompts is the sorting task's alone


# ---------------------------------------------------------------- g. output when stderr is not a terminal


def test_progress_without_a_terminal_is_plain_lines(tmp_path):
    proc = cli("train", f"out_dir={tmp_path / 'run'}", "algo.epochs=20", "algo.inner_steps=1", "log.plot=false")
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "epoch" in line]
    # every 2nd epoch of 20 (a tenth of the run), the reward and solve rate of that epoch
    assert [line.split()[2] for line in lines] == [f"{e}/20" for e in range(2, 21, 2)]
    assert "reward" in lines[0] and "solve rate" in lines[0]


def test_warnings_in_the_cli_are_one_clean_line(tmp_path):
    proc = cli("train", f"out_dir={tmp_path / 'run'}", "algo.epochs=1", "algo.loss=clipped", "algo.inner_steps=1",
               *QUIET)
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "ratio pi/pi_old is always 1" in line]
    assert len(warned) == 1 and warned[0].startswith("rlvr: warning: ")
    assert "UserWarning" not in proc.stderr and ".py:" not in proc.stderr


def test_cli_leaves_the_warning_format_of_library_users_alone(tmp_path):
    before = warnings.formatwarning
    assert main(["train", f"out_dir={tmp_path / 'run'}", "algo.epochs=1", *QUIET]) == 0
    assert warnings.formatwarning is before


# ---------------------------------------------------------------- h. the figures


def _records(losses_by_epoch: list[list[float]], reward: float = 1.0) -> list[dict]:
    records, step = [], 0
    for epoch, losses in enumerate(losses_by_epoch):
        for loss in losses:
            records.append({"kind": "train", "epoch": epoch, "step": step, "loss": loss, "reward_mean": reward})
            step += 1
        records.append({"kind": "eval", "epoch": epoch + 1, "step": step, "greedy_solve_rate": 0.0})
    return records


def test_figure_has_axis_labels_one_legend_and_distinct_styles():
    import matplotlib.pyplot as plt

    from rlvr.metrics import draw_runs

    same = _records([[1.0, 3.0], [5.0, 7.0]])
    fig = draw_runs({"a": same, "b": same, "c": [same, same]}, "t", "training prompts")
    try:
        assert all(ax.get_ylabel() for ax in fig.axes)
        assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)
        assert "training prompts" in fig.axes[2].get_title() or "training prompts" in fig.axes[2].get_ylabel()
        # equal curves stay visible: each run its own line style and marker
        curves = [line for line in fig.axes[2].get_lines() if not line.get_label().startswith("_")]
        styles = {(line.get_linestyle(), line.get_marker()) for line in curves}
        assert len(curves) == 3
        assert len(styles) == 3
        # the loss panel: the per-epoch mean (1+3)/2 = 2 and (5+7)/2 = 6 at each epoch's first step
        main_lines = [line for line in fig.axes[0].get_lines() if line.get_label() == "a"]
        assert len(main_lines) == 1
        assert list(main_lines[0].get_xdata()) == [0, 2] and list(main_lines[0].get_ydata()) == [2.0, 6.0]
    finally:
        plt.close(fig)


def test_plot_of_several_run_directories_names_each_with_its_seed(tmp_path, capsys):
    runs = []
    for seed in (0, 1):
        out = tmp_path / f"run{seed}"
        assert main(["train", f"out_dir={out}", "algo.epochs=1", f"seed={seed}", *QUIET]) == 0
        runs.append(str(out))
    from rlvr.cli import plot_labels

    labels, eval_label = plot_labels(runs)
    assert labels == ["run0 (seed 0)", "run1 (seed 1)"] and eval_label == "training prompts"


# ---------------------------------------------------------------- i. GSM8K tests when the data is missing


def test_pytest_summary_says_when_gsm8k_data_is_missing(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "tests").mkdir(parents=True)
    shutil.copy(Path(__file__).with_name("conftest.py"), checkout / "tests" / "conftest.py")
    (checkout / "tests" / "test_gsm8k.py").write_text(
        "import pytest\n\n@pytest.mark.skip(reason='GSM8K data not found')\ndef test_gsm8k():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=checkout,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    missing = tmp_path / "shared" / "data" / "gsm8k"
    assert f"GSM8K data not found at {missing}: 1 GSM8K test skipped" in proc.stdout
