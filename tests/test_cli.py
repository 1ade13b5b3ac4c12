"""The command line: train, plot, compare (and running compare again), and the console it leaves: plain
progress lines without a terminal, warnings in one line, no library noise."""

import subprocess
import sys
import warnings

import pytest

from helpers import QUIET, cli, rlvr_cli
from rlvr.cli import main
from rlvr.runs.metrics import read_records, summary, without_timings


def test_train_writes_a_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", f"out_dir={out}", "algo.epochs=20", "log.progress=false", "seed=1"]) == 0
    assert {p.name for p in out.iterdir()} == {"config.yaml", "metrics.jsonl", "plot.png", "checkpoints", "samples.md",
                                              ".lock"}  # free once the run ends: flock dies with its process
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000000100", "step-000000200"]

    records = read_records(out)
    s = summary(records)
    assert s["reward_end"] > s["reward_start"]
    assert "reward start" in capsys.readouterr().out
    # The same out_dir again is refused rather than overwritten.
    assert main(["train", f"out_dir={out}", "algo.epochs=1", "log.progress=false"]) == 2
    assert len(read_records(out)) == len(records)


def test_plot_redraws_what_the_records_say(tmp_path):
    import matplotlib.pyplot as plt

    runs = [tmp_path / "a", tmp_path / "b"]
    for seed, out in enumerate(runs):
        main(["train", f"out_dir={out}", "algo.epochs=2", f"seed={seed}", "log.progress=false", "log.plot=false"])
        assert not (out / "plot.png").exists()
        assert main(["plot", str(out)]) == 0
    a, b = (plt.imread(out / "plot.png") for out in runs)
    height, width = a.shape[:2]
    assert a.shape == b.shape and abs(width / height - 15 / 3.8) < 0.01  # three 5 x 3.8 inch panels
    assert a[..., :3].std() > 0.05  # drawn on, not a blank canvas
    assert (a != b).any()  # other records, other curves
    assert main(["plot", str(runs[0]), str(runs[1]), "--out", str(tmp_path / "both.png")]) == 0
    assert (plt.imread(tmp_path / "both.png") != a).any()  # the overlay adds the second run


def test_invalid_config_exits_nonzero_and_leaves_nothing(tmp_path):
    out = tmp_path / "never"
    proc = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", f"out_dir={out}", "algo.deltas=wrong"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2
    assert "algo.deltas='wrong' is not allowed" in proc.stderr
    assert not out.exists()


def test_compare_reproduces_the_lecture_finding(tmp_path, capsys):
    # The lecture: centering the rewards ends above raw rewards on its 3 prompts.
    out = tmp_path / "cmp"
    assert main(["compare", f"out_dir={out}", "log.progress=false", "--seeds", "0,1,2"]) == 0
    assert (out / "compare.png").exists()
    final = {}
    for mode in ("raw", "centered", "normalized"):
        ends = [summary(read_records(out / f"{mode}-seed{s}"))["reward_end"] for s in (0, 1, 2)]
        final[mode] = sum(ends) / 3
    assert final["centered"] > final["raw"]
    assert "mean over seeds" in capsys.readouterr().out
    config = (out / "raw-seed1" / "config.yaml").read_text()
    assert "deltas: raw" in config and "seed: 1" in config


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


