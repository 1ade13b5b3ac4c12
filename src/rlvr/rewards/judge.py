"""A judge reward: a model behind any OpenAI-compatible endpoint grades each completion.

    rewards:
      functions:
        - function: rlvr.rewards.judge:judge
          options: {base_url: "http://127.0.0.1:8000/v1", model: grader, scale: 10}

Each completion becomes one chat request: ``template`` filled with ``{prompt}`` (a chat
prompt as "role: content" lines), ``{completion}`` (its text) and any data column by name
(``{answer}``), each value cut to ``max_chars`` characters before it is sent. The reply is
read as a score: with ``verdicts`` (``{"CORRECT": 1, "INCORRECT": 0}``) the verdict it
names (the longest first, whole words, any case); else its first number divided by
``scale`` (a number outside ``[0, scale]`` is no score). A reply without a score, an error
or a request past ``timeout`` seconds abstains (None); when every request of a call
fails, the call raises with the first failure, which the reward runner logs.

At most ``concurrency`` requests of a call are in flight at once (a reward with a
``timeout`` runs in worker processes: each of its calls has its own). Replies are cached by the whole
request (endpoint, model, settings, system and user text), ``CACHE_SIZE`` at most, so a
completion sampled twice, or graded again at evaluation, costs one request. The key is
read from ``api_key``, else from the environment variable ``api_key_env`` (a local server
takes any). Each score is a ``Judged`` float carrying the judge's reply as its ``note``.
``base_url: reference`` asks the model the run starts from, frozen, served by the run
itself (``rlvr.config.compose.serve_reference``).

Needs the ``openai`` client (the ``agents`` extra: ``pip install 'rlvr[agents]'``).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
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
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_cache: collections.OrderedDict[tuple, str] = collections.OrderedDict()
_cache_lock = threading.Lock()


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
    """Each completion's score from the judge at ``base_url`` (see the module docstring)."""
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
    """The score in a judge's ``reply`` (see the module docstring), None where it has none."""
    if verdicts:
        for verdict in sorted(verdicts, key=len, reverse=True):
            if re.search(rf"(?<!\w){re.escape(verdict)}(?!\w)", reply, flags=re.IGNORECASE):
                return Judged(float(verdicts[verdict]), reply)
        return None
    numbers = _NUMBER.findall(reply)
    if not numbers:
        return None
    value = float(numbers[0])  # "8/10", "8 out of 10": the score comes first
    return Judged(value / scale, reply) if 0 <= value <= scale else None


def _template_fields(template: str) -> set[str]:
    try:
        return {name for _, name, _, _ in string.Formatter().parse(template) if name}
    except ValueError as err:
        raise ValueError(f"judge: the template is not a format string: {err}") from None


def _text(value: Any, max_chars: int) -> str:
    """A prompt, completion or column as the judge reads it, at most ``max_chars`` characters:
    a chat (messages) as "role: content" lines, a one-message completion as its content."""
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        if len(value) == 1 and value[0].get("role") == "assistant":
            value = value[0].get("content", "")
        else:
            value = "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in value)
    text = value if isinstance(value, str) else str(value)
    return text[:max_chars]


def _replies(requests: list[str], settings: tuple, api_key: str, concurrency: int, timeout: float
             ) -> list[str | BaseException]:
    """Each request's reply text (or the exception it failed with), cached ones without a request."""
    keys = [(*settings, text) for text in requests]
    with _cache_lock:
        replies: list[Any] = [_cache.get(key) for key in keys]
        for key, reply in zip(keys, replies):
            if reply is not None:
                _cache.move_to_end(key)  # recently used
    todo = [i for i, reply in enumerate(replies) if reply is None]
    first = {}  # each distinct request once: key -> the first completion that asks it
    for i in todo:
        first.setdefault(keys[i], i)
    if first:
        coroutine = _ask([requests[i] for i in first.values()], settings, api_key, concurrency, timeout)
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlvr-judge") as pool:
            asked = dict(zip(first, pool.submit(asyncio.run, coroutine).result()))  # its own event loop
        with _cache_lock:
            for key, reply in asked.items():
                if isinstance(reply, str):
                    _cache[key] = reply
                    _cache.move_to_end(key)
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
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
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0) as client:

        async def one(text: str) -> str:
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user",
                                                                                      "content": text}]
            async with gate:
                reply = await asyncio.wait_for(client.chat.completions.create(
                    model=model, messages=messages, max_tokens=max_tokens, temperature=temperature), timeout)
            return reply.choices[0].message.content or ""

        return await asyncio.gather(*(one(text) for text in requests), return_exceptions=True)
