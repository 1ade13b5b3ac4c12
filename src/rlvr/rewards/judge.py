"""A judge reward: a model behind any OpenAI-compatible endpoint grades each completion.

Each completion is one chat request (``template`` filled with its prompt, its text and data columns), whose reply is
read in a declared format (``score``: a score over ``scale``, or ``verdicts``); that completion abstains where the
reply follows none, fails, is late or is too large. Replies are cached by the whole request. The options, the
formats and the limits: docs/how-to/python-api.md. Needs the ``openai`` client (the ``agents`` extra).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import hashlib
import json
import math
import os
import re
import string
import threading
from collections.abc import Sequence
from typing import Any

DEFAULT_TEMPLATE = (
    "Grade this response to the request below.\n\nRequest:\n{prompt}\n\nResponse:\n{completion}\n\n"
    "Reply with one number from 0 (wrong or unhelpful) to 10 (fully correct and helpful), and nothing else."
)
CACHE_SIZE = 10_000  # replies kept, least recently used dropped
CACHE_CHARS = 1 << 25  # characters of replies kept, likewise
MAX_REPLY_BYTES = 1 << 20  # of a reply's HTTP body: a larger one is never read past this
ERROR_BYTES = 4096  # of an error reply's body (a status but 2xx): its message is read from these alone
_NUMBER = r"[-+]?\d+(?:\.\d+)?"
_OUT_OF = rf"(?P<value>{_NUMBER})(?:[ \t]*(?:/|out of)[ \t]*(?P<scale>{_NUMBER}))?(?!\w|\.\d)"
_SCORE_LABEL = re.compile(rf"(?<![\w-])score[*_ \t]*[:=][*_ \t]*{_OUT_OF}", re.IGNORECASE)
_BARE_SCORE = re.compile(_OUT_OF, re.IGNORECASE)
_VERDICT_LABEL = re.compile(r"(?<![\w-])verdict[*_ \t]*[:=](?P<verdict>[^\n]*)", re.IGNORECASE)
_DECORATION = "*_`'\" \t\r\n.!"  # around a verdict or a number alone: markdown, quotes, a closing stop


class JudgeReplyError(ValueError):
    """A reply with an error status (any but 2xx, a redirect too): its status and message."""


class Judged(float):
    """A judge's score, with the judge's reply (the text it was read from) as its ``note``."""

    note: str

    def __new__(cls, value: float, note: str) -> Judged:
        judged = super().__new__(cls, value)
        judged.note = note
        return judged

    def __reduce__(self) -> tuple:
        return Judged, (float(self), self.note)


def judge(prompts: Sequence[Any], completions: Sequence[Any], *, base_url: str, model: str,
          template: str = DEFAULT_TEMPLATE, system: str | None = None, scale: float = 10.0,
          verdicts: dict[str, float] | None = None, api_key: str | None = None, api_key_env: str = "OPENAI_API_KEY",
          concurrency: int = 8, timeout: float = 30.0, max_tokens: int = 16, temperature: float = 0.0,
          max_chars: int = 8000, **columns: Any) -> list[Judged | None]:
    """Each completion's score from the judge at ``base_url`` (docs/how-to/python-api.md)."""
    if concurrency < 1 or timeout <= 0 or max_chars < 1 or scale <= 0:
        raise ValueError(f"judge: concurrency {concurrency}, timeout {timeout}, max_chars {max_chars} and scale "
                         f"{scale} must be positive")
    fields = _template_fields(template)
    missing = sorted(fields - {"prompt", "completion"} - columns.keys())
    if missing:
        raise ValueError(f"judge: the template names {missing}, which are neither prompt, completion nor a data "
                         f"column ({', '.join(sorted(columns)) or 'none'})")
    requests = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        values = {"prompt": _text(prompt, max_chars), "completion": _text(completion, max_chars),
                  **{name: _text(columns[name][i], max_chars) for name in fields if name in columns}}
        requests.append(template.format_map(values))
    settings = (base_url, model, system, max_tokens, temperature)
    replies = _replies(requests, settings, api_key if api_key is not None else os.environ.get(api_key_env, "none"),
                       concurrency, timeout)
    failed = [reply for reply in replies if isinstance(reply, BaseException)]
    if failed and len(failed) == len(replies):
        raise RuntimeError(f"judge at {base_url}: all {len(replies)} requests failed; the first: "
                           f"{type(failed[0]).__name__}: {failed[0]}") from failed[0]
    return [None if isinstance(reply, BaseException) else score(reply, scale, verdicts) for reply in replies]


