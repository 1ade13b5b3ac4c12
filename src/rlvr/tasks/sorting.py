"""The lecture's toy task: sort n numbers.

Prompts are n tokens from a vocabulary of V numbers; a response is n tokens. The reward functions are vectorised
over ``prompts [B, n]`` and ``responses [B, G, n]`` and equal the lecture's scalar definitions (written out in
tests/tasks/test_sorting.py); they see numbers written as text (``"3 1 2"``). ``inclusion_ordering`` has a loophole
on prompts with repeated numbers (docs/explanation/tasks.md)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlvr.base.rules import SEED_MAX, option
from rlvr.rewards import RewardResult, RewardSpec, TrainerState
from rlvr.tasks.grading import GradedTask

LECTURE_PROMPTS = [[1, 0, 2], [3, 2, 4], [1, 2, 3]]


# Vectorised versions: prompts [B, n], responses [B, G, n] -> rewards [B, G].
def exact_reward(prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
    target = prompts.sort(dim=-1).values.unsqueeze(1)  # [B, 1, n]
    return (responses == target).all(dim=-1).float()


def position_match_reward(prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
    target = prompts.sort(dim=-1).values.unsqueeze(1)  # [B, 1, n]
    return (responses == target).sum(dim=-1).float()


def inclusion_ordering_reward(prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
    # present[b, g, i]: prompt token i appears somewhere in response g.
    present = (prompts[:, None, :, None] == responses[:, :, None, :]).any(dim=-1)  # [B, G, n]
    ordered = responses[..., :-1] <= responses[..., 1:]  # [B, G, n-1]
    return (present.sum(dim=-1) + ordered.sum(dim=-1)).float()


REWARD_FUNCTIONS = {
    "exact": exact_reward,
    "position_match": position_match_reward,
    "inclusion_ordering": inclusion_ordering_reward,
}


REWARDS = tuple(REWARD_FUNCTIONS)


class NumberTexts(Sequence[str]):
    """Rows of numbers [N, n] as the texts reward functions see (``"3 1 2"``), written when first read. ``numbers``
    keeps the tensor, so the task's own reward reads it without parsing, and a run without user functions writes
    no text at all."""

    def __init__(self, numbers: torch.Tensor) -> None:
        self.numbers = numbers
        self._texts: list[str] | None = None

    def __len__(self) -> int:
        return self.numbers.shape[0]

    def __getitem__(self, index: int | slice) -> str | NumberTexts:  # a slice gives a NumberTexts
        if isinstance(index, slice):
            return self if index == slice(0, len(self)) else NumberTexts(self.numbers[index])
        if self._texts is None:
            self._texts = [" ".join(map(str, row)) for row in self.numbers.tolist()]
        return self._texts[index]


def sorting_reward(
    prompts: Sequence[str], completions: Sequence[str], reward: str = "inclusion_ordering", **kwargs: object
) -> torch.Tensor:
    """``REWARD_FUNCTIONS[reward]`` in the TRL form: prompts [N] and completions [N] of n numbers each, as text
    ("1 0 2") -> rewards [N]."""
    responses = _numbers(completions).unsqueeze(1)  # [N, 1, n]: one response per prompt
    return REWARD_FUNCTIONS[reward](_numbers(prompts), responses).squeeze(1)


def _numbers(texts: Sequence[str]) -> torch.Tensor:
    """[N, n] long: the numbers of N texts of n numbers each."""
    if isinstance(texts, NumberTexts):
        return texts.numbers
    return torch.tensor([[int(x) for x in text.split()] for text in texts], dtype=torch.long)


@dataclass
class SortingTask(GradedTask):
    """Sort n numbers from ``range(vocab_size)``; the gold check is "exact", reported with weight 0 when it is not
    the ``reward``. The user's reward functions are summed first and the task's reward added to their sum: the
    float32 number the toy has always computed, builtin + (u1 + u2 + ...).
    """

    name = "sorting"
    gold_reward = "exact"
    user_rewards_first = True
    reports_builtin_rewards = False
    options = {
        "num_numbers": option("numbers per prompt (n)", min=2, max=1024),
        "vocab_size": option("numbers are drawn from range(vocab_size)", above=0, max=4096),
        "reward": option("the rewarded function", choices=REWARDS),
        "allow_repeats": option("random prompts may repeat a number"),
        "prompts": option("fixed prompts used every epoch and for evaluation (default: the lecture's three); "
                          "null to sample fresh ones"),
        "eval_size": option("held-out prompts (random prompts)", above=0, max=2**14),
        "eval_seed": option("seed of the held-out prompts (random prompts)", min=0, max=SEED_MAX),
    }
    config_defaults = {"prompts": LECTURE_PROMPTS}  # a config runs the lecture's prompts unless told otherwise

    num_numbers: int = 3
    vocab_size: int = 5
    reward: str = "inclusion_ordering"
    allow_repeats: bool = False
    prompts: list[list[int]] | None = None
    eval_size: int = 64
    eval_seed: int = 1234

    def __post_init__(self) -> None:
        if self.reward not in REWARD_FUNCTIONS:
            raise ValueError(f"unknown sorting reward {self.reward!r}; allowed: {', '.join(REWARDS)}")
        if not self.allow_repeats and self.num_numbers > self.vocab_size:
            raise ValueError(
                f"cannot draw {self.num_numbers} distinct numbers from a vocabulary of {self.vocab_size}"
            )
        if self.prompts is not None:
            self._fixed = torch.tensor(self.prompts, dtype=torch.long)
            if self._fixed.dim() != 2 or self._fixed.shape[1] != self.num_numbers:
                raise ValueError(f"fixed prompts must be a list of lists of {self.num_numbers} numbers")
            if self._fixed.min() < 0 or self._fixed.max() >= self.vocab_size:
                raise ValueError(f"fixed prompts must use numbers in [0, {self.vocab_size})")

    @property
    def max_reward(self) -> float | None:
        """The most a response can score (the hacking monitor's top); None when user reward functions add to it."""
        if self._user_reward_names:
            return None
        n = self.num_numbers
        return {"exact": 1.0, "position_match": float(n), "inclusion_ordering": 2.0 * n - 1}[self.reward]

    def sample_prompts(self, num_prompts: int, generator: torch.Generator) -> torch.Tensor:
        """Prompts [B, n]: the fixed list (``num_prompts`` ignored) or fresh random ones."""
        if self.prompts is not None:
            return self._fixed.clone()
        return self._random_prompts(num_prompts, generator)

    def eval_prompts(self) -> torch.Tensor:
        if self.prompts is not None:
            return self._fixed.clone()
        return self._random_prompts(self.eval_size, torch.Generator().manual_seed(self.eval_seed))

    def _random_prompts(self, num_prompts: int, generator: torch.Generator) -> torch.Tensor:
        n, v = self.num_numbers, self.vocab_size
        if self.allow_repeats:
            return torch.randint(0, v, (num_prompts, n), generator=generator)
        keys = torch.rand(num_prompts, v, generator=generator)
        return keys.argsort(dim=-1)[:, :n]  # n distinct numbers per prompt

    def reward_specs(self) -> list[RewardSpec]:
        specs = [RewardSpec(functools.partial(sorting_reward, reward=self.reward), name=self.reward)]
        if self.reward != self.gold_reward:
            specs.append(RewardSpec(functools.partial(sorting_reward, reward=self.gold_reward), 0.0, self.gold_reward))
        return specs

    def score(self, prompts: torch.Tensor, responses: torch.Tensor, *, completion_ids: Any = None,
              trainer_state: TrainerState | None = None) -> RewardResult:
        """``GradedTask.score`` of prompts [B, n] and responses [B, G, n] as tensors."""
        b, g, n = responses.shape
        prompt_texts = NumberTexts(prompts.repeat_interleave(g, dim=0))  # [N, n]: each prompt G times
        result = self.runner(prompt_texts, NumberTexts(responses.reshape(b * g, n)), completion_ids=completion_ids,
                             trainer_state=trainer_state)
        return result.reshape(b, g)
