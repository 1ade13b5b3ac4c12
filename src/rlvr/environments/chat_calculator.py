"""Arithmetic for a chat model with a calculator it is told of in its system prompt.

``ChatCalculator`` is for instruct models whose chat template has no tools slot (SmolLM2's ChatML): the system
prompt says how to call the calculator, in the "plain" style, and one demonstrated exchange can go before the
question. An episode with the tool::

    system     You have a calculator. To use it, write calculator(expression) and nothing
               else. Its result comes back to you. Then reply with the answer.
    user       What is 318 * 47?              (with example=True: one such exchange first)
    assistant  calculator(318*47)              (trained)
    tool       14946                           (the runner's: the task's sandboxed calculator)
    assistant  318 * 47 = 14946                (trained; step: the last number is the answer)

Without the tool (``use_tools=False``, the baseline) the system prompt asks for the answer alone and the example
answers in one turn. A model may write its working first, so the answer is the turn's last number, compared as
``same_number`` does: "318 * 47 = 14946" and "14,946.0" answer 14946.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from rlvr.environments.base import Message, Step
from rlvr.rewards.verifiers import extract_answer, same_number

TOOL_SYSTEM = ("You have a calculator. To use it, write calculator(expression) and nothing else. "
               "Its result comes back to you. Then reply with the answer.")
PLAIN_SYSTEM = "Reply with the answer."
OPERATORS: dict[str, Callable[[int, int], int]] = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__}
EXAMPLE = (318, 47)  # the demonstrated exchange's operands


class ChatCalculator:
    """``a <operator> b`` asked as a chat question. The gold check: the last number of the answer turn is the result.

    digits: (digits of a, digits of b). use_tools: the calculator is described (the task's ``tools: [calculator]``
    runs it); False is the baseline, with ``tools: []``. example: one demonstrated exchange before the question.
    reset(start): an int seed or a row ``{"a": .., "b": ..}`` of integers. step(text): the answer turn: done;
    reward 1.0 when solved, else 0.
    """

    def __init__(self, digits: tuple[int, int] | list[int] = (3, 2), operator: str = "*", use_tools: bool = True,
                 example: bool = True) -> None:
        if len(digits) != 2 or not all(isinstance(d, int) and 1 <= d <= 30 for d in digits):
            raise ValueError(f"digits must be two whole numbers in 1..30, got {digits!r}")
        if operator not in OPERATORS:
            raise ValueError(f"operator must be one of {', '.join(OPERATORS)}, got {operator!r}")
        self.digits, self.operator = (int(digits[0]), int(digits[1])), operator
        self.use_tools, self.example = use_tools, example
        self.result: int | None = None

    def tools(self) -> dict[str, Callable[..., Any]]:
        return {}  # the task's sandboxed calculator runs the calls (task.options.tools)

    def reset(self, start: Any) -> list[Message]:
        if isinstance(start, dict):
            a, b = start.get("a"), start.get("b")
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in (a, b)):
                raise ValueError(f"a row needs integer 'a' and 'b', got {start!r}")
        elif isinstance(start, int) and not isinstance(start, bool):
            rng = random.Random(start)
            a, b = (rng.randint(10 ** (d - 1), 10**d - 1) for d in self.digits)
        else:
            raise ValueError(f"an episode starts from an int seed or a row dict, got {type(start).__name__}")
        self.result = OPERATORS[self.operator](a, b)
        messages = [{"role": "system", "content": TOOL_SYSTEM if self.use_tools else PLAIN_SYSTEM}]
        if self.example:
            messages += self.exchange(*EXAMPLE)
        return [*messages, {"role": "user", "content": self.question(a, b)}]

    def question(self, a: int, b: int) -> str:
        return f"What is {a} {self.operator} {b}?"

    def exchange(self, a: int, b: int) -> list[Message]:
        """A demonstrated exchange: the question, (with the tool) the call and its result, the answer."""
        result = OPERATORS[self.operator](a, b)
        answer = {"role": "assistant", "content": f"{a} {self.operator} {b} = {result}"}
        if not self.use_tools:
            return [{"role": "user", "content": self.question(a, b)}, answer]
        return [{"role": "user", "content": self.question(a, b)},
                {"role": "assistant", "content": f"calculator({a}{self.operator}{b})"},
                {"role": "tool", "name": "calculator", "content": str(result)}, answer]

    def step(self, text: str) -> Step:
        if self.result is None:
            raise RuntimeError("step() needs an episode in progress: call reset() first")
        found = extract_answer(text, "last_number")
        # the dataset's last_number check, so both grade a turn alike: "36.0" and "1,234" are numbers
        solved = found is not None and same_number(found, str(self.result))
        self.result = None
        return Step(None, 1.0 if solved else 0.0, done=True, solved=solved)
