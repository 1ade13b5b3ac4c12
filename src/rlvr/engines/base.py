"""The generation seam: what a policy asks of the thing that decodes responses.

Shapes: B prompts, G responses per prompt, N = B*G responses (row ``b * G + g`` is
response g of prompt b), P prompt tokens (left-padded), T response tokens (right-padded).

An engine turns token ids into token ids: encoding, decoding and scoring stay with the policy. It holds the
weights it samples with; ``load_weights`` gives it the trainer's (free for ``rlvr.engines.hf``, which shares the
trainer's module; a copy for an engine with its own).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to decode a response.

    temperature:    tau of pi_tau = softmax(logits / tau); 0 means greedy (argmax).
    top_k, top_p:   sampling truncation (0 and 1.0 disable them); the recorded log-probs are those of pi_tau
                    whatever the truncation.
    min_new_tokens: the end tokens (EOS and stop tokens) cannot be chosen before this many tokens.
    stop_token_ids: more tokens that end a response (kept in it, like EOS).
    stop_strings:   a response ends with the token that completes one of these.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 64
    min_new_tokens: int = 0
    eos_token_ids: tuple[int, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {self.temperature}")
        if self.max_new_tokens < 1 or not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(f"need 1 <= max_new_tokens and 0 <= min_new_tokens <= max_new_tokens, "
                             f"got max_new_tokens={self.max_new_tokens}, min_new_tokens={self.min_new_tokens}")
        if self.top_k < 0 or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"need top_k >= 0 and 0 < top_p <= 1, got top_k={self.top_k}, top_p={self.top_p}")
        if isinstance(self.stop_strings, str) or any(not s for s in self.stop_strings):
            raise ValueError(f"stop_strings must be a list of non-empty strings, got {self.stop_strings!r}")
        for name in ("eos_token_ids", "stop_token_ids", "stop_strings"):
            object.__setattr__(self, name, tuple(getattr(self, name)))  # lists in, hashable tuples kept

    @property
    def greedy(self) -> bool:
        """Temperature 0: the argmax token at every step, no randomness."""
        return self.temperature == 0.0

    @property
    def end_token_ids(self) -> tuple[int, ...]:
        """Every token that ends a response: EOS and the stop tokens, sorted, once each."""
        return tuple(sorted(set(self.eos_token_ids) | set(self.stop_token_ids)))


@dataclass
class Generation:
    """What an engine returns for N = B*G responses.

    response_ids:     [N, T] long, the chosen tokens, padding after each response's end
    response_mask:    [N, T] bool, True on response tokens (the end token included); T: the longest response
    sample_log_probs: [N, T] float, log pi_tau of each chosen token (0 off the mask; all 0 when greedy)
    versions:         [N, T] long, the weights version that sampled each token, or None: all by the version
                      the call started with (no new weights mid-call: ``Engine.new_weights``)
    """

    response_ids: torch.Tensor
    response_mask: torch.Tensor
    sample_log_probs: torch.Tensor
    versions: torch.Tensor | None = None

    @property
    def lengths(self) -> torch.Tensor:
        """[N] long: tokens in each response."""
        return self.response_mask.sum(-1)


class Engine(Protocol):
    """Decodes responses to prompts given as token ids; holds the weights it samples with."""

    weights_version: int  # counts the weights received by ``load_weights`` (0: the ones it was built with)
    # its sample log-probs are the trainer's (``rlvr.batch.interfaces.sampler_log_probs_exact``)
    exact_log_probs: bool = True
    # partial rollouts: asked between tokens; takes newer weights if any are published and says
    # whether it did (the running responses then go on with them). None: a call keeps its weights
    new_weights: Callable[[], bool] | None = None
    takes_new_weights: bool = True  # new_weights works (False: this engine's library cannot pause)

    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int,
                 sampling: SamplingParams, generator: torch.Generator | None = None,
                 seeds: torch.Tensor | None = None) -> Generation:
        """G responses to each of B prompts: prompt_ids [B, P] long, prompt_mask [B, P] bool (left-padded).
        ``generator`` drives the draws; it may be None only when greedy or given ``seeds`` ([N] long), which make
        each response's draws depend on its seed alone, not on the rest of the batch (an episode's turns)."""
        ...

    def load_weights(self, weights: torch.nn.Module | Mapping[str, torch.Tensor]) -> None:
        """Sample from now on with ``weights`` (the trainer's module, or its state dict)."""
        ...


def check_group(prompt_ids: torch.Tensor, group_size: int, seeds: torch.Tensor | None) -> None:
    """ValueError unless ``group_size`` >= 1 and ``seeds`` is None or one long per response row."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    rows = prompt_ids.shape[0] * group_size
    if seeds is not None and (seeds.dtype != torch.long or tuple(seeds.shape) != (rows,)):
        raise ValueError(f"seeds must be a long tensor of one seed per response ({rows}), "
                         f"got {seeds.dtype} of shape {tuple(seeds.shape)}")


def cut_at_stop_string(text: str, stop_strings: Sequence[str]) -> str:
    """``text`` up to the end of the stop string that ends first in it (the one the token loop meets first)."""
    ends = [text.find(s) + len(s) for s in stop_strings if s in text]
    return text[: min(ends)] if ends else text
