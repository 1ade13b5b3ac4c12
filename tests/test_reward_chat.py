"""Reward functions on chat data get what TRL gives them: message-list completions, the
prompts' messages, completion_ids and trainer_state; the built-in verifiers read both
forms; a function that fails on most completions is named in the log and the summary."""

from __future__ import annotations

import json
import logging

import pytest

from helpers import QUIET
from rlvr.cli import main
from rlvr.rewards import (
    RewardRunner,
    RewardSpec,
    TrainerState,
    answer_format,
    exact_match,
    math_answer,
    numeric_match,
    regex_reward,
)
from rlvr.rewards.combine import failure_warnings
from rlvr.rewards.verifiers import extract_answer

CHAT = [{"role": "user", "content": "2+2?"}]


def assistant(text):
    return [{"role": "assistant", "content": text}]


def trl_length(prompts, completions, trainer_state, **kwargs):
    """Written as for TRL on chat data: the completion's message content, and the step it
    was graded at; a prompt must be a list of messages. Sampled completions come with their
    tokens (the greedy evaluation's with none)."""
    assert all(isinstance(p, list) and p[-1]["role"] == "user" for p in prompts)
    assert 0 <= trainer_state.global_step <= trainer_state.max_steps and trainer_state.epoch >= 0
    assert len(kwargs.get("completion_ids", completions)) == len(completions)
    return [float(len(c[0]["content"])) for c in completions]


def text_only(completions, **kwargs):
    """Written for text prompts: on chat data every call raises AttributeError."""
    return [float(c.strip() == "7") for c in completions]


def test_chat_prompts_get_message_list_completions_and_text_prompts_text():
    seen = {}

    def record(prompts, completions, completion_ids, trainer_state, **kwargs):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, state=trainer_state)
        return [1.0] * len(completions)

    state = TrainerState(global_step=6, epoch=3, max_steps=20)
    prompts = [{"prompt": CHAT, "answer": "4"}, {"prompt": "3+3=", "answer": "6"}]
    result = RewardRunner([RewardSpec(record)]).score_groups(
        prompts, [["4", "<answer>4</answer>"], ["6", "five"]], completion_ids=[[1], [2, 3], [4], [5, 6]],
        trainer_state=state)
    assert result.rewards.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert seen["completions"] == [assistant("4"), assistant("<answer>4</answer>"), "6", "five"]
    assert seen["prompts"] == [CHAT, CHAT, "3+3=", "3+3="]
    assert seen["ids"] == [[1], [2, 3], [4], [5, 6]]
    assert seen["state"] is state


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_trl_chat_reward_scores_in_process_and_in_workers(timeout):
    prompts = [{"prompt": CHAT}]
    with RewardRunner([RewardSpec(trl_length, timeout=timeout)], num_workers=1) as runner:
        result = runner.score_groups(prompts, [["ab", "abcd"]], completion_ids=[[1, 2], [3]],
                                     trainer_state=TrainerState(0, 0, 2))
    assert result.stats["trl_length"].errors == 0
    assert result.rewards.tolist() == [[2.0, 4.0]]


def test_builtin_verifiers_read_chat_completions_as_their_text():
    texts = ["<answer>4</answer>", "\\boxed{5}", "<think>so</think> <answer>4</answer>", "no answer"]
    chats = [assistant(t) for t in texts]
    answers = ["4"] * 4
    for verifier in (math_answer, exact_match, numeric_match, answer_format,
                     regex_reward(r".*answer.*")):
        on_text = verifier(completions=texts, answer=answers)
        assert verifier(completions=chats, answer=answers) == on_text, verifier
    assert math_answer(completions=chats, answer=answers) == [1.0, 0.0, 1.0, 0.0]
    assert answer_format(completions=chats) == [0.0, 0.0, 1.0, 0.0]
    assert extract_answer(assistant("<answer> 7 </answer>")) == "7"


def test_a_function_failing_on_most_completions_is_named_with_its_share_and_first_error():
    records = [
        {"kind": "train", "epoch": 0, "step": 0, "reward/f/scored": 1.0, "reward/f/abstained": 0.0,
         "reward/f/errors": 3.0, "reward/f/timeouts": 0.0, "reward/f/invalid": 0.0,
         "reward/f/failure": "raised KeyError: 0", "reward/ok/scored": 4.0, "reward/ok/abstained": 0.0,
         "reward/ok/errors": 0.0, "reward/ok/timeouts": 0.0, "reward/ok/invalid": 0.0},
    ]
    second_step = {**records[0], "step": 1}  # an epoch's inner steps repeat its numbers: counted once
    later = {**records[0], "epoch": 1, "step": 2, "reward/f/scored": 2.0, "reward/f/errors": 2.0,
             "reward/f/failure": "raised KeyError: 1"}
    assert failure_warnings([*records, second_step, later]) == [
        "reward function 'f' failed on 62% of its completions (5 of 8); first failure: raised KeyError: 0"]
    half = {**later, "reward/f/scored": 4.0, "reward/f/errors": 0.0}
    assert failure_warnings([*records, half]) == []  # 3 of 8: not most
    assert failure_warnings([*records, second_step]) == [
        "reward function 'f' failed on 75% of its completions (3 of 4); first failure: raised KeyError: 0"]


def test_a_chat_run_scores_trl_rewards_and_its_summary_names_the_failing_one(tmp_path, tiny_model, capsys, caplog):
    rows = [{"prompt": [{"role": "user", "content": str(i)}], "answer": str(i)} for i in range(8)]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = [*QUIET, "task.name=dataset", f"task.options={{path: {path}, eval_fraction: 0.25}}",
                 "task.prompts_per_epoch=2", "policy.name=causal_lm", "algo.group_size=2", "algo.inner_steps=1",
                 "algo.epochs=2", "log.eval_every=100", "log.eval_at_start=false", "threads=1",
                 "rewards.functions=[test_reward_chat:trl_length, test_reward_chat:text_only]", "rewards.timeout=null",
                 f"out_dir={tmp_path / 'run'}",
                 f"policy.options={{model: {tiny_model}, max_new_tokens: 3, chat_template: "
                 "'{% for m in messages %}{{ m.content }}={% endfor %}>'}"]
    with caplog.at_level(logging.WARNING, logger="rlvr.rewards"):
        assert main(["train", *overrides]) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["reward/trl_length/scored"] for r in train] == [4.0, 4.0]  # 2 prompts x 2, every one scored
    assert [r["reward/text_only/errors"] for r in train] == [4.0, 4.0]
    first = "raised AttributeError: 'list' object has no attribute 'strip'"
    assert train[0]["reward/text_only/failure"] == first
    out = capsys.readouterr().out
    assert f"reward function 'text_only' failed on 100% of its completions (8 of 8); first failure: {first}" in out
    failed = [line for line in out.splitlines() if line.startswith("warning:") and "reward function" in line]
    assert len(failed) == 1 and "trl_length" not in failed[0]  # the function that worked is not named
    assert "reward function 'text_only' failed on 100% of its completions (4 of 4)" in caplog.text  # the live log
