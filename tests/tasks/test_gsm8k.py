"""rlvr.tasks.gsm8k: loading, answer extraction, math-verify grading under a time limit."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch

from rlvr.base.data import DataError
from rlvr.rewards.verifiers import is_equivalent
from rlvr.tasks.gsm8k import Gsm8kTask, answer_reward, extract_answer, format_reward, load_gsm8k

# the data lives beside the checkout, in ../shared/data (see its README)
DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"
pytestmark = pytest.mark.skipif(not (DATA / "test.jsonl").is_file(), reason=f"GSM8K not found in {DATA}")

GRADER_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def task():
    with Gsm8kTask(DATA / "train.jsonl", DATA / "test.jsonl", grader_timeout=GRADER_TIMEOUT) as task:
        yield task


def test_load_gsm8k():
    records = load_gsm8k(DATA / "test.jsonl")
    assert len(records) == 1319
    first = records[0]
    assert first["answer"] == "18"
    assert first["question"].startswith("Janet")
    assert "<<" not in first["solution"] and "####" not in first["solution"]
    assert first["solution"].endswith("$18 every day at the farmer’s market.")
    # "#### 2,125" in the file: the gold number loses its comma
    assert {"answer": "2125"}.items() <= next(r for r in records if r["answer"] == "2125").items()
    assert all("," not in r["answer"] for r in records)


def test_row_without_final_answer_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q", "answer": "so 3\\n#### 3"}\n{"question": "q", "answer": "so 3"}\n')
    with pytest.raises(DataError, match=f"{path}:2: answer does not end with '#### <number>'"):
        load_gsm8k(path)


@pytest.mark.parametrize(
    "completion, answer",
    [
        (" 2+2=4 </think> <answer> 4 </answer>", "4"),
        ("</think><answer>\\boxed{4}</answer>\n", "\\boxed{4}"),
        (" 2+2=4 </think> <answer> 4 </answer> and more", None),  # text after the answer
        (" 2+2=4 <answer> 4 </answer>", None),  # no </think>
        (" </think> <answer> 3 </answer> <answer> 4 </answer>", None),  # two answers
        (" </think> <answer>  </answer>", None),  # an empty one
    ],
)
def test_extract_answer_r1_zero(completion, answer):
    assert extract_answer(completion, "r1_zero") == answer


@pytest.mark.parametrize(
    "completion, answer",
    [
        (" 2+2=4\n#### 4", "4"),
        (" #### 3 wrong\n#### 4\nQuestion: next", "4"),  # the last marker, its line only
        (" 2+2=4, so 4", None),
        (" ####  \n", None),
    ],
)
def test_extract_answer_plain(completion, answer):
    assert extract_answer(completion, "plain") == answer


def test_gold_answers_score_one_in_both_templates(task):
    prompts = task.eval_prompts()[:50]
    gold = [[task.sft_completion(p)] for p in prompts]
    # answer 1.0 + format 0.1 * 1.0
    grades = task.grade(prompts, gold)
    torch.testing.assert_close(grades.rewards, torch.full((50, 1), 1.1))
    assert grades.correct.all()
    with Gsm8kTask(DATA / "train.jsonl", DATA / "test.jsonl", template="plain", num_eval=50) as plain:
        prompts = plain.eval_prompts()
        assert len(prompts) == 50 and prompts[0]["prompt"].startswith("Question: Janet")
        assert plain.grade(prompts, [[plain.sft_completion(p)] for p in prompts]).correct.all()


def test_equivalent_forms_score_one_and_wrong_numbers_zero():
    forms = ["18", "$18$", "\\boxed{18}", "18.0", "\\frac{36}{2}", "$18", "18 dollars"]
    completions = [f" ... </think> <answer> {form} </answer>" for form in forms]
    assert answer_reward([""] * 7, completions, answer=["18"] * 7) == [1.0] * 7
    wrong = [f" ... </think> <answer> {form} </answer>" for form in ["17", "180", "-18", "1.8"]]
    assert answer_reward([""] * 4, wrong, answer=["18"] * 4) == [0.0] * 4
    assert answer_reward([""], [" 18 </think> no tags"], answer=["18"]) == [0.0]
    assert answer_reward([""], [" x </think> <answer> 1,000 </answer>"], answer=["1000"]) == [1.0]
    assert answer_reward([""], [" x </think> <answer> 5 </answer>"], answer=["not a number"]) == [None]
    assert format_reward([""] * 2, [" x </think> <answer> 5 </answer>", "5"]) == [1.0, 0.0]


@pytest.mark.parametrize(
    "answer, gold, right",
    [
        ("\\$18", "18", True),  # an escaped dollar sign is currency, not "\\18"
        ("\\$18.00", "18", True),
        ("$\\$18$", "18", True),  # math mode around an escaped dollar
        ("\\$1,000", "1000", True),
        ("\\boxed{\\$18}", "18", True),
        ("18.", "18", True),  # a sentence's period, not a decimal point
        ("\\[18\\]", "18", True),  # display math is not wrapped in "$...$" again
        ("\\(18\\)", "18", True),
        ("The answer is 18.", "18", True),
        ("The answer is $18$.", "18", True),
        ("$18", "18", True),  # a lone "$" is currency
        ("\\$19", "18", False),
        ("\\$180", "18", False),
        ("\\$1.8", "18", False),
        ("180", "18", False),
        ("1.8", "18", False),
        ("18.5.", "18", False),
        ("\\[19\\]", "18", False),
        ("The answer is 19.", "18", False),
    ],
)
def test_currency_delimiters_and_sentence_periods_grade_by_value(answer, gold, right):
    assert is_equivalent(answer, gold) is right


def test_pathological_answer_times_out_and_abstains(task):
    prompt = {**task.eval_prompts()[0]}  # gold 18
    tower = " x </think> <answer> $9^{9^{9^{9}}}$ </answer>"
    right = " x </think> <answer> 18 </answer>"
    start = time.monotonic()
    result = task.score([prompt], [[tower, right]])
    elapsed = time.monotonic() - start
    assert elapsed < GRADER_TIMEOUT + 0.5, elapsed
    assert result.stats["answer"].timeouts == 1
    answer = result.column("answer")
    assert torch.isnan(answer[0, 0]) and answer[0, 1] == 1.0
    # the format reward still scores it, but without its answer verdict the sample abstains
    assert result.stats["format"].scored == 2
    torch.testing.assert_close(result.rewards, torch.tensor([[math.nan, 1.1]]), equal_nan=True)
    assert result.metrics()["reward/abstained"] == 1.0
    assert (result.column(task.gold_reward) == 1.0).tolist() == [[False, True]]  # grade's gold check
    # and the grader still works afterwards
    assert task.grade([prompt], [[right]]).correct.tolist() == [[True]]


def test_unparseable_gold_abstains_the_sample(task):
    prompt = {**task.eval_prompts()[0], "answer": "not a number"}
    result = task.score([prompt], [[" x </think> <answer> 18 </answer>"]])
    assert result.stats["answer"].abstained == 1 and result.stats["format"].scored == 1
    assert torch.isnan(result.rewards).all()
    assert [spec.name for spec in task.runner.specs if spec.required] == ["answer"]


def test_sample_prompts_seeded_and_distinct(task):
    first = task.sample_prompts(32, torch.Generator().manual_seed(0))
    assert first == task.sample_prompts(32, torch.Generator().manual_seed(0))
    assert len({p["prompt"] for p in first}) == 32
    assert first[0]["prompt"].endswith("Assistant: <think>")
    with pytest.raises(ValueError, match="the training set has 7473"):
        task.sample_prompts(8000, torch.Generator())


def test_model_answers_never_reach_sympy_parse_expr(monkeypatch):
    # sympy's parse_expr evaluates Python; the model's answer must only be read as LaTeX.
    import math_verify.parser

    seen = []
    original = math_verify.parser.parse_expr_cached
    monkeypatch.setattr(math_verify.parser, "parse_expr_cached", lambda expr: seen.append(expr) or original(expr))
    answers = ["18", "\\frac{36}{2}", "eval(chr(49)+chr(43)+chr(49))", "__import__(os)", "17"]
    completions = [f"ok </think> <answer> {a} </answer>" for a in answers]
    rewards = answer_reward([""] * 5, completions, answer=["18"] * 5)
    assert rewards == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert not any(a in expr for expr in seen for a in answers[2:4])
