"""The off-policy corrections (algo.is_correction): each method against hand values on one
[2, 4] batch, the masks, the config's rules, and a short run per method on the sorting toy
with a perturbed sampler."""

import dataclasses
import math

import pytest
import torch

from helpers import QUIET
from rlvr import core
from rlvr.base.errors import ConfigError
from rlvr.config import load_config
from rlvr.core import (
    CAP_MASKING_CORRECTIONS,
    IS_CORRECTIONS,
    MASKING_CORRECTIONS,
    TRUNCATING_CORRECTIONS,
    off_policy_correction,
    response_fraction,
    token_fraction,
)
from rlvr.loop.step import optimizer_step
from rlvr.loop.trainer import collect_rollout, setup, train
from test_mismatch import NoisySampler, noisy_setup

LN2 = math.log(2.0)
F64 = torch.float64
# log r = log(pi_old / pi_sampler) in units of ln 2, so every ratio is a power of 2:
#   response 0: ratios 2, 1/2, 4, 1, all policy tokens: prod = 4, geometric mean sqrt(2) = 1.414
#   response 1: ratios 1/2 and 1 at its two policy tokens: prod = 1/2, geometric mean 0.707;
#               position 1 is an environment token (ratio 32), position 3 padding (ratio 1/8).
#               Counted, they would make its product 2 and its geometric mean 2^(1/4) = 1.19.
LOG2_RATIOS = [[1.0, -1.0, 2.0, 0.0], [-1.0, 5.0, 0.0, -3.0]]
MASK = torch.tensor([[True, True, True, True], [True, False, True, False]])
T, F = True, False


def batch():
    """(old_log_probs, sample_log_probs) [2, 4], float64, with old - sample = LOG2_RATIOS * ln 2."""
    sample = torch.full((2, 4), -8.0, dtype=F64)
    return sample + LN2 * torch.tensor(LOG2_RATIOS, dtype=F64), sample


def correct(method, **bounds):
    old, sample = batch()
    return off_policy_correction(method, old, sample, MASK, **bounds)


def fractions(c):
    """(truncated token share, truncated response share, masked token share, masked response share)."""
    return (token_fraction(c.truncated, MASK, F64).item(), response_fraction(c.truncated, MASK, F64).item(),
            token_fraction(c.masked, MASK, F64).item(), response_fraction(c.masked, MASK, F64).item())


def weights_equal(c, expected):
    return torch.allclose(c.weights, torch.tensor(expected, dtype=F64), rtol=1e-12, atol=0)


# ---- each method by hand on the [2, 4] batch; 1 off the mask, 0 where masked


def test_token_tis_caps_each_ratio_at_c():
    c = correct("token_tis", cap=3.0)
    assert weights_equal(c, [[2.0, 0.5, 3.0, 1.0], [0.5, 1.0, 1.0, 1.0]])  # ratio 4 capped at 3
    assert c.truncated.tolist() == [[F, F, T, F], [F, F, F, F]]  # ratio 32 is the environment's: not counted
    assert fractions(c) == pytest.approx((1 / 6, 1 / 2, 0.0, 0.0), abs=1e-15)
    old, sample = batch()  # today's TIS weights, on the policy tokens
    assert torch.equal(c.weights[MASK], core.tis_weights(old, sample, 3.0)[MASK])


def test_seq_tis_gives_each_response_its_capped_product():
    c = correct("seq_tis", cap=3.0)
    # response 0: prod 4 -> 3 on all its tokens; response 1: prod of its policy tokens 1/2 (2 if the
    # environment and padding tokens counted)
    assert weights_equal(c, [[3.0, 3.0, 3.0, 3.0], [0.5, 1.0, 0.5, 1.0]])
    assert c.truncated.tolist() == [[T, T, T, T], [F, F, F, F]]
    assert fractions(c) == pytest.approx((4 / 6, 1 / 2, 0.0, 0.0), abs=1e-15)


