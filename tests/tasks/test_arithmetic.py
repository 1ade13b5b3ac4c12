"""rlvr.tasks.arithmetic: rendering against an independent parser, rewards, seeding, split."""

from __future__ import annotations

import ast
import importlib.util
import json
import random
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.tasks.arithmetic import (
    ArithmeticTask,
    evaluate,
    exact_answer_reward,
    integer_format_reward,
    random_expression,
    render,
    same_question,
)


def reference_value(text: str) -> int:
    """Python's own grammar parses the rendered text; only + - * and integers are walked."""
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](walk(node.left), walk(node.right))
        raise AssertionError(f"unexpected node {ast.dump(node)}")

    return walk(ast.parse(text, mode="eval").body)


@pytest.mark.parametrize(
    "tree, text",
    [
        (("+", 12, ("*", 7, 3)), "12+7*3"),
        (("*", ("+", 1, 2), 3), "(1+2)*3"),
        (("-", 1, ("-", 2, 3)), "1-(2-3)"),
        (("-", 1, ("+", 2, 3)), "1-(2+3)"),
        (("-", ("-", 1, 2), 3), "1-2-3"),
        (("+", 1, ("-", 2, 3)), "1+2-3"),  # same value either way, so no parentheses
        (("*", 2, ("*", 3, 4)), "2*3*4"),
    ],
)
def test_render_by_hand(tree, text):
    assert render(tree) == text


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 6), st.integers(1, 30))
def test_rendered_text_means_the_tree(seed, num_ops, max_operand):
    tree = random_expression(random.Random(seed), num_ops, max_operand)
    assert reference_value(render(tree)) == evaluate(tree)


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("33", 1.0),
        (" 33\n", 1.0),
        ("033", 1.0),
        ("34", 0.0),
        ("33.0", 0.0),
        ("3 3", 0.0),
        ("33 apples", 0.0),
        ("30+3", 0.0),  # an expression is not an answer, and is never evaluated
        ("__import__('os').getpid()", 0.0),
        ("٣٣", 0.0),  # Arabic-Indic digits: int() would take them
        ("9" * 5000, 0.0),  # int() of this many digits raises; the pattern refuses first
        ("", 0.0),
    ],
)
def test_exact_answer_reward(completion, expected):
    assert exact_answer_reward(["12+7*3="], [completion], answer=["33"]) == [expected]


def test_negative_answers_and_format_reward():
    assert exact_answer_reward(["1-8*5="] * 2, ["-39", "39"], answer=["-39"] * 2) == [1.0, 0.0]
    assert integer_format_reward(["p"] * 4, ["-39", "39", "x", "3.5"]) == [1.0, 1.0, 0.0, 0.0]


def test_prompts_and_gold_answers():
    task = ArithmeticTask(min_ops=1, max_ops=3, max_operand=20)
    for prompt in task.sample_prompts(50, torch.Generator().manual_seed(0)):
        assert re.fullmatch(r"[0-9+\-*()]+=", prompt["prompt"])
        assert int(prompt["answer"]) == reference_value(prompt["prompt"][:-1])
        assert 1 <= len(re.findall(r"[+\-*]", prompt["prompt"])) <= 3


def test_seeding_and_disjoint_eval_set():
    # one operator over 0..3: 48 expressions, 20 held out
    task = ArithmeticTask(min_ops=1, max_ops=1, max_operand=3, num_eval=20)
    held_out = {p["prompt"] for p in task.eval_prompts()}
    assert len(held_out) == 20
    draws = task.sample_prompts(300, torch.Generator().manual_seed(1))
    assert not {p["prompt"] for p in draws} & held_out
    assert draws == task.sample_prompts(300, torch.Generator().manual_seed(1))
    assert draws != task.sample_prompts(300, torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match="space is too small"):
        ArithmeticTask(min_ops=1, max_ops=1, max_operand=3, num_eval=49)


@pytest.mark.parametrize("first, second, same", [
    ("3+5=", "5+3=", True),
    ("2*3*4=", "4*3*2=", True),
    ("(1+2)*3=", "3*(2+1)=", True),
    ("1+2-3=", "2+1-3=", True),
    ("5-3=", "3-5=", False),
    ("1+2*3=", "(1+2)*3=", False),
])
def test_same_question(first, second, same):
    assert (same_question({"prompt": first}) == same_question({"prompt": second})) is same


def test_held_out_questions_in_either_order():
    """A held-out sum or product is held out with its operands swapped, and the held-out
    set asks each question once."""
    # one operator over 0..3: 36 questions (10 sums, 10 products, 16 differences), 20 held out
    task = ArithmeticTask(min_ops=1, max_ops=1, max_operand=3, num_eval=20)
    held_out = [same_question(p) for p in task.eval_prompts()]
    assert len(set(held_out)) == 20
    draws = task.sample_prompts(300, torch.Generator().manual_seed(1))
    assert not {same_question(p) for p in draws} & set(held_out)
    assert len({same_question(p) for p in draws}) == 16  # every question left is drawn
    with pytest.raises(ValueError, match="space is too small"):
        ArithmeticTask(min_ops=1, max_ops=1, max_operand=3, num_eval=37)


def test_task_rewards_and_gold_check():
    task = ArithmeticTask()
    prompts = task.sample_prompts(3, torch.Generator().manual_seed(0))
    responses = [[p["answer"], str(int(p["answer"]) + 1), "?"] for p in prompts]
    grades = task.grade(prompts, responses)
    assert grades.rewards.tolist() == [[1.0, 0.0, 0.0]] * 3
    assert grades.correct.tolist() == [[True, False, False]] * 3
    result = task.score(prompts, responses)
    assert result.column("integer_format").tolist() == [[1.0, 1.0, 0.0]] * 3
    examples = task.sft_examples(3, torch.Generator().manual_seed(0))
    assert all(completion == p["answer"] for (_, completion), p in zip(examples, prompts))


def test_chat_recipe_held_out_shares_no_pair_with_training():
    """The recipe's checked-in data: no held-out "a + b" is in training in either order, and
    examples/data/make_chat_arithmetic.py remakes both files byte for byte."""
    data = Path(__file__).resolve().parents[2] / "examples" / "data"

    files = ("chat_arithmetic_train.jsonl", "chat_arithmetic_eval.jsonl")

    def pairs(name: str) -> list[frozenset[int]]:
        """Each row's unordered pair of operands, its gold checked to be their sum."""
        found = []
        for row in map(json.loads, (data / name).read_text().splitlines()):
            a, b = map(int, re.fullmatch(r"What is (\d+) \+ (\d+)\? .*", row["prompt"][0]["content"]).groups())
            assert row["answer"] == str(a + b)
            found.append(frozenset((a, b)))
        return found

    train, held_out = map(pairs, files)
    assert (len(train), len(held_out), len(set(held_out))) == (1600, 256, 256)
    assert not set(held_out) & set(train)
    spec = importlib.util.spec_from_file_location("make_chat_arithmetic", data / "make_chat_arithmetic.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    remade = ["".join(json.dumps(row) + "\n" for row in part) for part in script.split()]
    assert remade == [(data / name).read_text() for name in files]
