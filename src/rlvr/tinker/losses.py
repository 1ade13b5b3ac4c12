"""The Tinker API's ``loss_fn``s, each one of ``rlvr.core``'s losses (the functions the trainer's step calls).

Shapes: N datums, L positions (right-padded); ``mask`` [N, L] is True on each datum's own positions. A Tinker loss is
a sum over positions and datums: the client normalises through its ``weights`` and ``advantages``. The mapping:

    cross_entropy        naive (delta = weights):                     -sum w * log p
    importance_sampling  ratio (delta = advantages, pi_old = logprobs): -sum A * p / q
    ppo                  clipped, range [clip_low_threshold, clip_high_threshold]
    cispo                cispo, the same range
    dro                  naive (delta = advantages) + beta * k2(log q / p): -sum A * log p - beta/2 (log p - log q)^2
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from rlvr import core

Config = Mapping[str, float | str]


class LossError(ValueError):
    """A loss the server cannot compute: an unknown or unsupported name, a missing input, a bad config value."""


@dataclass(frozen=True)
class LossSpec:
    """A ``loss_fn``: the ``loss_fn_inputs`` it reads (besides ``target_tokens``), its config keys with their
    defaults, and the per-token loss [N, L] from log-probs, the inputs and the config."""

    inputs: tuple[str, ...]
    config: Mapping[str, float]
    per_token: Callable[[torch.Tensor, Mapping[str, torch.Tensor], Mapping[str, float]], torch.Tensor]


def _cross_entropy(log_probs, inputs, config):
    return core.policy_loss(log_probs, inputs["weights"], "naive")[0]


def _importance_sampling(log_probs, inputs, config):
    return core.policy_loss(log_probs, inputs["advantages"], "ratio", inputs["logprobs"])[0]


def _clip_range(config: Mapping[str, float]) -> tuple[float, float]:
    """Tinker's ratio thresholds as rlvr's clip ranges: [1 - clip_eps, 1 + clip_eps_high]."""
    low, high = config["clip_low_threshold"], config["clip_high_threshold"]
    if not 0 <= low <= 1 <= high:
        raise LossError(f"loss_fn_config needs 0 <= clip_low_threshold <= 1 <= clip_high_threshold, "
                        f"got {low} and {high}")
    return 1.0 - low, high - 1.0


def _ppo(log_probs, inputs, config):
    clip_eps, clip_eps_high = _clip_range(config)
    return core.policy_loss(log_probs, inputs["advantages"], "clipped", inputs["logprobs"], clip_eps, clip_eps_high)[0]


def _cispo(log_probs, inputs, config):
    clip_eps, clip_eps_high = _clip_range(config)
    return core.policy_loss(log_probs, inputs["advantages"], "cispo", inputs["logprobs"], clip_eps, clip_eps_high)[0]


def _dro(log_probs, inputs, config):
    pg = core.policy_loss(log_probs, inputs["advantages"], "naive")[0]
    return pg + config["beta"] * core.kl_loss_term(log_probs, inputs["logprobs"], "k2")


_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}

LOSSES: dict[str, LossSpec] = {
    "cross_entropy": LossSpec(("weights",), {}, _cross_entropy),
    "importance_sampling": LossSpec(("logprobs", "advantages"), {}, _importance_sampling),
    "ppo": LossSpec(("logprobs", "advantages"), _CLIP, _ppo),
    "cispo": LossSpec(("logprobs", "advantages"), _CLIP, _cispo),
    "dro": LossSpec(("logprobs", "advantages"), {"beta": 0.05}, _dro),
}

# Names the SDK knows that this server does not compute, and why (docs/reference/tinker.md lists them too).
UNSUPPORTED = {
    "gspo": "its sequence ratio's token set and normalisation are not documented by the API",
    "stable_reinforce": "its definition is not documented by the API",
    "custom": "custom losses run in the client: forward_backward_custom sends cross_entropy, the gradient as weights",
}


def loss_spec(name: str) -> LossSpec:
    if name in UNSUPPORTED:
        raise LossError(f"loss_fn {name!r} is not supported by rlvr's Tinker server: {UNSUPPORTED[name]}; "
                        f"supported: {', '.join(LOSSES)}")
    if name not in LOSSES:
        raise LossError(f"unknown loss_fn {name!r}; supported: {', '.join(LOSSES)}")
    return LOSSES[name]


def loss_config(name: str, given: Config | None) -> dict[str, float]:
    """The loss's config: its defaults, overridden by ``given``; LossError on a key it does not read."""
    spec = loss_spec(name)
    given = dict(given or {})
    unknown = sorted(set(given) - set(spec.config))
    if unknown:
        allowed = ", ".join(spec.config) or "none"
        raise LossError(f"loss_fn_config key(s) {', '.join(unknown)} not read by loss_fn {name!r} "
                        f"(it reads: {allowed})")
    try:
        return {key: float(given.get(key, default)) for key, default in spec.config.items()}
    except (TypeError, ValueError) as err:
        raise LossError(f"loss_fn_config values of {name!r} must be numbers: {err}") from None


def datum_loss(name: str, log_probs: torch.Tensor, inputs: Mapping[str, torch.Tensor], mask: torch.Tensor,
               config: Mapping[str, float]) -> torch.Tensor:
    """The loss of ``name`` summed over the real positions of each datum: [N]. log_probs [N, L] (carrying the
    gradient), inputs [N, L] each (the spec's), mask [N, L] bool."""
    spec = loss_spec(name)
    missing = [key for key in spec.inputs if key not in inputs]
    if missing:
        raise LossError(f"loss_fn {name!r} needs loss_fn_inputs {', '.join(missing)} in every datum")
    per_token = spec.per_token(log_probs, inputs, config)  # [N, L]
    return core.masked_sum(per_token, mask, dim=-1)
