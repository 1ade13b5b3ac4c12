"""Reward functions in the TRL form, how several combine, and how they run safely.

``fn(prompts: list[str], completions: list[str], **columns) -> list[float | None]`` scores N = B*G completions at
once, every argument by keyword; ``None`` abstains. The contract, and one line on each module:
docs/explanation/rewards.md."""

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
