"""Prompt text to token ids, with errors that name the prompt a model cannot take.

A prompt is text, or a chat (a list of ``{"role", "content"}`` messages), on its own or as the "prompt" of a dict.
A chat is rendered here with the tokenizer's chat template and the generation prompt, and encoded without added
special tokens: the template writes those it wants (a BOS twice would be a prompt the model never saw). Rendering
where the tokenizer is keeps tasks free of tokenizers, and every policy path renders alike. The template renders
with limits (``rlvr.policies.template_sandbox``); a template past them is a PromptError naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlvr.base.errors import PromptError
from rlvr.policies.template_sandbox import TemplateLimitError, render_template

_TOKEN_CHARS: Any = None  # tokenizer -> the most characters one of its tokens stands for (weakly held)


def max_token_chars(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` can stand for (at least 1): text longer than ``n`` times this
    has more than ``n`` tokens, known without encoding it (a megabyte of text costs the tokenizer a gigabyte)."""
    global _TOKEN_CHARS
    import weakref

    if _TOKEN_CHARS is None:
        _TOKEN_CHARS = weakref.WeakKeyDictionary()
    try:
        return _TOKEN_CHARS[tokenizer]
    except (KeyError, TypeError):
        pass
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    longest = max((len(token) for token in vocab), default=1)
    try:
        _TOKEN_CHARS[tokenizer] = max(1, longest)
    except TypeError:  # an object without weak references: measured each time
        pass
    return max(1, longest)


def content_chars(value: Any) -> int:
    """The characters of a prompt's text, or of a chat's message contents (what a rendering holds at least);
    of text cut where it was made, as long as it was (its ``chars``)."""
    if hasattr(value, "chars"):
        return value.chars
    if isinstance(value, str):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(len(m["content"]) if isinstance(m, dict) and isinstance(m.get("content"), str) else 0
                   for m in value)
    return 0


