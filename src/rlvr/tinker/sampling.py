"""Sampling clients: snapshots of a training model's weights, sampled with rlvr's engine.

A snapshot holds only the weights that train (the adapters, or all of them); the worker keeps one sampling module
per base model and adapter layout and loads a snapshot into it when a request needs another one. Log-probs are those
of pi_tau = softmax(logits / temperature) of each sampled token (``rlvr.engines``), and at temperature 1 they equal
what ``forward`` computes for the same tokens up to float rounding.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlvr import core
from rlvr.engines import SamplingParams
from rlvr.engines.hf import HFEngine
from rlvr.policies.hf_model import eos_token_ids
from rlvr.tinker.models import Adapters, ModelError, build_model

_ids = itertools.count(1)
MAX_SAMPLES = 1024  # responses to one request: sampled as one batch, so its memory is bounded by this


@dataclass
class Snapshot:
    """The weights one sampling client samples with: ``state`` over ``base`` with ``adapters`` (an empty state:
    the base model as it is)."""

    base: str
    folder: str
    adapters: Adapters
    state: dict[str, torch.Tensor] | None  # None: released
    seed: int = 0
    checkpoint: Path | None = None  # a saved checkpoint's folder, its weights read when first sampled
    id: int = field(default_factory=lambda: next(_ids))

    def weights(self) -> dict[str, torch.Tensor]:
        if not self.state and self.checkpoint is not None:
            from safetensors.torch import load_file

            self.state = load_file(str(self.checkpoint / "weights.safetensors"))
        return self.state or {}


@dataclass(frozen=True)
class Request:
    """One sample request: ``num_samples`` responses to ``prompt`` [P], and the prompt's own log-probs."""

    prompt: torch.Tensor
    num_samples: int
    max_tokens: int | None
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()
    stop_tokens: tuple[int, ...] = ()
    prompt_logprobs: bool = False


@dataclass
class Completion:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" (an end token or stop string) or "length"


@dataclass
class Sampled:
    sequences: list[Completion]
    prompt_logprobs: list[float | None] | None


class _Module:
    """A sampling module: a model like the training one, its engine, and the snapshot loaded into it."""

    def __init__(self, snapshot: Snapshot, device: str):
        self.module, self.tokenizer = build_model(snapshot.folder, snapshot.adapters, snapshot.seed, device)
        self.module.eval()
        self.device = next(self.module.parameters()).device
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.engine = HFEngine(self.module, self.tokenizer, pad)
        self.eos = eos_token_ids(self.module, self.tokenizer)
        config = getattr(self.module, "config", None)
        self.max_positions = getattr(config, "max_position_embeddings", None)
        self.vocab_size = self.module.get_output_embeddings().weight.shape[0]
        self.params = dict(self.module.named_parameters())
        self.base_state: dict[str, torch.Tensor] = {}  # the weights a snapshot replaced, as built
        self.loaded = 0

    def load(self, snapshot: Snapshot) -> None:
        if snapshot.id == self.loaded:
            return
        state = snapshot.weights()
        unknown = sorted(set(state) - set(self.params))
        if unknown:
            raise ModelError(f"the sampler weights do not fit {snapshot.base} with {snapshot.adapters}: "
                             f"{unknown[0]} is not one of its parameters")
        with torch.no_grad():
            for name in set(state) - set(self.base_state):
                self.base_state[name] = self.params[name].detach().clone()
            for name, value in self.base_state.items():
                self.params[name].copy_(state.get(name, value))
        self.loaded = snapshot.id


class Samplers:
    """Sampling modules by base model and adapter layout, built on first use."""

    def __init__(self, device: str = "cpu"):
        self.device = device
        self._modules: dict[tuple[str, Adapters], _Module] = {}

    def _module(self, snapshot: Snapshot) -> _Module:
        key = (snapshot.folder, snapshot.adapters)
        if key not in self._modules:
            self._modules[key] = _Module(snapshot, self.device)
        found = self._modules[key]
        found.load(snapshot)
        return found

    def sample(self, snapshot: Snapshot, request: Request) -> Sampled:
        m = self._module(snapshot)
        prompt = request.prompt
        _check_prompt(prompt, m.vocab_size)
        room = None if m.max_positions is None else m.max_positions - len(prompt)
        if room is not None and room < 1:
            raise ModelError(f"the prompt has {len(prompt)} tokens: no room left in the model's {m.max_positions} "
                             "positions")
        max_tokens = request.max_tokens if request.max_tokens is not None else (room or 512)
        if room is not None and max_tokens > room:
            raise ModelError(f"max_tokens={max_tokens} with a {len(prompt)}-token prompt passes the model's "
                             f"{m.max_positions} positions")
        if not 1 <= request.num_samples <= MAX_SAMPLES:
            raise ModelError(f"num_samples must be 1 to {MAX_SAMPLES}, got {request.num_samples}")
        try:
            params = SamplingParams(temperature=request.temperature, top_k=max(request.top_k, 0),
                                    top_p=request.top_p, max_new_tokens=max_tokens, eos_token_ids=m.eos,
                                    stop_token_ids=request.stop_tokens, stop_strings=request.stop_strings)
        except ValueError as err:
            raise ModelError(f"sampling_params: {err}") from None
        generator = torch.Generator(device=m.device)
        generator.manual_seed(request.seed if request.seed is not None else torch.seed())
        ids = prompt.to(m.device).unsqueeze(0)
        out = m.engine.generate(ids, torch.ones_like(ids, dtype=torch.bool), request.num_samples, params, generator)
        ends = set(params.end_token_ids)
        sequences = []
        for row in range(out.response_ids.shape[0]):
            n = int(out.lengths[row])
            tokens = out.response_ids[row, :n].tolist()
            stopped = n < max_tokens or (n > 0 and tokens[-1] in ends) or _ends_with_stop(m, tokens, params)
            log_probs = out.sample_log_probs[row, :n].tolist()
            sequences.append(Completion(tokens, log_probs, "stop" if stopped else "length"))
        return Sampled(sequences, _prompt_logprobs(m, ids) if request.prompt_logprobs else None)


def _prompt_logprobs(m: _Module, ids: torch.Tensor) -> list[float | None]:
    """log p(prompt[t] | prompt[:t]) for each position of ``ids`` [1, P]; None for the first, which nothing
    predicts."""
    with torch.inference_mode():
        logits = m.module(input_ids=ids).logits[:, :-1]  # [1, P - 1, V]
        values = core.token_log_probs(logits, ids[:, 1:], 1.0)[0].tolist()
    return [None, *values]


def _check_prompt(prompt: torch.Tensor, vocab_size: int) -> None:
    if prompt.numel() == 0:
        raise ModelError("the prompt is empty")
    if int(prompt.min()) < 0 or int(prompt.max()) >= vocab_size:
        raise ModelError(f"the prompt has token ids outside the vocabulary [0, {vocab_size})")


def _ends_with_stop(m: _Module, tokens: Sequence[int], params: SamplingParams) -> bool:
    if not params.stop_strings or not tokens:
        return False
    tail = m.tokenizer.decode(tokens[-8:])
    return any(s in tail for s in params.stop_strings)
