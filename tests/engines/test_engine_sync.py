"""Engine selection and weight sync without vLLM: options checked before any loading,
LoRA merged for a copying engine, the per-epoch hand-over and the probe.

Shapes: L probe tokens.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("transformers")

from helpers import QUIET  # noqa: E402
from rlvr.base.errors import ConfigError  # noqa: E402
from rlvr.config import load_config  # noqa: E402
from rlvr.config.compose import build_policy  # noqa: E402
from rlvr.engines import SamplingParams, WeightSyncError  # noqa: E402
from rlvr.engines.hf import HFEngine  # noqa: E402
from rlvr.engines.vllm import (  # noqa: E402
    VLLMOptions,  # noqa: E402
    logprobs_mode_for,
    merged_state_dict,
)
from rlvr.loop.seams import sync_engine  # noqa: E402
from rlvr.loop.state import TrainingError  # noqa: E402
from rlvr.modeling import load_model_and_tokenizer  # noqa: E402
from rlvr.policies import engine_sync  # noqa: E402
from rlvr.policies.causal_lm import CausalLMPolicy  # noqa: E402


def lm_config(model, **options):
    text = ", ".join(f"{key}: {value}" for key, value in {"model": f"'{model}'", **options}.items())
    return load_config(None, QUIET + ["task.name=sort_text", "task.options={num_digits: 3, num_eval: 4}",
                                      "policy.name=causal_lm", f"policy.options={{{text}}}"])


@pytest.fixture
def no_loading(monkeypatch):
    """Loading a model fails the test: the errors below must come before any work."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("rlvr.modeling.load_model_and_tokenizer", refuse)


def test_engine_vllm_without_the_package_is_a_config_error_before_loading(tiny_model, monkeypatch, no_loading):
    monkeypatch.setattr("rlvr.config.checks.vllm_installed", lambda: False)
    with pytest.raises(ConfigError, match=r"engine='vllm' needs the vllm package, which is not installed: "
                                          r"pip install 'rlvr\[vllm\]'"):
        build_policy(lm_config(tiny_model, engine="vllm"))


@pytest.mark.parametrize("options, message", [
    ({"engine": "vlm"}, r"engine='vlm' is not allowed; choose one of: hf, vllm"),
    ({"engine": "vllm", "engine_options": "{kv_cache_bytes: 1}"},
     r"policy.options.engine_options: unknown option 'kv_cache_bytes'; did you mean 'kv_cache_memory_bytes'\?"),
    ({"engine": "vllm", "engine_options": "{probe_tolerance: 0}"},
     r"policy.options.engine_options.probe_tolerance=0.0 must be > 0"),
    ({"engine": "vllm", "engine_options": "{dtype: float64}"},
     r"engine_options.dtype='float64' is not allowed; choose one of: auto, float32, bfloat16, float16"),
    ({"engine_options": "{dtype: float32}"},
     r"policy.options.engine_options \['dtype'\] are for engine=vllm; engine=hf takes none"),
])
def test_bad_engine_settings_are_config_errors_before_loading(tiny_model, no_loading, options, message):
    with pytest.raises(ConfigError, match=message):
        build_policy(lm_config(tiny_model, **options))


def test_the_config_command_accepts_the_engine_options(tiny_model, capsys):
    from rlvr.cli import main

    assert main(["config", "task.name=sort_text", "policy.name=causal_lm",
                 f"policy.options={{model: '{tiny_model}', engine: vllm, engine_options: {{dtype: float32}}}}"]) == 0
    assert "engine: vllm" in capsys.readouterr().out


def test_vllm_options_defaults(tiny_model):
    options = VLLMOptions()
    assert (options.dtype, options.probe_tolerance, options.kv_cache_memory_bytes) == ("auto", 1e-3, None)
    assert lm_config(tiny_model, engine="vllm", engine_options="{max_model_len: 64}").policy.options.engine_options \
        == VLLMOptions(max_model_len=64)
    with pytest.raises(ConfigError, match=r"engine_options.max_model_len: expected int, got True \(bool\)"):
        lm_config(tiny_model, engine="vllm", engine_options="{max_model_len: true}")


