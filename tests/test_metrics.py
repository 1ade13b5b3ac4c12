"""metrics.jsonl: written as strict JSON (non-finite numbers as null), read back refusing what is not a record."""

import json
import math

import pytest

from helpers import train_record
from rlvr.cli import main
from rlvr.runs.metrics import JsonlSink, read_records, summary


def strict_json(line: str):
    """json.loads refusing NaN and Infinity, as JSON itself (and jq, JavaScript) does."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(line, parse_constant=refuse)


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
