import subprocess
import sys

from rlvr.cli import main
from rlvr.metrics import read_records, summary


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