def excerpt(text: str, at: int = 0, width: int = 40) -> str:
    """``text`` near index ``at`` as a repr of at most ``width`` characters, "..." where cut."""
    start = max(0, min(at - width // 2, len(text) - width))
    return ("..." if start else "") + repr(text[start:start + width]) + ("..." if start + width < len(text) else "")


def prompt_token_ids(tokenizer: Any, prompts: Sequence[str | dict], add_special_tokens: bool, max_new_tokens: int,
                     max_positions: int | None, what: str = "prompt", offset: int = 0,
                     budget: str = "policy.options.max_new_tokens", tools: list[dict] | None = None
                     ) -> list[list[int]]:
    """The token ids of each prompt (``tools`` given to a chat's template).

    PromptError naming the first prompt ("<what> <offset + index>") that has no tokens, a character the tokenizer
    cannot encode, or more than ``max_positions`` tokens with ``max_new_tokens`` (the setting ``budget``) beside it,
    that was cut where it was made (``chars``), or that is a chat the tokenizer cannot render.
    """
    values = [p["prompt"] if isinstance(p, dict) else p for p in prompts]
    if not values:
        raise PromptError(f"no {what}s to encode")
    if max_positions is not None:  # a prompt past the positions by its length alone is refused before encoding
        chars = (max_positions - max_new_tokens) * max_token_chars(tokenizer)
        for i, value in enumerate(values):
            if content_chars(value) > chars:
                raise PromptError(
                    f"{what} {offset + i} ({excerpt(str(value))}): {content_chars(value)} characters, more than "
                    f"{chars} ({max_positions} positions - max_new_tokens {max_new_tokens}, at most "
                    f"{max_token_chars(tokenizer)} characters a token) could hold; shorten the prompt", offset + i)
    for i, value in enumerate(values):  # text cut where it was made (``chars``) is never encoded; where the model
        if hasattr(value, "chars"):     # states its positions, the check above has refused it already
            raise PromptError(
                f"{what} {offset + i} ({excerpt(str(value))}): {value.chars} characters, more than its episode could "
                f"hold (at most {max_token_chars(tokenizer)} characters a token; the model states no positions, so "
                f"{max_new_tokens} tokens, {budget}); shorten the prompt or raise {budget}", offset + i)
    texts = prompt_texts(tokenizer, prompts, what, offset, tools)
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
        unknown = unknown_characters(tokenizer, texts, what, offset)
        if unknown is None:
            raise
        raise unknown from err
    for i, ids in enumerate(encoded):
        if not ids:
            raise PromptError(f"{what} {offset + i} ({texts[i]!r}) has no tokens; a prompt needs at least one token",
                              offset + i)
        total = len(ids) + max_new_tokens
        if max_positions is not None and total > max_positions:
            raise PromptError(
                f"{what} {offset + i} ({excerpt(texts[i])}): {len(ids)} tokens + {budget.rsplit('.', 1)[-1]} "
                f"{max_new_tokens} = {total} > {max_positions}, the model's positions; "
                f"shorten the prompt or lower {budget}", offset + i
            )
    return encoded


def prompt_texts(tokenizer: Any, prompts: Sequence[str | dict], what: str = "prompt", offset: int = 0,
                 tools: list[dict] | None = None) -> list[str]:
    """Each prompt as the text the tokenizer encodes (a chat rendered by ``render_chat``)."""
    values = [p["prompt"] if isinstance(p, dict) else p for p in prompts]
    return [value if isinstance(value, str) else render_chat(tokenizer, value, f"{what} {offset + i}", tools)
            for i, value in enumerate(values)]


def render_chat(tokenizer: Any, messages: Any, where: str = "prompt", tools: list[dict] | None = None) -> str:
    """The text of a chat by the tokenizer's chat template, ending with the generation prompt; ``tools`` (function
    schemas) go to the template. PromptError naming ``where`` when there is no template or it fails."""
    if not getattr(tokenizer, "chat_template", None):
        raise PromptError(
            f"{where} is a chat (a list of messages), and the tokenizer has no chat template to render it; "
            "use a model whose tokenizer has one, set policy.options.chat_template, or give text prompts")
    template = tokenizer.get_chat_template()
    try:
        return render_template(template, messages=list(messages), add_generation_prompt=True,
                               **({"tools": tools} if tools else {}), **tokenizer.special_tokens_map)
    except TemplateLimitError as err:
        raise PromptError(f"{where}: the chat template (policy.options.chat_template, or the tokenizer's own) "
                          f"{err}") from err
    except Exception as err:  # jinja2's errors, or the template's own raise_exception
        raise PromptError(f"{where}: the chat template failed on it ({type(err).__name__}: {err})") from err


class UnknownCharacters(PromptError):
    """Characters of the prompts that the tokenizer cannot encode (``characters``, each once, in order)."""

    def __init__(self, message: str, characters: list[str], index: int | None = None):
        super().__init__(message, index)
        self.characters = characters


def unknown_characters(tokenizer: Any, texts: list[str], what: str = "prompt",
                       offset: int = 0) -> UnknownCharacters | None:
    """The error naming every character of ``texts`` the tokenizer cannot encode (all at once: a vocabulary is not
    fixed one run per character), None when there is none."""
    known: set[str] = set()
    missing: dict[str, tuple[int, int]] = {}  # character -> (text, index) where it first appears
    for i, text in enumerate(texts):
        for at, char in enumerate(text):
            if char in known or char in missing:
                continue
            try:
                tokenizer(char, add_special_tokens=False)
            except Exception:  # as above: the tokenizer's bare Exception
                missing[char] = (i, at)
                continue
            known.add(char)
    if not missing:
        return None
    char, (i, at) = next(iter(missing.items()))
    message = (f"{what} {offset + i} ({excerpt(texts[i], at)}): character {char!r} at index {at} is not in the "
               "tokenizer's vocabulary")
    if len(missing) > 1:
        message += f"; all {len(missing)} characters of the {what}s that it lacks: {''.join(missing)!r}"
    return UnknownCharacters(message, list(missing), offset + i)


def left_pad(encoded: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """B token lists -> ids [B, P] long, left-padded with ``pad_id``, and mask [B, P] bool (True on tokens)."""
    width = max(len(ids) for ids in encoded)
    prompt_ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(encoded), width), dtype=torch.bool)
    for row, ids in enumerate(encoded):
        prompt_ids[row, width - len(ids):] = torch.tensor(ids)
        prompt_mask[row, width - len(ids):] = True
    return prompt_ids, prompt_mask