def score(reply: str, scale: float = 10.0, verdicts: dict[str, float] | None = None) -> Judged | None:
    """The score in a judge's ``reply`` read in its declared format, None where the reply follows none: with
    ``verdicts``, a JSON object's "verdict", the last ``Verdict: WORD`` ending its line, or the verdict alone; else
    the last ``Score: N`` (``N/scale``), a JSON object's "score", or a number alone, over ``scale``."""
    found = _json_object(reply)
    if verdicts:
        table = {name.casefold(): float(value) for name, value in verdicts.items()}
        if found is not None:
            verdict = found.get("verdict")
        else:
            labelled = _VERDICT_LABEL.findall(reply)
            verdict = labelled[-1] if labelled else reply
        verdict = verdict.strip(_DECORATION).casefold() if isinstance(verdict, str) else None
        return Judged(table[verdict], reply) if verdict in table else None
    if found is not None:
        value = found.get("score")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        value, out_of = float(value), None
    else:
        labelled = list(_SCORE_LABEL.finditer(reply))
        match = labelled[-1] if labelled else _BARE_SCORE.fullmatch(reply.strip(_DECORATION))
        if match is None:
            return None
        value, out_of = float(match["value"]), match["scale"]
    if out_of is not None and float(out_of) != scale:  # a grade on another scale than the one asked for
        return None
    return Judged(value / scale, reply) if math.isfinite(value) and 0 <= value <= scale else None


def _json_object(reply: str) -> dict | None:
    """The reply as a JSON object (alone, or alone in a code fence), else None."""
    text = reply.strip()
    if len(text) >= 6 and text.startswith("```") and text.endswith("```"):
        text = text[3:-3].removeprefix("json").strip()
    if not text.startswith("{"):
        return None
    try:
        found = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return None
    return found if isinstance(found, dict) else None


def _template_fields(template: str) -> set[str]:
    try:
        return {name for _, name, _, _ in string.Formatter().parse(template) if name}
    except ValueError as err:
        raise ValueError(f"judge: the template is not a format string: {err}") from None


def _text(value: Any, max_chars: int) -> str:
    """A prompt, completion or column as the judge reads it, at most ``max_chars`` characters: a chat as
    "role: content" lines, a one-message completion as its content."""
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        if len(value) == 1 and value[0].get("role") == "assistant":
            value = value[0].get("content", "")
        else:
            value = "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in value)
    text = value if isinstance(value, str) else str(value)
    return text[:max_chars]


class _ReplyCache:
    """Replies by request, least recently used dropped past CACHE_SIZE or CACHE_CHARS; shared by a process's threads."""

    def __init__(self) -> None:
        self._replies: collections.OrderedDict[tuple, str] = collections.OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, key: tuple) -> str | None:
        with self._lock:
            reply = self._replies.get(key)
            if reply is not None:
                self._replies.move_to_end(key)  # recently used
            return reply

    def put(self, key: tuple, reply: str) -> None:
        with self._lock:
            self._chars += len(reply) - len(self._replies.pop(key, ""))
            self._replies[key] = reply
            while self._replies and (len(self._replies) > CACHE_SIZE or self._chars > CACHE_CHARS):
                self._chars -= len(self._replies.popitem(last=False)[1])

    def replies(self) -> list[str]:
        with self._lock:
            return list(self._replies.values())

    def clear(self) -> None:
        with self._lock:
            self._replies.clear()
            self._chars = 0


_cache = _ReplyCache()


