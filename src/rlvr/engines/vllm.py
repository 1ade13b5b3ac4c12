"""vLLM as the generation engine, in the trainer's process (vLLM's offline ``LLM``).

Shapes: B prompts, G responses per prompt, N = B*G responses (row ``b * G + g`` is response g of prompt b), P prompt
tokens (left-padded), T response tokens, L probe tokens.

The engine holds its own copy of the weights (``load_weights``, checked with a probe). Log-probs, partial rollouts,
seeding and the differences from ``HFEngine``: docs/explanation/engines.md."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlvr.base.rules import setting
from rlvr.engines.base import Engine, Generation, SamplingParams, check_group
from rlvr.engines.vllm_requests import Drawn, Requests, can_pause
from rlvr.modeling import DTYPES

INSTALL_HINT = "pip install 'rlvr[vllm]'"
CPU_KV_CACHE_BYTES = 256 << 20  # vLLM's CPU default, most of the machine's memory, refuses to start beside a trainer
SEED_RANGE = 2**62  # per-prompt seeds; sample g of a prompt uses seed + g


def vllm_installed() -> bool:
    """Is the ``vllm`` package importable? Found without importing it (seconds, and global effects)."""
    return importlib.util.find_spec("vllm") is not None


def logprobs_mode_for(sampling: SamplingParams, temperature: float) -> str:
    """The vLLM ``logprobs_mode`` whose values are log pi_tau at ``temperature`` given the truncation in
    ``sampling`` (top_k, top_p, min_new_tokens)."""
    truncated = sampling.top_k > 0 or sampling.top_p < 1.0 or sampling.min_new_tokens > 0
    return "raw_logprobs" if truncated and temperature == 1.0 else "processed_logprobs"


def merged_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights of ``module`` under the plain model's names, LoRA adapters merged in.

    A LoRA layer ``x.base_layer`` becomes ``x.weight`` = W + sum over active adapters of scaling * B @ A (peft's
    ``get_delta_weight``) in new tensors; other tensors are the model's own (not copied). Adapters that are not a
    plain weight delta (DoRA, LoRA biases, modules_to_save) raise NotImplementedError.
    """
    if not hasattr(module, "get_base_model"):  # not peft-wrapped
        return module.state_dict()
    from peft.tuners.lora import LoraLayer

    base = module.get_base_model()
    state = {}
    for name, tensor in base.state_dict().items():
        if "modules_to_save" in name or "original_module" in name:
            raise NotImplementedError(f"LoRA with modules_to_save ({name}) is not supported by engine=vllm")
        if ".lora_" not in name:  # the adapters' own tensors: merged below
            state[name.replace(".base_layer.", ".")] = tensor
    with torch.no_grad():
        for name, layer in base.named_modules():
            if isinstance(layer, LoraLayer):
                state[f"{name}.weight"] = _merged_weight(name, layer)
    return state


def _merged_weight(name: str, layer: Any) -> torch.Tensor:
    weight = layer.get_base_layer().weight
    if layer.merged:  # peft already added the adapters into the base weight
        return weight
    merged = weight.clone()
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A and adapter not in getattr(layer, "lora_embedding_A", {}):
            continue  # an adapter of other layers
        if adapter in getattr(layer, "lora_variant", {}) or getattr(layer, "lora_bias", {}).get(adapter):
            raise NotImplementedError(f"{name}: only plain LoRA adapters (no DoRA or other variant, no LoRA "
                                      "bias) can be merged for engine=vllm")
        merged += layer.get_delta_weight(adapter).to(merged.dtype)
    return merged


@contextlib.contextmanager
def preserved_process_state() -> Iterator[None]:
    """Restore what vLLM's constructor changes for the whole process: the random, numpy and torch generator
    states, and ``torch.set_num_threads`` with the thread count."""
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.set_num_threads = set_threads  # vLLM's CPU worker replaces it with a no-op
        set_threads(threads)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


# vLLM logger -> the start of a warning it repeats that says nothing to act on: the CPU worker's no-op
# set_num_threads (start_llm restores the real one), and the rotary table (computed) not loaded at every weight copy.
HARMLESS_WARNINGS = {
    "vllm.v1.worker.cpu_worker": "CPU backend doesn't allow to use `torch.set_num_threads`",
    "vllm.model_executor.model_loader.reload.layerwise": "RotaryEmbedding: Failed to load weights",
}


ENGINE_DTYPES = ("auto", *DTYPES)


