"""OpenAI-style chat requests as the policy reads them, and its completions as the agent reads them back
(docs/explanation/agents.md)."""

from __future__ import annotations

import json
import re
import secrets
import time
from typing import Any

from rlvr.environments.tool_parsing import parse_tool_calls

ROLES = ("system", "user", "assistant", "tool")
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
# a call's block as rlvr.environments.tool_parsing reads it: a last one may be cut at a stop string
_CALL_BLOCK = re.compile(f"{re.escape(CALL_OPEN)}.*?(?:{re.escape(CALL_CLOSE)}|$)", re.DOTALL)
MAX_CHOICES = 16
MAX_STOPS = 4


class RequestError(Exception):
    """A request the endpoint refuses: the HTTP status, the message, and OpenAI's error ``type`` and ``code``."""

    def __init__(self, status: int, message: str, code: str | None = None, kind: str = "invalid_request_error",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.kind, self.param = status, message, code, kind, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def messages(value: Any) -> list[dict[str, str]]:
    """The request's ``messages`` as {"role", "content"} dicts with string content (tool calls written into an
    assistant's text, a tool message's name kept); RequestError naming the first bad message."""
    if not isinstance(value, list) or not value:
        raise RequestError(400, "'messages' must be a non-empty list of messages", param="messages")
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestError(400, f"{where} must be an object", param=where)
        role = message.get("role")
        if role not in ROLES:
            raise RequestError(400, f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", param=where)
        text = _content(message.get("content"), where)
        if role == "assistant" and message.get("tool_calls"):
            text += "".join(_call_text(call, f"{where}.tool_calls[{k}]")
                            for k, call in enumerate(_list(message["tool_calls"], f"{where}.tool_calls")))
        normal = {"role": role, "content": text}
        if role == "tool" and isinstance(message.get("name"), str):
            normal["name"] = message["name"]
        out.append(normal)
    return out


def tool_names(tools: Any) -> list[str]:
    """The function names of a request's ``tools``; RequestError on a malformed one."""
    names = []
    for k, tool in enumerate(_list(tools, "tools") if tools is not None else []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise RequestError(400, f"tools[{k}] must be {{'type': 'function', 'function': {{'name': ...}}}}",
                               param=f"tools[{k}]")
        names.append(function["name"])
    return names


def reply(text: str, names: list[str], call_id: str) -> tuple[dict[str, Any], str | None]:
    """The assistant message a completion's ``text`` becomes and "tool_calls" when it calls any of the request's
    tools (ids ``call_id`` + k), else None. The content is the text outside the calls (None where blank)."""
    calls, outside, start = [], [], 0
    for block in _CALL_BLOCK.finditer(text) if names else ():
        found, _ = parse_tool_calls(block.group(), "json", names)
        if found:  # a malformed call, or one of no tool of the request's, stays in the content
            calls += found
            outside.append(text[start:block.start()])
            start = block.end()
    if not calls:
        return {"role": "assistant", "content": text}, None
    content = "".join([*outside, text[start:]]).strip() or None
    tool_calls = [{"id": f"{call_id}{k}", "type": "function",
                   "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
                  for k, call in enumerate(calls)]
    return {"role": "assistant", "content": content, "tool_calls": tool_calls}, "tool_calls"


def reply_key(message: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """What identifies a served assistant message the agent sends back: the whole message normalised and its tool
    calls' ids. A call whose arguments the agent edited is another message, whatever its id."""
    calls = message.get("tool_calls") or []
    ids = tuple(str(call.get("id")) for call in calls if isinstance(call, dict))
    return messages([message])[0]["content"], ids


def _content(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: text only
        parts = []
        for k, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(400, f"{where}.content[{k}]: only text parts are supported", param=where)
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(400, f"{where}.content must be a string or a list of text parts", param=where)


def _call_text(call: Any, where: str) -> str:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RequestError(400, f"{where} must be {{'function': {{'name': ..., 'arguments': ...}}}}", param=where)
    arguments = function.get("arguments") or "{}"
    try:
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        raise RequestError(400, f"{where}.function.arguments is not valid JSON", param=where) from None
    return f"{CALL_OPEN}{json.dumps({'name': function['name'], 'arguments': arguments})}{CALL_CLOSE}"


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise RequestError(400, f"'{where}' must be a list", param=where)
    return value


def n_choices(body: dict[str, Any]) -> int:
    n = body.get("n", 1)
    if n is None:
        return 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_CHOICES:
        raise RequestError(400, f"'n' must be an integer from 1 to {MAX_CHOICES}, got {n!r}", param="n")
    return n


def stops(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise RequestError(400, f"'stop' must be a non-empty string or a list of at most {MAX_STOPS}",
                           param="stop")
    return tuple(stops)


def temperature(body: dict[str, Any]) -> float:
    value = body.get("temperature", 0.0)
    value = 0.0 if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 2:
        raise RequestError(400, f"'temperature' must be a number from 0 to 2, got {value!r:.40}", param="temperature")
    return float(value)


def seed(body: dict[str, Any]) -> int:
    value = body.get("seed", 0)
    value = 0 if value is None else value
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"'seed' must be an integer, got {value!r:.40}", param="seed")
    return value


def max_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise RequestError(400, f"'max_tokens' must be a positive integer, got {value!r}", param="max_tokens")
    return value


def without_stop(text: str, stop: tuple[str, ...]) -> str:
    """``text`` without the request's stop string it ends with (OpenAI leaves it out)."""
    for s in stop:
        if text.endswith(s):
            return text[:-len(s)]
    return text


def response(kind: str, model: str, choices: list, prompt_ids: list[int], outcomes: list) -> dict[str, Any]:
    completion = sum(len(o[0]) for o in outcomes)
    return {"id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{secrets.token_hex(8)}", "object": kind,
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": completion,
                      "total_tokens": len(prompt_ids) + completion}}
