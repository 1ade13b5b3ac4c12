"""A Hugging Face causal LM as an rlvr ``Policy``: prompts in, text out, and scoring.

Shapes: B prompts, G responses per prompt, N = B*G responses (row ``b * G + g`` is response g of prompt b), n any
number of rows, P prompt tokens (left-padded), T response tokens (right-padded), V vocabulary.
The design: ``docs/explanation/policies.md``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from rlvr.batch.interfaces import Policy
from rlvr.batch.rollout import Samples
from rlvr.core import token_log_probs
from rlvr.core.logprobs import DEFAULT_CHUNK_ELEMENTS, head_token_log_probs, token_log_probs_and_entropy
from rlvr.engines import Engine, Generation, SamplingParams
from rlvr.engines.base import cut_at_stop_string
from rlvr.engines.hf import HFEngine, autocast_context
from rlvr.policies import engine_sync
from rlvr.policies.grouped_attention import grouped_attention
from rlvr.policies.hf_model import (
    check_device,
    checkpointing_active,
    disable_dropout,
    enable_checkpointing,
    eos_token_ids,
    max_positions,
)
from rlvr.policies.lean_mlp import lean_mlps
from rlvr.policies.prompts import (
    PromptError,
    UnknownCharacters,
    left_pad,
    prompt_texts,
    prompt_token_ids,
    unknown_characters,
)
from rlvr.policies.scoring import (
    chunked_entropy,
    encode_prompts,
    hidden_forward,
    length_buckets,
    logits_forward,
    response_outputs,
    split_head,
)

if TYPE_CHECKING:
    from rlvr.engines.vllm import VLLMOptions

__all__ = ["CausalLMPolicy", "PromptError"]


def _sharded(module: torch.nn.Module) -> bool:
    """Are ``module``'s parameters DTensors (FSDP2's ``fully_shard``)?"""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return False
    return isinstance(next(module.parameters()), DTensor)


def _onto_mask(mask: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """values [M] (or [M, 1]) of the M True positions of mask [n, T] as [n, T], 0 elsewhere (differentiable)."""
    return torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(mask, values.reshape(-1))

_AUTOCAST = {None: None, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CausalLMPolicy(Policy):
    """Samples and scores responses of a transformers causal LM (optionally peft-wrapped; ``module`` is it).

    max_new_tokens, min_new_tokens, top_k, top_p, stop_strings: see ``rlvr.engines.SamplingParams``; the text
                      keeps the stop string and drops what follows it in its token, which stays in the mask.
    chunk_elements:   float32 logits per chunk when turning logits into log-probs.
    autocast:         "bfloat16" or "float16": forward passes under torch.autocast while the weights (and
                      Adam's updates) stay in their own dtype; None: no autocast.
    disable_dropout:  sampling runs in eval mode, so with dropout on in training the recorded log-probs would
                      not be those of the policy that is trained.
    compile:          score the trained module through ``torch.compile``: the same numbers within float rounding
                      (a test); generation and the reference stay eager.
    share_prompts:    when scoring, encode a prompt once for all its rows (``scoring.response_outputs``).
    engine:           what generates, handed the model's weights now; None: an ``HFEngine`` sharing ``model``.
    pack_linears:     that ``HFEngine``'s float32 CPU linear layers run by oneDNN on weights reordered once per
                      generation (``rlvr.engines.packed_linear``): faster decoding, float32 rounding apart.
    """

    # a LoRA policy's base model (``rlvr.policies.hf_model.model_identity``), saved with its checkpoints
    base_identity: dict[str, str] | None = None

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        max_new_tokens: int = 64,
        min_new_tokens: int = 0,
        top_k: int = 0,
        top_p: float = 1.0,
        stop_strings: Sequence[str] = (),
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        gradient_checkpointing: bool = False,
        add_special_tokens: bool = True,
        autocast: str | None = None,
        chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
        share_prompts: bool = True,
        disable_dropout: bool = True,
        engine: Engine | None = None,
        compile: bool = False,
        pack_linears: bool = True,
    ):
        # temperature is each call's; the rest of the sampling settings are the policy's
        self.sampling = SamplingParams(top_k=top_k, top_p=top_p, max_new_tokens=max_new_tokens,
                                       min_new_tokens=min_new_tokens, stop_strings=stop_strings,
                                       eos_token_ids=eos_token_ids(model, tokenizer))
        self.max_positions = max_positions(model)
        if self.max_positions is not None and max_new_tokens >= self.max_positions:
            raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt: the model has "
                             f"{self.max_positions} positions")
        if autocast not in _AUTOCAST:
            raise ValueError(f"autocast must be one of {list(_AUTOCAST)}, got {autocast!r}")
        self.module = model.to(device=device, dtype=dtype)
        self._prepare_module(disable_dropout, gradient_checkpointing)
        self.tokenizer, self.add_special_tokens = tokenizer, add_special_tokens
        self.autocast = _AUTOCAST[autocast]
        self.chunk_elements, self.share_prompts = chunk_elements, share_prompts
        self.compiled = torch.compile(self.module) if compile else None  # shares the module's parameters
        self.device = next(model.parameters()).device
        self._heads: dict[int, tuple[torch.nn.Module, torch.nn.Module] | None] = {}  # id(module) -> split_head
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.engine = engine if engine is not None else HFEngine(model, tokenizer, self.pad_id, self.autocast,
                                                                     pack_linears)
        if engine is not None:
            self.sync_engine()

    def _prepare_module(self, no_dropout: bool, gradient_checkpointing: bool) -> None:
        lean_mlps(self.module)  # the same gradients, half the MLP's activations kept for backward
        grouped_attention(self.module)  # grouped keys and values not repeated per query head
        if no_dropout:
            disable_dropout(self.module)
        if gradient_checkpointing:
            enable_checkpointing(self.module)

    @property
    def max_response_length(self) -> int:
        return self.sampling.max_new_tokens

    @classmethod
    def from_pretrained(cls, name_or_path: str, dtype: str = "float32", device: str = "cpu",
                        lora: dict | None = None, engine: str = "hf", engine_options: VLLMOptions | None = None,
                        temperature: float = 1.0, chat_template: str | None = None,
                        **settings: Any) -> CausalLMPolicy:
        """Load with ``rlvr.modeling.load_model_and_tokenizer``; ``settings`` go to the constructor.

        engine: "hf" or "vllm" (``VLLMEngine`` with ``engine_options``, its log-prob mode exact at ``temperature``
        when it can be), handed the loaded weights and probed before this returns. chat_template: a Jinja chat
        template in place of the tokenizer's own; checkpoints save it.
        """
        from rlvr.modeling import load_model_and_tokenizer
        from rlvr.policies.hf_model import locate_model, model_identity

        check_device(device)
        named, name_or_path = name_or_path, locate_model(name_or_path)  # a hub name: fail fast when not reachable
        model, tokenizer = load_model_and_tokenizer(name_or_path, dtype=dtype, device=device, lora=lora)
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        policy = cls(model, tokenizer, **settings)
        if lora is not None:  # checkpoints hold only the adapters: export merges them into this model, checked
            policy.base_identity = model_identity(named, name_or_path)
        if engine == "vllm":  # built after the policy: its mode depends on the policy's sampling settings
            from rlvr.engines.vllm import VLLMEngine, VLLMOptions, logprobs_mode_for

            if engine_options is None:  # a Python caller's: the defaults
                engine_options = VLLMOptions()
            weights = next(model.parameters())
            policy.engine = VLLMEngine(str(name_or_path), policy.pad_id, engine_options, weights.dtype,
                                       weights.device, logprobs_mode_for(policy.sampling, temperature))
            policy.sync_engine()
        return policy

    def forward(self, module: torch.nn.Module | None = None, **inputs: Any) -> Any:
        """A forward pass of ``module`` (None: the policy's), under the ``autocast`` setting."""
        if module is None:
            module = self.module if self.compiled is None else self.compiled
        with autocast_context(self.device, self.autocast):
            return module(**inputs)

    # ---- prompts ------------------------------------------------------------------

    def encode_prompts(self, prompts: Sequence[str | dict]) -> tuple[torch.Tensor, torch.Tensor]:
        """prompt_ids [B, P] long and prompt_mask [B, P] bool of B prompts, left-padded; PromptError for a prompt
        the model cannot take (``check_prompts``)."""
        prompt_ids, prompt_mask = left_pad(self._prompt_token_ids(prompts), self.pad_id)
        return prompt_ids.to(self.device), prompt_mask.to(self.device)

    def check_prompts(self, prompts: Sequence[str | dict], what: str = "prompt") -> None:
        """Raise PromptError naming the first prompt ("<what> <index>") that has no tokens, a character the
        tokenizer cannot encode, or more tokens than the model's positions leave beside ``max_new_tokens``: a bad
        one in a fixed set found before any work."""
        chunk = 1024  # token ids of a whole data set at once would be a lot of Python ints
        for start in range(0, len(prompts), chunk):
            try:
                self._prompt_token_ids(prompts[start:start + chunk], what, start)
            except UnknownCharacters:  # every character the whole set lacks, not those of one chunk
                texts = prompt_texts(self.tokenizer, prompts, what)
                raise unknown_characters(self.tokenizer, texts, what) from None

    def _prompt_token_ids(self, prompts: Sequence[str | dict], what: str = "prompt",
                          offset: int = 0) -> list[list[int]]:
        return prompt_token_ids(self.tokenizer, prompts, self.add_special_tokens, self.sampling.max_new_tokens,
                                self.max_positions, what, offset)

    # ---- generation (the engine's) ------------------------------------------------

    def sample(self, prompts: Sequence[str | dict], group_size: int, temperature: float,
               generator: torch.Generator) -> Samples:
        """G responses to each of B prompts, drawn with ``generator``: ``responses`` B lists of G strings,
        ``sample_log_probs`` [N, T] log pi_tau of the drawn tokens, 0 off the mask."""
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {temperature} (use greedy)")
        return self._generate(prompts, group_size, dataclasses.replace(self.sampling, temperature=temperature),
                              generator)

    def greedy(self, prompts: Sequence[str | dict]) -> list[list[str]]:
        """The argmax response to each prompt, as B lists of one string."""
        return self._generate(prompts, 1, dataclasses.replace(self.sampling, temperature=0.0), None).responses

    def _generate(self, prompts: Sequence[str | dict], group_size: int, sampling: SamplingParams,
                  generator: torch.Generator | None) -> Samples:
        """Encode, sample with the engine (the weights of the last ``sync_engine``), decode."""
        prompt_ids, prompt_mask = self.encode_prompts(prompts)  # [B, P]
        generation = self.engine.generate(prompt_ids, prompt_mask, group_size, sampling, generator)
        texts = self.decode(generation)
        return Samples(
            responses=[texts[b * group_size:(b + 1) * group_size] for b in range(len(prompts))],
            response_ids=generation.response_ids,
            response_mask=generation.response_mask,
            prompt_ids=prompt_ids.repeat_interleave(group_size, dim=0),
            prompt_mask=prompt_mask.repeat_interleave(group_size, dim=0),
            sample_log_probs=generation.sample_log_probs,
            policy_mask=generation.response_mask,  # single-turn: every response token is the policy's
            token_versions=generation.versions,
        )

    def sync_engine(self, version: int | None = None) -> dict[str, float]:
        """Hand the engine the trainer's current weights and check it holds them; the numbers for the record."""
        return engine_sync.sync_engine(self, version)

    def decode(self, generation: Generation, stop_strings: Sequence[str] | None = None) -> list[str]:
        """The N response texts: special tokens skipped, cut after the first stop string (default: the policy's)."""
        stops = self.sampling.stop_strings if stop_strings is None else stop_strings
        return [
            cut_at_stop_string(self.tokenizer.decode(ids[:length], skip_special_tokens=True), stops)
            for ids, length in zip(generation.response_ids.tolist(), generation.lengths.tolist())
        ]

    # ---- scoring ------------------------------------------------------------------

    def log_probs(self, samples: Samples, temperature: float, with_entropy: bool = False,
                  module: torch.nn.Module | None = None, entropy_grad: bool = False,
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log pi_tau(a_t | s_t) [n, T] of the response tokens, 0 off the mask.

        With ``with_entropy``, also the entropy [n, T] of pi_tau (0 off the mask; detached unless ``entropy_grad``:
        the entropy bonus's gradient flows, at the cost of keeping its graph). ``module``: these weights instead of
        the policy's (the reference). Rows are scored in buckets of like response width, each narrowed to its
        widest row: the padding after short responses is not run through the model.
        """
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        scored = self.module if module is None else module
        parts = None if module is None and self.compiled is not None else self._split_head(scored)
        # the whole model's logits at every response position, or the body's hidden states (the head applied at
        # the real response tokens only)
        forward = (logits_forward(functools.partial(self.forward, module)) if parts is None
                   else hidden_forward(functools.partial(self.forward, parts[0])))
        # gradient checkpointing drops the caches that sharing a prompt's encoding needs
        share = self.share_prompts and not checkpointing_active(scored)
        prompts = encode_prompts(forward, samples) if share else None  # once, for every bucket
        n, width = samples.response_ids.shape
        ends = (samples.response_mask * torch.arange(1, width + 1, device=self.device)).amax(dim=1).cpu()  # [n]
        buckets = length_buckets(ends, 0)  # another pass encodes no prompt again: it costs its rows alone
        scores = []
        for rows in buckets:
            part = samples if len(buckets) == 1 else samples.rows(rows.to(self.device))
            part = part.narrow(max(1, int(ends[rows].max())))
            outputs = response_outputs(forward, part, prompts, None if len(buckets) == 1 else rows.to(self.device))
            scores.append(self._scored(outputs, part, parts, temperature, with_entropy, entropy_grad))

        def whole(pieces: list[torch.Tensor]) -> torch.Tensor:  # [k_b, w_b] per bucket -> [n, T] in row order
            padded = [torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in pieces]
            if len(padded) == 1:
                return padded[0]
            order = torch.cat(buckets).to(self.device)
            return torch.cat(padded)[torch.empty_like(order).index_put_((order,), torch.arange(n, device=self.device))]

        log_probs = whole([lp for lp, _ in scores])
        return log_probs, whole([e for _, e in scores]) if with_entropy else None

    def _scored(self, outputs: torch.Tensor, samples: Samples, parts: tuple[torch.nn.Module, torch.nn.Module] | None,
                temperature: float, with_entropy: bool, entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``log_probs`` of rows of like width (one bucket, narrowed to its widest row) from their ``outputs``: the
        logits [n, T, V] (``parts`` None), else the body's hidden states [n, T, H] and ``parts`` (body, head)."""
        mask = samples.response_mask  # [n, T]
        if parts is None:
            logits, tokens = outputs, samples.response_ids  # logits [n, T, V], tokens [n, T]
        else:  # the head at the M real response tokens only
            head = parts[1]
            hidden = outputs[mask]  # [M, H]
            spread = functools.partial(_onto_mask, mask)  # [M] or [M, 1] -> [n, T], 0 off the mask
            if type(head) is torch.nn.Linear and self.autocast is None and not entropy_grad:
                # the head's logits made a chunk at a time, forward and backward: never the whole [M, V]
                log_probs, entropy = head_token_log_probs(hidden, head, samples.response_ids[mask], temperature,
                                                          self.chunk_elements, with_entropy)
                return spread(log_probs), None if entropy is None else spread(entropy)
            with autocast_context(self.device, self.autocast):
                logits = head(hidden).unsqueeze(1)  # [M, 1, V]
            tokens = samples.response_ids[mask].unsqueeze(1)  # [M, 1]
        entropy = None
        if with_entropy and not entropy_grad:  # one pass over the logits for both
            log_probs, entropy = token_log_probs_and_entropy(logits, tokens, temperature, self.chunk_elements)
        else:
            log_probs = token_log_probs(logits, tokens, temperature, self.chunk_elements)
            if with_entropy:  # the entropy bonus: its gradient flows
                entropy = chunked_entropy(logits, temperature, self.chunk_elements)
        if parts is None:
            return log_probs.masked_fill(~mask, 0.0), None if entropy is None else entropy.masked_fill(~mask, 0.0)
        return spread(log_probs), None if entropy is None else spread(entropy)

    def _split_head(self, module: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
        """``split_head`` of ``module``, found once per module; None for a module sharded by FSDP (its parameters
        gathered only by its own forward)."""
        if _sharded(module):  # checked each call: a module may be sharded after it was first scored
            return None
        key = id(module)
        if key not in self._heads:
            probe = torch.tensor([engine_sync.probe_ids(self)], device=self.device)
            with autocast_context(self.device, self.autocast):
                self._heads[key] = split_head(module, probe)
        return self._heads[key]

    def truncated(self, samples: Samples) -> torch.Tensor:
        """[N] bool: the responses cut at ``max_new_tokens``, not ended by an end-of-sequence token."""
        lengths = samples.response_mask.sum(dim=1)  # [N]
        last = samples.response_ids.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)  # [N]
        eos = torch.tensor(self.sampling.eos_token_ids, dtype=last.dtype, device=last.device)
        return (lengths >= self.sampling.max_new_tokens) & ~torch.isin(last, eos)
