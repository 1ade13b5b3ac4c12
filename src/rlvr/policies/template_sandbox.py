"""Chat templates rendered in a Jinja sandbox with limits.

A chat template is a program, so it renders in the sandbox transformers uses, with the same globals and filters,
and no value, range or output past MAX_TEMPLATE_SIZE, and no render past MAX_TEMPLATE_SECONDS (TemplateLimitError).
"""

from __future__ import annotations

import contextvars
import json
import re
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from rlvr.base.errors import ConfigError

# A chat template renders a prompt in well under a millisecond and writes a few thousand characters; past these it
# is broken or hostile (a string repeated 2e9 times), and stops instead of taking the memory or the hours.
MAX_TEMPLATE_SIZE = 2**20  # characters or items in any value it makes, range() included, and in its output
MAX_TEMPLATE_SECONDS = 2.0  # one render


class TemplateLimitError(Exception):
    """A chat template past MAX_TEMPLATE_SIZE or MAX_TEMPLATE_SECONDS; says which and where."""


def check_chat_template(template: Any) -> None:
    """ConfigError unless ``template`` parses and renders a one-message chat within the limits; the template's own
    errors (``raise_exception`` on a chat it does not take) wait for real prompts."""
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
    """``template`` rendered as transformers' ``apply_chat_template`` renders it, within the limits."""
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
    """Does a chat template read a ``tools`` variable (the tools' schemas, as in the Qwen and Hermes templates)?"""
    return "tools" in meta.find_undeclared_variables(_sandbox().parse(template))


@lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    return _sandbox().from_string(template)


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


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers marks assistant tokens with it): its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _Namespace(jinja2.utils.Namespace):
    """transformers' namespace: no underscore attribute (CPython's internals) can be stored."""

    def __setitem__(self, name: str, value: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a namespace cannot hold {name!r}")
        super().__setitem__(name, value)


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox with every operator that can make a large value, and every call, checked."""

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


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=1)
def _sandbox() -> _BoundedSandbox:
    """transformers' chat-template sandbox (``_compile_jinja_template``), bounded, every filter checked."""
    env = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    for name, function in list(env.filters.items()):
        env.filters[name] = _checked_filter(function)
    env.globals.update(raise_exception=_raise_exception, strftime_now=lambda f: datetime.now().strftime(f),
                       range=_bounded_range, namespace=_Namespace, dict=lambda *args, **kwargs: dict(*args, **kwargs))
    return env


def _checked_filter(function: Any) -> Any:
    """A filter refusing a size argument past the limit ('a'|center(2e9)) and a render past its time."""
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
