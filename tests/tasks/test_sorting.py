"""rlvr.tasks.sorting: the lecture's rewards by hand, against the scalar definitions, and graded."""

import itertools

import pytest
import torch

from rlvr.tasks.sorting import (
    LECTURE_PROMPTS,
    REWARD_FUNCTIONS,
    NumberTexts,
    SortingTask,
    exact_reward,
    inclusion_ordering_reward,
    position_match_reward,
    sorting_reward,
)


# The lecture's definitions, one prompt and one response as lists: what the vectorised rewards must equal
def exact_scalar(prompt: list[int], response: list[int]) -> float:
    return float(list(response) == sorted(prompt))


def position_match_scalar(prompt: list[int], response: list[int]) -> float:
    return float(sum(1 for x, y in zip(response, sorted(prompt)) if x == y))


def inclusion_ordering_scalar(prompt: list[int], response: list[int]) -> float:
    inclusion = sum(1 for x in prompt if x in response)
    ordering = sum(1 for x, y in zip(response, response[1:]) if x <= y)
    return float(inclusion + ordering)


PROMPT = [3, 1, 0, 2]
RESPONSES = [[0, 1, 2, 3], [7, 2, 2, 5], [0, 3, 1, 2]]


def batch(prompt, responses):
    return torch.tensor([prompt]), torch.tensor([responses])  # [1, n], [1, G, n]


def test_lecture_examples_position_match():
    # sorted prompt is [0, 1, 2, 3]: the right answer matches all 4 positions,
    # [7, 2, 2, 5] only position 2 (the 2), [0, 3, 1, 2] only position 0 (the 0).
    assert [position_match_scalar(PROMPT, r) for r in RESPONSES] == [4, 1, 1]
    assert position_match_reward(*batch(PROMPT, RESPONSES)).tolist() == [[4.0, 1.0, 1.0]]


def test_lecture_examples_inclusion_ordering():
    # [0,1,2,3]: 4 prompt tokens present + 3 ordered pairs = 7.
    # [7,2,2,5]: only the 2 of the prompt is present (1) + pairs (2,2), (2,5) ordered (2) = 3.
    # [0,3,1,2]: all 4 present + pairs (0,3), (1,2) ordered = 6.
    assert [inclusion_ordering_scalar(PROMPT, r) for r in RESPONSES] == [7, 3, 6]
    assert inclusion_ordering_reward(*batch(PROMPT, RESPONSES)).tolist() == [[7.0, 3.0, 6.0]]


def test_exact_reward_and_gold_check():
    assert exact_reward(*batch(PROMPT, RESPONSES)).tolist() == [[1.0, 0.0, 0.0]]
    task = SortingTask(num_numbers=4, vocab_size=8)
    grades = task.grade(*batch(PROMPT, RESPONSES))
    assert grades.correct.tolist() == [[True, False, False]]
    # the reward is inclusion_ordering (7, 3, 6 as above); "exact" is reported with weight 0
    assert grades.rewards.tolist() == [[7.0, 3.0, 6.0]]
    # the toy's own rewards are its reward_mean and solve_rate: no per-function metrics
    assert grades.metrics == {}
    stats = task.score(*batch(PROMPT, RESPONSES)).stats
    assert stats["inclusion_ordering"].mean == 16 / 3 and stats["exact"].mean == 1 / 3


def test_exact_as_the_reward_is_also_the_gold_check():
    task = SortingTask(num_numbers=4, vocab_size=8, reward="exact")
    assert [spec.name for spec in task.runner.specs] == ["exact"]
    grades = task.grade(*batch(PROMPT, RESPONSES))
    assert grades.rewards.tolist() == [[1.0, 0.0, 0.0]] and grades.correct.tolist() == [[True, False, False]]


