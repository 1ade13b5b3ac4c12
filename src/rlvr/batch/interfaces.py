"""The two interfaces that produce a batch (``rlvr.batch.rollout``): a ``Policy`` samples responses and scores their
log-probs, a ``Task`` gives prompts and grades responses.

Shapes: B prompts, G responses per prompt, N = B*G responses, n any number of rows, T response tokens.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from rlvr.batch.rollout import Grades, Samples


class Policy(Protocol):
    """Something that samples responses and scores their log-probs.

    ``module`` is the torch module the trainer optimises. ``max_response_length`` is the longest response ``sample``
    can return, in tokens: a constant of the policy, not of a batch (Dr. GRPO's normalizer). A policy, or its
    ``engine``, whose ``sample_log_probs`` are not those its ``log_probs`` computes (other kernels, another precision)
    says so with ``exact_log_probs = False``. The project's policies derive from this class and take the defaults of
    its optional members.
    """

    module: torch.nn.Module
    max_response_length: int
    engine: Any = None  # what generates, when not the policy itself (``rlvr.engines.Engine``)
    exact_log_probs: bool | None = None  # None: as its engine says (``sampler_log_probs_exact``)

    def sample(self, prompts: Any, group_size: int, temperature: float, generator: torch.Generator) -> Samples:
        """G responses to each of B prompts at temperature > 0 (same generator seed, same samples)."""
        ...

    def log_probs(
        self, samples: Samples, temperature: float, with_entropy: bool = False,
        module: torch.nn.Module | None = None, entropy_grad: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log pi(a_t | s_t) [n, T] of ``samples``' responses, and entropy [n, T] (None unless
        ``with_entropy``; with ``entropy_grad`` it carries its gradient, for the entropy bonus). ``module``: score
        with these weights instead of ``self.module`` (the frozen KL reference)."""
        ...

    def greedy(self, prompts: Any) -> Any:
        """One greedy (argmax) response per prompt, in the task's form grouped as G = 1."""
        ...

    def sync_engine(self, version: int | None = None) -> dict[str, float]:
        """Hand the generation engine the trainer's weights of ``version``: engine/* numbers."""
        return {}

    def check_prompts(self, prompts: Any, what: str = "prompt") -> None:
        """Raise ``rlvr.policies.prompts.PromptError`` for the first of ``prompts`` the policy cannot take
        (``what`` names them in the message)."""

    def truncated(self, samples: Samples) -> torch.Tensor | None:
        """[N] bool, True on responses cut at the length limit; None: none ever is."""
        return None


def sampler_log_probs_exact(policy: Policy) -> bool:
    """Are the log-probs recorded while sampling the trainer's own, up to float rounding? The policy's
    ``exact_log_probs``, else its engine's, else True (in-process samplers score with the trainer's module)."""
    if policy.exact_log_probs is not None:
        return bool(policy.exact_log_probs)
    return policy.engine is None or policy.engine.exact_log_probs


class Task(Protocol):
    """A verifiable task: prompts, a reward and a gold check. The project's tasks derive from this class
    (``rlvr.tasks.grading.GradedTask``) and take the defaults of its optional members."""

    # the highest reward a response can get (the hacking monitor's top), None: not known
    max_reward: float | None = None
    # is the reward the gold check alone? Then a top reward is a right answer
    reward_is_gold: bool = False

    def grade(self, prompts: Any, responses: Any, *, completion_ids: list[list[int]] | None = None,
              trainer_state: Any = None) -> Grades:
        """Rewards, gold check and reward metrics in one pass; ``completion_ids`` (N lists of token ids) and
        ``trainer_state`` (``rlvr.rewards.TrainerState``) go to the reward functions as TRL passes them."""
        ...

    def sample_prompts(self, num_prompts: int, generator: torch.Generator) -> Any:
        """``num_prompts`` training prompts (same seed, same prompts)."""
        ...

    def eval_prompts(self) -> Any:
        """The fixed held-out prompts."""
        ...

    def fixed_prompts(self) -> dict[str, Any]:
        """Every prompt known before training, by what it is ("train", "eval"), for the policy to check up front."""
        return {}

    def prompt_origin(self, what: str, index: int) -> str | None:
        """Where prompt ``index`` of ``fixed_prompts()[what]`` comes from (a file and line), for errors; or None."""
        return None

    def policy_for(self, policy: Policy) -> Policy:
        """The policy as this task samples it (an environment task's acts in its environment: episodes)."""
        return policy

    def close(self) -> None:
        """Release what the task holds (reward worker processes)."""