@dataclass
class VLLMOptions:
    """``policy.options.engine_options``: the vLLM engine's (``engine: vllm``; hf takes none)."""

    dtype: str = setting("auto", "weights and activations in the engine (auto: the trainer's dtype)",
                         choices=ENGINE_DTYPES)
    gpu_memory_utilization: float = setting(0.3, "share of the GPU vLLM may take (weights, activations, KV cache); "
                                                 "the trainer lives beside it on the same GPU", above=0, max=1)
    kv_cache_memory_bytes: int | None = setting(None, "KV cache size (null: from gpu_memory_utilization on a GPU, "
                                                      "256 MiB on CPU)", above=0)
    max_model_len: int | None = setting(None, "longest prompt + response (null: the model's positions)", above=0)
    max_num_seqs: int | None = setting(None, "sequences decoded at once (null: vLLM's default)", above=0)
    enable_prefix_caching: bool = setting(True, "reuse the KV of shared prompt prefixes (whole blocks only)")
    enforce_eager: bool = setting(True, "no CUDA graphs or torch.compile (starts in seconds; false: faster on a GPU)")
    probe_tolerance: float = setting(1e-3, "largest |engine - trainer| log-prob on the probe after a weight sync; "
                                           "above it training stops (1e-3 suits float32; raise it for bfloat16)",
                                     above=0)


def drop_harmless_warnings(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(HARMLESS_WARNINGS.get(record.name, "\0"))


def start_llm(model_path: str, options: VLLMOptions, dtype: torch.dtype, device: torch.device,
              logprobs_mode: str) -> Any:
    """A vLLM ``LLM`` in this process (no engine subprocess), the process's random state and threads kept."""
    if not vllm_installed():
        raise ImportError(f"engine=vllm needs the vllm package: {INSTALL_HINT}")
    # In-process: the weights go in by reference, not through a pipe, and a breakpoint() works.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # dozens of INFO lines per start otherwise
    engine_dtype = str(dtype).removeprefix("torch.") if options.dtype == "auto" else options.dtype
    kv_bytes = options.kv_cache_memory_bytes
    if kv_bytes is None and device.type == "cpu":
        kv_bytes = CPU_KV_CACHE_BYTES
    settings = {"max_model_len": options.max_model_len, "max_num_seqs": options.max_num_seqs,
                "kv_cache_memory_bytes": kv_bytes}
    with preserved_process_state():
        from vllm import LLM

        for name in HARMLESS_WARNINGS:
            logging.getLogger(name).addFilter(drop_harmless_warnings)
        return LLM(model=model_path, dtype=engine_dtype, gpu_memory_utilization=options.gpu_memory_utilization,
                   enable_prefix_caching=options.enable_prefix_caching, enforce_eager=options.enforce_eager,
                   logprobs_mode=logprobs_mode, seed=0, disable_log_stats=True,
                   **{key: value for key, value in settings.items() if value is not None})


class VLLMEngine(Engine):
    """Samples with vLLM in this process from ``model_path`` (the trainer's starting point); ``dtype`` and
    ``device``: the trainer's."""

    exact_log_probs = False  # vLLM's kernels: the trainer recomputes the old log-probs

    def __init__(self, model_path: str, pad_token_id: int, options: VLLMOptions, dtype: torch.dtype,
                 device: torch.device, logprobs_mode: str):
        self.pad_token_id, self.device, self.logprobs_mode = pad_token_id, device, logprobs_mode
        self.probe_tolerance = options.probe_tolerance
        self.llm = start_llm(model_path, options, dtype, device, logprobs_mode)
        self.requests = Requests(self.llm, lambda: self.weights_version)
        self.takes_new_weights = can_pause(self.llm)  # Engine.new_weights works: partial rollouts
        self.weights_version = 0
        self.weight_names: frozenset[str] | None = None  # of the first weights received
        self.broken: str | None = None  # why the engine cannot be used any more

    def load_weights(self, weights: torch.nn.Module | Mapping[str, torch.Tensor]) -> None:
        """Copy ``weights`` (a module, LoRA merged; or a state dict under the model's names) into the engine.
        vLLM leaves a model it could not load broken, so names other than the first weights' are refused first."""
        self._check_usable()
        state = merged_state_dict(weights) if isinstance(weights, torch.nn.Module) else dict(weights)
        names = frozenset(state)
        if self.weight_names is not None and names != self.weight_names:
            extra, missing = sorted(names - self.weight_names), sorted(self.weight_names - names)
            raise ValueError(f"weights with other names than the engine's first: new {extra[:5]}, "
                             f"missing {missing[:5]}; nothing was copied")
        try:
            self.requests.load_weights(
                lambda: self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state.items())}))
        except Exception as err:
            self.broken = f"vLLM could not load the weights ({type(err).__name__}: {err})"
            raise RuntimeError(f"{self.broken}; the engine is unusable, build a new one") from err
        self.weight_names = names
        self.weights_version += 1

    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int,
                 sampling: SamplingParams, generator: torch.Generator | None = None,
                 seeds: torch.Tensor | None = None) -> Generation:
        """See ``Engine.generate``; ``seeds`` need G = 1 (each its request's seed)."""
        from vllm.inputs import TokensPrompt

        self._check_usable()
        check_group(prompt_ids, group_size, seeds)
        if seeds is not None and group_size != 1:
            raise ValueError("seeds (one per response) need group_size=1 with the vllm engine")
        if not sampling.greedy and generator is None and seeds is None:
            raise ValueError("sampling with temperature > 0 needs a torch.Generator")
        prompts = [TokensPrompt(prompt_token_ids=ids[mask].tolist())
                   for ids, mask in zip(prompt_ids.cpu(), prompt_mask.cpu())]  # padding dropped
        if sampling.greedy:  # one argmax response per prompt, repeated G times (vLLM refuses n > 1 greedy)
            params = [request_params(sampling, 1, None)] * len(prompts)
        else:
            if seeds is None:
                seeds = torch.randint(SEED_RANGE, (len(prompts),), generator=generator, device=generator.device)
            else:
                seeds = seeds % SEED_RANGE
            params = [request_params(sampling, group_size, seed) for seed in seeds.tolist()]
        requests = [self.requests.add(prompt, p) for prompt, p in zip(prompts, params)]
        # vLLM's CPU sampler also draws from the global torch generator (then overrides the seeded rows)
        with torch.random.fork_rng(devices=[]):
            self.requests.run(requests, between=self.new_weights)
        drawn = []
        for request in requests:
            group = [request.responses[i] for i in sorted(request.responses)]
            drawn += group * group_size if sampling.greedy else group
        generation = to_generation(drawn, sampling.greedy, self.pad_token_id, prompt_ids.device)
        if self.new_weights is None:
            generation.versions = None  # all the call's first weights (Generation.versions)
        return generation

    def prompt_log_probs(self, token_ids: Sequence[int]) -> torch.Tensor:
        """log pi_1(token_i | tokens before it) [L - 1] of the engine, for i >= 1: the probe. vLLM scores prompt
        tokens from the raw logits whatever ``logprobs_mode`` is, and such a request skips the prefix cache."""
        from vllm import SamplingParams as RequestParams
        from vllm.inputs import TokensPrompt

        self._check_usable()
        ids = list(token_ids)
        # temperature 0: the one token it must generate is the argmax, drawn without the global RNG
        params = RequestParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        request = self.requests.add(TokensPrompt(prompt_token_ids=ids), params)
        self.requests.run([request])  # beside any responses running (mid partial rollout)
        return torch.tensor([scores[t].logprob for scores, t in zip(request.prompt_log_probs[1:], ids[1:])])

    def _check_usable(self) -> None:
        if self.broken is not None:
            raise RuntimeError(f"{self.broken}; the engine is unusable, build a new one")


