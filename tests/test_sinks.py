"""Optional metric sinks: TensorBoard and wandb/trackio-style trackers."""

import sys
import types

import pytest

from rlvr.cli import main
from rlvr.runs.metrics import read_records


def test_tracker_sink_logs_train_and_eval_scalars(tmp_path, monkeypatch):
    calls = {"init": [], "log": [], "finish": 0}
    fake = types.ModuleType("trackio")
    fake.init = lambda **kw: calls["init"].append(kw)
    fake.log = lambda scalars, step: calls["log"].append((step, scalars))
    fake.finish = lambda: calls.__setitem__("finish", calls["finish"] + 1)
    monkeypatch.setitem(sys.modules, "trackio", fake)
    out = tmp_path / "run"
    assert main(["train", f"out_dir={out}", "algo.epochs=2", "log.eval_every=2", "log.progress=false",
                 "log.plot=false", "log.tracker=trackio", "log.tracker_project=p"]) == 0
    assert calls["init"][0]["project"] == "p" and calls["init"][0]["config"]["algo"]["epochs"] == 2
    assert calls["finish"] == 1
    train_steps = [step for step, scalars in calls["log"] if "train/reward_mean" in scalars]
    eval_steps = [step for step, scalars in calls["log"] if "eval/greedy_solve_rate" in scalars]
    assert train_steps == list(range(20)) and eval_steps == [0, 20]  # eval at the start and at the end


def test_unknown_tracker_is_rejected(tmp_path, capsys):
    assert main(["train", f"out_dir={tmp_path / 'x'}", "log.tracker=mlflow"]) == 2
    assert "log.tracker='mlflow' is not allowed" in capsys.readouterr().err


def test_tensorboard_sink_writes_the_records_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert main(["train", f"out_dir={out}", "algo.epochs=2", "log.eval_every=2", "log.progress=false",
                 "log.plot=false", "log.tensorboard=true"]) == 0
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    records = read_records(out)
    train = [r for r in records if r["kind"] == "train"]
    logged = events.Scalars("train/reward_mean")
    assert [e.step for e in logged] == [r["step"] for r in train]
    assert [e.value for e in logged] == pytest.approx([r["reward_mean"] for r in train])  # float32 on disk
    evals = [r for r in records if r["kind"] == "eval"]
    assert [(e.step, e.value) for e in events.Scalars("eval/greedy_solve_rate")] == [
        (r["step"], pytest.approx(r["greedy_solve_rate"])) for r in evals]
