"""Property tests: slow loop references vs the tensor code, and degenerate inputs."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.core import (
    AGGREGATIONS,
    DELTA_MODES,
    KL_ESTIMATORS,
    aggregate_loss,
    aggregation_weights,
    compute_deltas,
    entropy_from_logits,
    kl_penalty,
    masked_mean,
    policy_loss,
    weighted_sum,
)

FAST = settings(max_examples=80, deadline=None)
NAN = float("nan")


def reference_deltas(rows, valid_rows, mode, eps):
    """compute_deltas written as plain loops over python floats."""

    def kept(row, valid_row):
        return [v and math.isfinite(r) for r, v in zip(row, valid_row)]

    def mean_std(vals):  # mean and Bessel std (0 for fewer than two values)
        mean = sum(vals) / len(vals) if vals else 0.0
        std = math.sqrt(sum((r - mean) ** 2 for r in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
        return mean, std

    batch, batch_centered = [], []  # every valid reward of the batch, and minus its group mean
    for row, valid_row in zip(rows, valid_rows):
        vals = [r for r, k in zip(row, kept(row, valid_row)) if k]
        batch += vals
        batch_centered += [r - mean_std(vals)[0] for r in vals]
    batch_std, centered_std = mean_std(batch)[1], mean_std(batch_centered)[1]
    out = []
    for row, valid_row in zip(rows, valid_rows):
        keep = kept(row, valid_row)
        vals = [r for r, k in zip(row, keep) if k]
        num_valid = len(vals)  # G'
        mean, std = mean_std(vals)
        best = max(vals) if vals else None
        deltas = []
        for r, k in zip(row, keep):
            if not k:
                deltas.append(0.0)
            elif mode == "raw":
                deltas.append(r)
            elif mode == "centered":
                deltas.append(r - mean)
            elif mode == "normalized":
                deltas.append((r - mean) / (std + eps))
            elif mode == "max_only":
                deltas.append(r if r == best else 0.0)
            elif mode == "batch_normalized":
                deltas.append((r - mean) / (batch_std + eps))
            elif mode == "reinforce_pp":
                deltas.append((r - mean) / (centered_std + eps))
            else:  # leave_one_out: r minus the mean of the other G' - 1
                deltas.append(r - (sum(vals) - r) / (num_valid - 1) if num_valid > 1 else 0.0)
        out.append(deltas)
    return out


@st.composite
def reward_groups(draw):
    b = draw(st.integers(1, 4))
    g = draw(st.integers(1, 6))
    # Rewards on a grid k * scale: ties and constant groups are common, and groups that are
    # not constant have a std of at least scale / g, so normalized deltas are well-conditioned.
    scale = draw(st.sampled_from([1e-3, 0.25, 1.0, 1e3]))
    cell = st.one_of(st.integers(-8, 8).map(lambda k: k * scale), st.just(NAN))
    rows = draw(st.lists(st.lists(cell, min_size=g, max_size=g), min_size=b, max_size=b))
    valid = draw(st.lists(st.lists(st.booleans() | st.just(True), min_size=g, max_size=g), min_size=b, max_size=b))
    return rows, valid, scale


@FAST
@given(reward_groups(), st.sampled_from(list(DELTA_MODES)), st.booleans())
def test_compute_deltas_matches_loop_reference(groups, mode, use_valid):
    rows, valid, scale = groups
    if not use_valid:
        valid = [[True] * len(row) for row in rows]
    expected = torch.tensor(reference_deltas(rows, valid, mode, 1e-6), dtype=torch.float64)
    got = compute_deltas(
        torch.tensor(rows, dtype=torch.float64), mode, valid=torch.tensor(valid) if use_valid else None
    )
    # float64 rounding of sums of <= 24 terms of size <= 8 * scale; values divided by a std
    # are O(1) (a nonzero std is >= scale / 24 on this grid), hence the scale-free atol there.
    atol = 1e-9 if mode in ("normalized", "batch_normalized", "reinforce_pp") else 1e-12 * scale
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=atol)


@FAST
@given(
    st.integers(0, 4),
    st.integers(0, 5),
    st.sampled_from(list(DELTA_MODES)),
    st.sampled_from([torch.float32, torch.float64]),
    st.data(),
)
def test_compute_deltas_degenerate_inputs_stay_finite(b, g, mode, dtype, data):
    # Any shape (B = 0, G = 0, G = 1), NaN / +-inf abstentions, all-invalid groups: deltas
    # are finite, 0 where the reward abstained, and a constant group's relative deltas are 0.
    cell = st.sampled_from([0.0, 1.0, -1.0, 0.1, 1e6, NAN, math.inf, -math.inf])
    rows = data.draw(st.lists(st.lists(cell, min_size=g, max_size=g), min_size=b, max_size=b))
    rewards = torch.tensor(rows, dtype=dtype).reshape(b, g)
    deltas = compute_deltas(rewards, mode)
    assert deltas.shape == (b, g)
    assert torch.isfinite(deltas).all()
    assert (deltas[~torch.isfinite(rewards)] == 0).all()
    constant = torch.full((b, g), 0.1, dtype=dtype)
    if mode in ("centered", "normalized", "leave_one_out", "batch_normalized", "reinforce_pp"):
        assert (compute_deltas(constant, mode) == 0).all()


@FAST
@given(
    st.integers(0, 5),
    st.integers(0, 6),
    st.sampled_from(["naive", "ratio", "clipped"]),
    st.sampled_from(list(AGGREGATIONS)),
    st.integers(0, 2**31 - 1),
)
def test_loss_pipeline_finite_on_degenerate_batches(N, T, loss_mode, agg_mode, seed):
    # Empty batches, empty responses, fully masked rows and far-apart log-probs (ratios up
    # to e^40) give a finite scalar and finite gradients.
    gen = torch.Generator().manual_seed(seed)
    log_probs = (-torch.rand(N, T, generator=gen) * 40).requires_grad_()
    old = -torch.rand(N, T, generator=gen) * 40
    deltas = torch.randn(N, generator=gen)
    mask = torch.rand(N, T, generator=gen) < 0.5
    if N:
        mask[0] = False  # always one fully masked response
    per_token, stats = policy_loss(log_probs, deltas, loss_mode, old_log_probs=old)
    loss = aggregate_loss(per_token, mask, agg_mode)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(log_probs.grad).all()
    # The micro-batch weights reproduce the same scalar.
    weights = aggregation_weights(mask, agg_mode)
    torch.testing.assert_close(weighted_sum(per_token.detach(), weights), loss.detach(), rtol=1e-5, atol=1e-6)


@FAST
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_masked_mean_matches_loop_reference(N, T, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, T, generator=gen, dtype=torch.float64)
    mask = torch.rand(N, T, generator=gen) < 0.5
    rows = []
    for i in range(N):
        vals = [x[i, j].item() for j in range(T) if mask[i, j]]
        rows.append(sum(vals) / len(vals) if vals else 0.0)
    torch.testing.assert_close(masked_mean(x, mask, dim=-1), torch.tensor(rows, dtype=torch.float64))


@FAST
@given(
    st.lists(st.floats(-1e4, 1e4) | st.just(-math.inf), min_size=1, max_size=8).filter(
        lambda row: any(math.isfinite(v) for v in row)
    ),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_entropy_finite_and_bounded(row, dtype):
    # 0 <= H <= log(number of tokens with finite logit), for any logits incl. -inf ones.
    logits = torch.tensor(row, dtype=dtype, requires_grad=True)
    entropy = entropy_from_logits(logits)
    entropy.backward()
    n_finite = sum(math.isfinite(v) for v in row)
    assert torch.isfinite(entropy) and torch.isfinite(logits.grad).all()
    assert -1e-6 <= entropy.item() <= math.log(n_finite) + 1e-5


@FAST
@given(
    st.lists(st.floats(-30, 0), min_size=1, max_size=16),
    st.lists(st.floats(-30, 0), min_size=1, max_size=16),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_kl_estimators_finite_k2_k3_nonnegative(lp, ref, dtype):
    size = min(len(lp), len(ref))
    log_probs, ref_log_probs = torch.tensor(lp[:size], dtype=dtype), torch.tensor(ref[:size], dtype=dtype)
    for estimator in KL_ESTIMATORS:
        values = kl_penalty(log_probs, ref_log_probs, estimator)
        assert torch.isfinite(values).all()
        if estimator not in ("k1", "k1+"):  # k1 = log pi - log ref is negative where pi < ref
            assert (values >= 0).all()
