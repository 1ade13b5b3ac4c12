"""The figures (``rlvr plot``, ``rlvr.runs.metrics.draw_runs``): labelled axes, one legend, runs told apart,
names drawn literally, no run's own figure overwritten."""

import json

from helpers import QUIET, train_record
from rlvr.cli import main
from rlvr.runs.metrics import draw_runs, plot_runs


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
    from rlvr.runs.summary import plot_labels

    labels, eval_label = plot_labels(runs)
    assert labels == ["run0 (seed 0)", "run1 (seed 1)"] and eval_label == "training prompts"


def run_dir(path, records):
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_plot_of_several_runs_overwrites_no_runs_own_figure(tmp_path, monkeypatch, capsys):
    runs = [run_dir(tmp_path / name, [train_record(e) for e in range(3)]) for name in ("a", "b")]
    (runs[0] / "plot.png").write_bytes(b"a's own figure")
    monkeypatch.chdir(tmp_path)
    assert main(["plot", str(runs[0]), str(runs[1])]) == 0
    assert (runs[0] / "plot.png").read_bytes() == b"a's own figure"
    assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"
    assert "wrote compare.png" in capsys.readouterr().out
    assert main(["plot", str(runs[1])]) == 0  # one run: its own figure, redrawn
    assert (runs[1] / "plot.png").is_file()


def test_names_with_dollars_are_drawn_as_text(tmp_path):
    records = [train_record(e) for e in range(3)] + [{"kind": "eval", "epoch": 2, "step": 2, "greedy_solve_rate": 0.0}]
    names = {"cost $5": records, r"$\frac{1$": records, r"a$\undefinedmacro$b": records}
    plot_runs(names, tmp_path / "p.png", title=r"$\badtitle$")  # mathtext would raise on each of these
    fig = draw_runs(names, r"$x$")
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [r"cost \$5", r"\$\frac{1\$",
                                                                   r"a\$\undefinedmacro\$b"]
    labelled = run_dir(tmp_path / "$\\oops$", records)
    assert main(["plot", str(labelled)]) == 0
    assert main(["report", str(labelled)]) == 0


def test_a_constant_zero_solve_rate_is_drawn_on_its_whole_range():
    records = [train_record(e) for e in range(3)] + [{"kind": "eval", "epoch": e, "step": e, "greedy_solve_rate": 0.0}
                                                     for e in range(3)]
    fig = draw_runs({"run": records})
    solve = next(ax for ax in fig.axes if ax.get_title().startswith("greedy solve rate"))
    low, high = solve.get_ylim()
    assert -0.1 < low <= 0 and 1 <= high < 1.1  # not -0.04 to 0.04 around the zeros
