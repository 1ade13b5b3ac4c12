"""Verifiers ready to use as reward functions: math, exact and numeric answers, a format check.

Each is a reward function in the TRL form, usable from YAML as ``rlvr.rewards.verifiers:<name>``;
``regex_reward(pattern)`` makes a format reward. The gold column is ``answer``; values: 1.0 right, 0.0 wrong or no
answer, None when the gold cannot be read. ``extract`` (``EXTRACTORS``) says where the answer is: the choices and an
example config in docs/explanation/rewards.md."""

from __future__ import annotations

import functools
import importlib
import logging
import math
import re
from collections.abc import Callable
from decimal import Decimal
from types import ModuleType
from typing import Any

EXTRACTORS = ("auto", "answer_tag", "boxed", "whole", "last_number")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_LATEX_SIGNS = re.compile(r"[\\^{}]")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
# a number in running text: a sign, digits with thousands commas, decimals; "38." ends a sentence.
# A "-" right after a letter, digit or dot joins ("12-15", "x-3"), it is no sign: the range's end is 15
_NUMBER_IN_TEXT = re.compile(r"(?:(?<![\w.])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
# what lm-eval's GSM8K exact match ignores on both sides: thousands commas, "$", a final "."
_NUMBER_NOISE = re.compile(r",|\\?\$|\.\s*\Z")
# ASCII digits only (int() takes other scripts' digits too), and few: int() past 4300 digits raises
_INTEGER = re.compile(r"\s*(-?[0-9]{1,100})\s*")
_DECIMAL = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")  # no exponent: Decimal("1e99999999999999999999") raises
# <think> reasoning </think> <answer> answer </answer>, nothing around them but white space
R1_FORMAT = r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*"


class _DropTimeoutWarning(logging.Filter):
    """math-verify warns once per process that its timeouts are off: on purpose (calls run under a RewardRunner
    timeout instead), so in every reward worker that is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutWarning())


def math_verify() -> ModuleType:
    """The math-verify module, imported on first use: optional (the ``lm`` extra), and its import takes ~0.5 s."""
    return importlib.import_module("math_verify")


_WORDS = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_SENTENCE_END = re.compile(r"\.\s*\Z")
_MATH_DELIMITERS = ("$", "\\[", "\\(")


def is_equivalent(answer: str, gold: str) -> bool | None:
    """math-verify: does ``answer`` (LaTeX or plain) equal the number ``gold``? None when the gold does not parse.
    No time limit here: run it under a RewardRunner timeout.

    The model's answer is read only as LaTeX (a grammar parser): math-verify's plain expression path goes through
    sympy's ``parse_expr``, which evaluates Python, so model output never reaches it. The gold (trusted) may.
    """
    mv = math_verify()
    gold_parsed = mv.parse(gold, extraction_config=[mv.ExprExtractionConfig()], parsing_timeout=None)
    if not gold_parsed:
        return None
    # Plain words (units such as "18 dollars") are dropped; LaTeX commands (\\frac) stay.
    # Currency goes before math mode is decided: "\\$" always, and a lone "$" ("$18").
    text = _WORDS.sub(" ", answer).replace("\\$", "")
    if text.count("$") % 2:
        text = text.replace("$", "")
    # "18." ends a sentence; math-verify reads "$18.$" as the string "18.", not a number
    text = _SENTENCE_END.sub("", text.strip())
    # math-verify finds math only inside delimiters; text with its own is not wrapped again
    if not any(delimiter in text for delimiter in _MATH_DELIMITERS):
        text = f"${text}$"
    answer_parsed = mv.parse(text, extraction_config=[mv.LatexExtractionConfig()], parsing_timeout=None)
    return mv.verify(gold_parsed, answer_parsed, timeout_seconds=None)


def completion_text(completion: str | list[dict[str, Any]]) -> str:
    """The text of a completion: itself, or a chat completion's last message's content ("" for an empty list)."""
    if isinstance(completion, str):
        return completion
    return str(completion[-1]["content"]) if completion else ""


def extract_answer(completion: str | list[dict[str, Any]], extract: str = "auto") -> str | None:
    """The answer in ``completion`` (text or a chat) by the rule ``extract``, stripped; None when none or empty."""
    completion = completion_text(completion)
    if extract == "whole":
        answer: str | None = completion
    elif extract == "answer_tag":
        answer = _last_answer_tag(completion)
    elif extract == "boxed":
        answer = last_boxed(completion)
    elif extract == "last_number":
        numbers = _NUMBER_IN_TEXT.findall(completion)
        answer = numbers[-1] if numbers else None
    elif extract == "auto":
        answer = _last_answer_tag(completion)
        answer = last_boxed(completion) if answer is None else answer
    else:
        raise ValueError(f"extract={extract!r} is not allowed; choose one of: {', '.join(EXTRACTORS)}")
    return (answer.strip() or None) if answer is not None else None


def _last_answer_tag(text: str) -> str | None:
    matches = _ANSWER_TAG.findall(text)
    return matches[-1] if matches else None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (nested braces balanced), or None when none closes."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for i in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth < 0:
            return text[begin:i]
    return None


def math_equal(answer: str, gold: str) -> bool | None:
    """Does ``answer`` equal ``gold`` as mathematics (math-verify)? None when the gold cannot be parsed. No time limit
    here: run it under a reward timeout.

    A gold without "\\", "^", "{" or "}" that parses as a plain number or expression ("0.5", "1/2", "3,000") is read
    as GSM8K's grader reads it (``is_equivalent``); any other gold ("\\frac{1}{2}", "x^2+1") is read as LaTeX, like
    the answer (the plain reader would take "^" for Python's xor). Model output is only ever parsed as LaTeX.
    """
    if not _LATEX_SIGNS.search(gold):
        same = is_equivalent(answer, gold)
        if same is not None:
            return same
    mv = math_verify()
    latex = [mv.LatexExtractionConfig()]
    gold_parsed = mv.parse(_in_math_mode(gold), extraction_config=latex, parsing_timeout=None)
    if not gold_parsed:
        return None
    answer_parsed = mv.parse(_in_math_mode(answer), extraction_config=latex, parsing_timeout=None)
    return bool(mv.verify(gold_parsed, answer_parsed, timeout_seconds=None))


def _in_math_mode(text: str) -> str:
    """``text`` inside "$...$" unless it already has math delimiters (math-verify reads math only there)."""
    return text if any(d in text for d in ("$", "\\[", "\\(", "\\boxed")) else f"${text}$"


def parse_number(text: str) -> float | None:
    """The number ``text`` is ("1,234.5", "$12", "-3e2", "50%" -> 50.0), or None when it is not exactly one."""
    cleaned = text.strip().replace(",", "").replace("\\$", "").lstrip("$").rstrip("%").strip()
    return float(cleaned) if _NUMBER.fullmatch(cleaned) else None


def parse_integer(text: str) -> int | None:
    """The integer ``text`` states (whitespace around allowed), else None ("12x", "1 2", over 100 digits)."""
    match = _INTEGER.fullmatch(text)
    return None if match is None else int(match.group(1))


def _per_completion(score: Callable[[str, Any], float | None], completions: list[str], answer: list[Any],
                    extract: str) -> list[float | None]:
    """``score(extracted, gold)`` of each completion, 0.0 where no answer is found. [N]"""
    if extract not in EXTRACTORS:
        raise ValueError(f"extract={extract!r} is not allowed; choose one of: {', '.join(EXTRACTORS)}")
    rewards: list[float | None] = []
    for completion, gold in zip(completions, answer):
        extracted = extract_answer(completion, extract)
        rewards.append(0.0 if extracted is None else score(extracted, gold))
    return rewards


def math_answer(completions: list[str], answer: list[Any], extract: str = "auto", **kwargs: Any
                ) -> list[float | None]:
    """1.0 when the completion's answer equals the gold ``answer`` (``math_equal``), 0.0 when it differs or none is
    found, None when the gold does not parse. [N]"""

    def score(extracted: str, gold: Any) -> float | None:
        same = math_equal(extracted, str(gold))
        return None if same is None else float(same)

    return _per_completion(score, completions, answer, extract)


def exact_match(completions: list[str], answer: list[Any], extract: str = "auto", **kwargs: Any) -> list[float]:
    """1.0 when the completion's answer is ``str(gold)`` exactly (both stripped), else 0.0; with
    ``extract="last_number"`` both are read as lm-eval's flexible extract reads them (``same_number``). [N]"""
    same = same_number if extract == "last_number" else lambda extracted, gold: extracted == gold.strip()
    return _per_completion(lambda extracted, gold: float(same(extracted, str(gold))), completions, answer, extract)


def same_number(answer: str, gold: str) -> bool:
    """Are ``answer`` and ``gold`` the same once thousands commas, "$" and a final "." are dropped (lm-eval's GSM8K
    exact match), compared as numbers where both are plain decimals ("79.0" is "79"), else as text?"""
    answer, gold = (_NUMBER_NOISE.sub("", text).strip() for text in (answer, gold))
    if _DECIMAL.fullmatch(answer) and _DECIMAL.fullmatch(gold):
        return Decimal(answer) == Decimal(gold)  # exact: floats would merge integers past 2**53
    return answer == gold


def numeric_match(completions: list[str], answer: list[Any], extract: str = "auto", rel_tol: float = 1e-6,
                  abs_tol: float = 1e-9, **kwargs: Any) -> list[float | None]:
    """1.0 when the completion's answer is a number ``math.isclose`` to the gold ``answer`` (``parse_number``), 0.0
    when it is not or is no number, None when the gold is no number. [N]"""

    def score(extracted: str, gold: Any) -> float | None:
        gold_number = float(gold) if isinstance(gold, (int, float)) else parse_number(str(gold))
        if gold_number is None or not math.isfinite(gold_number):
            return None
        value = parse_number(extracted)
        return float(value is not None and math.isclose(value, gold_number, rel_tol=rel_tol, abs_tol=abs_tol))

    return _per_completion(score, completions, answer, extract)


def regex_match(completions: list[str], pattern: str = R1_FORMAT, **kwargs: Any) -> list[float]:
    """1.0 when the whole completion matches ``pattern`` (``re.fullmatch``, "." matching newlines), else 0.0. [N]"""
    compiled = re.compile(pattern, re.DOTALL)
    return [float(compiled.fullmatch(completion_text(c)) is not None) for c in completions]


def answer_format(completions: list[str], **kwargs: Any) -> list[float]:
    """1.0 when the completion is "<think> ... </think> <answer> ... </answer>" (``R1_FORMAT``), else 0.0. [N]"""
    return regex_match(completions, R1_FORMAT)


def regex_reward(pattern: str) -> Callable[..., list[float]]:
    """A reward function that is 1.0 when a completion fully matches ``pattern``: a
    ``functools.partial`` of ``regex_match``, so reward worker processes can receive it.
    The pattern is checked now (``re.error`` for a bad one)."""
    re.compile(pattern)
    return functools.partial(regex_match, pattern=pattern)
