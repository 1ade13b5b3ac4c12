"""Tool calls as a policy writes them and tool results as it reads them back, in two styles.

A style (``TOOL_STYLES``) is how calls are found in a policy turn's text and how results
are written for the policy to read:
  * "json": ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, as the Qwen and
    Hermes chat templates write them; results come back in ``<tool_response>`` tags.
  * "plain": ``name(argument text)`` for tiny character-level models; results come back
    as a line ``= content``.

A malformed call is not dropped: ``parse_tool_calls`` returns it as a failed
``ToolResult`` whose message the policy reads, so that it can learn the format.
``tool_schema`` is the JSON schema a chat template shows for a tool. ``calculator`` parses
a call's arithmetic (Python's ``ast``, never ``eval``) and evaluates it exactly.
"""

from __future__ import annotations

import ast
import decimal
import inspect
import json
import math
import operator
import re
import typing
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from rlvr.base.errors import ConfigError, did_you_mean
from rlvr.environments.base import ToolCall, ToolResult

PLAIN_ARGUMENT = "_"  # the key of a "plain" call's one argument, which goes to the tool's first parameter

_CALL_TAGS = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)  # a last call may be cut at its stop string


@dataclass(frozen=True)
class ToolStyle:
    """How calls are found in a turn's text (``parse``) and how results are written back (``format``)."""

    help: str
    parse: Callable[[str, Collection[str]], tuple[list[ToolCall], list[ToolResult]]]
    format: Callable[[ToolResult], str]
    how_to_call: str  # what a policy is told, after the tools' schemas (``describe_tools``)


def parse_tool_calls(text: str, style: str, known: Collection[str]) -> tuple[list[ToolCall], list[ToolResult]]:
    """The tool calls in a policy turn's ``text``, in order, and a failed ``ToolResult`` for each malformed
    call or call of a tool not in ``known``, for the policy to read with the calls' results."""
    return _style(style).parse(text, known)


def format_tool_results(results: list[ToolResult], style: str) -> str:
    """What the policy reads back after a turn's calls; an error as ``error: <message>``."""
    return "".join(_style(style).format(result) for result in results)