def request_params(sampling: SamplingParams, group_size: int, seed: int | None) -> Any:
    """vLLM's sampling parameters for one prompt's G responses: exactly the end tokens of ``sampling`` end a
    response (ignore_eos: vLLM's EOS is among them anyway); detokenized only for stop strings."""
    from vllm import SamplingParams as RequestParams

    return RequestParams(
        n=group_size, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
        max_tokens=sampling.max_new_tokens, min_tokens=sampling.min_new_tokens,
        stop_token_ids=list(sampling.end_token_ids), ignore_eos=True, stop=list(sampling.stop_strings) or None,
        detokenize=bool(sampling.stop_strings), logprobs=None if sampling.greedy else 0, seed=seed,
    )


def to_generation(drawn: Sequence[Drawn], greedy: bool, pad_token_id: int, device: torch.device) -> Generation:
    """N drawn responses (row b*G + g) as a ``Generation`` (versions: 0 off the mask)."""
    width = max(1, max(len(d.token_ids) for d in drawn))
    response_ids = torch.full((len(drawn), width), pad_token_id, dtype=torch.long)
    log_probs = torch.zeros((len(drawn), width))
    versions = torch.zeros((len(drawn), width), dtype=torch.long)
    for n, d in enumerate(drawn):
        response_ids[n, : len(d.token_ids)] = torch.tensor(d.token_ids, dtype=torch.long)
        versions[n, : len(d.versions)] = torch.tensor(d.versions, dtype=torch.long)
        if not greedy:
            log_probs[n, : len(d.log_probs)] = torch.tensor(d.log_probs)
    lengths = torch.tensor([len(d.token_ids) for d in drawn])
    response_mask = torch.arange(width) < lengths.unsqueeze(-1)  # [N, T]
    return Generation(response_ids.to(device), response_mask.to(device), log_probs.to(device), versions.to(device))
