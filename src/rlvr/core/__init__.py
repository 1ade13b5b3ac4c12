"""Pure tensor math of policy-gradient RL: no models, no I/O.

Deltas, losses, aggregations and KL estimators are name -> function tables (``DELTA_MODES``, ``LOSS_MODES``,
``AGGREGATIONS``, ``KL_ESTIMATORS``): the keys are the allowed modes, and ``compute_deltas``, ``policy_loss``,
``aggregation_weights`` and ``kl_penalty`` dispatch through them. ``importance``: the off-policy corrections
(``IS_CORRECTIONS``) and mismatch measures between a sampler's log-probs and the trainer's. ``selection``: which
groups, responses and tokens train (dynamic sampling, overlong filtering and penalty, top-entropy tokens).
"""

from rlvr.core.aggregation import AGGREGATIONS, aggregate_loss, aggregation_weights, weighted_sum
from rlvr.core.deltas import DELTA_MODES, REWARD_SCALES, compute_deltas, scale_rewards
from rlvr.core.importance import (
    CAP_MASKING_CORRECTIONS,
    IS_CORRECTIONS,
    MASKING_CORRECTIONS,
    TRUNCATING_CORRECTIONS,
    Correction,
    max_abs_log_prob_gap,
    mismatch_k3,
    off_policy_correction,
    response_fraction,
    tis_truncated_frac,
    tis_weights,
    token_fraction,
)
from rlvr.core.kl import KL_ESTIMATORS, KL_LOSS_ESTIMATORS, kl_loss_term, kl_penalty, kl_reward_penalty
from rlvr.core.logprobs import token_log_probs
from rlvr.core.losses import LOSS_MODES, LossInputs, entropy_bonus, policy_loss
from rlvr.core.masked import entropy_from_logits, masked_mean, masked_normalize, masked_sum
from rlvr.core.selection import nonzero_delta_groups, overlong_mask, overlong_penalty, top_entropy_mask

__all__ = [
    "AGGREGATIONS",
    "CAP_MASKING_CORRECTIONS",
    "DELTA_MODES",
    "IS_CORRECTIONS",
    "KL_ESTIMATORS",
    "KL_LOSS_ESTIMATORS",
    "LOSS_MODES",
    "MASKING_CORRECTIONS",
    "REWARD_SCALES",
    "TRUNCATING_CORRECTIONS",
    "Correction",
    "LossInputs",
    "aggregate_loss",
    "aggregation_weights",
    "compute_deltas",
    "entropy_bonus",
    "entropy_from_logits",
    "kl_loss_term",
    "kl_penalty",
    "kl_reward_penalty",
    "masked_mean",
    "max_abs_log_prob_gap",
    "mismatch_k3",
    "masked_normalize",
    "masked_sum",
    "nonzero_delta_groups",
    "off_policy_correction",
    "overlong_mask",
    "overlong_penalty",
    "policy_loss",
    "response_fraction",
    "scale_rewards",
    "tis_truncated_frac",
    "tis_weights",
    "token_fraction",
    "token_log_probs",
    "top_entropy_mask",
    "weighted_sum",
]
