"""User reward functions in a training run: faults are counted, never fatal unless strict."""

import math
import time

import pytest
import torch

from faulty_rewards import flaky
from rlvr.cli import main
from rlvr.config import ConfigError, load_config
from rlvr.config.compose import build_task
from rlvr.loop.evaluation import pass_at_k
from rlvr.loop.trainer import train
from rlvr.rewards import RewardRunner, RewardSpec, combine_rewards
from rlvr.runs.metrics import read_records
from rlvr.tasks import TASKS, reward_runner
from rlvr.tasks.sorting import LECTURE_PROMPTS, REWARD_FUNCTIONS

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
        "rewards.functions=['faulty_rewards:flaky', {function: 'faulty_rewards:sometimes_nan', weight: 2}]",
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
                 "rewards.functions=['faulty_rewards:flaky']"])
    assert code == 4
    assert "flaky" in capsys.readouterr().err


def test_hanging_reward_function_times_out_and_the_run_goes_on():
    config = load_config(None, FAST + [
        "algo.epochs=2", "algo.inner_steps=1", "rewards.timeout=0.5", "task.prompts=null",
        "task.vocab_size=10", "task.prompts_per_epoch=6", "task.eval_size=2", "log.eval_samples=2",
        "rewards.functions=['faulty_rewards:sometimes_hangs']",
    ])
    records = [r for r in train(config) if r["kind"] == "train"]
    assert sum(r["reward/sometimes_hangs/timeouts"] for r in records) > 0


@pytest.mark.parametrize("spec, message", [
    ("['nomodule_xyz:f']", "rewards.functions[0]"),
    ("['faulty_rewards']", "must be 'module:function'"),
    ("[{function: 'faulty_rewards:flaky', wieght: 1}]", "unknown keys ['wieght']"),
    ("[{function: 'faulty_rewards:flaky', required: 1}]", "required=1 must be true or false"),
    ("[{function: 'faulty_rewards:flaky', options: [1]}]", "options=[1] must be a mapping"),
    ("[{function: 'faulty_rewards:flaky', name: inclusion_ordering}]", "repeated: inclusion_ordering"),
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
    """``gold`` padded with spaces so that faulty_rewards.flaky raises on it (or not)."""
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
        f"rewards.functions=[{{function: 'faulty_rewards:flaky', required: {str(required).lower()}}}]",
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
        assert [spec.name for spec in task.runner.specs if spec.required] == [task.gold_reward]


# sorting: the user's functions and the built-in reward in one runner


def tenth(prompts, completions, **kwargs):
    return [0.1] * len(completions)


def fifth(prompts, completions, **kwargs):
    return [0.2] * len(completions)


def abstains(prompts, completions, **kwargs):
    return [None] * len(completions)


def _sorting_batch():
    prompts = torch.tensor([[1, 0, 2], [3, 2, 4]])
    responses = torch.tensor([[[0, 1, 2], [2, 1, 0], [1, 1, 1], [0, 0, 2]],
                              [[2, 3, 4], [4, 3, 2], [3, 3, 3], [0, 1, 2]]])
    return prompts, responses  # [B=2, n=3], [B, G=4, n]


def test_sorting_adds_the_users_sum_to_its_reward_as_before():
    # Before one runner, sorting computed builtin + (user combined), NaN as 0. In float32
    # b + (0.1 + 0.2) and (b + 0.1) + 0.2 differ for b in {1, 4, 5}: the user's terms come
    # first in the sum so that the numbers stay the same.
    functions = "rewards.functions=['test_task_rewards:tenth', 'test_task_rewards:fifth', 'test_task_rewards:abstains']"
    with build_task(load_config(None, [functions, "rewards.timeout=null"])) as task:
        prompts, responses = _sorting_batch()
        grades = task.grade(prompts, responses)
    builtin = REWARD_FUNCTIONS["inclusion_ordering"](prompts, responses)  # [B, G]
    user = torch.tensor([[0.1] * 8, [0.2] * 8, [math.nan] * 8]).T  # [N, 3], laid out as the runner had them
    before = builtin + torch.nan_to_num(combine_rewards(user, torch.ones(3)), nan=0.0).reshape(2, 4)
    assert torch.equal(grades.rewards, before)
    other_order = (builtin + torch.tensor(0.1)) + torch.tensor(0.2)
    assert not torch.equal(other_order, before)  # the test would see the order change
    assert grades.metrics["reward/abstains/abstained"] == 8.0 and grades.metrics["reward/abstained"] == 0.0


def test_sorting_takes_required_user_functions():
    # flaky raises on some texts: there the required function leaves no reward at all
    flaky_raises = []
    prompts = torch.tensor(LECTURE_PROMPTS)
    responses = torch.randint(0, 5, (3, 10, 3), generator=torch.Generator().manual_seed(0))  # [B, G, n]
    for group in responses.tolist():
        for response in group:
            try:
                flaky([""], [" ".join(map(str, response))])
                flaky_raises.append(False)
            except ValueError:
                flaky_raises.append(True)
    assert any(flaky_raises) and not all(flaky_raises)
    functions = "rewards.functions=[{function: 'faulty_rewards:flaky', required: true}]"
    with build_task(load_config(None, [functions, "rewards.timeout=null"])) as task:
        rewards = task.grade(prompts, responses).rewards.reshape(-1)
    builtin = REWARD_FUNCTIONS["inclusion_ordering"](prompts, responses).reshape(-1)
    for raised, reward, b in zip(flaky_raises, rewards.tolist(), builtin.tolist()):
        assert math.isnan(reward) if raised else reward == b + 0.5


# the registry and the one factory


def test_the_registry_names_every_task_by_its_config_name():
    assert list(TASKS) == ["sorting", "sort_text", "arithmetic", "gsm8k", "dataset", "reasoning_gym", "environment",
                           "agent", "verifiers"]
    assert all(cls.name == name for name, cls in TASKS.items())


def test_task_options_are_checked_without_building_the_task(tmp_path):
    missing = tmp_path / "missing.jsonl"  # never read: the unknown key is found first
    options = f"task.options={{train_path: '{missing}', eval_path: '{missing}', templat: plain}}"
    with pytest.raises(ConfigError, match="task.options: unknown option 'templat'; did you mean 'template'"):
        load_config(None, ["task.name=gsm8k", "policy.name=causal_lm", options])
    with pytest.raises(ConfigError, match="task.options: unknown option 'anything'"):
        load_config(None, ["task.options.anything=1"])


def test_one_factory_builds_the_task_and_user_specs_in_summing_order():
    config = load_config(None, ["task.name=sort_text", "policy.name=causal_lm", "rewards.strict=true",
                                "rewards.num_workers=3", "rewards.functions=['test_task_rewards:tenth']"])
    with build_task(config) as task:
        assert task.runner.names == ("position", "exact_match", "tenth")  # the task's first
        assert task.runner.strict and task.runner.num_workers == 3
    sorting = build_task(load_config(None, ["rewards.functions=['test_task_rewards:tenth']", "rewards.timeout=null"]))
    assert sorting.runner.names == ("tenth", "inclusion_ordering", "exact")  # the user's first
    alone = reward_runner(TASKS["sort_text"]())  # as a task built directly grades
    assert alone.names == ("position", "exact_match") and not alone.strict
