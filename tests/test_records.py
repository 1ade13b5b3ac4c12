"""What a run records and how its readers take it: metrics.jsonl as strict JSON, samples
as text a person reads, figures that overwrite no run's own and draw names literally."""

import json
import math
from types import SimpleNamespace

import pytest
import torch

import conftest
from rlvr.cli import main
from rlvr.diagnostics import hacking_warnings
from rlvr.evaluation import sample_table
from rlvr.metrics import JsonlSink, draw_runs, plot_runs, read_records, summary, write_samples_markdown

CHAT = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2+2?"}]


def strict_json(line: str):
    """json.loads refusing NaN and Infinity, as JSON itself (and jq, JavaScript) does."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(line, parse_constant=refuse)


def train_record(epoch: int, **values) -> dict:
    return {"kind": "train", "epoch": epoch, "step": epoch, "loss": 0.5, "reward_mean": 1.0, "solve_rate": 0.0,
            "frac_zero_delta_groups": 0.0, **values}


def test_non_finite_numbers_are_written_as_null_and_read_back(tmp_path):
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    sink(train_record(0, kl=math.nan, grad_norm=math.inf, reward_mean=-math.inf))
    sink({"kind": "samples", "epoch": 0, "step": 0,
          "rows": [{"prompt": "1 2", "response": "2 1", "reward": math.nan, "correct": False}]})
    sink.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    train, samples = (strict_json(line) for line in lines)  # a bare NaN would raise here
    assert train["kl"] is None and train["grad_norm"] is None and train["reward_mean"] is None
    assert train["loss"] == 0.5 and samples["rows"][0]["reward"] is None
    records = read_records(tmp_path)
    assert math.isnan(summary(records)["reward_end"])  # a null reads as "no value"
    assert main(["plot", str(tmp_path), "--out", str(tmp_path / "p.png")]) == 0
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "r.html")]) == 0


def test_read_records_refuses_huge_lines_and_non_objects(tmp_path):
    path = tmp_path / "metrics.jsonl"
    first = json.dumps(train_record(0)) + "\n"
    path.write_text(first + json.dumps({"kind": "train", "pad": "x" * 2000}) + "\n")
    with pytest.raises(ValueError, match=rf"metrics.jsonl:2: a line longer than {len(first)} characters"):
        read_records(path, max_line=len(first))
    assert len(read_records(path)) == 2
    path.write_text(json.dumps(train_record(0)) + "\n[1, 2]\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON record \(a list, not an object\)"):
        read_records(path)
    path.write_text(json.dumps(train_record(0)) + "\n" + "[" * 100_000 + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON record \(nested too deeply\)"):
        read_records(path)
    path.write_text(json.dumps(train_record(0)) + "\n" + '{"kind": "tr')  # torn by a kill: left out
    assert read_records(path) == [train_record(0)]


def test_chat_prompts_read_as_messages_in_samples(tmp_path):
    grades = SimpleNamespace(rewards=torch.tensor([[1.0], [0.0]]), correct=torch.tensor([[True], [False]]))
    # a chat on its own and one as the "prompt" of a prompt dict
    record = sample_table([CHAT, {"prompt": CHAT, "answer": "4"}], [["4"], ["5"]], grades, 1, 7, rows=2)
    assert [row["prompt"] for row in record["rows"]] == [CHAT, CHAT]  # kept as data in metrics.jsonl
    write_samples_markdown(tmp_path / "samples.md", record)
    text = (tmp_path / "samples.md").read_text()
    assert "| system: Answer briefly.\\nuser: What is 2+2? | 4 | 1.000 | yes |" in text
    assert "'role'" not in text and "{" not in text
    page = tmp_path / "report.html"
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    assert main(["report", str(tmp_path), "--out", str(page)]) == 0
    assert "system: Answer briefly.\nuser: What is 2+2?" in page.read_text() and "&#x27;role" not in page.read_text()


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


def test_warnings_count_in_words():
    rising = [train_record(e, reward_mean=float(e)) for e in range(15)]  # reward up, gold flat: windows 0-9, 5-14
    assert hacking_warnings(rising)[0].endswith("the reward may be hackable (1 more window)")
    one = [train_record(0, **{"hack/max_reward_not_gold": 1.0})]
    assert hacking_warnings(one) == ["over the last epoch, 100% of the responses with the top reward failed "
                                     "the gold check"]


def test_gsm8k_summary_line_only_when_some_were_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest, "GSM8K_DATA", tmp_path / "absent")
    lines = []
    reporter = SimpleNamespace(stats={"skipped": []}, write_line=lines.append)
    conftest.pytest_terminal_summary(reporter)
    assert lines == []
    reporter.stats["skipped"] = [SimpleNamespace(longrepr=("test_gsm8k.py", 3, "Skipped: no GSM8K data"))]
    conftest.pytest_terminal_summary(reporter)
    assert len(lines) == 1 and ": 1 GSM8K test skipped (put" in lines[0]