def _replies(requests: list[str], settings: tuple, api_key: str, concurrency: int, timeout: float
             ) -> list[str | BaseException]:
    """Each request's reply text (or the exception it failed with), cached ones without a request."""
    endpoint_key = hashlib.sha256(api_key.encode()).hexdigest()  # the key itself is kept nowhere
    keys = [(*settings, endpoint_key, text) for text in requests]
    replies: list[Any] = [_cache.get(key) for key in keys]
    todo = [i for i, reply in enumerate(replies) if reply is None]
    first = {}  # each distinct request once: key -> the first completion that asks it
    for i in todo:
        first.setdefault(keys[i], i)
    if first:
        coroutine = _ask([requests[i] for i in first.values()], settings, api_key, concurrency, timeout)
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlvr-judge") as pool:
            asked = dict(zip(first, pool.submit(asyncio.run, coroutine).result()))  # its own event loop
        for key, reply in asked.items():
            if isinstance(reply, str):
                _cache.put(key, reply)
        for i in todo:
            replies[i] = asked[keys[i]]
    return replies


async def _ask(requests: list[str], settings: tuple, api_key: str, concurrency: int, timeout: float
               ) -> list[str | BaseException]:
    try:
        import openai
    except ImportError as err:
        raise ImportError("rlvr.rewards.judge needs the openai client: pip install 'rlvr[agents]'") from err
    base_url, model, system, max_tokens, temperature = settings
    gate = asyncio.Semaphore(concurrency)
    # an error reply is refused on its headers: the client would read its body whole to make its error
    http = openai.DefaultAsyncHttpxClient(follow_redirects=False, event_hooks={"response": [_refuse_errors]})
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0,
                                  http_client=http) as client:

        async def one(text: str) -> str:
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user",
                                                                                      "content": text}]
            async with gate:
                # the body is read here, within MAX_REPLY_BYTES, not by the client, which reads it whole
                create = client.chat.completions.with_streaming_response.create(
                    model=model, messages=messages, max_tokens=max_tokens, temperature=temperature,
                    extra_headers={"Accept-Encoding": "identity"})  # a compressed body's size says nothing
                try:
                    return _content(await asyncio.wait_for(_body(create), timeout))
                except openai.APIConnectionError as err:  # a client that wraps what the hook raised
                    if isinstance(err.__cause__, JudgeReplyError):
                        raise err.__cause__ from None
                    raise

        return await asyncio.gather(*(one(text) for text in requests), return_exceptions=True)


async def _body(create: Any) -> bytes:
    """The HTTP body of a streamed ``create``, refused past MAX_REPLY_BYTES (or compressed)."""
    async with create as response:
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            raise ValueError(f"the judge's reply is compressed ({encoding}); it was asked for none")
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > MAX_REPLY_BYTES:
            raise ValueError(f"the judge's reply is {length} bytes, over {MAX_REPLY_BYTES} bytes")
        body = bytearray()
        async for chunk in response.iter_bytes():
            body += chunk
            if len(body) > MAX_REPLY_BYTES:
                raise ValueError(f"the judge's reply runs over {MAX_REPLY_BYTES} bytes")
        return bytes(body)


async def _refuse_errors(response: Any) -> None:
    """JudgeReplyError for a reply with an error status, its message read from the first ERROR_BYTES of its body."""
    if 200 <= response.status_code < 300:
        return
    head = bytearray()
    async for chunk in response.aiter_raw():
        head += chunk
        if len(head) >= ERROR_BYTES:
            break
    await response.aclose()
    text = bytes(head[:ERROR_BYTES]).decode("utf-8", "replace")
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, RecursionError, LookupError, TypeError):
        message = text
    message = message if isinstance(message, str) else json.dumps(message)
    raise JudgeReplyError(f"the judge answered {response.status_code}: {' '.join(message.split())[:200]}")


def _content(body: bytes) -> str:
    """The text of a chat completion's first choice; ValueError naming what is wrong when the body is none."""
    try:
        reply = json.loads(body)
        content = reply["choices"][0]["message"]["content"]
    except (ValueError, RecursionError, LookupError, TypeError) as err:
        raise ValueError(f"the judge's reply is no chat completion ({type(err).__name__}: {err})"[:300]) from None
    if content is None:
        return ""
    if not isinstance(content, str):
        raise ValueError(f"the judge's reply content is a {type(content).__name__}, not text")
    return content