@pytest.mark.parametrize("settings, temperature, mode", [
    ({}, 1.0, "processed_logprobs"),  # nothing truncated: processed = log_softmax(logits / tau), any tau
    ({}, 0.7, "processed_logprobs"),
    ({"top_p": 0.9}, 1.0, "raw_logprobs"),  # truncated at tau = 1: raw = log_softmax(logits) is pi_1
    ({"min_new_tokens": 2}, 1.0, "raw_logprobs"),
    ({"top_k": 5}, 0.7, "processed_logprobs"),  # neither is exact; the temperature at least is right
])
def test_the_log_prob_mode_is_exact_where_one_can_be(settings, temperature, mode):
    assert logprobs_mode_for(SamplingParams(**settings), temperature) == mode


def perturb(parameters, seed, scale):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in parameters:
            p.add_(scale * torch.randn(p.shape, generator=gen))


def test_merged_state_dict_is_peft_merge_and_leaves_the_trainer_alone(tiny_model):
    pytest.importorskip("peft")
    plain, _ = load_model_and_tokenizer(tiny_model)
    assert merged_state_dict(plain).keys() == plain.state_dict().keys()
    model, _ = load_model_and_tokenizer(tiny_model, lora={"r": 4, "lora_alpha": 8})
    perturb([p for name, p in model.named_parameters() if "lora_B" in name], seed=0, scale=0.3)  # B = 0 at init
    before = {name: (p.data_ptr(), p.detach().clone()) for name, p in model.named_parameters()}
    merged = merged_state_dict(model)
    want = copy.deepcopy(model).merge_and_unload().state_dict()
    assert merged.keys() == want.keys() == plain.state_dict().keys()  # the plain model's names
    for name, tensor in want.items():
        assert torch.equal(merged[name], tensor), name  # base + scaling * B @ A, as peft adds it
    changed = [name for name in want if not torch.equal(want[name], plain.state_dict()[name])]
    assert changed and all("proj" in name or "mlp" in name for name in changed)  # the adapted linears
    for name, p in model.named_parameters():
        assert p.data_ptr() == before[name][0] and torch.equal(p, before[name][1]), name


class CopyingEngine(HFEngine):
    """An engine with its own copy of the weights that can score a sequence, as VLLMEngine:
    the probe without vLLM."""

    probe_tolerance = 1e-5

    @torch.no_grad()
    def prompt_log_probs(self, token_ids):
        ids = torch.tensor([token_ids])  # [1, L]
        log_probs = torch.log_softmax(self.module(input_ids=ids).logits[0, :-1].float(), dim=-1)  # [L - 1, V]
        return log_probs.gather(-1, ids[0, 1:, None]).squeeze(-1)


def test_the_shared_hf_engine_syncs_without_copying(tiny_model):
    model, tokenizer = load_model_and_tokenizer(tiny_model)
    policy = CausalLMPolicy(model, tokenizer, max_new_tokens=8)
    pointers = [p.data_ptr() for p in policy.engine.module.parameters()]
    assert policy.engine.weights_version == 0  # built around the module: nothing handed over yet
    assert policy.sync_engine() == {"engine/weights_version": 1.0}  # no probe: nothing was copied
    assert policy.engine.module is policy.module and [p.data_ptr() for p in model.parameters()] == pointers


def test_a_skipped_sync_is_caught_by_the_probe(tiny_model, monkeypatch):
    model, tokenizer = load_model_and_tokenizer(tiny_model)
    copy_model, _ = load_model_and_tokenizer(tiny_model)
    engine = CopyingEngine(copy_model, tokenizer, 0)
    policy = CausalLMPolicy(model, tokenizer, max_new_tokens=8, engine=engine)  # handed the weights and probed
    assert engine.weights_version == 1 and len(engine_sync.probe_ids(policy)) == engine_sync.PROBE_LENGTH
    assert engine_sync.probe_gap(policy) < 1e-6  # the same float32 weights, scored two ways
    perturb(model.parameters(), seed=1, scale=0.05)  # a training step, say
    monkeypatch.setattr(engine, "load_weights", lambda weights: None)  # the copy is skipped
    with pytest.raises(WeightSyncError, match=r"weights \(version 5\) after a weight sync: its log-probs of a fixed "
                                              r"24-token probe differ from the trainer's by up to .* \(policy.options."
                                              r"engine_options.probe_tolerance=1e-05\)"):
        policy.sync_engine(5)
    with pytest.raises(TrainingError, match=r"^epoch 3, step 7: the generation engine does not hold"):
        sync_engine(SimpleNamespace(policy=policy, epoch=3, step=7))  # the trainer stops the run
    monkeypatch.undo()
    stats = policy.sync_engine()
    assert stats["engine/weights_version"] == 8.0 and stats["engine/probe_gap"] < 1e-6  # one more than 7, the last
    assert stats["time/engine_sync"] > 0
