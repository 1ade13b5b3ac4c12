"""The lecture's toy task: sort n numbers.

Prompts are n tokens from a vocabulary of V numbers; a response is n tokens. All
reward functions are vectorised over ``prompts [B, n]`` and ``responses [B, G, n]``
and equal the lecture's scalar definitions (``*_scalar`` below, kept as the reference
the tests compare against).

The loophole in ``inclusion_ordering``: it awards one point per *prompt* token that
appears anywhere in the response, so it checks membership, not multiplicity. When a
prompt repeats a number, a response can drop one copy and repeat another number
instead, keep every adjacent pair in order, and still score the maximum
``n + (n - 1)``. Example: prompt ``[2, 0, 2]`` (sorted ``[0, 2, 2]``); the wrong
response ``[0, 0, 2]`` scores 3 (0, 2 and 2 all "appear") + 2 (both pairs ordered) = 5,
the same as the right answer. With distinct prompt numbers the maximum forces a
permutation in order, so the lecture's fixed prompts (all distinct) cannot be hacked
this way; prompts sampled with repeats can.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlvr.rollout import Grades

LECTURE_PROMPTS = [[1, 0, 2], [3, 2, 4], [1, 2, 3]]
REWARDS = ("exact", "position_match", "inclusion_ordering")


# Scalar reference definitions (the lecture's, one prompt and one response as lists).
def exact_scalar(prompt: list[int], response: list[int]) -> float:
    return float(list(response) == sorted(prompt))


def position_match_scalar(prompt: list[int], response: list[int]) -> float:
    return float(sum(1 for x, y in zip(response, sorted(prompt)) if x == y))


def inclusion_ordering_scalar(prompt: list[int], response: list[int]) -> float:
    inclusion = sum(1 for x in prompt if x in response)
    ordering = sum(1 for x, y in zip(response, response[1:]) if x <= y)
    return float(inclusion + ordering)


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


def max_reward(reward: str, n: int) -> float:
    """The largest value ``reward`` can take on n numbers."""
    return {"exact": 1.0, "position_match": float(n), "inclusion_ordering": float(2 * n - 1)}[reward]


@dataclass
class SortingTask:
    """Sort n numbers from ``range(vocab_size)``.

    fixed_prompts: a list of prompts used every epoch (the lecture's setting) and as
    the held-out set; otherwise ``sample_prompts`` draws fresh prompts (with or without
    repeated numbers) and ``eval_prompts`` is a fixed set drawn from ``eval_seed``.
    """

    num_numbers: int = 3
    vocab_size: int = 5
    reward: str = "inclusion_ordering"
    allow_repeats: bool = False
    fixed_prompts: list[list[int]] | None = None
    eval_size: int = 64
    eval_seed: int = 1234
    extra_rewards: Any = None  # an rlvr.rewards.RewardRunner of user functions, or None

    def __post_init__(self) -> None:
        if self.reward not in REWARD_FUNCTIONS:
            raise ValueError(f"unknown sorting reward {self.reward!r}; allowed: {', '.join(REWARDS)}")
        if not self.allow_repeats and self.num_numbers > self.vocab_size:
            raise ValueError(
                f"cannot draw {self.num_numbers} distinct numbers from a vocabulary of {self.vocab_size}"
            )
        if self.fixed_prompts is not None:
            self._fixed = torch.tensor(self.fixed_prompts, dtype=torch.long)
            if self._fixed.dim() != 2 or self._fixed.shape[1] != self.num_numbers:
                raise ValueError(f"fixed prompts must be a list of lists of {self.num_numbers} numbers")
            if self._fixed.min() < 0 or self._fixed.max() >= self.vocab_size:
                raise ValueError(f"fixed prompts must use numbers in [0, {self.vocab_size})")

    def sample_prompts(self, num_prompts: int, generator: torch.Generator) -> torch.Tensor:
        """Prompts [B, n]: the fixed list (``num_prompts`` ignored) or fresh random ones."""
        if self.fixed_prompts is not None:
            return self._fixed.clone()
        return self._random_prompts(num_prompts, generator)

    def eval_prompts(self) -> torch.Tensor:
        if self.fixed_prompts is not None:
            return self._fixed.clone()
        return self._random_prompts(self.eval_size, torch.Generator().manual_seed(self.eval_seed))

    def _random_prompts(self, num_prompts: int, generator: torch.Generator) -> torch.Tensor:
        n, v = self.num_numbers, self.vocab_size
        if self.allow_repeats:
            return torch.randint(0, v, (num_prompts, n), generator=generator)
        keys = torch.rand(num_prompts, v, generator=generator)
        return keys.argsort(dim=-1)[:, :n]  # n distinct numbers per prompt

    def rewards(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """Rewards [B, G] for prompts [B, n] and responses [B, G, n]."""
        return self.grade(prompts, responses).rewards

    def grade(self, prompts: torch.Tensor, responses: torch.Tensor) -> Grades:
        """The built-in reward plus, if set, the user reward functions' combined reward.

        User functions see the prompt and response as space-separated numbers
        (``"3 1 2"``) in the TRL form; where all of them abstain, only the built-in
        reward counts.
        """
        rewards = REWARD_FUNCTIONS[self.reward](prompts, responses)
        metrics: dict[str, float] = {}
        if self.extra_rewards is not None:
            texts = [[" ".join(map(str, r)) for r in group] for group in responses.tolist()]
            prompt_dicts = [{"prompt": " ".join(map(str, p))} for p in prompts.tolist()]
            result = self.extra_rewards.score_groups(prompt_dicts, texts)
            rewards = rewards + torch.nan_to_num(result.rewards, nan=0.0)
            metrics = result.metrics()
        return Grades(rewards, exact_reward(prompts, responses).bool(), metrics)

    def close(self) -> None:
        if self.extra_rewards is not None:
            self.extra_rewards.close()

    def is_correct(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """Gold check [B, G]: is the response exactly the sorted prompt?"""
        return exact_reward(prompts, responses).bool()

    def max_reward(self) -> float:
        return max_reward(self.reward, self.num_numbers)
