"""An environment that fails: each failed episode abstains and its first error is named in
the live log, metrics.jsonl, samples.md and the end-of-run summary; a batch whose every
episode failed stops the run with one line."""

import logging

import pytest

from rlvr.cli import main
from rlvr.environments import Step
from rlvr.runs.metrics import read_records

pytest.importorskip("transformers")


class AlwaysFails:
    """Every step raises."""

    def reset(self, start):
        return "12>"

    def step(self, text):
        raise RuntimeError("the board is gone")


class FailsOnEvenSeeds:
    """A step raises for an even seed; an odd seed's episode is solved in one turn."""

    def reset(self, start):
        self.seed = start
        return "12>"

    def step(self, text):
        if self.seed % 2 == 0:
            raise RuntimeError("even seeds are broken")
        return Step(reward=1.0, done=True, solved=True)


def run_args(model, out, factory, *more):
    return [f"out_dir={out}", "task.name=environment", f"task.options.environment_factory=test_environment_errors:"
            f"{factory}", "task.options.max_turns=2", "task.options.max_tokens=12", "task.options.eval_size=4",
            "task.prompts_per_epoch=4", "policy.name=causal_lm", f"policy.options.model={model}",
            "policy.options.max_new_tokens=3", "algo.group_size=2", "algo.epochs=2", "algo.inner_steps=1",
            "log.eval_samples=1", "log.progress=false", "log.plot=false", "seed=0", *more]


@pytest.mark.parametrize("eval_at_start, episodes", [(True, 4), (False, 8)])  # the first batch: held-out, training
def test_an_environment_that_always_fails_stops_the_run_with_one_line(tiny_model, tmp_path, capsys, eval_at_start,
                                                                      episodes):
    out = tmp_path / "run"
    assert main(["train", *run_args(tiny_model, out, "AlwaysFails", f"log.eval_at_start={eval_at_start}")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"rlvr: error: every one of the {episodes} episodes of a batch ended with its environment's "
                       "error, so nothing can be learned; first error: AlwaysFails.step: RuntimeError: the board is "
                       "gone")
    assert not [r for r in read_records(out) if r["kind"] == "train"]  # nothing trained on NaN rewards


def test_failed_episodes_are_named_in_the_log_records_samples_and_summary(tiny_model, tmp_path, capsys, caplog):
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="rlvr.tasks.environment"):
        assert main(["train", *run_args(tiny_model, out, "FailsOnEvenSeeds")]) == 0
    first = "FailsOnEvenSeeds.step: RuntimeError: even seeds are broken"
    logged = [r.getMessage() for r in caplog.records if r.name == "rlvr.tasks.environment"]
    assert len(logged) == 1 and logged[0].endswith(f": {first}")  # the first of its kind, once a run
    train = [r for r in read_records(out) if r["kind"] == "train"]
    assert len(train) == 2 and all(0 < r["episode/env_errors"] < 1 and r["episode/error"] == first for r in train)
    assert f"environment error: {first}" in (out / "samples.md").read_text()
    summary = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    share = sum(r["episode/env_errors"] for r in train) / 2
    assert len(summary) == 1 and summary[0].endswith(f": {share:.1%} of the training episodes ended with their "
                                                     f"environment's error (episode/env_errors); first error: {first}")


def test_the_summary_counts_each_epoch_once_and_is_silent_without_errors():
    from rlvr.tasks.environment import error_warnings

    records = [{"kind": "train", "epoch": 0, "step": 0, "episode/env_errors": 0.5, "episode/error": "E.step: A: a"},
               {"kind": "train", "epoch": 0, "step": 1, "episode/env_errors": 0.5, "episode/error": "E.step: A: a"},
               {"kind": "train", "epoch": 1, "step": 2, "episode/env_errors": 0.0}]
    assert error_warnings(records) == ["25.0% of the training episodes ended with their environment's error "
                                       "(episode/env_errors); first error: E.step: A: a"]
    assert error_warnings(records[2:]) == [] and error_warnings([{"kind": "eval", "epoch": 0}]) == []
