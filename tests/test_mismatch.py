"""Sampler-trainer mismatch: where the old log-probs come from (algo.old_log_probs),
truncated importance sampling (algo.tis_cap) and the mismatch/* metrics, end to end."""

import dataclasses
import math

import pytest
import torch

from helpers import QUIET
from rlvr import core
from rlvr.base.errors import ConfigError
from rlvr.batch.interfaces import Policy, sampler_log_probs_exact
from rlvr.config import load_config
from rlvr.engines import Engine
from rlvr.loop.state import TrainingError
from rlvr.loop.step import optimizer_step
from rlvr.loop.trainer import collect_rollout, setup, train

MISMATCH_KEYS = {"mismatch/k3", "mismatch/max_abs_gap", "mismatch/tis_truncated_frac"}


class NoisySampler:
    """A policy whose sampler's log-probs are off: the wrapped policy's, plus Gaussian
    noise of std ``scale`` on every token (the drawn tokens and the scorer are untouched).
    ``noise`` keeps the last draw's noise [N, T]."""

    exact_log_probs = False

    def __init__(self, policy, scale, seed=0, drop=False):
        self.policy, self.scale, self.drop = policy, scale, drop
        self.generator = torch.Generator().manual_seed(seed)
        self.noise = None

    def __getattr__(self, name):  # module, log_probs, greedy, max_response_length: the policy's
        return getattr(self.policy, name)

    def sample(self, prompts, group_size, temperature, generator):
        samples = self.policy.sample(prompts, group_size, temperature, generator)
        if self.drop:
            return dataclasses.replace(samples, sample_log_probs=None)
        self.noise = self.scale * torch.randn(samples.sample_log_probs.shape, generator=self.generator)
        return dataclasses.replace(samples, sample_log_probs=samples.sample_log_probs + self.noise)


def noisy_setup(overrides, scale=0.3, drop=False):
    config = load_config(None, QUIET + overrides)
    task, st = setup(config)
    st.policy = NoisySampler(st.policy, scale, drop=drop)
    return config, task, st


# ---- configuration


