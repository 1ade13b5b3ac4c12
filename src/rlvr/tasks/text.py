"""What the text tasks share: prompt dicts, string responses, generated prompts.

A text task's prompts are dicts with ``"prompt"`` (the text the LM continues) and gold columns such as ``"answer"``;
responses are B lists of G completion strings, which its reward functions (TRL form) see as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Hashable

import torch

from rlvr.tasks.grading import GradedTask, Prompt

# held-out prompts at most: a larger set takes minutes to draw and to evaluate at every evaluation
MAX_EVAL_PROMPTS = 2**16


class TextTask(GradedTask):
    """The ``Task`` methods every text task has in common. A subclass declares its rewards (``reward_specs``,
    ``gold_reward``) and sets ``prompts``, or overrides ``sample_prompts`` and ``eval_prompts``. Its constructor's
    keyword arguments are the config's ``task.options``.
    """

    prompts: GeneratedPrompts

    def sample_prompts(self, num_prompts: int, generator: torch.Generator) -> list[Prompt]:
        """``num_prompts`` training prompts, none from the eval set (same generator state, same prompts)."""
        return self.prompts.sample(num_prompts, generator)

    def eval_prompts(self) -> list[Prompt]:
        """The fixed held-out prompts."""
        return list(self.prompts.eval)

    def fixed_prompts(self) -> dict[str, list[Prompt]]:
        """The prompts known before training, by what they are, to check up front; drawn ones are checked as drawn."""
        return {"eval prompt": self.eval_prompts()}

    def sft_completion(self, prompt: Prompt) -> str:
        """The gold completion of one prompt, for SFT (the policy appends EOS)."""
        return prompt["answer"]

    def sft_examples(self, num: int, generator: torch.Generator) -> list[tuple[str, str]]:
        """``num`` (prompt text, gold completion) pairs from the training prompts."""
        return [(p["prompt"], self.sft_completion(p)) for p in self.sample_prompts(num, generator)]


def resolve_weights(defaults: dict[str, float], weights: dict[str, float] | None) -> dict[str, float]:
    """The default reward weights with ``weights`` overriding some; unknown names are an error."""
    unknown = set(weights or {}) - set(defaults)
    if unknown:
        raise ValueError(f"unknown reward names {sorted(unknown)}; allowed: {', '.join(defaults)}")
    return {**defaults, **(weights or {})}


def prompt_text(prompt: Prompt) -> str:
    """A prompt's text: the question it asks, unless its task says otherwise."""
    return prompt["prompt"]


class GeneratedPrompts:
    """Prompts from a seeded generator, with a fixed held-out set that training never repeats.

    draw(k, generator) -> k fresh random prompts; key(prompt) says which prompts ask the same question (by default:
    the same text). The eval set is ``num_eval`` prompts drawn with ``eval_seed``, no two the same question;
    ``sample`` skips any prompt whose question is in it, so a reworded held-out question is held out too.
    """

    def __init__(
        self,
        draw: Callable[[int, torch.Generator], list[Prompt]],
        num_eval: int,
        eval_seed: int,
        key: Callable[[Prompt], Hashable] | None = None,
    ) -> None:
        self._draw, self._key = draw, key or prompt_text
        self.eval = self._take(num_eval, torch.Generator().manual_seed(eval_seed), unique=True)
        self._held_out = frozenset(map(self._key, self.eval))

    def sample(self, num: int, generator: torch.Generator) -> list[Prompt]:
        """``num`` training prompts (same generator state, same prompts)."""
        return self._take(num, generator, exclude=self._held_out)

    def _take(
        self, num: int, generator: torch.Generator, exclude: Container[Hashable] = frozenset(), unique: bool = False
    ) -> list[Prompt]:
        """``num`` prompts in draw order, skipping excluded questions and, if ``unique``, repeats; ValueError when
        100 * num + 1000 draws do not give enough (the space is too small)."""
        chosen: list[Prompt] = []
        seen: set[Hashable] = set()
        budget = 100 * num + 1000
        while len(chosen) < num:
            if budget <= 0:
                raise ValueError(
                    f"could draw only {len(chosen)} of {num} acceptable prompts; the task's "
                    "space is too small for this many (lower num_eval or widen the task)"
                )
            batch = self._draw(num - len(chosen), generator)
            budget -= len(batch)
            for prompt in batch:
                question = self._key(prompt)
                if question in exclude or (unique and question in seen) or len(chosen) == num:
                    continue
                seen.add(question)
                chosen.append(prompt)
        return chosen