def call_arguments(arguments: Mapping[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """(positional, keywords) for a tool; a "plain" call's one argument is the first positional one."""
    args = (arguments[PLAIN_ARGUMENT],) if PLAIN_ARGUMENT in arguments else ()
    return args, {key: value for key, value in arguments.items() if key != PLAIN_ARGUMENT}


def _style(style: str) -> ToolStyle:
    if style not in TOOL_STYLES:
        raise ConfigError(f"unknown tool style {style!r}; {did_you_mean(style, TOOL_STYLES)}")
    return TOOL_STYLES[style]


def _failed(name: str, message: str) -> ToolResult:
    return ToolResult(name=name, content=message, error=True)


def _unknown(name: str, known: Collection[str]) -> ToolResult:
    return _failed(name, f"unknown tool {name!r}; tools: {', '.join(sorted(known)) or 'none'}")


def _parse_json(text: str, known: Collection[str]) -> tuple[list[ToolCall], list[ToolResult]]:
    calls: list[ToolCall] = []
    errors: list[ToolResult] = []
    for match in _CALL_TAGS.finditer(text):
        body, closed = match.group(1).strip(), bool(match.group(2))
        if not closed and not body:
            continue  # a bare opening tag at the end: the policy stopped before writing a call
        call = _json_call(body)
        if isinstance(call, str):
            errors.append(_failed("", call if closed else f"{call} (and no </tool_call>)"))
        elif call.name not in known:
            errors.append(_unknown(call.name, known))
        else:
            calls.append(call)
    return calls, errors


def _json_call(body: str) -> ToolCall | str:
    """The call a ``<tool_call>`` body holds, or why it is malformed."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError as err:
        return f"malformed tool call: invalid JSON ({err.msg} at character {err.pos})"
    except RecursionError:  # the parser recurses per nesting level: a policy can write 1,000 brackets
        return "malformed tool call: JSON nested too deeply"
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return 'malformed tool call: expected {"name": "...", "arguments": {...}}'
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some templates and models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as err:
            return f"malformed tool call: arguments are not valid JSON ({err.msg} at character {err.pos})"
        except RecursionError:
            return "malformed tool call: arguments nested too deeply"
    if not isinstance(arguments, dict):
        return f"malformed tool call: arguments must be an object, not {type(arguments).__name__}"
    return ToolCall(name=value["name"], arguments=arguments)


def _format_json(result: ToolResult) -> str:
    content = f"error: {result.content}" if result.error else result.content
    return f"<tool_response>\n{content}\n</tool_response>\n"


def _parse_plain(text: str, known: Collection[str]) -> tuple[list[ToolCall], list[ToolResult]]:
    calls: list[ToolCall] = []
    errors: list[ToolResult] = []
    if not known:
        return calls, errors
    names = "|".join(re.escape(name) for name in sorted(known, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w.])({names})\(")  # a name inside a longer word or attribute is no call
    for line in text.splitlines():
        start = 0
        while match := pattern.search(line, start):
            end = _closing_paren(line, match.end())
            if end is None:
                errors.append(_failed(match.group(1), f"malformed tool call: no ')' closes {match.group(1)}("))
                break
            calls.append(ToolCall(name=match.group(1), arguments={PLAIN_ARGUMENT: line[match.end():end]}))
            start = end + 1
    return calls, errors


def _closing_paren(line: str, start: int) -> int | None:
    """The index of the ")" that closes the "(" just before ``start``, or None."""
    depth = 0
    for index in range(start, len(line)):
        if line[index] == "(":
            depth += 1
        elif line[index] == ")":
            if depth == 0:
                return index
            depth -= 1
    return None


def _format_plain(result: ToolResult) -> str:
    return f"= error: {result.content}\n" if result.error else f"= {result.content}\n"


TOOL_STYLES: dict[str, ToolStyle] = {
    "json": ToolStyle(
        help='<tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen, Hermes); results in <tool_response>',
        parse=_parse_json,
        format=_format_json,
        how_to_call='To call one, write <tool_call>{"name": NAME, "arguments": {...}}</tool_call> and stop; '
                    "its result comes back in a tool message.",
    ),
    "plain": ToolStyle(
        help="name(argument text) on one line, for tiny character-level models; results as '= content'",
        parse=_parse_plain,
        format=_format_plain,
        how_to_call="To call one, write NAME(ARGUMENT) on a line of its own and stop; its result comes back "
                    "as a line '= RESULT'.",
    ),
}


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI / Hugging Face function schema of a tool: ``transformers.utils.get_json_schema`` when the
    docstring documents every argument (an ``Args:`` section), else one from the signature: the docstring's
    first paragraph, plain-type annotations (anything else untyped), parameters without a default required."""
    try:
        from transformers.utils import get_json_schema
    except ImportError:
        pass
    else:
        try:
            return get_json_schema(fn)
        except Exception:  # undocumented arguments or unsupported hints: the signature still serves
            pass
    hints = _type_hints(fn)
    properties: dict[str, Any] = {}
    required = []
    for name, parameter in inspect.signature(fn).parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        kind = _JSON_TYPES.get(hints.get(name))
        properties[name] = {"type": kind} if kind else {}
        if parameter.default is parameter.empty:
            required.append(name)
    description = (inspect.getdoc(fn) or "").split("\n\n")[0].replace("\n", " ").strip()
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": fn.__name__, "description": description, "parameters": parameters}}


def shown_tools(template: str | None, prompt: Any, schemas: list[dict[str, Any]], style: str
                ) -> tuple[Any, list[dict[str, Any]] | None]:
    """(the prompt to render, the ``tools`` for its chat template). A template whose ``tools`` slot teaches
    ``<tool_call>`` (Qwen's, Hermes') gets the schemas there in the "json" style; otherwise (no slot, a slot
    teaching another syntax as Llama 3's and Mistral's do, or "plain") the system message describes them.
    A text prompt is left as it is (as TRL shows tools through the chat template alone)."""
    from rlvr.policies.template_sandbox import template_takes_tools

    if not schemas or isinstance(prompt, str):  # a text prompt describes its tools itself
        return prompt, None
    if style == "json" and template and template_takes_tools(template) and "<tool_call>" in template:
        return prompt, schemas
    return describe_tools(prompt, schemas, style), None


def describe_tools(chat: list[dict[str, Any]], schemas: list[dict[str, Any]], style: str) -> list[dict[str, Any]]:
    """``chat`` with its tools' schemas (JSON, one a line) and how to call them in ``style`` at the end of
    its system message (one added first when it has none)."""
    lines = "\n".join(json.dumps(schema.get("function", schema), sort_keys=True) for schema in schemas)
    text = f"You can call these tools. Their schemas, one a line:\n{lines}\n{_style(style).how_to_call}"
    if not chat or chat[0].get("role") != "system":
        return [{"role": "system", "content": text}, *chat]
    content = chat[0].get("content") or ""
    if isinstance(content, list):  # content parts: the description as one more part
        content = [*content, {"type": "text", "text": f"\n\n{text}"}]
    else:
        content = f"{content}\n\n{text}"
    return [{**chat[0], "content": content}, *chat[1:]]


_FROM_TEXT = {int: int, float: float, bool: lambda text: {"true": True, "false": False}[text.strip().lower()]}


def typed_arguments(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """``args`` and ``kwargs`` with text for a parameter annotated ``int``, ``float`` or ``bool`` converted
    (``increment(3)`` in "plain" gives "3"); ValueError naming the parameter when it does not convert."""
    hints = _type_hints(fn)
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs)
    except (TypeError, ValueError):  # the call itself will say what is wrong
        return args, kwargs
    for name, value in bound.arguments.items():
        convert = _FROM_TEXT.get(hints.get(name))
        if convert is not None and isinstance(value, str):
            try:
                bound.arguments[name] = convert(value.strip())
            except (ValueError, KeyError):
                raise ValueError(f"argument {name!r} must be {hints[name].__name__}, got {value!r:.40}") from None
    return bound.args, bound.kwargs


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # a hint that does not resolve leaves that parameter untyped
        return {}


# calculator: exact arithmetic, bounded so that no expression burns the CPU
_MAX_EXPRESSION_CHARS = 1000
_MAX_EXPONENT = 1000
_MAX_DIGITS = 10_000
_DECIMAL_DIGITS = 50  # significant digits of a result that is not an integer
_LOG10_2 = math.log10(2)


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly: integers and decimals with + - * / // % ** and parentheses.

    Args:
        expression: The expression, such as "12345 + 67890" or "(2.5 - 1) * 3 ** 4".
    """
    source = expression.strip()
    if len(source) > _MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression over {_MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise ValueError(f"not an arithmetic expression ({getattr(err, 'msg', None) or err})") from None
    try:
        with decimal.localcontext() as context:
            context.prec = _DECIMAL_DIGITS
            return _show(_evaluate(tree.body, source))
    except RecursionError:
        raise ValueError("expression nested too deeply") from None
    except (decimal.InvalidOperation, decimal.Overflow):
        raise ValueError("the result is undefined or too large") from None


def _evaluate(node: ast.AST, source: str) -> int | Decimal:
    """The value of an expression node: ints stay exact ints, any decimal makes a Decimal."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = node.value if type(node.value) is int else Decimal(ast.get_source_segment(source, node) or "nan")
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        operand = _evaluate(node.operand, source)
        value = -operand if isinstance(node.op, ast.USub) else operand
    elif isinstance(node, ast.BinOp) and isinstance(node.op, _OPERATORS):
        value = _apply(node.op, _evaluate(node.left, source), _evaluate(node.right, source))
    else:
        raise ValueError(f"not allowed in arithmetic: {ast.get_source_segment(source, node) or type(node).__name__}")
    if _digits(value) > _MAX_DIGITS:
        raise ValueError(f"a value over {_MAX_DIGITS} digits")
    return value


_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)


def _apply(op: ast.operator, a: int | Decimal, b: int | Decimal) -> int | Decimal:
    if type(op) in _EXACT:
        return _EXACT[type(op)](a, b)
    if b == 0:
        raise ZeroDivisionError("division by zero")
    if isinstance(op, ast.Div):
        return a // b if isinstance(a, int) and isinstance(b, int) and a % b == 0 else Decimal(a) / Decimal(b)
    if isinstance(a, int) and isinstance(b, int):
        return a // b if isinstance(op, ast.FloorDiv) else a % b
    # Decimal's // and % truncate toward zero; Python's (and the policy's) floor
    quotient, remainder = Decimal(a) // Decimal(b), Decimal(a) % Decimal(b)
    if remainder != 0 and (remainder < 0) != (b < 0):
        quotient, remainder = quotient - 1, remainder + b
    return quotient if isinstance(op, ast.FloorDiv) else remainder


def _power(base: int | Decimal, exponent: int | Decimal) -> int | Decimal:
    if isinstance(exponent, Decimal) and exponent == exponent.to_integral_value():
        exponent = int(exponent)
    if abs(exponent) > _MAX_EXPONENT:
        raise ValueError(f"an exponent over {_MAX_EXPONENT}")
    # log10|base| >= (digits - 1), so this refuses only results surely over the bound
    if base != 0 and (_digits(base) - 1) * abs(exponent) > _MAX_DIGITS:
        raise ValueError(f"a value over {_MAX_DIGITS} digits")
    if isinstance(base, int) and isinstance(exponent, int) and exponent >= 0:
        return base**exponent
    if base == 0 and exponent < 0:
        raise ZeroDivisionError("zero to a negative power")
    return Decimal(base) ** exponent


_EXACT = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Pow: _power}


def _digits(value: int | Decimal) -> int:
    """About how many digits ``value`` shows (an int's within one)."""
    if isinstance(value, int):
        return int(abs(value).bit_length() * _LOG10_2) + 1
    if not value.is_finite():
        return 0
    return abs(value.adjusted()) + len(value.as_tuple().digits)


def _show(value: int | Decimal) -> str:
    if isinstance(value, int):
        return str(Decimal(value))  # exact; str(int) refuses over 4300 digits
    value = value.normalize()
    return "0" if value == 0 else format(value, "f")
