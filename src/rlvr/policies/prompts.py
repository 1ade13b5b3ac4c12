"""Prompt text to token ids, with errors that name the prompt a model cannot take."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlvr.errors import ConfigError


class PromptError(ConfigError):
    """A prompt the model cannot take: with the response it is longer than the model's
    positions, or it holds a character the tokenizer cannot encode. Names the prompt."""


def excerpt(text: str, at: int = 0, width: int = 40) -> str:
    """``text`` near index ``at`` as a repr of at most ``width`` characters, "..." where cut."""
    start = max(0, min(at - width // 2, len(text) - width))
    return ("..." if start else "") + repr(text[start:start + width]) + ("..." if start + width < len(text) else "")


def prompt_token_ids(tokenizer: Any, prompts: Sequence[str | dict], add_special_tokens: bool, max_new_tokens: int,
                     max_positions: int | None, what: str = "prompt", offset: int = 0) -> list[list[int]]:
    """The token ids of each prompt (a string, or a dict with a "prompt" key).

    PromptError naming the first prompt (as "<what> <offset + index>") that has no
    tokens, a character the tokenizer cannot encode, or more than ``max_positions``
    tokens with ``max_new_tokens`` beside it.
    """
    texts = [p["prompt"] if isinstance(p, dict) else p for p in prompts]
    if not texts:
        raise PromptError(f"no {what}s to encode")
    try:
        encoded = tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]
    except Exception as err:  # tokenizers raises a bare Exception for a character it has no id for
        unknown = _unknown_character(tokenizer, texts, what, offset)
        if unknown is None:
            raise
        raise unknown from err
    for i, ids in enumerate(encoded):
        if not ids:
            raise PromptError(f"{what} {offset + i} ({texts[i]!r}) has no tokens; a prompt needs at least one token")
        total = len(ids) + max_new_tokens
        if max_positions is not None and total > max_positions:
            raise PromptError(
                f"{what} {offset + i} ({excerpt(texts[i])}): {len(ids)} tokens + max_new_tokens "
                f"{max_new_tokens} = {total} > {max_positions}, the model's positions; "
                "shorten the prompt or lower policy.options.max_new_tokens"
            )
    return encoded


def _unknown_character(tokenizer: Any, texts: list[str], what: str, offset: int) -> PromptError | None:
    """The error for the first character of ``texts`` the tokenizer cannot encode on its own, if any."""
    known: set[str] = set()
    for i, text in enumerate(texts):
        for at, char in enumerate(text):
            if char in known:
                continue
            try:
                tokenizer(char, add_special_tokens=False)
            except Exception:  # as above: the tokenizer's bare Exception
                return PromptError(f"{what} {offset + i} ({excerpt(text, at)}): character {char!r} at index {at} "
                                   "is not in the tokenizer's vocabulary")
            known.add(char)
    return None


def left_pad(encoded: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """B token lists -> ids [B, P] long, left-padded with ``pad_id``, and mask [B, P] bool (True on tokens)."""
    width = max(len(ids) for ids in encoded)
    prompt_ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(encoded), width), dtype=torch.bool)
    for row, ids in enumerate(encoded):
        prompt_ids[row, width - len(ids):] = torch.tensor(ids)
        prompt_mask[row, width - len(ids):] = True
    return prompt_ids, prompt_mask
