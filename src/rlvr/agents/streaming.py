"""A finished reply sent as an OpenAI-style stream (``"stream": true``), for agents that read one.

The endpoint samples a call whole (its batch is one engine call), so a streamed reply is the same reply cut into
server-sent events: per choice, a first chunk with the role, the whole text and the tool calls, and a last with its
finish reason; then, when ``stream_options.include_usage`` asks for it, a chunk with no choices and the usage; then
``data: [DONE]``. What is recorded for training does not depend on how it was sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from rlvr.agents.chat import RequestError


def streamed(body: dict[str, Any]) -> tuple[bool, bool]:
    """Whether the request asks for a stream, and for the usage chunk at its end."""
    stream = False if body.get("stream") is None else body["stream"]
    if not isinstance(stream, bool):
        raise RequestError(400, f"'stream' must be true or false, got {stream!r:.40}", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError(400, "'stream_options' must be an object", param="stream_options")
    return stream, bool(stream and options.get("include_usage"))


def events(response: dict[str, Any], include_usage: bool) -> Iterator[bytes]:
    """``response`` (a chat.completion or text_completion object) as server-sent events."""
    chat = response["object"] == "chat.completion"
    head = {key: response[key] for key in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk" if chat else "text_completion"
    for choice in response["choices"]:
        if chat:
            delta = {key: value for key, value in choice["message"].items() if value is not None}
            if "tool_calls" in delta:
                delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(delta["tool_calls"])]
            first = {"index": choice["index"], "delta": delta, "logprobs": choice["logprobs"], "finish_reason": None}
            last = {"index": choice["index"], "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"]}
        else:
            first = {**choice, "finish_reason": None}
            last = {"index": choice["index"], "text": "", "logprobs": None, "finish_reason": choice["finish_reason"]}
        yield _event({**head, "choices": [first]})
        yield _event({**head, "choices": [last]})
    if include_usage:
        yield _event({**head, "choices": [], "usage": response["usage"]})
    yield b"data: [DONE]\n\n"


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"
