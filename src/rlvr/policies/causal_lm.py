"""A Hugging Face causal LM as an rlvr ``Policy``: sampling with a KV cache, and scoring.

Shapes: B prompts, G responses per prompt, N = B*G responses (row ``b * G + g`` is
response g of prompt b), n any number of rows, P prompt tokens (left-padded), T
response tokens (right-padded), V vocabulary.

Log-probs are always those of the policy pi_tau(a | s) = softmax(logits / tau) over the
whole vocabulary. ``top_k``, ``top_p`` and ``min_new_tokens`` change which token is
drawn (the sampler is then not exactly pi_tau), never the recorded log-probs, so
``sample(...).sample_log_probs`` equals ``log_probs(samples, tau)`` and serves as the
old policy's log-probs without another forward pass.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlvr.config import ConfigError
from rlvr.core import entropy_from_logits, token_log_probs
from rlvr.core.logprobs import DEFAULT_CHUNK_ELEMENTS, row_chunks
from rlvr.rollout import Samples

# (logits [n, V] of the next token, step) -> (tokens [n], log pi_tau of them [n])
TokenPicker = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


def _truncate(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to -inf the logits [n, V] outside the top-k tokens and the top-p nucleus."""
    if 0 < top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, -torch.inf)
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens strictly more likely already reach top_p (keeps >= 1)
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, -torch.inf)
    return scaled


def draw_tokens(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of probs [n, V] (rows need not sum to 1): tokens [n] long.

    Inverse CDF: u ~ U(0, 1) from ``generator`` on its own device, token = the first
    index whose cumulative probability exceeds u * total. Only n numbers cross devices
    (a CPU generator can drive sampling on a GPU), and zero-probability tokens are
    never drawn.
    """
    uniforms = torch.rand((probs.shape[0], 1), generator=generator, device=generator.device, dtype=torch.float64)
    cdf = probs.double().cumsum(dim=-1)  # [n, V]; float64 so the tail of a large V keeps its mass
    tokens = torch.searchsorted(cdf, uniforms.to(probs.device) * cdf[:, -1:], right=True)
    return tokens.squeeze(-1).clamp(max=probs.shape[-1] - 1)


class PromptError(ConfigError):
    """A prompt the model cannot take: with the response it is longer than the model's
    positions, or it holds a character the tokenizer cannot encode. Names the prompt."""


def _excerpt(text: str, at: int = 0, width: int = 40) -> str:
    """``text`` near index ``at`` as a repr of at most ``width`` characters, "..." where cut."""
    start = max(0, min(at - width // 2, len(text) - width))
    return ("..." if start else "") + repr(text[start:start + width]) + ("..." if start + width < len(text) else "")


def max_positions(model: torch.nn.Module) -> int | None:
    """The longest sequence ``model`` takes, prompt and response together: its config's
    ``max_position_embeddings`` (``n_positions`` in GPT-2's), or None if it states none."""
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions"):
        if isinstance(getattr(config, name, None), int):
            return getattr(config, name)
    return None


def check_device(device: str | torch.device) -> None:
    """A ValueError unless ``device`` is a torch device this machine has."""
    try:
        where = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={device!r} is not a torch device (e.g. cpu, cuda, cuda:1, mps)") from None
    if where.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} but CUDA is not available (torch.cuda.is_available() is False); "
                             "use device=cpu")
        if where.index is not None and where.index >= torch.cuda.device_count():
            raise ValueError(f"device={device!r} but this machine has {torch.cuda.device_count()} CUDA device(s)")
    if where.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={device!r} but MPS is not available; use device=cpu")


LOAD_OPTIONS = ("model", "dtype", "device", "lora")
SETTING_OPTIONS = ("max_new_tokens", "min_new_tokens", "top_k", "top_p", "stop_strings", "gradient_checkpointing",
                   "add_special_tokens", "autocast", "chunk_elements", "share_prompts", "disable_dropout")