def test_token_mis_drops_tokens_outside_the_bounds():
    c = correct("token_mis", low=0.4, high=3.0)  # only ratio 4 is outside [0.4, 3]
    assert weights_equal(c, [[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    assert c.masked.tolist() == [[F, F, T, F], [F, F, F, F]]
    assert fractions(c) == pytest.approx((0.0, 0.0, 1 / 6, 1 / 2), abs=1e-15)
    # high 1.5, low defaulting to 1 / 1.5 = 0.667: only the ratios 1 are kept
    c = correct("token_mis", high=1.5)
    assert weights_equal(c, [[0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
    assert fractions(c) == pytest.approx((0.0, 0.0, 4 / 6, 1.0), abs=1e-15)


def test_token_mis_with_a_cap_weighs_kept_tokens_by_their_truncated_ratio():
    c = correct("token_mis", cap=1.5, low=0.4, high=3.0)  # verl: rollout_is=token beside rollout_rs=token
    assert weights_equal(c, [[1.5, 0.5, 0.0, 1.0], [0.5, 1.0, 1.0, 1.0]])  # 2 -> 1.5; 4 dropped, not capped
    assert fractions(c) == pytest.approx((1 / 6, 1 / 2, 1 / 6, 1 / 2), abs=1e-15)


def test_seq_mis_drops_whole_responses_by_their_product():
    c = correct("seq_mis", low=0.4, high=1.5)  # prod 4: dropped; prod 1/2: kept (2, counting the others: dropped)
    assert weights_equal(c, [[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    assert c.masked.tolist() == [[T, T, T, T], [F, F, F, F]]
    assert fractions(c) == pytest.approx((0.0, 0.0, 4 / 6, 1 / 2), abs=1e-15)
    c = correct("seq_mis", cap=1.5, low=0.4, high=5.0)  # both kept, each token's ratio capped at 1.5
    assert weights_equal(c, [[1.5, 0.5, 1.5, 1.0], [0.5, 1.0, 1.0, 1.0]])
    assert fractions(c) == pytest.approx((2 / 6, 1 / 2, 0.0, 0.0), abs=1e-15)


def test_geo_mask_drops_responses_by_the_geometric_mean_of_their_ratios():
    c = correct("geo_mask", low=0.8, high=1.5)  # 1.414 kept; 0.707 dropped (1.19 with the others: kept)
    assert weights_equal(c, [[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0]])
    assert c.masked.tolist() == [[F, F, F, F], [T, F, T, F]]
    assert fractions(c) == pytest.approx((0.0, 0.0, 2 / 6, 1 / 2), abs=1e-15)
    c = correct("geo_mask", high=1.4)  # [0.714, 1.4]: 1.414 and 0.707 both outside
    assert weights_equal(c, [[0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
    assert fractions(c) == pytest.approx((0.0, 0.0, 1.0, 1.0), abs=1e-15)


def test_icepop_keeps_the_ratio_inside_the_bounds_and_zero_outside():
    c = correct("icepop", low=0.4, high=3.0)  # M(k) = k on [0.4, 3]: 2, 1/2, 1 kept as themselves
    assert weights_equal(c, [[2.0, 0.5, 0.0, 1.0], [0.5, 1.0, 1.0, 1.0]])
    assert not c.truncated.any() and c.masked.tolist() == [[F, F, T, F], [F, F, F, F]]
    assert fractions(c) == pytest.approx((0.0, 0.0, 1 / 6, 1 / 2), abs=1e-15)
    c = correct("icepop", low=0.6, high=3.0)  # the ratios 1/2 dropped too
    assert weights_equal(c, [[2.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
    assert fractions(c) == pytest.approx((0.0, 0.0, 3 / 6, 1.0), abs=1e-15)


def test_seq_mask_is_keeps_a_response_s_product_up_to_c_and_drops_it_above():
    c = correct("seq_mask_is", cap=3.0)  # prod 4 > 3: dropped; prod 1/2 (2 with the others: kept too) weighs 1/2
    assert weights_equal(c, [[0.0, 0.0, 0.0, 0.0], [0.5, 1.0, 0.5, 1.0]])
    assert not c.truncated.any() and c.masked.tolist() == [[T, T, T, T], [F, F, F, F]]
    assert fractions(c) == pytest.approx((0.0, 0.0, 4 / 6, 1 / 2), abs=1e-15)
    c = correct("seq_mask_is", cap=5.0)  # a product below C is kept, as itself
    assert weights_equal(c, [[4.0, 4.0, 4.0, 4.0], [0.5, 1.0, 0.5, 1.0]])
    assert fractions(c) == pytest.approx((0.0, 0.0, 0.0, 0.0), abs=1e-15)


def test_seq_mask_is_is_trl_s_sequence_mask():
    # TRL's GRPOTrainer, vllm_importance_sampling_mode="sequence_mask": the log-ratio summed over the
    # completion's (tool-masked) tokens, exponentiated, and set to 0 where it exceeds the cap.
    g = torch.Generator().manual_seed(0)
    old, sample = -torch.rand(64, 9, generator=g, dtype=F64), -torch.rand(64, 9, generator=g, dtype=F64)
    mask = torch.rand(64, 9, generator=g) > 0.2
    ratio = torch.exp(((old - sample) * mask).sum(dim=-1, keepdim=True))
    trl = ratio.masked_fill(ratio > 3.0, 0.0).expand_as(old)
    c = off_policy_correction("seq_mask_is", old, sample, mask, cap=3.0)
    assert c.masked.any() and (~c.masked & mask).any()  # not vacuous: some dropped, some kept
    assert torch.allclose(c.weights[mask], trl[mask], rtol=1e-12, atol=0)


# ---- masks, extremes, and how the methods relate


ALL = [("token_tis", {"cap": 3.0}), ("seq_tis", {"cap": 3.0}), ("token_mis", {"high": 1.5}),
       ("seq_mis", {"high": 1.5}), ("geo_mask", {"high": 1.4}), ("icepop", {"high": 1.5}),
       ("seq_mask_is", {"cap": 3.0})]


def test_every_method_is_tested_here():
    assert {method for method, _ in ALL} == set(IS_CORRECTIONS)


@pytest.mark.parametrize("method, bounds", ALL)
def test_off_the_policy_mask_the_weight_is_one_and_nothing_is_flagged(method, bounds):
    c = correct(method, **bounds)
    assert torch.equal(c.weights[~MASK], torch.ones(2, dtype=F64))  # the environment token and padding
    assert not c.truncated[~MASK].any() and not c.masked[~MASK].any()
    assert not c.weights.requires_grad and c.weights.shape == (2, 4)


@pytest.mark.parametrize("method, bounds", ALL)
def test_a_response_without_policy_tokens_weighs_one_and_is_not_counted(method, bounds):
    old, sample = batch()
    old, sample = torch.cat([old, old[:1]]), torch.cat([sample, sample[:1]])  # [3, 4]: response 0 again
    mask = torch.cat([MASK, torch.zeros(1, 4, dtype=torch.bool)])  # ... with no policy token
    c = off_policy_correction(method, old, sample, mask, **bounds)
    assert torch.equal(c.weights[2], torch.ones(4, dtype=F64))
    alone = correct(method, **bounds)
    for flags, flags_alone in ((c.masked, alone.masked), (c.truncated, alone.truncated)):
        # the share is over the two responses that have policy tokens, as without the third
        assert response_fraction(flags, mask, F64).item() == response_fraction(flags_alone, MASK, F64).item()


def test_huge_ratios_give_the_cap_or_zero_never_inf_or_nan():
    old, sample = torch.tensor([[1000.0, 0.0]]), torch.zeros(1, 2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    assert off_policy_correction("seq_tis", old, sample, mask, cap=2.0).weights.tolist() == [[2.0, 2.0]]
    assert off_policy_correction("icepop", old, sample, mask, high=5.0).weights.tolist() == [[0.0, 1.0]]
    assert off_policy_correction("token_mis", old, sample, mask, cap=2.0, high=5.0).weights.tolist() == [[0.0, 1.0]]
    assert off_policy_correction("seq_mis", -old, sample, mask, high=5.0).weights.tolist() == [[0.0, 0.0]]
    assert off_policy_correction("seq_mask_is", old, sample, mask, cap=2.0).weights.tolist() == [[0.0, 0.0]]
    assert off_policy_correction("seq_mask_is", -old, sample, mask, cap=2.0).weights.tolist() == [[0.0, 0.0]]


def test_icepop_is_token_tis_at_cap_high_times_the_token_mask():
    # verl's reading of IcePop: rollout_is=token with threshold high beside rollout_rs=token.
    g = torch.Generator().manual_seed(0)
    old, sample = torch.randn(6, 9, generator=g), torch.randn(6, 9, generator=g)
    mask = torch.rand(6, 9, generator=g) > 0.2
    ice = off_policy_correction("icepop", old, sample, mask, low=0.5, high=2.0)
    tis = off_policy_correction("token_tis", old, sample, mask, cap=2.0)
    mis = off_policy_correction("token_mis", old, sample, mask, low=0.5, high=2.0)
    assert mis.masked.any() and (~mis.masked & mask).any()  # not vacuous: some dropped, some kept
    assert torch.equal(ice.weights, torch.where(mis.masked, 0.0, tis.weights))
    assert torch.equal(ice.masked, mis.masked)


@pytest.mark.parametrize("method, bounds, message", [
    ("token_tis", {}, "token_tis needs the cap C"),
    ("seq_tis", {"cap": 0.5}, r"cap must be >= 1, got 0.5"),
    ("geo_mask", {}, "geo_mask needs the upper bound high"),
    ("token_mis", {"low": 1.2, "high": 2.0}, r"0 < low < 1 < high, got low=1.2, high=2.0"),
    ("icepop", {"cap": 2.0, "high": 5.0}, "it takes no cap"),
    ("seq_mask_is", {}, "seq_mask_is needs the cap C"),
    ("seq_mask_is", {"cap": 3.0, "high": 5.0}, "seq_mask_is drops ratios above the cap C; it takes no bounds"),
    ("clip", {}, "unknown off-policy correction 'clip'; allowed: token_tis, seq_tis, token_mis, seq_mis, icepop"),
])
def test_bad_arguments_are_refused(method, bounds, message):
    with pytest.raises(ValueError, match=message):
        correct(method, **bounds)


# ---- configuration: one rule per field, the rules between fields


@pytest.mark.parametrize("overrides, message", [
    (["algo.is_correction=clip"], r"algo.is_correction='clip' is not allowed; choose one of: token_tis, seq_tis"),
    (["algo.is_low=1"], r"algo.is_low=1.0 must be < 1"),
    (["algo.is_high=1"], r"algo.is_high=1.0 must be > 1"),
    (["algo.is_high=2"], r"algo.is_high=2.0: the bounds of a masking correction, and algo.is_correction=null"),
    (["algo.is_correction=seq_tis", "algo.tis_cap=2", "algo.is_low=0.5"],
     r"algo.is_low=0.5: the bounds .* algo.is_correction='seq_tis' masks nothing; choose one of token_mis"),
    (["algo.is_correction=geo_mask"], r"algo.is_correction='geo_mask' drops ratios outside .* set algo.is_high"),
    (["algo.is_correction=seq_tis"], r"algo.is_correction='seq_tis' weighs min\(prod_t r_t, C\) per response, "
                                     r"C = algo.tis_cap; set it"),
    (["algo.is_correction=token_tis"], r"algo.is_correction='token_tis' weighs min\(r_t, C\) per token"),
    (["algo.is_correction=icepop", "algo.is_high=5", "algo.tis_cap=2"],
     r"algo.tis_cap=2.0 with algo.is_correction='icepop': IcePop .* takes no cap"),
    (["algo.is_correction=seq_mask_is"], r"algo.is_correction='seq_mask_is' weighs prod_t r_t per response, 0 "
                                         r"above C, C = algo.tis_cap; set it"),
    (["algo.is_correction=seq_mask_is", "algo.tis_cap=3", "algo.is_high=2"],
     r"^algo.is_high=2.0 with algo.is_correction='seq_mask_is': it drops responses whose ratio is above "
     r"algo.tis_cap and takes no bounds; drop them$"),
    (["algo.is_correction=token_mis", "algo.is_high=2", "algo.old_log_probs=sampler"],
     r"algo.is_correction='token_mis' with algo.old_log_probs='sampler': the weights pi_old / pi_sampler need"),
    (["cluster.rollout_workers=1", "cluster.max_staleness=1"],
     r"stale batches need the off-policy correction; set algo.tis_cap .* or algo.is_correction"),
])
def test_config_refuses(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_config_derives_the_method_and_keeps_tis_cap_alone_as_token_tis():
    a = load_config(None, []).algo
    assert (a.is_correction, a.is_low, a.is_high, a.off_policy_method) == (None, None, None, None)
    assert load_config(None, ["algo.tis_cap=2"]).algo.off_policy_method == "token_tis"
    a = load_config(None, ["algo.is_correction=geo_mask", "algo.is_high=1.001"]).algo
    assert a.off_policy_method == "geo_mask" and a.needs_old_log_probs  # the naive loss recomputes for it
    a = load_config(None, ["algo.is_correction=seq_mis", "algo.is_high=3", "algo.is_low=0.5", "algo.tis_cap=2"]).algo
    assert (a.off_policy_method, a.is_low, a.is_high, a.tis_cap) == ("seq_mis", 0.5, 3.0, 2.0)
    # stale batches take any correction
    assert load_config(None, ["cluster.rollout_workers=1", "cluster.max_staleness=1", "algo.is_correction=icepop",
                              "algo.is_high=5"]).cluster.max_staleness == 1


# ---- end to end: the sorting toy's sampler with noise on its log-probs (old - sample = -noise)


def _seq(lr):
    return lr.sum(dim=-1, keepdim=True)  # [N, 1]: every token of the toy's responses is a policy token


RUNS = {  # method -> (overrides, the key it logs, that share and the weights from log r = -noise, by hand)
    "token_tis": (["algo.tis_cap=1.2"], "mismatch/tis_truncated_frac",
                  lambda lr: ((lr > math.log(1.2)).float().mean(), lr.clamp(max=math.log(1.2)).exp())),
    "seq_tis": (["algo.is_correction=seq_tis", "algo.tis_cap=1.2"], "mismatch/seq_truncated_frac",
                lambda lr: ((_seq(lr) > math.log(1.2)).float().mean(),
                            _seq(lr).clamp(max=math.log(1.2)).exp().expand_as(lr))),
    "token_mis": (["algo.is_correction=token_mis", "algo.is_high=1.2"], "mismatch/masked_token_frac",
                  lambda lr: ((lr.abs() > math.log(1.2)).float().mean(), (lr.abs() <= math.log(1.2)).float())),
    "seq_mis": (["algo.is_correction=seq_mis", "algo.is_high=1.5"], "mismatch/masked_seq_frac",
                lambda lr: ((_seq(lr).abs() > math.log(1.5)).float().mean(),
                            (_seq(lr).abs() <= math.log(1.5)).float().expand_as(lr))),
    "geo_mask": (["algo.is_correction=geo_mask", "algo.is_high=1.05"], "mismatch/masked_seq_frac",
                 lambda lr: ((lr.mean(-1).abs() > math.log(1.05)).float().mean(),
                             (lr.mean(-1, keepdim=True).abs() <= math.log(1.05)).float().expand_as(lr))),
    "icepop": (["algo.is_correction=icepop", "algo.is_low=0.9", "algo.is_high=1.2"], "mismatch/masked_token_frac",
               lambda lr: (((lr < math.log(0.9)) | (lr > math.log(1.2))).float().mean(),
                           torch.where((lr >= math.log(0.9)) & (lr <= math.log(1.2)), lr.exp(), 0.0))),
    "seq_mask_is": (["algo.is_correction=seq_mask_is", "algo.tis_cap=1.5"], "mismatch/masked_seq_frac",
                    lambda lr: ((_seq(lr) > math.log(1.5)).float().mean(),
                                torch.where(_seq(lr) <= math.log(1.5), _seq(lr).exp(), 0.0).expand_as(lr))),
}


def test_every_method_has_a_run():
    assert set(RUNS) == set(IS_CORRECTIONS)


@pytest.mark.parametrize("method", list(RUNS))
def test_perturbed_sampler_weights_logs_and_first_step(method):
    overrides, key, by_hand = RUNS[method]
    config, task, st = noisy_setup(["algo.loss=ratio", *overrides])
    rollout = collect_rollout(config, task, st)
    share, weights = by_hand(-st.policy.noise)  # [N, T]: old - sample = -noise up to float32 rounding
    assert 0.05 < share.item() < 0.95 and rollout.stats[key] == pytest.approx(share.item(), abs=1e-9)
    assert torch.allclose(rollout.importance_weights, weights, rtol=1e-5, atol=0)
    assert ({k for k in rollout.stats if k.startswith("mismatch/")} - {"mismatch/k3", "mismatch/max_abs_gap"}
            == {key} | ({"mismatch/tis_truncated_frac"} if method in TRUNCATING_CORRECTIONS else set())
            | ({"mismatch/masked_token_frac", "mismatch/masked_seq_frac"}
               if method in MASKING_CORRECTIONS + CAP_MASKING_CORRECTIONS else set()))
    # At the first step pi == pi_old, so each token's pg term is -delta * w: the masked tokens
    # add nothing, and the aggregation's weights (the normaliser) are those of every token.
    record = optimizer_step(config, st, rollout)
    deltas = rollout.deltas.unsqueeze(-1)  # [N, 1]
    assert record["pg_loss"] == pytest.approx(core.weighted_sum(-deltas * weights, rollout.weights).item(),
                                              rel=1e-5, abs=1e-7)
    assert torch.equal(rollout.weights, core.aggregation_weights(rollout.samples.policy_mask, config.algo.aggregation))


@pytest.mark.parametrize("method", list(RUNS))
def test_a_short_run_logs_what_each_method_truncated_or_masked(method):
    overrides, key, _ = RUNS[method]
    config, task, st = noisy_setup(["algo.epochs=2", "algo.inner_steps=2", "log.eval_every=2", *overrides])
    records = [r for r in train(config, state=(task, st)) if r["kind"] == "train"]
    assert len(records) == 4
    for r in records:
        assert 0 < r[key] < 1 and math.isfinite(r["loss"]) and r["skipped_step"] == 0.0


class EnvironmentTokenSampler(NoisySampler):
    """The last token of every response is the environment's (not in the policy mask), and
    its sampler log-prob is off by 50: counted, it would flag every response."""

    def sample(self, prompts, group_size, temperature, generator):
        samples = self.policy.sample(prompts, group_size, temperature, generator)
        self.noise = self.scale * torch.randn(samples.sample_log_probs.shape, generator=self.generator)
        self.noise[:, -1] = 50.0
        policy_mask = samples.response_mask.clone()
        policy_mask[:, -1] = False
        return dataclasses.replace(samples, sample_log_probs=samples.sample_log_probs + self.noise,
                                   policy_mask=policy_mask)


def test_only_the_policys_tokens_are_weighted_and_counted():
    config = load_config(None, QUIET + ["algo.is_correction=seq_mis", "algo.is_high=1.5"])
    task, st = setup(config)
    st.policy = EnvironmentTokenSampler(st.policy, 0.3)
    rollout = collect_rollout(config, task, st)
    policy_mask = rollout.samples.policy_mask
    assert not policy_mask[:, -1].any() and policy_mask[:, :-1].all()
    lr = (rollout.old_log_probs - rollout.samples.sample_log_probs)[:, :-1]  # [N, T - 1]: the policy's tokens
    assert (rollout.old_log_probs - rollout.samples.sample_log_probs)[:, -1].max() < -40  # the environment's gap
    kept = _seq(lr).abs() <= math.log(1.5)  # [N, 1]
    assert 0 < kept.float().mean() < 1
    dropped = (~kept).float().mean().item()  # each response's policy tokens are as many: the same token share
    assert rollout.stats["mismatch/masked_seq_frac"] == pytest.approx(dropped, abs=1e-9)
    assert rollout.stats["mismatch/masked_token_frac"] == pytest.approx(dropped, abs=1e-9)
    assert torch.equal(rollout.importance_weights[:, :-1], kept.float().expand_as(lr))
    assert torch.equal(rollout.importance_weights[:, -1], torch.ones(rollout.samples.num_responses))
