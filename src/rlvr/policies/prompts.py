"""Prompt text to token ids, with errors that name the prompt a model cannot take.

A prompt is text, or a chat: a list of messages ``{"role": ..., "content": ...}``, either
on its own or as the "prompt" of a prompt dict. A chat is rendered here, with the
tokenizer's chat template and the generation prompt (``apply_chat_template(...,
add_generation_prompt=True, tokenize=False)``), and its text encoded without added
special tokens: the template writes those it wants (a BOS twice would be a prompt the
model never saw). Rendering where the tokenizer is keeps tasks free of tokenizers: a
task hands over messages, every policy path (sampling, greedy, the up-front check, Ray
workers) renders them alike, and reward functions see the messages as ``prompts``, as
TRL passes a conversational prompt.
"""

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
    """The token ids of each prompt (text or a chat, on its own or as the "prompt" of a
    dict; a chat rendered and encoded as the module docstring says).

    PromptError naming the first prompt (as "<what> <offset + index>") that has no
    tokens, a character the tokenizer cannot encode, or more than ``max_positions``
    tokens with ``max_new_tokens`` beside it, or that is a chat the tokenizer cannot
    render (no chat template, or the template fails on it).
    """
    values = [p["prompt"] if isinstance(p, dict) else p for p in prompts]
    if not values:
        raise PromptError(f"no {what}s to encode")
    texts = [value if isinstance(value, str) else render_chat(tokenizer, value, f"{what} {offset + i}")
             for i, value in enumerate(values)]
    chats = [i for i, value in enumerate(values) if not isinstance(value, str)]
    plain = [i for i, value in enumerate(values) if isinstance(value, str)]
    encoded: list[list[int]] = [[] for _ in texts]
    try:
        for rows, special in ((plain, add_special_tokens), (chats, False)):
            if rows:
                ids = tokenizer([texts[i] for i in rows], add_special_tokens=special)["input_ids"]
                for i, row_ids in zip(rows, ids):
                    encoded[i] = row_ids
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


def render_chat(tokenizer: Any, messages: Any, where: str = "prompt") -> str:
    """The text of a chat (a list of {"role", "content"} messages) by the tokenizer's
    chat template, ending with the generation prompt. PromptError (naming ``where``) when
    the tokenizer has no chat template or the template fails on these messages."""
    if not getattr(tokenizer, "chat_template", None):
        raise PromptError(
            f"{where} is a chat (a list of messages), and the tokenizer has no chat template to render it; "
            "use a model whose tokenizer has one, set policy.options.chat_template, or give text prompts")
    try:
        return tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    except Exception as err:  # jinja2's errors, or the template's own raise_exception
        raise PromptError(f"{where}: the chat template failed on it ({type(err).__name__}: {err})") from err


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
