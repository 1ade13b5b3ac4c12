"""rlvr.tasks.sort_text: prompt format, rewards by hand, seeding and the held-out split."""

from __future__ import annotations

import re

import pytest
import torch

from rlvr.tasks.sort_text import SortTextTask, exact_match_reward, position_reward


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("1 2 3", 1.0),
        ("  1\t2  3\n", 1.0),  # only the tokens count, not the spacing
        ("1 3 3", 2 / 3),
        ("1 2", 2 / 3),  # a missing token is a wrong position
        ("1 2 3 4", 3 / 4),  # an extra one too: 3 right of max(3, 4)
        ("3 2 1", 1 / 3),
        ("123", 0.0),
        ("", 0.0),
    ],
)
def test_position_reward_by_hand(completion, expected):
    assert position_reward(["3 1 2>"], [completion], answer=["1 2 3"]) == [pytest.approx(expected)]


def test_exact_match_reward():
    completions = ["1 2 3", " 1 2 3 ", "1 2 3 3", "1 2", "1 3 2"]
    assert exact_match_reward(["3 1 2>"] * 5, completions, answer=["1 2 3"] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_prompts_are_digits_then_gt_and_answers_sorted():
    task = SortTextTask(num_digits=6)
    for prompt in task.sample_prompts(20, gen(0)):
        assert re.fullmatch(r"([0-9] ){5}[0-9]>", prompt["prompt"])
        digits = prompt["prompt"][:-1].split()
        assert prompt["answer"] == " ".join(sorted(digits, key=int))


def test_same_generator_state_same_prompts():
    task = SortTextTask()
    assert task.sample_prompts(16, gen(3)) == task.sample_prompts(16, gen(3))
    assert task.sample_prompts(16, gen(3)) != task.sample_prompts(16, gen(4))
    assert SortTextTask(eval_seed=1).eval_prompts() == SortTextTask(eval_seed=1).eval_prompts()
    assert SortTextTask(eval_seed=1).eval_prompts() != SortTextTask(eval_seed=2).eval_prompts()


def test_eval_set_is_fixed_distinct_and_never_trained_on():
    # 2 digits: 100 sequences, 50 held out, so a training draw hits one half the time
    task = SortTextTask(num_digits=2, num_eval=50)
    held_out = {p["prompt"] for p in task.eval_prompts()}
    assert len(held_out) == 50
    train = {p["prompt"] for p in task.sample_prompts(500, gen(0))}
    assert not train & held_out
    assert len(train) == 50  # the whole other half shows up


def test_too_large_eval_set_is_refused():
    with pytest.raises(ValueError, match="num_eval must be in"):
        SortTextTask(num_digits=1, num_eval=6)


def test_grade_and_sft_examples():
    task = SortTextTask(num_digits=3)
    prompts = [{"prompt": "3 1 2>", "answer": "1 2 3"}, {"prompt": "0 0 9>", "answer": "0 0 9"}]
    responses = [["1 2 3", "1 3 2"], ["0 9", "x"]]
    grades = task.grade(prompts, responses)
    assert grades.rewards.dtype == torch.float32 and grades.rewards.shape == (2, 2)
    # position + exact match, both weight 1
    torch.testing.assert_close(grades.rewards, torch.tensor([[2.0, 1 / 3], [1 / 3, 0.0]]))
    assert grades.correct.tolist() == [[True, False], [False, False]]
    assert grades.metrics["reward/exact_match/mean"] == 0.25
    examples = task.sft_examples(8, gen(0))
    texts, completions = zip(*examples)
    groups = [[c] for c in completions]
    dicts = task.sample_prompts(8, gen(0))
    assert list(texts) == [p["prompt"] for p in dicts]
    assert task.grade(dicts, groups).correct.all()


def test_weights_override_and_unknown_names():
    task = SortTextTask(weights={"position": 0.0})
    rewards = task.grade([{"prompt": "2 1>", "answer": "1 2"}], [["1 2", "1 1"]]).rewards
    assert rewards.tolist() == [[1.0, 0.0]]
    with pytest.raises(ValueError, match="unknown reward names \\['exact'\\]; allowed: position, exact_match"):
        SortTextTask(weights={"exact": 1.0})


def test_min_digits_gives_prompts_of_every_length_in_the_range():
    task = SortTextTask(num_digits=7, min_digits=3)
    prompts = task.sample_prompts(200, gen(0))
    lengths = {len(p["prompt"][:-1].split()) for p in prompts}
    assert lengths == {3, 4, 5, 6, 7}
    assert all(p["answer"] == " ".join(sorted(p["prompt"][:-1].split(), key=int)) for p in prompts)
    assert {len(p["prompt"][:-1].split()) for p in task.eval_prompts()} == {3, 4, 5, 6, 7}
    # without it, or equal to num_digits, the prompts are those of num_digits alone
    same = SortTextTask(num_digits=5, min_digits=5).sample_prompts(16, gen(3))
    assert same == SortTextTask().sample_prompts(16, gen(3))
    with pytest.raises(ValueError, match="min_digits"):
        SortTextTask(num_digits=3, min_digits=4)
