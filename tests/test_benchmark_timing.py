"""benchmarks/time_to_accuracy.py's timing: both sides' training seconds are the wall clock
less the evaluations' (benchmarks/training_clock.py), rlvr's read around its real loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def benchmarks(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the scripts import their sibling training_clock.py
    import time_to_accuracy
    import training_clock

    return training_clock, time_to_accuracy


class FakeTime:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_training_seconds_leave_out_every_evaluation(benchmarks):
    training_clock, _ = benchmarks
    time = FakeTime()
    time.now = 1000.0
    clock = training_clock.TrainingClock(time)
    time.now += 3  # loading
    with clock.evaluation():  # before training: at 3 s
        time.now += 50
    time.now += 20  # training
    with clock.evaluation():  # at 3 + 20 s
        time.now += 40
    time.now += 7
    assert clock.at_evaluations == [3.0, 23.0]
    assert clock.seconds() == 30.0  # 120 s of wall clock less 90 s of evaluations


def test_rlvr_side_times_its_evaluations_apart(benchmarks):
    training_clock, time_to_accuracy = benchmarks
    time = FakeTime()
    clock = training_clock.TrainingClock(time)

    class Source:
        def evaluate(self, st, task):
            time.now += 100  # an evaluation
            return [{"kind": "eval", "epoch": st}]

        def offer_weights(self, st):
            return st

    source = time_to_accuracy.TimedEvaluations(Source(), clock)
    time.now += 5
    assert source.evaluate(0, None) == [{"kind": "eval", "epoch": 0}]
    time.now += 5
    source.evaluate(1, None)
    assert source.offer_weights(2) == 2  # everything else is the source's
    assert clock.at_evaluations == [5.0, 10.0]


def test_rlvr_curve_on_the_real_loop(benchmarks, chat_model, monkeypatch):
    _, time_to_accuracy = benchmarks
    monkeypatch.chdir(BENCHMARKS.parent)  # the recipe's data paths are the checkout's
    overrides = [f"policy.options.model={chat_model}", "policy.options.max_new_tokens=3", "algo.epochs=2",
                 "algo.group_size=2", "task.prompts_per_epoch=2", "log.eval_every=1", "log.eval_samples=1",
                 "task.options.num_eval=4", "log.checkpoint_every=0", "threads=1"]
    curve = time_to_accuracy.rlvr_curve(time_to_accuracy.RECIPE, overrides)
    assert len(curve) == 3  # before training and after each of the 2 steps
    seconds = [s for s, _ in curve]
    assert 0 < seconds[0] < seconds[1] < seconds[2]
    assert all(accuracy in (0.0, 0.25, 0.5, 0.75, 1.0) for _, accuracy in curve)


def test_rlvr_run_stops_at_its_target_and_times_each_step(benchmarks, chat_model, monkeypatch):
    training_clock, time_to_accuracy = benchmarks
    monkeypatch.chdir(BENCHMARKS.parent)
    overrides = [f"policy.options.model={chat_model}", "policy.options.max_new_tokens=3", "algo.epochs=3",
                 "algo.group_size=2", "task.prompts_per_epoch=2", "log.eval_every=1", "log.eval_samples=1",
                 "task.options.num_eval=4", "log.checkpoint_every=0", "threads=1"]
    clock = training_clock.TrainingClock()
    # every accuracy is at or above 0: the run stops after the step that follows the first evaluation
    curve = time_to_accuracy.rlvr_curve(time_to_accuracy.RECIPE, overrides, stop_at=0.0, clock=clock)
    assert len(curve) == 2 and len(clock.at_steps) == 1
    assert curve[0][0] < clock.at_steps[0] <= curve[1][0]


def test_summary_reads_each_seed_and_takes_the_median(benchmarks, tmp_path, capsys):
    _, time_to_accuracy = benchmarks
    files = []
    for seed, (trl, ours) in enumerate([([(0, .2), (100, .6), (200, .7)], [(0, .2), (30, .7)]),
                                        ([(0, .2), (100, .66), (200, .6)], [(0, .2), (50, .6), (80, .66)]),
                                        ([(0, .2), (100, .7)], [(0, .2), (40, .6)])]):
        path = tmp_path / f"{seed}.json"
        path.write_text(json.dumps({"settings": {"seed": seed}, "timing": time_to_accuracy.TIMING,
                                    "trl": trl, "rlvr": ours}))
        files.append(str(path))
    time_to_accuracy.summarize(files, fixed=0.65)
    out = capsys.readouterr().out
    # TRL's final (0.7, 0.6, 0.7): 30/200, 50/100 (TRL first at or above 0.6 at 100 s), none (rlvr never
    # reaches 0.7): median 0.50; fixed 0.65: 30/200, 80/100, none: median 0.80
    medians = [line for line in out.splitlines() if "median" in line]
    assert medians == ["  median rlvr / TRL over 3 seeds: 0.50x", "  median rlvr / TRL over 3 seeds: 0.80x"]
    assert "none" in out
