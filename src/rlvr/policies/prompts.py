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

A chat template is a program (``policy.options.chat_template``, or a model's own), so it
renders with limits (``render_template``): in the sandbox transformers uses, with the
same globals and filters, and no value, range or output past MAX_TEMPLATE_SIZE, and no
render past MAX_TEMPLATE_SECONDS. A template past them is a PromptError naming it.
"""

from __future__ import annotations

import contextvars
import json
import re
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import torch

from rlvr.base.errors import ConfigError, PromptError

# A chat template renders a prompt in well under a millisecond and writes a few thousand
# characters; past these it is broken or hostile (a string repeated 2e9 times, nested
# ranges of 1e5), and stops with a PromptError instead of taking the memory or the hours.
MAX_TEMPLATE_SIZE = 2**20  # characters or items in any value it makes, range() included, and in its output
MAX_TEMPLATE_SECONDS = 2.0  # one render


_TOKEN_CHARS: Any = None  # tokenizer -> the most characters one of its tokens stands for (weakly held)


def max_token_chars(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` can stand for (its longest vocabulary
    entry, at least 1): text longer than ``n`` times this has more than ``n`` tokens, known
    without encoding it (a megabyte of text costs the tokenizer most of a gigabyte)."""
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
    """The token ids of each prompt (text or a chat, on its own or as the "prompt" of a
    dict; a chat rendered and encoded as the module docstring says, ``tools`` given to
    its template).

    PromptError naming the first prompt (as "<what> <offset + index>") that has no
    tokens, a character the tokenizer cannot encode, or more than ``max_positions``
    tokens with ``max_new_tokens`` beside it (the setting ``budget`` says how many), that
    was cut where it was made (an environment's, ``chars``: before any encoding), or that
    is a chat the tokenizer cannot render (no chat template, or the template fails on it).
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
    """The text of a chat (a list of {"role", "content"} messages) by the tokenizer's
    chat template, ending with the generation prompt; ``tools`` (function schemas) go to
    the template's ``tools`` variable. PromptError (naming ``where``) when the tokenizer
    has no chat template or the template fails on these messages."""
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


class TemplateLimitError(Exception):
    """A chat template past MAX_TEMPLATE_SIZE or MAX_TEMPLATE_SECONDS; says which and where."""


def check_chat_template(template: Any) -> None:
    """ConfigError naming ``policy.options.chat_template`` when it is not a template that
    renders a one-message chat within the limits (or parses at all); errors of the
    template's own (``raise_exception`` on a chat it does not take) wait for real prompts."""
    import jinja2

    field = "policy.options.chat_template"
    if not isinstance(template, str):
        raise ConfigError(f"{field}: expected a Jinja template (text), got {type(template).__name__}")
    try:
        render_template(template, messages=[{"role": "user", "content": "1 2 3"}], add_generation_prompt=True)
    except TemplateLimitError as err:
        raise ConfigError(f"{field} {err}") from err
    except jinja2.TemplateSyntaxError as err:
        raise ConfigError(f"{field}: not a valid Jinja template ({err.message} at line {err.lineno})") from err
    except Exception:  # noqa: S110 (the template's own errors depend on the chat; real prompts show them)
        pass


def render_template(template: str, **variables: Any) -> str:
    """``template`` rendered with ``variables`` as transformers' ``apply_chat_template``
    renders it (its sandbox, globals and filters), within MAX_TEMPLATE_SIZE and
    MAX_TEMPLATE_SECONDS (TemplateLimitError past them)."""
    compiled = _compiled(template)
    deadline = _DEADLINE.set(time.monotonic() + MAX_TEMPLATE_SECONDS)
    tracing = sys.gettrace() is None  # a debugger's or coverage's tracer is left alone (the hooks still check)
    if tracing:
        sys.settrace(_trace_templates)
    try:
        text = compiled.render(**variables)
    finally:
        if tracing:
            sys.settrace(None)
        _DEADLINE.reset(deadline)
    if len(text) > MAX_TEMPLATE_SIZE:
        raise TemplateLimitError(f"wrote {len(text):,} characters; the limit is {MAX_TEMPLATE_SIZE:,}")
    return text


@lru_cache(maxsize=8)
def template_takes_tools(template: str) -> bool:
    """Does a chat template read a ``tools`` variable (a slot for the tools' schemas, as the
    Qwen and Hermes templates have)?"""
    from jinja2 import meta

    return "tools" in meta.find_undeclared_variables(_environment().parse(template))


@lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    return _environment().from_string(template)


_DEADLINE: contextvars.ContextVar[float] = contextvars.ContextVar("template_deadline", default=float("inf"))
_WIDTH = re.compile(r"[0-9]{7,}")  # a width or precision of a million or more in a format string


def _check_time() -> None:
    if time.monotonic() > _DEADLINE.get():
        raise TemplateLimitError(f"ran past {MAX_TEMPLATE_SECONDS} s")


def _trace_templates(frame: Any, event: str, arg: Any) -> Any:
    """The time check on every line of a template's own code (a loop that calls nothing)."""
    if frame.f_code.co_filename != "<template>":
        return None

    def line(frame: Any, event: str, arg: Any) -> Any:
        _check_time()
        return line

    return line


def _sized(what: str, size: int) -> None:
    if size > MAX_TEMPLATE_SIZE:
        raise TemplateLimitError(f"makes {what} of {size:,} items; the limit is {MAX_TEMPLATE_SIZE:,}")


def _bounded_range(*args: int) -> Iterator[int]:
    numbers = range(*args)
    _sized(f"range{args}", len(numbers))
    for number in numbers:
        _check_time()
        yield number


@lru_cache(maxsize=1)
def _environment() -> Any:
    """transformers' chat-template sandbox (``_compile_jinja_template``) with every
    operator that can make a large value, every call and every filter checked."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """``{% generation %}...{% endgeneration %}`` (transformers marks assistant tokens with
        it; a prompt has none to mark): its body, rendered as it stands."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class Namespace(jinja2.utils.Namespace):
        """transformers' namespace: no underscore attribute (CPython's internals) can be stored."""

        def __setitem__(self, name: str, value: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a namespace cannot hold {name!r}")
            super().__setitem__(name, value)

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "+", "**", "%"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _check_time()
            sequences = (str, list, tuple)
            if operator == "*" and isinstance(left, int) and isinstance(right, sequences):
                left, right = right, left
            if operator == "*" and isinstance(left, sequences) and isinstance(right, int):
                _sized(f"{type(left).__name__} * {right}", len(left) * right)
            elif operator == "+" and isinstance(left, sequences) and isinstance(right, sequences):
                _sized("a concatenation", len(left) + len(right))
            elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
                _sized(f"{left} ** {right} (digits)", right)
            elif operator == "%" and isinstance(left, str) and _WIDTH.search(left):
                raise TemplateLimitError(f"formats with a width past {MAX_TEMPLATE_SIZE:,}")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja2's)
            _check_time()
            for value in (*args, *kwargs.values()):
                if isinstance(value, int) and not isinstance(value, bool):
                    _sized("a call's argument", value)
            return super().call(__context, __obj, *args, **kwargs)

        def getattr(self, obj: Any, attribute: str) -> Any:
            if isinstance(obj, str) and attribute in ("format", "format_map") and _WIDTH.search(obj):
                raise TemplateLimitError(f"formats with a width past {MAX_TEMPLATE_SIZE:,}")
            return super().getattr(obj, attribute)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    for name, function in list(env.filters.items()):
        env.filters[name] = _checked_filter(function)
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f),
                       range=_bounded_range, namespace=Namespace, dict=lambda *args, **kwargs: dict(*args, **kwargs))
    return env


