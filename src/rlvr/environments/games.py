"""Ready multi-turn environments for tiny character-level models (``rlvr init-model``), each with its gold check
and an SFT warm start; each environment's ``chars`` names every character its texts use. Episodes are plain text:
the prompt, the policy's turn (up to its EOS), the observation appended as it is, the next turn, and so on.

  * ``GuessingGame``: a number in a range, "+"/"-" (higher / lower) after each guess: ``1-32>16 +>24 ->20 +>22``.
  * ``CalculatorArithmetic``: the sum of two long numbers, with a ``calculator`` tool (the "plain" style)::

        12345+67890=calculator(12345+67890)= 80235
        80235

An SFT warm start is demonstrations: each policy turn of a demonstrated episode is one (prompt, completion) pair,
the prompt the whole transcript before it (``write_sft_jsonl`` for ``rlvr sft``). SFT adds the EOS to a completion
but sees a prompt only as text, so ``turn_end`` (the tokenizer's EOS text, ``"<eos>"`` for ``rlvr init-model``'s)
is written after each earlier policy turn in a prompt, for the ids an episode's context holds; "" gives the plain
transcript. ``ENVIRONMENTS`` also names ``chat_calculator``, for chat models.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rlvr.environments.base import Step, ToolResult
from rlvr.environments.chat_calculator import ChatCalculator
from rlvr.environments.tool_parsing import format_tool_results
from rlvr.rewards.verifiers import parse_integer

Pair = tuple[str, str]  # (prompt: the transcript before a policy turn, completion: that turn)

CALCULATOR = "calculator"
TOOL_STYLE = "plain"  # how the calculator is called, calculator(12345+67890), and answers, "= 80235\n"


def _seed_or_row(start: Any, keys: tuple[str, ...]) -> tuple[int | None, dict[str, int]]:
    """``start`` as (seed, None-row) or (None, the row's integer ``keys``); ValueError otherwise."""
    if isinstance(start, int) and not isinstance(start, bool):
        return start, {}
    if isinstance(start, dict):
        values = {key: start.get(key) for key in keys}
        bad = [key for key, value in values.items() if not isinstance(value, int) or isinstance(value, bool)]
        if bad:
            raise ValueError(f"a row needs integer {', '.join(repr(k) for k in bad)}, got {start!r}")
        return None, values
    raise ValueError(f"an episode starts from an int seed or a row dict, got {type(start).__name__}")


def _chars(*texts: str) -> str:
    return "".join(sorted(set("".join(texts))))


class GuessingGame:
    """Guess a whole number in ``low``..``high`` (the gold check); the prompt states the range, ``"1-32>"``.

    reset(start): an int seed (the target ``random.Random(seed).randint(low, high)``) or a row ``{"target": n}``.
    step(text): ``text`` read as an integer guess:
      * the target: done, solved, reward ``max(0.1, 1 - 0.1 * (turns - 1))``, the episode's whole return, so
        fewer turns score higher and binary search (at most 6 turns over 32 numbers) scores at least 0.5;
      * too low or too high: reward 0, observation ``" +>"`` (higher) or ``" ->"`` (lower); with
        ``feedback="interval"`` the range still open instead, ``" 17-32>"`` (the policy need not remember);
      * not an integer: reward 0, the range asked again (the open range with ``feedback="interval"``).
    With ``max_turns``, the episode ends unsolved, reward 0, after that many turns.
    """

    FEEDBACK = ("direction", "interval")

    def __init__(self, low: int = 1, high: int = 32, feedback: str = "direction", max_turns: int | None = None) -> None:
        if not 0 <= low < high:
            raise ValueError(f"need 0 <= low < high, got {low}, {high}")
        if feedback not in self.FEEDBACK:
            raise ValueError(f"feedback must be one of {', '.join(self.FEEDBACK)}, got {feedback!r}")
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be >= 1 or None, got {max_turns}")
        self.low, self.high, self.feedback, self.max_turns = low, high, feedback, max_turns
        self.target: int | None = None
        self.turns = 0
        self.done = False
        self.open_low, self.open_high = low, high  # the range the guesses so far leave open

    @property
    def chars(self) -> str:
        """Every character the game's texts use (digits, space, "-", ">", and "+" for direction)."""
        return _chars("0123456789 ->", "+" if self.feedback == "direction" else "")

    def settings(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, "feedback": self.feedback, "max_turns": self.max_turns}

    def tools(self) -> dict[str, Callable[..., Any]]:
        return {}

    def reset(self, start: Any) -> str:
        seed, row = _seed_or_row(start, ("target",))
        target = random.Random(seed).randint(self.low, self.high) if seed is not None else row["target"]
        if not self.low <= target <= self.high:
            raise ValueError(f"target {target} is outside {self.low}..{self.high}")
        self.target, self.turns, self.done = target, 0, False
        self.open_low, self.open_high = self.low, self.high
        return f"{self.low}-{self.high}>"

    def step(self, text: str) -> Step:
        if self.target is None or self.done:
            raise RuntimeError("step() needs an episode in progress: call reset() first")
        self.turns += 1
        guess = parse_integer(text)
        if guess == self.target:
            self.done = True
            return Step(None, max(0.1, 1.0 - 0.1 * (self.turns - 1)), done=True, solved=True)
        if self.max_turns is not None and self.turns >= self.max_turns:
            self.done = True
            return Step(None, 0.0, done=True, solved=False)
        if guess is None:
            return Step(self._open_range() if self.feedback == "interval" else f" {self.low}-{self.high}>",
                        solved=False)
        if guess < self.target:
            self.open_low = max(self.open_low, guess + 1)
        else:
            self.open_high = min(self.open_high, guess - 1)
        if self.feedback == "interval":
            return Step(self._open_range(), solved=False)
        return Step(" +>" if guess < self.target else " ->", solved=False)

    def _open_range(self) -> str:
        return f" {self.open_low}-{self.open_high}>"

    def demonstration(self, start: Any, rng: random.Random, turn_end: str = "") -> list[Pair]:
        """One demonstrated episode: each guess drawn uniformly from the range still open, until it hits (about
        2 ln n guesses against binary search's log2 n, so RL has turns to save). Under ``max_turns`` it halves
        the open range once only enough turns for binary search are left, so it solves whenever it can."""
        game = GuessingGame(**self.settings())
        transcript = game.reset(start)
        pairs = []
        while True:
            low, high = game.open_low, game.open_high
            turns_left = None if self.max_turns is None else self.max_turns - game.turns
            if turns_left is not None and turns_left <= (high - low + 1).bit_length():
                guess = str((low + high) // 2)  # bit_length(n) = ceil(log2(n + 1)): binary search's worst case
            else:
                guess = str(rng.randint(low, high))
            pairs.append((transcript, guess))
            step = game.step(guess)
            if step.done:
                return pairs
            transcript += guess + turn_end + step.observation

    def sft_examples(self, n: int, rng: random.Random, turn_end: str = "") -> list[Pair]:
        """``n`` pairs: every turn of demonstrated episodes from seeds drawn from ``rng`` (the last cut at ``n``)."""
        return _collect(lambda: self.demonstration(rng.getrandbits(62), rng, turn_end), n)


class CalculatorArithmetic:
    """The sum of two ``digits``-digit numbers, too long for a tiny model to add in its head, with a
    ``calculator`` tool to call. The gold check: the answer is the sum.

    reset(start): an int seed or a row ``{"a": .., "b": ..}`` of non-negative integers; the prompt ``"12345+67890="``.
    step(text): the final answer (a tool call never reaches ``step``): done; reward 1.0 when it is the sum, else 0.
    use_tools: the calculator is offered (``tool_names``, run by the episode runner: ``tools()`` is empty);
    False is the baseline, the same task answered without tools.
    """

    def __init__(self, digits: int = 5, use_tools: bool = True) -> None:
        if not 1 <= digits <= 30:
            raise ValueError(f"digits must be in 1..30, got {digits}")
        self.digits, self.use_tools = digits, use_tools
        self.a: int | None = None
        self.b: int | None = None
        self.done = False

    @property
    def tool_names(self) -> tuple[str, ...]:
        """The tools the policy may call in this variant."""
        return (CALCULATOR,) if self.use_tools else ()

    @property
    def chars(self) -> str:
        """Every character the prompts, answers and (with tools) the calls and results use."""
        return _chars("0123456789+=", f"{CALCULATOR}(){tool_result('0')}" if self.use_tools else "")

    def settings(self) -> dict[str, Any]:
        return {"digits": self.digits, "use_tools": self.use_tools}

    def tools(self) -> dict[str, Callable[..., Any]]:
        return {}

    def reset(self, start: Any) -> str:
        seed, row = _seed_or_row(start, ("a", "b"))
        if seed is not None:
            rng = random.Random(seed)
            row = {key: rng.randint(10 ** (self.digits - 1), 10**self.digits - 1) for key in ("a", "b")}
        if row["a"] < 0 or row["b"] < 0:
            raise ValueError(f"a and b must be non-negative, got {row['a']}, {row['b']}")
        self.a, self.b, self.done = row["a"], row["b"], False
        return f"{self.a}+{self.b}="

    def step(self, text: str) -> Step:
        if self.a is None or self.done:
            raise RuntimeError("step() needs an episode in progress: call reset() first")
        self.done = True
        solved = parse_integer(text) == self.a + self.b
        return Step(None, 1.0 if solved else 0.0, done=True, solved=solved)

    def demonstration(self, start: Any, turn_end: str = "") -> list[Pair]:
        """One demonstrated episode. With tools: call the calculator on the sum, then answer with its result (two
        pairs). Without: the true sum at once (one pair), which the baseline model has to learn to compute."""
        task = CalculatorArithmetic(**self.settings())
        prompt = task.reset(start)
        answer = str(task.a + task.b)
        if not self.use_tools:
            return [(prompt, answer)]
        call = f"{CALCULATOR}({task.a}+{task.b})"
        return [(prompt, call), (prompt + call + turn_end + tool_result(answer), answer)]

    def sft_examples(self, n: int, rng: random.Random, turn_end: str = "") -> list[Pair]:
        """``n`` pairs from demonstrated episodes from seeds drawn from ``rng`` (the last cut at ``n``)."""
        return _collect(lambda: self.demonstration(rng.getrandbits(62), turn_end), n)


def tool_result(content: str) -> str:
    """What the policy reads back after a calculator call that gave ``content``."""
    return format_tool_results([ToolResult(CALCULATOR, content)], TOOL_STYLE)


def _collect(episode: Callable[[], list[Pair]], n: int) -> list[Pair]:
    """The first ``n`` pairs of episodes made by ``episode()`` one after another."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    pairs: list[Pair] = []
    while len(pairs) < n:
        pairs.extend(episode())
    return pairs[:n]


def write_sft_jsonl(pairs: Iterable[Pair], path: str | Path) -> Path:
    """Write ``pairs`` as JSON Lines with "prompt" and "completion" columns (``rlvr sft``'s ``sft.data``)."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as file:
        for prompt, completion in pairs:
            file.write(json.dumps({"prompt": prompt, "completion": completion}) + "\n")
    return path


# name -> class; each is built with its keyword options (``GuessingGame(high=64)``). The retry
# wrapper is not here: it wraps a task's gold check (``rlvr.environments.retry``).
ENVIRONMENTS: dict[str, type] = {
    "guessing": GuessingGame,
    "calculator_arithmetic": CalculatorArithmetic,
    "chat_calculator": ChatCalculator,  # for chat models: the tool told of in the system prompt
}
