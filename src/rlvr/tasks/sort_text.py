"""Sort digits, as text: the lecture's sorting task for language-model policies.

Prompt ``"3 1 4 1 5 9>"`` (n digits separated by spaces, then ``>``); the gold answer is ``"1 1 3 4 5 9"``. A
response is read as whitespace-separated tokens, so spacing does not matter but every token does.
"""

from __future__ import annotations

from typing import Any

import torch

from rlvr.base.rules import SEED_MAX, option
from rlvr.rewards import RewardSpec
from rlvr.tasks.grading import Prompt
from rlvr.tasks.text import MAX_EVAL_PROMPTS, GeneratedPrompts, TextTask, resolve_weights


def position_reward(
    prompts: list[str], completions: list[str], answer: list[str], **kwargs: Any
) -> list[float]:
    """Partial credit [N]: matches / max(len(gold tokens), len(response tokens)), so a missing token and an extra
    token both count as a wrong position."""
    rewards = []
    for completion, gold in zip(completions, answer):
        response, target = completion.split(), gold.split()
        matches = sum(r == t for r, t in zip(response, target))
        rewards.append(matches / max(len(response), len(target)))
    return rewards


def exact_match_reward(
    prompts: list[str], completions: list[str], answer: list[str], **kwargs: Any
) -> list[float]:
    """1.0 when the response's tokens are exactly the gold tokens, else 0.0. [N]"""
    return [float(completion.split() == gold.split()) for completion, gold in zip(completions, answer)]


DEFAULT_WEIGHTS = {"position": 1.0, "exact_match": 1.0}


class SortTextTask(TextTask):
    """Sort ``num_digits`` digits 0-9 (with ``min_digits``, each prompt's length drawn from min_digits ..
    num_digits); training prompts never repeat a held-out one. The gold check is exact match.
    """

    name = "sort_text"
    gold_reward = "exact_match"
    options = {
        "num_digits": option("digits per prompt (the most, with min_digits)", min=1, max=1024),
        "min_digits": option("the fewest digits a prompt has: each prompt's length drawn from min_digits .. "
                             "num_digits (null: all num_digits)", min=1, max=1024),
        "num_eval": option("held-out prompts (at most half the digit sequences)", min=1, max=MAX_EVAL_PROMPTS),
        "eval_seed": option("seed of the held-out prompts", min=0, max=SEED_MAX),
        "weights": option("reward weights by name, over the defaults (position 1, exact_match 1)"),
    }

    def __init__(
        self,
        num_digits: int = 5,
        num_eval: int = 100,
        min_digits: int | None = None,
        eval_seed: int = 0,
        weights: dict[str, float] | None = None,
    ) -> None:
        if num_digits < 1:
            raise ValueError(f"num_digits must be >= 1, got {num_digits}")
        if num_eval < 0 or (num_digits < 20 and num_eval > 10**num_digits // 2):  # 10**20 / 2 > any num_eval
            raise ValueError(
                f"num_eval must be in [0, {10**min(num_digits, 20) // 2}] (half the {10**min(num_digits, 20)} "
                f"sequences of {num_digits} digits, to leave room for training), got {num_eval}"
            )
        if min_digits is not None and min_digits > num_digits:
            raise ValueError(f"min_digits ({min_digits}) must be at most num_digits ({num_digits})")
        self.num_digits = num_digits
        self.min_digits = num_digits if min_digits is None else min_digits
        self.weights = resolve_weights(DEFAULT_WEIGHTS, weights)
        self.prompts = GeneratedPrompts(self._draw, num_eval, eval_seed)

    def reward_specs(self) -> list[RewardSpec]:
        return [
            RewardSpec(position_reward, self.weights["position"], "position"),
            RewardSpec(exact_match_reward, self.weights["exact_match"], "exact_match", required=True),
        ]

    def _draw(self, num: int, generator: torch.Generator) -> list[Prompt]:
        digits = torch.randint(0, 10, (num, self.num_digits), generator=generator)  # [num, n]
        rows = digits.tolist()
        if self.min_digits < self.num_digits:  # then each prompt its own length
            lengths = torch.randint(self.min_digits, self.num_digits + 1, (num,), generator=generator).tolist()
            rows = [row[:length] for row, length in zip(rows, lengths)]
        return [
            {"prompt": " ".join(map(str, row)) + ">", "answer": " ".join(map(str, sorted(row)))}
            for row in rows
        ]