@pytest.mark.parametrize("reward", ["exact", "position_match", "inclusion_ordering"])
def test_trl_form_equals_the_vectorised_reward_on_text_and_on_number_texts(reward):
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, 10, (5, 4), generator=gen)
    responses = torch.randint(0, 10, (5, 3, 4), generator=gen)
    want = REWARD_FUNCTIONS[reward](prompts, responses).reshape(15)  # [B, G] -> [N]
    repeated = prompts.repeat_interleave(3, dim=0)  # [N, n]: each prompt once per response
    texts = NumberTexts(repeated), NumberTexts(responses.reshape(15, 4))
    assert torch.equal(sorting_reward(*texts, reward=reward), want)
    as_lists = [list(t) for t in texts]  # plain strings, parsed
    assert as_lists[1][0] == " ".join(map(str, responses[0, 0].tolist()))
    assert torch.equal(sorting_reward(*as_lists, reward=reward), want)


def test_number_texts_are_written_on_first_read_and_slice_lazily():
    texts = NumberTexts(torch.tensor([[3, 1, 2], [10, 0, 7]]))
    assert len(texts) == 2 and texts._texts is None
    part = texts[1:]
    assert isinstance(part, NumberTexts) and part._texts is None and texts[0:2] is texts
    assert list(part) == ["10 0 7"] and texts[0] == "3 1 2"


@pytest.mark.parametrize(
    "vector, scalar",
    [(exact_reward, exact_scalar), (position_match_reward, position_match_scalar),
     (inclusion_ordering_reward, inclusion_ordering_scalar)],
)
def test_vectorised_rewards_equal_the_scalar_definitions(vector, scalar):
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 5, (6, 4), generator=gen)
    responses = torch.randint(0, 5, (6, 7, 4), generator=gen)
    got = vector(prompts, responses)
    want = [[scalar(p.tolist(), r.tolist()) for r in rs] for p, rs in zip(prompts, responses)]
    assert got.tolist() == want


def test_inclusion_ordering_loophole_wrong_answer_gets_maximum():
    # Membership, not multiplicity: prompt [2, 0, 2] sorts to [0, 2, 2], but [0, 0, 2]
    # "includes" 2, 0 and 2 (3 points) and keeps both pairs ordered (2 points) = 5,
    # the maximum 2n - 1, while being wrong.
    prompts, responses = batch([2, 0, 2], [[0, 0, 2], [0, 2, 2]])
    rewards = inclusion_ordering_reward(prompts, responses)
    assert rewards.tolist() == [[5.0, 5.0]]
    assert exact_reward(prompts, responses).tolist() == [[0.0, 1.0]]


def test_no_loophole_with_distinct_numbers():
    # With distinct prompt numbers, every response scoring the maximum is the sorted one.
    prompt = [3, 0, 2]
    for response in itertools.product(range(4), repeat=3):
        if inclusion_ordering_scalar(prompt, list(response)) == 5:
            assert list(response) == [0, 2, 3]


def test_prompts_seeded_distinct_and_fixed():
    task = SortingTask(num_numbers=4, vocab_size=6, prompts=None)
    a = task.sample_prompts(50, torch.Generator().manual_seed(3))
    b = task.sample_prompts(50, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    assert all(len(set(p)) == 4 for p in a.tolist())
    assert a.min() >= 0 and a.max() < 6
    with_repeats = SortingTask(num_numbers=4, vocab_size=3, allow_repeats=True, prompts=None)
    assert with_repeats.sample_prompts(40, torch.Generator().manual_seed(0)).shape == (40, 4)
    fixed = SortingTask(num_numbers=3, vocab_size=5, prompts=LECTURE_PROMPTS)
    assert fixed.sample_prompts(99, torch.Generator()).tolist() == LECTURE_PROMPTS
    assert fixed.eval_prompts().tolist() == LECTURE_PROMPTS


def test_bad_task_arguments_are_named():
    with pytest.raises(ValueError, match="distinct"):
        SortingTask(num_numbers=6, vocab_size=4, prompts=None)
    with pytest.raises(ValueError, match="unknown sorting reward"):
        SortingTask(reward="nope")
    with pytest.raises(ValueError, match=r"range|\[0, 3\)"):
        SortingTask(num_numbers=3, vocab_size=3, prompts=[[0, 1, 5]])
