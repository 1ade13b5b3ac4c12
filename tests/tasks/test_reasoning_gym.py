"""The reasoning_gym task: generated problems, each graded by its own scorer; a tiny run."""

from __future__ import annotations

import string

import pytest

from rlvr.base.errors import ConfigError
from rlvr.config import load_config
from rlvr.config.compose import build_task

pytest.importorskip("reasoning_gym")

QUIET = ["log.progress=false", "log.plot=false"]


def config_with(options: str, *overrides: str):
    return load_config(None, ["task.name=reasoning_gym", f"task.options={options}", "policy.name=causal_lm",
                              *overrides])


def test_problems_prompts_and_the_scorer_as_gold():
    task = build_task(config_with("{dataset: basic_arithmetic, size: 20, eval_size: 5}", "rewards.timeout=null"))
    train, held_out = task.fixed_prompts()["training prompt"], task.eval_prompts()
    assert len(held_out) == 5 and not {p["question"] for p in train} & {p["question"] for p in held_out}
    prompt = held_out[0]
    assert prompt["prompt"][0]["role"] == "system" and "<answer>" in prompt["prompt"][0]["content"]
    assert prompt["prompt"][1] == {"role": "user", "content": prompt["question"]}
    right, untagged = f"so <answer>{prompt['answer']}</answer>", prompt["answer"]
    grades = task.grade([prompt], [[right, untagged, "<answer>nonsense</answer>"]])
    # the generator's scorer: 1.0 for its answer in tags; no tags = no answer = 0.0
    assert grades.rewards.tolist() == [[1.0, 0.0, 0.0]] and grades.correct.tolist() == [[True, False, False]]
    task.close()


def test_unknown_generator_and_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="unknown reasoning-gym dataset 'basic_arithmatic'; did you mean "
                                          "'basic_arithmetic'"):
        build_task(config_with("{dataset: basic_arithmatic}"))
    with pytest.raises(ConfigError, match="task.options for 'reasoning_gym'"):
        build_task(config_with("{dataset: basic_arithmetic, config: {no_such_setting: 1}}"))


def test_tiny_run_on_a_reasoning_gym_task(tmp_path):
    """Two epochs of a tiny LM on text prompts (no system prompt): every response graded by
    the scorer in the reward workers, and the held-out evaluation recorded."""
    from rlvr.loop.trainer import train
    from rlvr.modeling import init_model

    model = init_model(tmp_path / "model", hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                       chars=string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", ""))
    config = load_config(None, [
        *QUIET, "task.name=reasoning_gym", "policy.name=causal_lm", "task.prompts_per_epoch=2",
        "task.options={dataset: basic_arithmetic, size: 8, eval_size: 2, system_prompt: null}",
        f"policy.options={{model: {model}, max_new_tokens: 4}}", "algo.epochs=2", "algo.inner_steps=1",
        "algo.group_size=3", "log.eval_every=2", "threads=1"])
    records = train(config)
    steps = [r for r in records if r["kind"] == "train"]
    assert [r["reward/score/scored"] for r in steps] == [6, 6]  # 2 prompts x 3 responses, every one scored
    assert [r["epoch"] for r in records if r["kind"] == "eval"] == [0, 2]
