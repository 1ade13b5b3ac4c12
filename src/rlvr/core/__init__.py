"""Pure tensor math of policy-gradient RL: no models, no I/O."""

from rlvr.core.advantages import DELTA_MODES, compute_deltas
from rlvr.core.kl import KL_ESTIMATORS, KL_LOSS_ESTIMATORS, kl_loss_term, kl_penalty
from rlvr.core.logprobs import token_log_probs
from rlvr.core.losses import (
    AGGREGATIONS,
    LOSS_MODES,
    aggregate_loss,
    aggregation_weights,
    policy_loss,
    weighted_sum,
)
from rlvr.core.masked import entropy_from_logits, masked_mean, masked_normalize, masked_sum

__all__ = [
    "AGGREGATIONS",
    "DELTA_MODES",
    "KL_ESTIMATORS",
    "KL_LOSS_ESTIMATORS",
    "LOSS_MODES",
    "aggregate_loss",
    "aggregation_weights",
    "compute_deltas",
    "entropy_from_logits",
    "kl_loss_term",
    "kl_penalty",
    "masked_mean",
    "masked_normalize",
    "masked_sum",
    "policy_loss",
    "token_log_probs",
    "weighted_sum",
]