def test_compare_names_a_failing_run_and_keeps_the_others(tmp_path, capsys):
    # the runs train side by side: one refused (its directory holds other settings) fails alone
    out, args = tmp_path / "cmp", ["--modes", "raw", "algo.epochs=1", *QUIET]
    assert main(["compare", *args, "--seeds", "1", f"out_dir={out}", "optim.lr=0.01"]) == 0
    capsys.readouterr()
    assert main(["compare", *args, "--seeds", "0,1", f"out_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert "run raw-seed1 failed" in err and "optim.lr" in err
    assert [r["kind"] for r in read_records(out / "raw-seed0")].count("train") == 10


def test_compare_takes_overrides_before_and_after_its_options(tmp_path):
    # argparse alone refuses the items after an option ("unrecognized arguments: algo.epochs=1")
    out = tmp_path / "cmp"
    assert main(["compare", f"out_dir={out}", "--modes", "raw", "--seeds", "0", "algo.epochs=1", *QUIET]) == 0
    assert "epochs: 1\n" in (out / "raw-seed0" / "config.yaml").read_text()
    with pytest.raises(SystemExit):  # an unknown option is still argparse's error
        main(["compare", "--modes", "raw", "--sed", "0", "algo.epochs=1"])


def test_compare_help_says_what_a_second_run_does(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    assert "finished runs are reused" in " ".join(capsys.readouterr().out.split())


# ---------------------------------------------------------------- the console


def test_progress_without_a_terminal_is_plain_lines(tmp_path, capsys):
    assert main(["train", f"out_dir={tmp_path / 'run'}", "algo.epochs=20", "algo.inner_steps=1", "log.plot=false"]) == 0
    err = capsys.readouterr().err  # capsys's stderr, like a pipe, is not a terminal
    assert "\r" not in err
    lines = [line for line in err.splitlines() if "epoch" in line]
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


NOISE = ("Loading weights", "Writing model shards", "deprecated", "Warning")


def test_lm_commands_print_no_library_noise(lora_run):
    where, stderr = lora_run
    done = rlvr_cli(["export", "runs/lora", "--out", "merged"], where)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (where / "merged" / "config.json").is_file()
    for text in (stderr, done.stderr):
        assert not [word for word in NOISE if word in text], text


def test_the_quiet_console_is_undone_after_the_command(tiny_model, tmp_path):
    import warnings

    from transformers.utils import logging as hf_logging

    filters = list(warnings.filters)
    assert hf_logging.is_progress_bar_enabled()
    assert main(["train", "task.name=sort_text", "task.options={num_digits: 3, num_eval: 2}", "policy.name=causal_lm",
                 f"policy.options={{model: {tiny_model}, max_new_tokens: 6}}", "algo.epochs=1", "algo.group_size=2",
                 "task.prompts_per_epoch=2", f"out_dir={tmp_path / 'run'}", *QUIET]) == 0
    assert hf_logging.is_progress_bar_enabled() and warnings.filters == filters


def test_the_python_api_prints_no_library_noise(tiny_model, tmp_path):
    config = {"task": {"name": "sort_text", "prompts_per_epoch": 2, "options": {"num_digits": 3, "num_eval": 2}},
              "policy": {"name": "causal_lm", "options": {"model": str(tiny_model), "max_new_tokens": 6}},
              "algo": {"epochs": 1, "group_size": 2}, "log": {"progress": False, "plot": False}}
    script = f"import rlvr\nrlvr.train({config!r}, out_dir={str(tmp_path / 'run')!r})\n"
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not [word for word in NOISE if word in done.stderr], done.stderr


def test_the_rlvr_process_ignores_further_stop_signals_once_it_is_stopping(monkeypatch, capsys):
    """``rlvr`` (no argv: the process's own command) exits a moment after a stop; a SIGTERM
    then would kill it midway (exit -15, no final line), so it is ignored from there."""
    import signal

    import rlvr.cli
    from rlvr.runs.launch import Stopped

    def stopped(args):
        raise Stopped("stopped by SIGTERM at epoch 1", signal.SIGTERM)

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(sys, "argv", ["rlvr", "train", "algo.epochs=1"])
    monkeypatch.setattr(rlvr.cli, "cmd_train", stopped)
    try:
        parser = rlvr.cli.build_parser()
        monkeypatch.setattr(rlvr.cli, "build_parser", lambda: parser)
        for action in parser._subparsers._group_actions[0].choices.values():
            if action.prog.endswith(" train"):
                action.set_defaults(func=stopped)
        assert rlvr.cli.main() == 143
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert capsys.readouterr().err.strip() == "rlvr: stopped by SIGTERM at epoch 1"
        signal.signal(signal.SIGTERM, before[signal.SIGTERM])
        assert rlvr.cli.main(["config"]) == 0  # an argv list: an in-process call, its handlers untouched
        assert signal.getsignal(signal.SIGTERM) is before[signal.SIGTERM]
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
