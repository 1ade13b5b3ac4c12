"""User reward functions in a training run: faults are counted, never fatal unless strict."""

import math
import time

import pytest
import torch

from rlvr.cli import main
from rlvr.config import ConfigError, load_config
from rlvr.evaluation import pass_at_k
from rlvr.metrics import read_records
from rlvr.reward_faults import flaky
from rlvr.rewards import RewardRunner, RewardSpec
from rlvr.tasks import build_task
from rlvr.trainer import train

FAST = ["log.progress=false", "log.plot=false", "log.checkpoint_every=0"]


def test_pass_at_k_by_hand():
    # n=4 samples, c correct. pass@1 = c/4. pass@2 = 1 - C(4-c,2)/C(4,2):
    # c=0 -> 0; c=1 -> 1 - 3/6 = 0.5; c=2 -> 1 - 1/6; c=3 or 4 -> 1.
    got = pass_at_k(4, torch.tensor([0, 1, 2, 3, 4]), 2)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.5, 5 / 6, 1.0, 1.0]))
    torch.testing.assert_close(pass_at_k(4, torch.tensor([0, 1, 2, 4]), 1), torch.tensor([0.0, 0.25, 0.5, 1.0]))
    with pytest.raises(ValueError):
        pass_at_k(4, torch.tensor([1]), 5)


def test_failing_reward_functions_abstain_and_are_counted():
    config = load_config(None, FAST + [
        "algo.epochs=3",
        "rewards.functions=['rlvr.reward_faults:flaky', {function: 'rlvr.reward_faults:sometimes_nan', weight: 2}]",
    ])
    records = [r for r in train(config) if r["kind"] == "train"]
    errors = sum(r["reward/flaky/errors"] for r in records[::10])
    invalid = sum(r["reward/sometimes_nan/invalid"] for r in records[::10])
    scored = sum(r["reward/flaky/scored"] for r in records[::10])
    assert errors > 0 and invalid > 0 and scored > 0
    assert all(r["reward/flaky/errors"] + r["reward/flaky/scored"] == 30 for r in records)


def test_strict_mode_makes_the_first_error_fatal(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", f"out_dir={out}", *FAST, "algo.epochs=3", "rewards.strict=true",
                 "rewards.functions=['rlvr.reward_faults:flaky']"])
    assert code == 4
    assert "flaky" in capsys.readouterr().err


def test_hanging_reward_function_times_out_and_the_run_goes_on():
    config = load_config(None, FAST + [
        "algo.epochs=2", "algo.inner_steps=1", "rewards.timeout=0.5", "task.prompts=null",
        "task.vocab_size=10", "task.prompts_per_epoch=6", "task.eval_size=2", "log.eval_samples=2",
        "rewards.functions=['rlvr.reward_faults:sometimes_hangs']",
    ])
    records = [r for r in train(config) if r["kind"] == "train"]
    assert sum(r["reward/sometimes_hangs/timeouts"] for r in records) > 0


@pytest.mark.parametrize("spec, message", [
    ("['nomodule_xyz:f']", "rewards.functions[0]"),
    ("['rlvr.reward_faults']", "must be 'module:function'"),
    ("[{function: 'rlvr.reward_faults:flaky', wieght: 1}]", "unknown keys ['wieght']"),
    ("[{function: 'rlvr.reward_faults:flaky', required: 1}]", "required=1 must be true or false"),
    ("[{function: 'rlvr.reward_faults:flaky', required: true}]", "rewards.functions[0].required"),  # sorting
])
def test_bad_reward_function_specs_are_config_errors(spec, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        train(load_config(None, FAST + [f"rewards.functions={spec}"]))


def test_samples_table_is_written(tmp_path):
    out = tmp_path / "run"
    assert main(["train", f"out_dir={out}", *FAST, "algo.epochs=2", "log.eval_every=1"]) == 0
    text = (out / "samples.md").read_text()
    assert text.count("## epoch") == 3 and "| prompt | response | reward | correct |" in text
    evals = [r for r in read_records(out) if r["kind"] == "eval"]
    assert {"pass@1", "pass@8"} <= set(evals[0])


# required rewards: a sample whose answer check has no verdict abstains


def _answer_check(prompts, completions, **kwargs):
    """1.0, but "slow" hangs past any test timeout and "none" abstains on purpose."""
    if "slow" in completions:
        time.sleep(30)
    return [None if c == "none" else 1.0 for c in completions]


def _format_check(prompts, completions, **kwargs):
    return [0.5] * len(completions)


@pytest.mark.parametrize("required", [True, False])
def test_required_function_without_a_verdict_abstains_the_sample(required):
    specs = [RewardSpec(_answer_check, 1.0, "answer", timeout=0.3, required=required),
             RewardSpec(_format_check, 0.1, "format")]
    with RewardRunner(specs, num_workers=1) as runner:
        result = runner([""] * 3, ["slow", "none", "ok"])
    assert result.stats["answer"].timeouts == 1 and result.stats["answer"].abstained == 1
    assert result.stats["format"].scored == 3
    # required: the timed-out and the abstaining answer leave no reward, although format
    # scored them; not required: only the answer term drops, 0.1 * 0.5 is left
    left = math.nan if required else 0.05
    torch.testing.assert_close(result.rewards, torch.tensor([left, left, 1.05]), equal_nan=True)
    assert result.metrics()["reward/abstained"] == (2.0 if required else 0.0)


def _padded(gold: str, raises: bool) -> str:
    """``gold`` padded with spaces so that rlvr.reward_faults.flaky raises on it (or not)."""
    for width in range(len(gold), len(gold) + 100):
        text = gold.rjust(width)
        try:
            flaky([""], [text])
        except ValueError:
            if raises:
                return text
        else:
            if not raises:
                return text
    raise AssertionError("no padding found")


@pytest.mark.parametrize("required", [True, False])
def test_required_user_function_that_raises_abstains_the_sample(required):
    config = load_config(None, [
        "task.name=arithmetic", "policy.name=causal_lm", "rewards.timeout=null",
        f"rewards.functions=[{{function: 'rlvr.reward_faults:flaky', required: {str(required).lower()}}}]",
    ])
    with build_task(config) as task:
        prompt = task.eval_prompts()[0]
        result = task.score([prompt], [[_padded(prompt["answer"], True), _padded(prompt["answer"], False)]])
    assert result.stats["flaky"].errors == 1 and result.stats["exact_answer"].scored == 2
    # both are the right integer (exact_answer 1.0); flaky adds 0.5 where it scores
    first = math.nan if required else 1.0
    torch.testing.assert_close(result.rewards, torch.tensor([[first, 1.5]]), equal_nan=True)


@pytest.mark.parametrize("name", ["arithmetic", "sort_text"])
def test_the_gold_check_is_the_only_required_builtin_reward(name):
    with build_task(load_config(None, [f"task.name={name}", "policy.name=causal_lm"])) as task:
        assert [spec.name for spec in task.runner.specs if spec.required] == [task.correct_reward]
