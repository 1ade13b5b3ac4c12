"""The 2025 variants in the loop: entropy bonus, KL in the reward, dynamic sampling, overlong
handling, entropy token selection, the gradient-noise meter, the per-prompt records, and the new
losses' settings."""

import math
import warnings

import pytest
import torch

from helpers import QUIET
from rlvr.config import ConfigError, load_config
from rlvr.core import kl_penalty, top_entropy_mask
from rlvr.loop.step import accumulate_gradients, optimizer_step
from rlvr.loop.trainer import collect_rollout, setup, train

SHORT = QUIET + ["algo.epochs=3", "algo.inner_steps=2", "log.eval_every=3"]


def test_the_positional_entropy_gradient_is_autograd_of_the_entropy():
    """The hand-written backward of the toy's scorer, with the entropy in the loss, against
    autograd through log_softmax of the model's logits (float64)."""
    config = load_config(None, QUIET + ["algo.group_size=4"])
    task, st = setup(config)
    st.policy.module.double()
    rollout = collect_rollout(config, task, st)
    samples, module = rollout.samples, st.policy.module
    weights = torch.rand(samples.response_ids.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    temperature = 0.7

    def loss_of(log_probs, entropy):
        return (weights * (log_probs - 0.3 * entropy)).sum()

    log_probs, entropy = st.policy.log_probs(samples, temperature, with_entropy=True, entropy_grad=True)
    fast = torch.autograd.grad(loss_of(log_probs, entropy), list(module.parameters()))
    all_log_probs = torch.log_softmax(module(samples.prompt_ids) / temperature, dim=-1)  # [N, n, V]
    reference_lp = all_log_probs.gather(-1, samples.response_ids.unsqueeze(-1)).squeeze(-1)
    reference_h = -(all_log_probs.exp() * all_log_probs).sum(-1)
    torch.testing.assert_close(entropy, reference_h)
    slow = torch.autograd.grad(loss_of(reference_lp, reference_h), list(module.parameters()))
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_the_entropy_bonus_raises_the_entropy():
    flat = train(load_config(None, SHORT))
    bonus = train(load_config(None, SHORT + ["algo.entropy_coef=0.5"]))
    end = [r["entropy"] for r in flat if r["kind"] == "train"][-1], [r["entropy"] for r in bonus
                                                                      if r["kind"] == "train"][-1]
    assert end[1] > end[0]
    first = [r for r in bonus if r["kind"] == "train"][0]
    # the loss at the first step is the policy-gradient term minus coef * the weighted entropy
    assert first["loss"] < first["pg_loss"]


def test_kl_in_the_reward_shapes_the_deltas_and_leaves_the_loss_alone():
    overrides = QUIET + ["algo.kl_coef=0.5", "algo.kl_in=reward", "algo.kl_estimator=k1", "algo.deltas=raw"]
    config = load_config(None, overrides)
    task, st = setup(config)
    optimizer_step(config, st, collect_rollout(config, task, st))  # move pi away from the reference
    st.inner_step, st.epoch = 0, 1
    generator_state = st.generator.get_state()
    rollout = collect_rollout(config, task, st)
    st.generator.set_state(generator_state)  # the same batch, to recompute its pieces by hand
    samples = st.policy.sample(task.sample_prompts(3, st.generator), config.algo.group_size, 1.0, st.generator)
    grades = task.grade(task.sample_prompts(3, st.generator), samples.responses)
    with torch.no_grad():
        ref, _ = st.policy.log_probs(samples, 1.0, module=st.ref_module)
    k1 = (samples.sample_log_probs - ref).sum(dim=1)  # [N]: log pi_old - log ref over the response
    assert k1.abs().max() > 0
    expected = grades.rewards.reshape(-1) - 0.5 * k1
    torch.testing.assert_close(rollout.deltas, expected)
    assert rollout.stats["kl_reward_penalty"] == pytest.approx((0.5 * k1).mean().item(), rel=1e-5)
    record = optimizer_step(config, st, rollout)
    assert record["loss"] == record["pg_loss"]  # no KL term in the loss


def test_k1_as_a_loss_term_still_points_at_the_reward():
    with pytest.raises(ConfigError, match="algo.kl_in=reward"):
        load_config(None, ["algo.kl_coef=0.1", "algo.kl_estimator=k1"])


def test_kl_in_the_reward_refuses_an_estimator_it_would_ignore():
    with pytest.raises(ConfigError, match="algo.kl_in=reward with algo.kl_estimator='k3'"):
        load_config(None, ["algo.kl_coef=0.1", "algo.kl_in=reward", "algo.kl_estimator=k3"])
    # not given: the reward's own estimator, k1
    assert load_config(None, ["algo.kl_coef=0.1", "algo.kl_in=reward"]).algo.kl_estimator == "k1"


def test_kl_in_the_reward_logs_the_policy_s_kl():
    config = load_config(None, QUIET + ["algo.kl_coef=0.5", "algo.kl_in=reward", "algo.kl_estimator=k1"])
    task, st = setup(config)
    optimizer_step(config, st, collect_rollout(config, task, st))  # move pi away from the reference
    st.epoch = 1  # the reference is refreshed every 10 epochs: epoch 1 keeps epoch 0's
    rollout = collect_rollout(config, task, st)
    with torch.no_grad():
        ref, _ = st.policy.log_probs(rollout.samples, 1.0, module=st.ref_module)
        log_probs, _ = st.policy.log_probs(rollout.samples, 1.0)
    record = optimizer_step(config, st, rollout)
    k1 = (log_probs - ref).mean().item()  # the toy's responses: every position a token
    assert abs(k1) > 1e-4
    assert record["kl"] == pytest.approx(k1, rel=1e-5)
    assert record["loss"] == record["pg_loss"]  # no KL term in the loss


def test_dynamic_sampling_fills_the_batch_with_learning_groups():
    """The toy on fresh prompts: groups of one repeated response have all-zero deltas, a third
    to all of the batch late in the run. Dynamic sampling keeps only groups with a nonzero
    delta, sampling again until there are B of them."""
    base = QUIET + ["algo.epochs=30", "algo.inner_steps=10", "log.eval_every=30", "seed=1", "task.prompts=null"]
    plain = [r for r in train(load_config(None, base)) if r["kind"] == "train" and r["step"] % 10 == 0]
    dynamic = [r for r in train(load_config(None, base + ["algo.dynamic_sampling=true", "algo.max_sampling_tries=8"]))
               if r["kind"] == "train" and r["step"] % 10 == 0]
    assert sum(r["frac_zero_delta_groups"] for r in plain[-10:]) / 10 > 0.3
    assert all(r["dynamic/learning_groups_frac"] == 1.0 and r["frac_zero_delta_groups"] == 0.0 for r in dynamic)
    assert all(1 <= r["dynamic/tries"] <= 8 for r in dynamic)
    assert any(r["dynamic/tries"] > 1 for r in dynamic)  # it did sample again


def test_dynamic_sampling_is_refused_with_rollout_workers():
    with pytest.raises(ConfigError, match="dynamic_sampling"):
        load_config(None, ["algo.dynamic_sampling=true", "cluster.rollout_workers=1"])


@pytest.mark.parametrize("prompts", [[[1, 0, 2], [3, 2, 4]], [[1, 0, 2], [3, 2, 4], [1, 2, 3], [0, 1, 2], [4, 3, 2]]])
def test_dynamic_sampling_with_fixed_prompts_keeps_the_whole_list_as_the_batch(prompts):
    # A fixed list is the batch without dynamic sampling; with it too, whatever prompts_per_epoch.
    overrides = QUIET + [f"task.prompts={prompts}", "algo.dynamic_sampling=true", "algo.max_sampling_tries=1",
                         "algo.group_size=4"]
    config = load_config(None, overrides)
    task, st = setup(config)
    rollout = collect_rollout(config, task, st)
    assert rollout.samples.num_responses == len(prompts) * 4
    plain = load_config(None, QUIET + [f"task.prompts={prompts}", "algo.group_size=4"])
    task, st = setup(plain)
    assert collect_rollout(plain, task, st).samples.num_responses == len(prompts) * 4


def test_dynamic_sampling_refuses_a_batch_size_that_contradicts_the_fixed_list():
    with pytest.raises(ConfigError, match="task.prompts_per_epoch=5 with 3 fixed task.options.prompts"):
        load_config(None, ["algo.dynamic_sampling=true", "task.prompts_per_epoch=5"])
    load_config(None, ["algo.dynamic_sampling=true", "task.prompts_per_epoch=5", "task.prompts=null"])


def lm_overrides(tiny_model, *extra):
    return QUIET + [
        "task.name=sort_text", "task.options={num_digits: 3, num_eval: 4}", "task.prompts_per_epoch=2",
        "policy.name=causal_lm", f"policy.options={{model: '{tiny_model}', max_new_tokens: 4}}",
        "algo.epochs=1", "algo.inner_steps=1", "algo.group_size=4", "log.eval_every=1", "log.eval_samples=1",
        "log.entropy=false", "threads=1", *extra]


def test_overlong_responses_are_found_masked_or_penalised(tiny_model):
    pytest.importorskip("transformers")
    config = load_config(None, lm_overrides(tiny_model, "algo.overlong=mask"))
    task, st = setup(config)
    state = st.generator.get_state()
    masked = collect_rollout(config, task, st)
    samples = masked.samples
    lengths = samples.response_mask.sum(dim=1)
    last = samples.response_ids.gather(1, (lengths - 1).unsqueeze(1)).squeeze(1)
    eos = set(st.policy.sampling.eos_token_ids)
    truncated = torch.tensor([n == 4 and t not in eos for n, t in zip(lengths.tolist(), last.tolist())])
    assert 0 < truncated.sum() < len(truncated)  # a random tiny model: some cut, some ended
    torch.testing.assert_close(st.policy.truncated(samples), truncated)
    assert (masked.weights[truncated] == 0).all() and (masked.weights[~truncated].sum(dim=1) > 0).all()
    assert masked.stats["truncated_frac"] == pytest.approx(truncated.float().mean().item())

    config = load_config(None, lm_overrides(tiny_model, "algo.overlong=penalty", "algo.overlong_cache=2",
                                            "algo.deltas=raw"))
    task, st = setup(config)
    st.generator.set_state(state)
    penalised = collect_rollout(config, task, st)
    rewards = task.grade(task.sample_prompts(2, torch.Generator().set_state(state)), samples.responses).rewards
    # max_len 4, cache 2: lengths 1-2 no penalty, 3 -> -0.5, 4 -> -1 (factor 1)
    penalty = torch.tensor([0.0, 0.0, 0.0, -0.5, -1.0])[lengths]
    torch.testing.assert_close(penalised.deltas, rewards.reshape(-1) + penalty)


def test_top_entropy_selection_trains_on_the_highest_entropy_tokens():
    config = load_config(None, QUIET + ["algo.top_entropy_q=0.25", "algo.aggregation=token_mean"])
    task, st = setup(config)
    rollout = collect_rollout(config, task, st)
    kept = rollout.pg_token_mask
    assert kept.sum().item() == math.ceil(0.25 * kept.numel())
    _, entropy = st.policy.log_probs(rollout.samples, 1.0, with_entropy=True)
    assert entropy[kept].min() >= entropy[~kept].max()
    assert torch.equal(rollout.pg_token_mask, kept)
    # the weights keep every response token: token_mean's normaliser is the batch's token count
    assert torch.equal(rollout.weights > 0, rollout.samples.response_mask)
    torch.testing.assert_close(rollout.weights.sum(), torch.tensor(1.0))


def test_top_entropy_selection_keeps_the_all_token_normaliser_and_the_kl_on_every_token():
    """The method (and TRL): the selection multiplies the policy-gradient term of the full-mask
    per-token loss; the aggregation's normaliser and the KL term keep every token. By hand,
    seq_mean_token_mean on the toy (n tokens each): w = 1 / (n N) on every token, and
        loss = sum_t w (keep_t * (-delta_i log pi_t) + kl_coef * k3_t)."""
    config = load_config(None, QUIET + ["algo.top_entropy_q=0.25", "algo.kl_coef=0.1", "algo.group_size=4"])
    task, st = setup(config)
    rollout = collect_rollout(config, task, st)
    samples, mask = rollout.samples, rollout.samples.response_mask
    st.optimizer.zero_grad(set_to_none=True)
    accumulate_gradients(config, st.policy, rollout, 1)
    got = [p.grad.clone() for p in st.policy.module.parameters()]

    log_probs, entropy = st.policy.log_probs(samples, 1.0, with_entropy=True)
    keep = top_entropy_mask(entropy.detach(), mask, 0.25)
    assert 0 < keep.sum() < mask.sum()
    n, num = mask.shape[1], mask.shape[0]
    with torch.no_grad():
        ref, _ = st.policy.log_probs(samples, 1.0, module=st.ref_module)
    pg = torch.where(keep, -rollout.deltas.unsqueeze(1) * log_probs, 0.0)
    per_token = pg + 0.1 * kl_penalty(log_probs, ref, "k3")
    expected = torch.autograd.grad((per_token / (n * num)).sum(), list(st.policy.module.parameters()))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_the_noise_meter_logs_every_k_epochs_without_changing_the_step():
    overrides = SHORT + ["algo.epochs=4", "task.prompts=null", "task.prompts_per_epoch=8", "algo.deltas=raw"]
    plain = [r for r in train(load_config(None, overrides)) if r["kind"] == "train"]
    measured = [r for r in train(load_config(None, overrides + ["log.grad_noise_every=2", "log.grad_noise_parts=4"]))
                if r["kind"] == "train"]
    assert [r["step"] for r in measured if "grad/noise_scale" in r] == [0, 4]  # epochs 0 and 2, first steps
    for a, b in zip(plain, measured):  # parts of whole groups add up to the same gradient
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
        assert b["reward_mean"] == pytest.approx(a["reward_mean"], rel=1e-5)
    for r in measured:
        if "grad/noise_scale" in r:
            assert r["grad/batch_size"] == pytest.approx(8.0)
            assert r["grad/snr"] == pytest.approx(8.0 / r["grad/noise_scale"], rel=1e-6)


def test_the_meter_splits_into_whole_groups():
    config = load_config(None, QUIET + ["task.prompts=null", "task.prompts_per_epoch=5", "algo.group_size=3"])
    task, st = setup(config)
    rollout = collect_rollout(config, task, st)
    from rlvr.loop.step import group_parts

    parts = group_parts(rollout, 4, 3)
    assert [p.samples.num_responses for p in parts] == [3, 3, 3, 6]
    assert len(group_parts(rollout, 99, 3)) == 5  # at most one part per group
    from rlvr.loop.diagnostics import GradientNoiseMeter

    meter = GradientNoiseMeter()
    st.optimizer.zero_grad(set_to_none=True)
    accumulate_gradients(config, st.policy, rollout, 1, meter)
    assert meter.sizes == pytest.approx([1.0, 1.0, 1.0, 2.0])  # each part's share of the batch, in prompts


def test_a_prompts_record_per_epoch_says_which_prompts_were_solved():
    records = train(load_config(None, SHORT + ["examples/sorting_best.yaml"][:0]))
    prompts = [r for r in records if r["kind"] == "prompts"]
    assert [r["epoch"] for r in prompts] == [0, 1, 2]
    assert set(prompts[0]["solved"]) == {"1 0 2", "3 2 4", "1 2 3"}
    trains = [r for r in records if r["kind"] == "train" and r["step"] % 2 == 0]
    for p, t in zip(prompts, trains):  # the shares average to the batch's solve rate
        assert sum(p["solved"].values()) / 3 == pytest.approx(t["solve_rate"])
    assert not [r for r in train(load_config(None, SHORT + ["log.prompt_records=false"])) if r["kind"] == "prompts"]


@pytest.mark.parametrize("loss", ["gspo", "dual_clip", "cispo"])
def test_the_new_losses_train(loss):
    extra = ["algo.clip_eps=0.05"] if loss == "gspo" else []
    records = [r for r in train(load_config(None, SHORT + [f"algo.loss={loss}", *extra])) if r["kind"] == "train"]
    assert all(math.isfinite(r["loss"]) and r["skipped_step"] == 0 for r in records)
    assert records[1]["grad_norm"] > 0


def test_gspo_with_a_token_weighted_aggregation_warns():
    with pytest.warns(UserWarning, match="algo.loss='gspo' with algo.aggregation='token_mean'"):
        load_config(None, ["algo.loss=gspo", "algo.aggregation=token_mean"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(None, ["algo.loss=gspo", "algo.inner_steps=2"])


def test_a_run_with_cispo_defaults_trains():
    records = train(load_config(None, QUIET + ["algo.loss=cispo", "algo.epochs=2", "algo.inner_steps=2",
                                               "log.eval_every=2"]))
    assert all(math.isfinite(r["loss"]) for r in records if r["kind"] == "train")
