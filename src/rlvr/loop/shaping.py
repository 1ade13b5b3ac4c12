"""What the deltas are computed from, and which tokens train: the reward shaping and loss masks of the 2025 variants,
applied in ``rlvr.loop.trainer.build_rollout`` before the deltas.

- ``algo.kl_in=reward``: kl_coef * k1 summed over each response (log pi_old - log ref), subtracted from its reward
  (the KL penalty in the reward, as PPO-RLHF puts it).
- ``algo.overlong=penalty``: DAPO's soft length penalty added to the reward; ``algo.overlong=mask``: truncated
  responses out of the loss (their tokens leave the aggregation's denominators too).
"""

from __future__ import annotations

import torch

from rlvr import core
from rlvr.batch.interfaces import Policy
from rlvr.batch.rollout import Samples
from rlvr.config import Config


def shaped_rewards(config: Config, policy: Policy, samples: Samples, rewards: torch.Tensor,
                   old_log_probs: torch.Tensor | None, ref_log_probs: torch.Tensor | None
                   ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """The rewards [B, G] the deltas are computed from, the mask [N, T] of the tokens that train, and their numbers."""
    a, mask, shaping = config.algo, samples.policy_mask, {}
    if a.kl_coef > 0 and a.kl_in == "reward":
        penalty = samples.per_episode(core.kl_reward_penalty(old_log_probs, ref_log_probs, mask, a.kl_coef))  # [N]
        rewards = rewards - penalty.reshape(rewards.shape)
        shaping["kl_reward_penalty"] = penalty.mean().item()
    if a.overlong != "none":
        truncated = policy.truncated(samples)  # None: the toy's answers have one fixed length, never cut
        truncated = torch.zeros(samples.num_responses, dtype=torch.bool) if truncated is None else truncated
        truncated = samples.per_episode(truncated.long()) > 0  # [N]: a response with a row cut is cut
        shaping["truncated_frac"] = truncated.float().mean().item()
        if a.overlong == "mask":
            mask = core.overlong_mask(samples.per_row(truncated), mask)
        else:
            lengths = samples.per_episode(samples.response_mask.sum(dim=1))  # [N]: as the limit counts them
            penalty = core.overlong_penalty(lengths, policy.max_response_length, a.overlong_cache,
                                            a.overlong_factor, dtype=rewards.dtype)
            rewards = rewards + penalty.reshape(rewards.shape)
            shaping["overlong_penalty"] = penalty.mean().item()
    return rewards, mask, shaping
