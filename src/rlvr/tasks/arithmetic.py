"""Small integer arithmetic, as text: prompt ``"12+7*3="``, gold answer ``"33"``.

Expressions are random binary trees over + - * and operands 0..max_operand, printed with the usual precedence and
only the parentheses it needs. The gold answer is computed on the tree with Python integers; model output is only
matched against an integer pattern, never evaluated. The held-out set holds questions, not texts: ``3+5=`` held out
holds out ``5+3=`` too (``same_question``).
"""

from __future__ import annotations

import ast
import operator
import random
from collections.abc import Hashable
from typing import Any

import torch

from rlvr.base.rules import SEED_MAX, option
from rlvr.rewards import RewardSpec
from rlvr.rewards.verifiers import parse_integer
from rlvr.tasks.grading import Prompt
from rlvr.tasks.text import MAX_EVAL_PROMPTS, GeneratedPrompts, TextTask, resolve_weights

# an expression: an operand, or (operator, left, right)
Expression = int | tuple[str, "Expression", "Expression"]

OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
PRECEDENCE = {"+": 1, "-": 1, "*": 2}


def random_expression(rng: random.Random, num_ops: int, max_operand: int) -> Expression:
    """A uniformly shaped random tree with ``num_ops`` operators."""
    if num_ops == 0:
        return rng.randint(0, max_operand)
    left_ops = rng.randint(0, num_ops - 1)
    return (
        rng.choice(list(OPERATORS)),
        random_expression(rng, left_ops, max_operand),
        random_expression(rng, num_ops - 1 - left_ops, max_operand),
    )


def evaluate(expression: Expression) -> int:
    """The value of the tree, in exact integer arithmetic."""
    if isinstance(expression, int):
        return expression
    op, left, right = expression
    return OPERATORS[op](evaluate(left), evaluate(right))


def render(expression: Expression, parent: str = "", is_right: bool = False) -> str:
    """The tree as text. A subtree gets parentheses when it binds looser than its parent, or is the right operand
    of "-" at the same precedence: a-(b-c) and a-(b+c)."""
    if isinstance(expression, int):
        return str(expression)
    op, left, right = expression
    text = render(left, op) + op + render(right, op, is_right=True)
    if parent and (
        PRECEDENCE[op] < PRECEDENCE[parent]
        or (is_right and parent == "-" and PRECEDENCE[op] == PRECEDENCE[parent])
    ):
        return f"({text})"
    return text


def same_question(prompt: Prompt) -> Hashable:
    """What a prompt asks, up to the order of the operands of + and *: ``3+5=`` and ``5+3=`` give one key, as do
    ``2*3*4=`` and ``4*3*2=``; ``5-3=`` and ``3-5=`` give two. Read from the text with Python's parser (the same
    grammar), so prompts of the same text always share a key."""

    def canonical(node: ast.expr) -> Hashable:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if not isinstance(node, ast.BinOp) or type(node.op) not in (ast.Add, ast.Sub, ast.Mult):
            raise ValueError(f"not an arithmetic task prompt: {prompt['prompt']!r}")
        if isinstance(node.op, ast.Sub):
            return ("-", canonical(node.left), canonical(node.right))
        # a chain of one commutative, associative operator is the multiset of its operands
        terms, pending = [], [node]
        while pending:
            part = pending.pop()
            if isinstance(part, ast.BinOp) and type(part.op) is type(node.op):
                pending += (part.left, part.right)
            else:
                terms.append(canonical(part))
        return ("+" if isinstance(node.op, ast.Add) else "*", tuple(sorted(terms, key=repr)))

    return canonical(ast.parse(prompt["prompt"].removesuffix("="), mode="eval").body)


def exact_answer_reward(
    prompts: list[str], completions: list[str], answer: list[str], **kwargs: Any
) -> list[float]:
    """1.0 when the completion is exactly the gold integer, else 0.0. [N]"""
    return [float(parse_integer(c) == int(gold)) for c, gold in zip(completions, answer)]


def integer_format_reward(prompts: list[str], completions: list[str], **kwargs: Any) -> list[float]:
    """1.0 when the completion is an integer at all, right or wrong. [N]"""
    return [float(parse_integer(c) is not None) for c in completions]


DEFAULT_WEIGHTS = {"exact_answer": 1.0, "integer_format": 0.0}


class ArithmeticTask(TextTask):
    """Expressions with ``min_ops``..``max_ops`` operators over operands 0..``max_operand``. Training prompts never
    ask a question of the ``num_eval`` held-out ones, in any order of the operands of + and * (``same_question``).
    """

    name = "arithmetic"
    gold_reward = "exact_answer"
    # past 64 operators of up to 10**6 an answer has hundreds of digits; no response states it
    options = {
        "min_ops": option("fewest operators in an expression", min=1, max=64),
        "max_ops": option("most operators in an expression (>= min_ops)", min=1, max=64),
        "max_operand": option("operands are drawn from 0..max_operand", min=1, max=10**6),
        "num_eval": option("held-out prompts", min=1, max=MAX_EVAL_PROMPTS),
        "eval_seed": option("seed of the held-out prompts", min=0, max=SEED_MAX),
        "weights": option("reward weights by name, over the defaults (exact_answer 1, integer_format 0)"),
    }

    def __init__(
        self,
        min_ops: int = 1,
        max_ops: int = 2,
        max_operand: int = 20,
        num_eval: int = 100,
        eval_seed: int = 0,
        weights: dict[str, float] | None = None,
    ) -> None:
        if not 1 <= min_ops <= max_ops:
            raise ValueError(f"need 1 <= min_ops <= max_ops, got {min_ops}, {max_ops}")
        if max_operand < 1:
            raise ValueError(f"max_operand must be >= 1, got {max_operand}")
        self.min_ops, self.max_ops, self.max_operand = min_ops, max_ops, max_operand
        self.weights = resolve_weights(DEFAULT_WEIGHTS, weights)
        self.prompts = GeneratedPrompts(self._draw, num_eval, eval_seed, key=same_question)

    def reward_specs(self) -> list[RewardSpec]:
        return [
            RewardSpec(exact_answer_reward, self.weights["exact_answer"], "exact_answer", required=True),
            RewardSpec(integer_format_reward, self.weights["integer_format"], "integer_format"),
        ]

    def _draw(self, num: int, generator: torch.Generator) -> list[Prompt]:
        """``num`` random prompts; one draw from ``generator`` seeds a Python RNG, so the generator fixes them."""
        rng = random.Random(int(torch.randint(0, 2**62, (1,), generator=generator)))
        prompts = []
        for _ in range(num):
            num_ops = rng.randint(self.min_ops, self.max_ops)
            expression = random_expression(rng, num_ops, self.max_operand)
            prompts.append({"prompt": render(expression) + "=", "answer": str(evaluate(expression))})
        return prompts