_AUTOCAST = {None: None, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_causal_lm_policy(config: Any) -> CausalLMPolicy:
    """The policy of a ``PolicyConfig`` named "causal_lm", from its ``options`` dict.

    options: ``model`` (a folder, e.g. from ``rlvr init-model``, or a hub name; required),
    ``dtype``, ``device``, ``lora`` (see ``rlvr.modeling.load_model_and_tokenizer``) and
    the ``CausalLMPolicy`` settings named in ``SETTING_OPTIONS``.
    """
    options = dict(config.options)
    allowed = LOAD_OPTIONS + SETTING_OPTIONS
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        close = difflib.get_close_matches(unknown[0], allowed, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown policy.options {unknown}{hint} (allowed: {', '.join(allowed)})")
    if "model" not in options:
        raise ValueError("policy.options.model is required: a model folder (rlvr init-model) or a hub name")
    return CausalLMPolicy.from_pretrained(options.pop("model"), **options)


def _disable_dropout(model: torch.nn.Module) -> None:
    """Dropout probability 0 everywhere: ``nn.Dropout`` modules and the float
    ``attention_dropout`` attributes that attention layers pass to their kernels."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def cut_at_stop_string(text: str, stop_strings: Sequence[str]) -> str:
    """``text`` up to the end of the stop string that ends first in it (all of it if none).

    That is the stop string the token loop meets first, one token at a time.
    """
    ends = [text.find(s) + len(s) for s in stop_strings if s in text]
    return text[: min(ends)] if ends else text


def _enable_checkpointing(model: torch.nn.Module) -> None:
    """Non-reentrant activation checkpointing (transformers 5 name, else the older one)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _checkpointing(model: torch.nn.Module) -> bool:
    """Is activation checkpointing active (it drops KV caches in train mode)?

    Read from the layers' flag, which transformers sets whatever wraps the model (peft).
    """
    return model.training and any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


class CausalLMPolicy:
    """Samples and scores responses of a transformers causal LM (``AutoModelForCausalLM``).

    model:            the LM (optionally peft-wrapped); ``module`` is this model.
    tokenizer:        its tokenizer; prompts are encoded with ``add_special_tokens``.
    max_new_tokens:   longest response, in tokens.
    min_new_tokens:   EOS cannot be drawn before this many tokens.
    top_k, top_p:     sampling truncation (0 and 1.0 disable them); log-probs ignore it.
    stop_strings:     a response ends with the token that completes one of these. The
                      text keeps the stop string and drops what follows it in that
                      token; the token stays in ``response_ids`` and in the mask.
    device, dtype:    where and in which precision to put the model (None: as it is).
    gradient_checkpointing: recompute activations in backward (train mode only).
    chunk_elements:   float32 logits per chunk when turning logits into log-probs.
    autocast:         "bfloat16" or "float16": run forward passes under torch.autocast
                      while the weights (and Adam's updates) stay in their own dtype,
                      e.g. float32 master weights; None: no autocast.
    disable_dropout:  set every dropout probability to 0 (default): sampling runs in eval
                      mode, so with dropout on in training the recorded log-probs would
                      not be those of the policy that is scored and trained.
    share_prompts:    when scoring, encode a prompt once for all its rows (see
                      ``_response_logits``); False: one forward over every full row.
    """

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
    ):
        if max_new_tokens < 1 or not 0 <= min_new_tokens <= max_new_tokens:
            raise ValueError(f"need 1 <= max_new_tokens and 0 <= min_new_tokens <= max_new_tokens, "
                             f"got {max_new_tokens=}, {min_new_tokens=}")
        if top_k < 0 or not 0.0 < top_p <= 1.0:
            raise ValueError(f"need top_k >= 0 and 0 < top_p <= 1, got {top_k=}, {top_p=}")
        if isinstance(stop_strings, str) or any(not s for s in stop_strings):
            raise ValueError(f"stop_strings must be a list of non-empty strings, got {stop_strings!r}")
        self.max_positions = max_positions(model)
        if self.max_positions is not None and max_new_tokens >= self.max_positions:
            raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt: the model has "
                             f"{self.max_positions} positions")
        self.module = model.to(device=device, dtype=dtype)
        if disable_dropout:
            _disable_dropout(model)
        self.tokenizer = tokenizer
        self.max_new_tokens, self.min_new_tokens = max_new_tokens, min_new_tokens
        self.top_k, self.top_p = top_k, top_p
        self.stop_strings = list(stop_strings)
        self.add_special_tokens = add_special_tokens
        if autocast not in _AUTOCAST:
            raise ValueError(f"autocast must be one of {list(_AUTOCAST)}, got {autocast!r}")
        self.autocast = _AUTOCAST[autocast]
        self.chunk_elements = chunk_elements
        self.share_prompts = share_prompts
        self.device = next(model.parameters()).device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = self._eos_ids(model, tokenizer)
        if gradient_checkpointing:
            _enable_checkpointing(model)

    @property
    def max_response_length(self) -> int:
        """Responses stop at max_new_tokens; a batch's width is its longest response."""
        return self.max_new_tokens

    @classmethod
    def from_pretrained(cls, name_or_path: str, dtype: str = "float32", device: str = "cpu",
                        lora: dict | None = None, **settings: Any) -> CausalLMPolicy:
        """Load with ``rlvr.modeling.load_model_and_tokenizer``; ``settings`` go to the constructor."""
        from rlvr.modeling import load_model_and_tokenizer

        check_device(device)
        model, tokenizer = load_model_and_tokenizer(name_or_path, dtype=dtype, device=device, lora=lora)
        return cls(model, tokenizer, **settings)

    @staticmethod
    def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> torch.Tensor:
        """The token ids that end a response: the tokenizer's EOS and the generation config's."""
        ids = {tokenizer.eos_token_id}
        config_ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        ids.update(config_ids if isinstance(config_ids, list) else [config_ids])
        ids.discard(None)
        if not ids:
            raise ValueError("the tokenizer and the model's generation config define no EOS token")
        return torch.tensor(sorted(ids), device=next(model.parameters()).device)

    def _forward(self, **inputs: Any) -> Any:
        """The model's forward pass, under autocast when the ``autocast`` setting asks."""
        if self.autocast is None:
            return self.module(**inputs)
        with torch.autocast(device_type=self.device.type, dtype=self.autocast):
            return self.module(**inputs)

    # ---- prompts ------------------------------------------------------------------

    def encode_prompts(self, prompts: Sequence[str | dict]) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenize B prompts (strings, or dicts with a "prompt" key), left-padded.

        Returns prompt_ids [B, P] long and prompt_mask [B, P] bool (True on real tokens).
        Raises PromptError for a prompt the model cannot take (see ``check_prompts``).
        """
        encoded = self._prompt_token_ids(prompts)
        width = max(len(ids) for ids in encoded)
        prompt_ids = torch.full((len(encoded), width), self.pad_id, dtype=torch.long)
        prompt_mask = torch.zeros((len(encoded), width), dtype=torch.bool)
        for row, ids in enumerate(encoded):
            prompt_ids[row, width - len(ids):] = torch.tensor(ids)
            prompt_mask[row, width - len(ids):] = True
        return prompt_ids.to(self.device), prompt_mask.to(self.device)

    def check_prompts(self, prompts: Sequence[str | dict], what: str = "prompt") -> None:
        """Raise PromptError naming the first prompt (as "<what> <index>") that has no
        tokens, a character the tokenizer cannot encode, or more tokens than the model's
        positions leave beside ``max_new_tokens``. Sampling checks each batch it gets;
        call this on a fixed set of prompts to find a bad one before any work."""
        chunk = 1024  # token ids of a whole data set at once would be a lot of Python ints
        for start in range(0, len(prompts), chunk):
            self._prompt_token_ids(prompts[start:start + chunk], what, start)

    def _prompt_token_ids(self, prompts: Sequence[str | dict], what: str = "prompt",
                          offset: int = 0) -> list[list[int]]:
        """The token ids of each prompt, checked as ``check_prompts`` says (``offset``:
        the index of the first prompt, for messages)."""
        texts = [p["prompt"] if isinstance(p, dict) else p for p in prompts]
        if not texts:
            raise PromptError(f"no {what}s to encode")
        try:
            encoded = self.tokenizer(texts, add_special_tokens=self.add_special_tokens)["input_ids"]
        except Exception as err:  # tokenizers raises a bare Exception for a character it has no id for
            unknown = self._unknown_character(texts, what, offset)
            if unknown is None:
                raise
            raise unknown from err
        for i, ids in enumerate(encoded):
            if not ids:
                raise PromptError(f"{what} {offset + i} ({texts[i]!r}) has no tokens; "
                                  "a prompt needs at least one token")
            total = len(ids) + self.max_new_tokens
            if self.max_positions is not None and total > self.max_positions:
                raise PromptError(
                    f"{what} {offset + i} ({_excerpt(texts[i])}): {len(ids)} tokens + max_new_tokens "
                    f"{self.max_new_tokens} = {total} > {self.max_positions}, the model's positions; "
                    "shorten the prompt or lower policy.options.max_new_tokens"
                )
        return encoded

    def _unknown_character(self, texts: list[str], what: str, offset: int) -> PromptError | None:
        """The error for the first character of ``texts`` the tokenizer cannot encode on its own, if any."""
        known: set[str] = set()
        for i, text in enumerate(texts):
            for at, char in enumerate(text):
                if char in known:
                    continue
                try:
                    self.tokenizer(char, add_special_tokens=False)
                except Exception:  # as above: the tokenizer's bare Exception
                    return PromptError(f"{what} {offset + i} ({_excerpt(text, at)}): character {char!r} at index {at} "
                                       "is not in the tokenizer's vocabulary")
                known.add(char)
        return None

    # ---- generation ---------------------------------------------------------------

    def sample(self, prompts: Sequence[str | dict], group_size: int, temperature: float,
               generator: torch.Generator) -> Samples:
        """G responses to each of B prompts, drawn with ``generator`` (same seed, same samples).

        ``responses`` is a list of B lists of G strings; ``sample_log_probs`` [N, T] are
        log pi_tau of the drawn tokens (see the module docstring), 0 where the mask is False.
        """
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {temperature} (use greedy)")
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")

        def pick(logits: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
            scaled = logits.float() / temperature  # [n, V]
            log_probs = torch.log_softmax(scaled, dim=-1)
            probs = torch.softmax(_truncate(self._block_eos(scaled, step), self.top_k, self.top_p), dim=-1)
            tokens = draw_tokens(probs, generator)  # [n]
            return tokens, log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

        return self._generate(prompts, group_size, pick)

    def greedy(self, prompts: Sequence[str | dict]) -> list[list[str]]:
        """The argmax response to each prompt, as B lists of one string."""

        def pick(logits: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
            tokens = self._block_eos(logits.float(), step).argmax(dim=-1)
            return tokens, torch.zeros(tokens.shape, device=tokens.device)  # log-probs unused

        return self._generate(prompts, 1, pick).responses

    def _block_eos(self, scaled: torch.Tensor, step: int) -> torch.Tensor:
        """Logits [n, V] with EOS at -inf while fewer than ``min_new_tokens`` tokens exist."""
        if step >= self.min_new_tokens:
            return scaled
        return scaled.index_fill(-1, self.eos_ids, -torch.inf)

    def _generate(self, prompts: Sequence[str | dict], group_size: int, pick: TokenPicker) -> Samples:
        """Decode G responses per prompt with a KV cache; the prompt is encoded once, not G times."""
        prompt_ids, prompt_mask = self.encode_prompts(prompts)  # [B, P]
        was_training = self.module.training
        self.module.eval()  # no dropout while sampling; checkpointing is off in eval mode
        try:
            # inference_mode: cheaper than no_grad per op (measured ~12% on the benchmark's
            # sampling); its outputs are cloned into ordinary tensors so that scoring can
            # save them for backward.
            with torch.inference_mode():
                decoded = self._decode(prompt_ids, prompt_mask, group_size, pick)
            response_ids, lengths, log_probs = (t.clone() for t in decoded)
        finally:
            self.module.train(was_training)
        response_mask = torch.arange(response_ids.shape[1], device=self.device) < lengths.unsqueeze(-1)
        texts = [
            cut_at_stop_string(self.tokenizer.decode(ids[:length], skip_special_tokens=True), self.stop_strings)
            for ids, length in zip(response_ids.tolist(), lengths.tolist())
        ]
        return Samples(
            responses=[texts[b * group_size:(b + 1) * group_size] for b in range(len(prompts))],
            response_ids=response_ids,
            response_mask=response_mask,
            prompt_ids=prompt_ids.repeat_interleave(group_size, dim=0),
            prompt_mask=prompt_mask.repeat_interleave(group_size, dim=0),
            sample_log_probs=log_probs.masked_fill(~response_mask, 0.0),
        )

    def _decode(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int,
                pick: TokenPicker) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The token loop. Returns response_ids [N, T], lengths [N] and log-probs [N, T].

        Finished rows leave the batch (and the cache), so late steps cost only the rows
        still running; the loop stops when none is.
        """
        n = prompt_ids.shape[0] * group_size
        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # [B, P], 0 on left padding
        out = self._forward(input_ids=prompt_ids, attention_mask=prompt_mask.long(), position_ids=positions,
                          use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        cache.batch_repeat_interleave(group_size)  # [B, ...] -> [N, ...], row b*G + g
        logits = out.logits[:, -1].repeat_interleave(group_size, dim=0)  # [N, V]
        attention = prompt_mask.long().repeat_interleave(group_size, dim=0)  # [n, P + t]
        next_position = prompt_mask.sum(-1).repeat_interleave(group_size)  # [n]
        rows = torch.arange(n, device=self.device)  # global index of each running row
        response_ids = torch.full((n, self.max_new_tokens), self.pad_id, dtype=torch.long, device=self.device)
        log_probs = torch.zeros((n, self.max_new_tokens), device=self.device)
        lengths = torch.full((n,), self.max_new_tokens, dtype=torch.long, device=self.device)
        for step in range(self.max_new_tokens):
            tokens, picked_log_probs = pick(logits, step)  # [n], [n]
            response_ids[rows, step] = tokens
            log_probs[rows, step] = picked_log_probs
            done = torch.isin(tokens, self.eos_ids) | self._stop_string_hits(response_ids[rows, : step + 1])
            lengths[rows[done]] = step + 1
            running = ~done
            if step + 1 == self.max_new_tokens or not running.any():
                break
            if not running.all():
                cache.batch_select_indices(running.nonzero().squeeze(-1))
                rows, tokens = rows[running], tokens[running]
                attention, next_position = attention[running], next_position[running]
            attention = torch.cat([attention, attention.new_ones((rows.shape[0], 1))], dim=-1)
            out = self._forward(input_ids=tokens.unsqueeze(-1), attention_mask=attention,
                              position_ids=next_position.unsqueeze(-1), past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1]
            next_position = next_position + 1
        width = int(lengths.max())
        return response_ids[:, :width], lengths, log_probs[:, :width]

    def _stop_string_hits(self, response_ids: torch.Tensor) -> torch.Tensor:
        """[n] bool: does the response [n, t] now contain a stop string?

        Only the last few tokens are decoded (every token adds at least one character,
        so a stop string just completed lies within its length in tokens, plus margin).
        """
        hits = torch.zeros(response_ids.shape[0], dtype=torch.bool, device=response_ids.device)
        if not self.stop_strings:
            return hits
        window = max(len(s) for s in self.stop_strings) + 2
        tails = self.tokenizer.batch_decode(response_ids[:, -window:].tolist(), skip_special_tokens=True)
        for row, text in enumerate(tails):
            hits[row] = any(s in text for s in self.stop_strings)
        return hits

    # ---- scoring ------------------------------------------------------------------

    def log_probs(self, samples: Samples, temperature: float,
                  with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log pi_tau(a_t | s_t) [n, T] of the response tokens, 0 where the mask is False.

        Left-padded prompts and right-padded responses, positions counted over real
        tokens only; logits are kept only at the T positions that predict response
        tokens. With ``with_entropy``, also the entropy [n, T] of pi_tau at each
        position (detached: a metric; 0 off the mask). Gradients flow to the module's
        parameters unless called under no_grad.
        """
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        logits = self._response_logits(samples)  # [n, T, V]
        log_probs = token_log_probs(logits, samples.response_ids, temperature, self.chunk_elements)
        log_probs = log_probs.masked_fill(~samples.response_mask, 0.0)
        entropy = self._entropy(logits.detach(), temperature, samples.response_mask) if with_entropy else None
        return log_probs, entropy

    def _response_logits(self, samples: Samples) -> torch.Tensor:
        """Logits [n, T, V] at the positions that predict each response token.

        Rows of one prompt are consecutive (a group); when prompts repeat, each is
        encoded once and its KV cache shared by its rows (same values up to float
        rounding, fewer tokens through the model). Not under gradient checkpointing,
        which drops caches in training.
        """
        prompt_key = torch.cat([samples.prompt_ids, samples.prompt_mask.long()], dim=1)  # [n, 2P]
        _, inverse, counts = torch.unique_consecutive(prompt_key, dim=0, return_inverse=True, return_counts=True)
        if self.share_prompts and len(counts) < len(inverse) and not _checkpointing(self.module):
            first_rows = counts.cumsum(0) - counts  # [u]: one row per distinct prompt
            return self._shared_prompt_logits(samples, first_rows, inverse)
        response_ids, response_mask = samples.response_ids, samples.response_mask  # [n, T]
        input_ids = torch.cat([samples.prompt_ids, response_ids], dim=1)  # [n, P + T]
        attention = torch.cat([samples.prompt_mask, response_mask], dim=1).long()
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        return self._forward(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                           use_cache=False, logits_to_keep=response_ids.shape[1] + 1).logits[:, :-1]

    def _shared_prompt_logits(self, samples: Samples, first_rows: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
        """Response logits [n, T, V]: u distinct prompts [u, P] encoded once, then all n responses.

        first_rows [u] picks one row per prompt; inverse [n] maps each row to its prompt.
        """
        prompt_ids, prompt_mask = samples.prompt_ids[first_rows], samples.prompt_mask[first_rows].long()  # [u, P]
        out = self._forward(input_ids=prompt_ids, attention_mask=prompt_mask,
                          position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0), use_cache=True, logits_to_keep=1)
        first_logits = out.logits[:, -1:][inverse]  # [n, 1, V]: predicts response token 0
        num_tokens = samples.response_ids.shape[1]
        if num_tokens == 1:
            return first_logits
        cache = out.past_key_values
        cache.batch_select_indices(inverse)  # [u, ...] -> [n, ...], differentiable
        inputs = samples.response_ids[:, :-1]  # [n, T - 1]: token t predicts token t + 1
        attention = torch.cat([prompt_mask[inverse], samples.response_mask[:, :-1].long()], dim=1)
        positions = prompt_mask.sum(-1)[inverse].unsqueeze(-1) + torch.arange(num_tokens - 1, device=inputs.device)
        rest = self._forward(input_ids=inputs, attention_mask=attention, position_ids=positions,
                           past_key_values=cache, use_cache=True).logits  # [n, T - 1, V]
        return torch.cat([first_logits, rest], dim=1)

    def _entropy(self, logits: torch.Tensor, temperature: float, response_mask: torch.Tensor) -> torch.Tensor:
        """Entropy [n, T] of softmax(logits / tau), logits [n, T, V], chunked like the log-probs."""
        entropy = torch.cat([entropy_from_logits(logits[rows].float() / temperature)
                             for rows in row_chunks(logits, self.chunk_elements)])
        return entropy.masked_fill(~response_mask, 0.0)