def _checked_filter(function: Any) -> Any:
    """``function`` (a filter) refusing a size argument past the limit ('a'|center(2e9))
    and, like every call, a render past its time."""
    first = 2 if hasattr(function, "jinja_pass_arg") else 1  # after the context (if passed) and the value

    def checked(*args: Any, **kwargs: Any) -> Any:
        _check_time()
        for value in (*args[first:], *kwargs.values()):
            if isinstance(value, int) and not isinstance(value, bool):
                _sized("a filter's argument", value)
            elif isinstance(value, str) and _WIDTH.search(value) and "%" in value:
                raise TemplateLimitError(f"formats with a width past {MAX_TEMPLATE_SIZE:,}")
        return function(*args, **kwargs)

    if hasattr(function, "jinja_pass_arg"):  # pass_context, pass_environment: jinja2 passes it first
        checked.jinja_pass_arg = function.jinja_pass_arg  # type: ignore[attr-defined]
    return checked


class UnknownCharacters(PromptError):
    """Characters of the prompts that the tokenizer cannot encode (``characters``, each once,
    in the order they first appear); the message names where the first one is, and all."""

    def __init__(self, message: str, characters: list[str], index: int | None = None):
        super().__init__(message, index)
        self.characters = characters


def unknown_characters(tokenizer: Any, texts: list[str], what: str = "prompt",
                       offset: int = 0) -> UnknownCharacters | None:
    """The error naming every character of ``texts`` the tokenizer cannot encode on its own
    (all at once: a vocabulary is not fixed one run per character), None when there is none."""
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
