"""Reward functions in the TRL form, how several combine, and how they run safely.

A reward function scores N = B*G completions at once (the form TRL's GRPOTrainer
calls, so functions move between the two)::

    fn(prompts: list[str], completions: list[str], **columns) -> list[float | None]

The design: ``docs/explanation/rewards.md`` (``rlvr.rewards``).
"""

from rlvr.rewards.calls import RewardError, RewardFn, TrainerState
from rlvr.rewards.combine import RewardResult, RewardSpec, RewardStats, combine_rewards
from rlvr.rewards.loading import load_reward_function, load_reward_specs
from rlvr.rewards.runner import RewardRunner
from rlvr.rewards.verifiers import answer_format, exact_match, math_answer, numeric_match, regex_reward

__all__ = [
    "RewardError",
    "RewardFn",
    "RewardResult",
    "RewardRunner",
    "RewardSpec",
    "RewardStats",
    "TrainerState",
    "answer_format",
    "combine_rewards",
    "exact_match",
    "load_reward_function",
    "load_reward_specs",
    "math_answer",
    "numeric_match",
    "regex_reward",
]