@pytest.mark.parametrize("overrides, message", [
    (["algo.tis_cap=0.5"], r"algo.tis_cap=0.5 must be >= 1"),
    (["algo.old_log_probs=trainer"], r"algo.old_log_probs='trainer' is not allowed; choose one of: auto, sampler, "
                                     r"recompute"),
    (["algo.tis_cap=2", "algo.old_log_probs=sampler"], r"algo.tis_cap=2.0 with algo.old_log_probs='sampler'"),
])
def test_config_refuses_bad_mismatch_settings(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_config_defaults_keep_todays_behaviour_and_cap_one_is_allowed():
    a = load_config(None, []).algo
    assert (a.old_log_probs, a.tis_cap) == ("auto", None)
    assert load_config(None, ["algo.tis_cap=1", "algo.old_log_probs=recompute"]).algo.tis_cap == 1.0


def test_recompute_with_the_naive_loss_alone_warns_and_recomputes_nothing():
    # The naive loss uses no old log-probs; recomputing them only for the log is not done.
    with pytest.warns(UserWarning, match="none are recomputed"):
        config = load_config(None, QUIET + ["algo.old_log_probs=recompute"])
    task, st = setup(config)
    rollout = collect_rollout(config, task, st)
    assert rollout.old_log_probs is None and rollout.importance_weights is None
    assert not MISMATCH_KEYS & set(rollout.stats)


# ---- which log-probs are the old ones


def test_exactness_is_the_policys_then_its_engines_then_true():
    class Sampler(Policy):  # the protocol's defaults: no engine, exactness not said
        pass

    class Inexact(Engine):  # vLLM's kernels
        exact_log_probs = False

    assert sampler_log_probs_exact(Sampler()) is True  # the positional toy: says nothing
    with_engine = Sampler()
    with_engine.engine = Inexact()
    assert sampler_log_probs_exact(with_engine) is False
    with_engine.exact_log_probs = True
    assert sampler_log_probs_exact(with_engine) is True
    with_engine.engine = type("Exact", (Engine,), {})()  # HFEngine: the default, exact
    with_engine.exact_log_probs = None
    assert sampler_log_probs_exact(with_engine) is True


def test_auto_uses_the_exact_samplers_log_probs_as_today():
    config = load_config(None, QUIET + ["algo.loss=clipped"])
    task, st = setup(config)
    rollout = collect_rollout(config, task, st)
    assert rollout.old_log_probs is rollout.samples.sample_log_probs  # no extra forward pass
    assert rollout.importance_weights is None and not MISMATCH_KEYS & set(rollout.stats)


def test_auto_recomputes_for_an_inexact_sampler_and_logs_the_mismatch():
    config, task, st = noisy_setup(["algo.loss=clipped"])
    rollout = collect_rollout(config, task, st)
    trainer_log_probs, _ = st.policy.log_probs(rollout.samples, 1.0)
    assert torch.equal(rollout.old_log_probs, trainer_log_probs)  # the trainer's, not the noisy ones
    assert rollout.importance_weights is None  # TIS off: measured, not corrected
    assert rollout.stats["mismatch/k3"] > 0 and rollout.stats["mismatch/max_abs_gap"] > 0
    assert "mismatch/tis_truncated_frac" not in rollout.stats  # no cap: nothing can be truncated, nothing logged


@pytest.mark.parametrize("overrides, logged", [
    (["algo.loss=clipped"], False),  # measured only
    (["algo.is_correction=token_mis", "algo.is_high=1.2"], False),  # kept tokens weigh 1: none truncated
    (["algo.is_correction=icepop", "algo.is_high=1.2"], False),  # kept ratios are within high: none truncated
    (["algo.is_correction=token_mis", "algo.is_high=1.2", "algo.tis_cap=1.1"], True),
    (["algo.is_correction=seq_mask_is", "algo.tis_cap=1.5"], False),  # its cap drops responses, truncates none
    (["algo.tis_cap=1.2"], True),
])
def test_the_truncated_share_is_logged_only_where_a_cap_truncates(overrides, logged):
    config, task, st = noisy_setup(overrides)
    stats = collect_rollout(config, task, st).stats
    assert {"mismatch/k3", "mismatch/max_abs_gap"} <= set(stats)
    assert ("mismatch/tis_truncated_frac" in stats) == logged
    if logged:
        assert 0 < stats["mismatch/tis_truncated_frac"] < 1


# ---- a perturbed sampler: TIS weights capped at C


def test_perturbed_sampler_gives_capped_weights_and_matching_metrics():
    cap = 1.2
    config, task, st = noisy_setup(["algo.loss=ratio", f"algo.tis_cap={cap}"])
    rollout = collect_rollout(config, task, st)
    noise = st.policy.noise  # [N, T]
    assert rollout.samples.response_mask.all()  # every token is real: plain means below
    # old - sample = (trainer) - (trainer + noise) = -noise, up to the rounding of two
    # float32 scorings of the same model (1e-6 at these magnitudes).
    w = rollout.importance_weights
    assert torch.allclose(w, torch.exp((-noise).clamp(max=math.log(cap))), rtol=1e-5, atol=0)
    assert w.max().item() == pytest.approx(cap, rel=1e-6) and (w <= cap * (1 + 1e-6)).all()
    assert (w < 1).any()  # tokens the sampler over-rated are weighted down, uncapped
    s = rollout.stats
    truncated = (-noise > math.log(cap)).float().mean().item()  # P(Z > 0.61) ~ 0.27 for std 0.3
    assert 0.1 < truncated < 0.5 and s["mismatch/tis_truncated_frac"] == pytest.approx(truncated, abs=1e-9)
    assert s["mismatch/max_abs_gap"] == pytest.approx(noise.abs().max().item(), rel=1e-5)
    k3 = (torch.expm1(-noise) + noise).mean().item()  # r - log r - 1 with log r = -noise
    assert s["mismatch/k3"] == pytest.approx(k3, rel=1e-4) and s["mismatch/k3"] > 1e-3
    # At the epoch's first step pi == pi_old (the same scorer, the same weights), so the
    # ratio is 1 and each token's pg term is -delta * w: the record's pg_loss is that,
    # aggregated, and differs from the unweighted -delta aggregated.
    record = optimizer_step(config, st, rollout)
    deltas = rollout.deltas.unsqueeze(-1)  # [N, 1]
    weighted = core.weighted_sum(-deltas * w, rollout.weights).item()
    unweighted = core.weighted_sum(-deltas * torch.ones_like(w), rollout.weights).item()
    assert record["pg_loss"] == pytest.approx(weighted, rel=1e-5, abs=1e-7)
    assert abs(weighted - unweighted) > 1e-3


def test_tis_with_the_naive_loss_and_a_whole_run_logs_every_epoch():
    config, task, st = noisy_setup(["algo.epochs=3", "algo.tis_cap=1.5", "log.eval_every=3"])
    records = [r for r in train(config, state=(task, st)) if r["kind"] == "train"]
    assert len(records) == 30
    for r in records:
        assert r["mismatch/k3"] > 0 and r["mismatch/max_abs_gap"] > 0 and r["mismatch/tis_truncated_frac"] > 0
        assert math.isfinite(r["loss"]) and r["skipped_step"] == 0.0


class OffsetSampler(NoisySampler):
    """The sampler's log-probs 1 above the trainer's on every token: r = e^-1 everywhere."""

    def sample(self, prompts, group_size, temperature, generator):
        samples = self.policy.sample(prompts, group_size, temperature, generator)
        return dataclasses.replace(samples, sample_log_probs=samples.sample_log_probs + 1.0)


def _stopped(overrides, sampler):
    """The TrainingError's message a run with ``sampler`` stops with, the batch's policy tokens, the state."""
    config = load_config(None, QUIET + overrides)
    task, st = setup(config)
    st.policy = sampler(st.policy, 0.0)
    with pytest.raises(TrainingError) as err:
        train(config, state=(task, st))
    return str(err.value), config.task.prompts_per_epoch * config.algo.group_size * st.policy.max_response_length, st


@pytest.mark.parametrize("method", ["token_mis", "seq_mis", "geo_mask", "icepop"])
def test_a_correction_that_masks_every_token_stops_with_one_line(method):
    message, tokens, st = _stopped([f"algo.is_correction={method}", "algo.is_high=1.2"], OffsetSampler)
    assert message == (f"algo.is_correction={method} masked every one of the batch's {tokens} policy tokens "
                              "(their ratios pi_old / pi_sampler outside [0.833333, 1.2]), so the steps would train "
                              "nothing; widen the bounds or check that the sampler's log-probs are the policy's")
    assert st.step == 0  # no step taken on a loss of 0


class LowSampler(NoisySampler):
    """The sampler's log-probs 1 below the trainer's on every token: r = e everywhere."""

    def sample(self, prompts, group_size, temperature, generator):
        samples = self.policy.sample(prompts, group_size, temperature, generator)
        return dataclasses.replace(samples, sample_log_probs=samples.sample_log_probs - 1.0)


def test_a_cap_that_drops_every_response_stops_with_one_line_naming_it():
    message, tokens, st = _stopped(["algo.is_correction=seq_mask_is", "algo.tis_cap=3"], LowSampler)  # ratios e^T > 3
    assert message == (f"algo.is_correction=seq_mask_is masked every one of the batch's {tokens} policy "
                              "tokens (their responses' ratios above algo.tis_cap=3), so the steps would train "
                              "nothing; raise the cap or check that the sampler's log-probs are the policy's")
    assert st.step == 0


def test_tis_refuses_a_sampler_that_records_no_log_probs():
    config, task, st = noisy_setup(["algo.tis_cap=2"], drop=True)
    with pytest.raises(TrainingError, match="need the sampler's log-probs"):
        collect_rollout(config, task, st)


# ---- the HF engine: its log-probs are the trainer's, so TIS changes nothing


def test_hf_recompute_and_tis_change_nothing_that_matters(tiny_model, tmp_path):
    pytest.importorskip("transformers")
    from rlvr.cli import main
    from rlvr.runs.metrics import read_records, without_timings
    from test_lm_runs import lm_args

    plain, tis = tmp_path / "plain", tmp_path / "tis"
    assert main(["train", *lm_args(tiny_model, plain, epochs=2)]) == 0
    assert main(["train", *lm_args(tiny_model, tis, epochs=2), "algo.old_log_probs=recompute",
                 "algo.tis_cap=2"]) == 0
    before, after = without_timings(read_records(plain)), without_timings(read_records(tis))
    assert [r["kind"] for r in before] == [r["kind"] for r in after]
    train_after = [r for r in after if r["kind"] == "train"]
    assert len(train_after) == 4
    for r in train_after:
        # The KV-cache sampler and the trainer's scorer compute the same float32 log-probs
        # by different routes: they agree to a few ulps (4.8e-7 seen at |log p| ~ 4).
        assert r["mismatch/max_abs_gap"] < 1e-5
        assert 0 <= r["mismatch/k3"] < 1e-10  # ~ gap^2 / 2
        assert r["mismatch/tis_truncated_frac"] == 0.0  # every weight is 1 +- 1e-5, far below C = 2
    for b, a in zip(before, after):
        assert set(a) - set(b) == (MISMATCH_KEYS if a["kind"] == "train" else set())
        for key, value in b.items():
            # With the clipped loss, ratio * w = (pi / pi_old) * (pi_old / pi_sampler) is
            # today's pi / pi_sampler up to rounding; the records came out bitwise equal
            # here, but float32 rounding of the two routes may differ by ~1e-7 relative,
            # so the check allows 1e-6 (the losses are O(0.1-1)).
            if isinstance(value, float):
                assert a[key] == pytest.approx(value, rel=1e-6, abs=1e-8), (b["kind"], b.get("step"), key)
            else:
                assert a[key] == value, (b["kind"], key)
