"""The name -> function tables: a mode is an entry, and the dispatchers go through them."""

import pytest
import torch

from rlvr.core import (
    AGGREGATIONS,
    DELTA_MODES,
    KL_ESTIMATORS,
    KL_LOSS_ESTIMATORS,
    LOSS_MODES,
    LossInputs,
    aggregate_loss,
    aggregation_weights,
    compute_deltas,
    kl_penalty,
    policy_loss,
)

X = torch.zeros(2, 3)
DISPATCHERS = [
    (DELTA_MODES, "delta mode", lambda mode: compute_deltas(X, mode)),
    (LOSS_MODES, "loss mode", lambda mode: policy_loss(X, torch.zeros(2), mode)),
    (AGGREGATIONS, "aggregation", lambda mode: aggregation_weights(X.bool(), mode)),
    (AGGREGATIONS, "aggregation", lambda mode: aggregate_loss(X, X.bool(), mode)),
    (KL_ESTIMATORS, "KL estimator", lambda mode: kl_penalty(X, X, mode)),
]


@pytest.mark.parametrize("table,kind,dispatch", DISPATCHERS)
def test_unknown_mode_names_every_allowed_key(table, kind, dispatch):
    allowed = ", ".join(table)
    with pytest.raises(ValueError, match=f"^unknown {kind} 'nope'; allowed: {allowed}$".replace("+", r"\+")):
        dispatch("nope")


def test_kl_loss_estimators_are_the_kl_estimators_but_k1():
    assert list(KL_LOSS_ESTIMATORS) == ["k1+", "k2", "k3", "k3+"]
    assert all(KL_LOSS_ESTIMATORS[name] is KL_ESTIMATORS[name] for name in KL_LOSS_ESTIMATORS)


def test_a_new_delta_entry_is_dispatched_and_its_invalid_entries_zeroed(monkeypatch):
    # The entry sees rewards with the abstention (NaN) zeroed and valid False there;
    # compute_deltas zeroes that delta whatever the entry returns.
    seen = {}

    def plus_one(rewards, valid, eps, lengths):
        seen.update(rewards=rewards, valid=valid, eps=eps, lengths=lengths)
        return rewards + 1.0

    monkeypatch.setitem(DELTA_MODES, "plus_one", plus_one)
    rewards = torch.tensor([[1.0, float("nan")], [3.0, 4.0]])
    deltas = compute_deltas(rewards, "plus_one", eps=0.5)
    assert torch.equal(deltas, torch.tensor([[2.0, 0.0], [4.0, 5.0]]))
    assert torch.equal(seen["rewards"], torch.tensor([[1.0, 0.0], [3.0, 4.0]]))
    assert seen["valid"].tolist() == [[True, False], [True, True]] and seen["eps"] == 0.5
    assert torch.equal(seen["lengths"], torch.ones(2, 2))  # no lengths given: one token per response


def test_a_new_loss_entry_gets_constant_per_response_deltas(monkeypatch):
    seen = {}

    def record(x: LossInputs):
        seen.update(deltas=x.deltas, args=(x.old_log_probs, x.clip_eps, x.clip_eps_high, x.clip_ratio_c,
                                           x.response_mask))
        return -x.deltas * x.log_probs, {}

    monkeypatch.setitem(LOSS_MODES, "record", record)
    deltas = torch.tensor([2.0, -1.0], dtype=torch.float64, requires_grad=True)
    log_probs = torch.ones(2, 3)
    loss, _ = policy_loss(log_probs, deltas, "record", clip_eps=0.1, clip_eps_high=0.3)
    # deltas [N] -> [N, 1], cast to log_probs' dtype, detached: -delta * 1 on every token.
    assert seen["deltas"].shape == (2, 1) and seen["deltas"].dtype == torch.float32
    assert not seen["deltas"].requires_grad
    assert seen["args"] == (None, 0.1, 0.3, 3.0, None)  # clip_ratio_c's default, no response_mask
    assert torch.equal(loss, torch.tensor([[-2.0] * 3, [1.0] * 3]))


def test_a_new_aggregation_entry_serves_weights_and_loss(monkeypatch):
    # Weights 1 on every response token: aggregate_loss is then the masked sum, 1 + 2 + 4 = 7.
    monkeypatch.setitem(AGGREGATIONS, "token_sum", lambda response_mask, normalizer: response_mask)
    loss = torch.tensor([[1.0, 2.0], [4.0, 100.0]], dtype=torch.float64)
    response_mask = torch.tensor([[True, True], [True, False]])
    weights = aggregation_weights(response_mask, "token_sum", dtype=torch.float64)
    assert torch.equal(weights, response_mask.double())
    assert aggregate_loss(loss, response_mask, "token_sum").item() == 7.0


def test_kl_entries_take_the_log_ratio(monkeypatch):
    # log r = log pi_ref - log pi: -1 - (-3) = 2.
    monkeypatch.setitem(KL_ESTIMATORS, "log_r", lambda log_ratio: log_ratio)
    assert kl_penalty(torch.full((1, 1), -3.0), torch.full((1, 1), -1.0), "log_r").item() == 2.0
