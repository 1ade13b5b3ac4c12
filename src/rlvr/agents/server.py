"""The policy served over HTTP during rollouts, recording every token it samples.

An OpenAI-compatible endpoint on loopback (Starlette on uvicorn, in a thread of the
trainer's process) over the run's own engine. Every episode has its base URL,
``http://127.0.0.1:PORT/episodes/<id>/v1``, which its agent is given with the run's API
key; under it:

    POST /chat/completions   messages, tools, n, temperature, max_tokens /
                             max_completion_tokens, stop, logprobs, stream
    POST /completions        prompt (text), n, max_tokens, stop, logprobs, stream
    GET  /models

Requests of every live episode that arrive together are sampled in one engine call
(``_Batcher``, a thread that owns the engine while rollouts run). A request renders its
prompt with the model's chat template, except a follow-up: when the request's last
assistant message is one this endpoint served (its content and tool call ids) after the
same earlier messages, the prompt is that call's prompt and completion ids (its
end-of-turn token added when it was cut at ``max_tokens``), then the ids of what the
template adds for the new messages (``rlvr.policies.chat_check.render_delta``), so
the calls join into one sequence (``rlvr.agents.calls``) with the tokens exactly as
sampled. Each call is recorded with its prompt ids, completion ids, sampler log-probs and
the engine's weights version.

The episode's sampling temperature is the run's (0 for held-out episodes), whatever the
request asks: the recorded log-probs must be the training temperature's. ``max_tokens``
is honoured up to the policy's ``max_new_tokens`` and the episode's token budget.

Refused, with OpenAI-style error JSON: an unknown or finished episode (404), a missing or
wrong API key (401), a body over ``max_body_bytes`` (413), a malformed body or message
(400), a prompt past the episode's budget or the model's positions (400,
``context_length_exceeded``). Nothing listens beyond loopback unless ``host`` says so.

With ``open_routes``, ``/v1/chat/completions`` and ``/v1/completions`` also answer requests
of no episode, each sampled at its own ``temperature`` (0 unless it says) and ``seed``:
the way a judge reward asks the run's frozen reference model (``rlvr.compose.serve_reference``).
The same app also listens on a Unix socket (``unix_socket``, in a private temporary
folder): the way in for agent commands jailed in a network namespace of their own
(``rlvr.agents.command``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import queue
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from rlvr.agents import chat, streaming
from rlvr.agents.calls import Call
from rlvr.agents.chat import RequestError
from rlvr.environments.tool_parsing import shown_tools

if TYPE_CHECKING:
    from rlvr.policies.causal_lm import CausalLMPolicy

Outcome = tuple[list[int], list[float], str, str]  # a completion: its ids, log-probs, text and finish reason
MAX_CHOICES = 16
MAX_STOPS = 4
POLL = 0.002  # seconds between the batcher's looks at the live episodes
GAP = 0.2  # seconds without a new request after which the batcher stops waiting for the rest


@dataclass
class _Served:
    """A call with what the agent sent and got back: the request's messages (normalised,
    before the tools' description), its tools, and the key of the reply it got."""

    call: Call
    messages: list[dict[str, str]] | None  # None: a /completions call
    tools: Any
    key: Any  # chat.reply_key of the reply; the prompt + completion text for /completions
    stop_cut: bool = False  # ended by a request's stop string, not the end-of-turn token


@dataclass
class AgentEpisode:
    """One episode's record: its calls in order, the first request's messages or text,
    whether a request ran past its token budget, and the seed its draws come from."""

    id: str
    seed: int
    temperature: float
    max_tokens: int
    served: list[_Served] = field(default_factory=list)
    prompt: Any = None
    first_prompt_length: int | None = None
    truncated: bool = False
    draws: int = 0  # completions asked for so far: the next one's index (its seed, its tool call ids)

    @property
    def calls(self) -> list[Call]:
        return [s.call for s in self.served]


@dataclass
class _Job:
    """One completion to sample: its prompt ids, its seed (None: greedy), the tokens it
    may draw, its stop strings; ``future`` gets (ids, log-probs, text, finish)."""

    episode: str
    prompt_ids: list[int]
    seed: int | None
    temperature: float
    max_new: int
    stop: tuple[str, ...]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class Endpoint:
    """The policy ``policy`` served on ``host``:``port`` (0: a free port) while started;
    episodes opened by ``open`` and read back by ``finish``."""

    def __init__(self, policy: CausalLMPolicy, host: str = "127.0.0.1", port: int = 0,
                 max_body_bytes: int = 1 << 20, batch_wait: float = 1.0, model_name: str = "rlvr-policy",
                 open_routes: bool = False) -> None:
        self.policy, self.host, self.port = policy, host, port
        self.max_body_bytes, self.model_name, self.open_routes = max_body_bytes, model_name, open_routes
        self.api_key = "rlvr-" + secrets.token_hex(16)
        self._episodes: dict[str, AgentEpisode] = {}
        self._lock = threading.Lock()
        self._arriving: set[int] = set()  # requests read but not yet queued for the engine (the server's thread)
        self._batcher = _Batcher(policy, batch_wait, lambda: len(self._episodes), lambda: len(self._arriving))
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.unix_socket: str | None = None  # its path while started

    # ---- life ---------------------------------------------------------------------

    def start(self) -> None:
        """Listen (once), on ``host``:``port`` and on ``unix_socket``; the port is known when
        this returns."""
        if self._server is not None:
            return
        import uvicorn

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        tcp = socket.create_server((self.host, self.port), family=family)
        # 0700: this user's alone; under /tmp, as a socket's path has room for about 100 characters
        self._folder = tempfile.TemporaryDirectory(prefix="rlvr-endpoint-",
                                                   dir="/tmp" if os.path.isdir("/tmp") else None)
        self.unix_socket = os.path.join(self._folder.name, "endpoint.sock")
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            unix.bind(self.unix_socket)
        except OSError:
            unix.close()
            tcp.close()
            self._folder.cleanup()
            raise
        self.port = tcp.getsockname()[1]
        config = uvicorn.Config(self.app(), log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [tcp, unix]},
                                        name="rlvr-endpoint", daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the agent endpoint could not listen on {self.host}:{self.port}")
            time.sleep(0.005)
        self._batcher.start()

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = None
            self._folder.cleanup()
        self._batcher.stop()

    def url(self, episode_id: str) -> str:
        """The base URL an episode's agent is given."""
        return f"http://{self.host}:{self.port}/episodes/{episode_id}/v1"

    # ---- episodes -----------------------------------------------------------------

    def open(self, seed: int, temperature: float, max_tokens: int) -> str:
        """A new live episode: its id. Its draws come from ``seed``; ``max_tokens``: the
        tokens after its first prompt it may use, sampled and appended."""
        episode = AgentEpisode(secrets.token_hex(8), seed, temperature, max_tokens)
        with self._lock:
            self._episodes[episode.id] = episode
        return episode.id

    def finish(self, episode_id: str) -> AgentEpisode:
        """The episode's record; later requests to it are refused (404)."""
        with self._lock:
            return self._episodes.pop(episode_id)

    def _live(self, episode_id: str) -> AgentEpisode:
        with self._lock:
            episode = self._episodes.get(episode_id)
        if episode is None:
            raise RequestError(404, f"no live episode {episode_id!r}: requests belong to an episode while its "
                                    "agent runs", code="episode_not_found")
        return episode

    # ---- HTTP ---------------------------------------------------------------------

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route

        def error(err: RequestError) -> JSONResponse:
            return JSONResponse(err.body(), status_code=err.status)

        async def refused(request: Any, exc: Exception) -> JSONResponse:
            if isinstance(exc, RequestError):
                return error(exc)
            if isinstance(exc, HTTPException):
                return error(RequestError(exc.status_code, str(exc.detail), kind="invalid_request_error"))
            return error(RequestError(500, f"{type(exc).__name__}: {exc}", kind="server_error"))

        def reply(response: dict[str, Any], stream: bool, usage: bool) -> Any:
            if not stream:
                return JSONResponse(response)
            return StreamingResponse(streaming.events(response, usage), media_type="text/event-stream")

        async def models(request: Any) -> JSONResponse:
            self._authorised(request)
            return JSONResponse({"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                                             "owned_by": "rlvr"}]})

        async def chat_completions(request: Any) -> JSONResponse:
            self._authorised(request)
            episode = self._live(request.path_params["episode"])
            with self._arrival(request):
                body = await self._body(request)
                stream = streaming.streamed(body)  # checked before anything is sampled
                return reply(await self._chat(episode, body, id(request)), *stream)

        async def completions(request: Any) -> JSONResponse:
            self._authorised(request)
            episode = self._live(request.path_params["episode"])
            with self._arrival(request):
                body = await self._body(request)
                stream = streaming.streamed(body)  # checked before anything is sampled
                return reply(await self._completion(episode, body, id(request)), *stream)

        async def open_call(request: Any) -> Any:
            """A request of no episode (``open_routes``): an episode of its own, at the request's
            temperature (0 unless it says) and seed, over when it is answered."""
            self._authorised(request)
            body = await self._body(request)
            stream = streaming.streamed(body)
            episode_id = self.open(_seed(body), _temperature(body), self.policy.max_positions or 2**20)
            call = self._chat if request.url.path.endswith("/chat/completions") else self._completion
            try:
                with self._arrival(request):
                    response = await call(self._live(episode_id), body, id(request))
            finally:
                self.finish(episode_id)
            return reply(response, *stream)

        open_routes = [Route("/v1/chat/completions", open_call, methods=["POST"]),
                       Route("/v1/completions", open_call, methods=["POST"])] if self.open_routes else []
        routes = [
            *open_routes,
            Route("/v1/models", models),
            Route("/episodes/{episode}/v1/models", models),
            Route("/episodes/{episode}/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/episodes/{episode}/v1/completions", completions, methods=["POST"]),
        ]
        return Starlette(routes=routes, exception_handlers={Exception: refused, HTTPException: refused,
                                                            RequestError: refused})

    @contextlib.contextmanager
    def _arrival(self, request: Any) -> Iterator[None]:
        """The request counts as arriving (the batcher waits for it) until its jobs are queued
        (``_sample``) or it fails."""
        self._arriving.add(id(request))
        try:
            yield
        finally:
            self._arriving.discard(id(request))

    def _authorised(self, request: Any) -> None:
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
            raise RequestError(401, "missing or wrong API key (the one the episode's agent was given)",
                               code="invalid_api_key", kind="authentication_error")

    async def _body(self, request: Any) -> dict[str, Any]:
        """The request's JSON object, read no further than ``max_body_bytes``."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise RequestError(413, f"request body of {declared} bytes, more than {self.max_body_bytes}",
                               code="request_too_large")
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > self.max_body_bytes:
                raise RequestError(413, f"request body more than {self.max_body_bytes} bytes",
                                   code="request_too_large")
        try:
            body = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
            raise RequestError(400, f"the body is not valid JSON: {err}") from None
        if not isinstance(body, dict):
            raise RequestError(400, "the body must be a JSON object")
        return body

    # ---- the calls ----------------------------------------------------------------

    async def _chat(self, episode: AgentEpisode, body: dict[str, Any], arrival: int = 0) -> dict[str, Any]:
        if not getattr(self.policy.tokenizer, "chat_template", None):
            raise RequestError(400, "the policy's tokenizer has no chat template: use /completions with text")
        raw = body.get("messages")
        plain = chat.messages(raw)
        tools = body.get("tools")
        names = chat.tool_names(tools)
        n, stop, logprobs = _choices(body), _stops(body), bool(body.get("logprobs"))
        requested = _max_tokens(body)
        prompt_ids = self._chat_prompt(episode, raw, plain, tools)
        first, outcomes = await self._sample(episode, prompt_ids, n, requested, stop, arrival)
        choices = []
        for k, (ids, log_probs, text, finish) in enumerate(outcomes):
            shown = _without_stop(text, stop) if finish == "stop" else text
            message, called = chat.reply(shown, names, f"call_{first + k}_")
            call = Call(prompt_ids, ids, log_probs, text, finish, self.policy.engine.weights_version)
            episode.served.append(_Served(call, plain, tools, chat.reply_key(message), shown != text))
            choice = {"index": k, "message": message, "finish_reason": called or finish, "logprobs": None}
            if logprobs:
                choice["logprobs"] = {"content": [{"token": self._token(i), "logprob": lp, "bytes": None,
                                                   "top_logprobs": []} for i, lp in zip(ids, log_probs)]}
            choices.append(choice)
        if episode.prompt is None:
            episode.prompt = plain
        return _response("chat.completion", self.model_name, choices, prompt_ids, outcomes)

    async def _completion(self, episode: AgentEpisode, body: dict[str, Any], arrival: int = 0) -> dict[str, Any]:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise RequestError(400, "'prompt' must be a non-empty string", param="prompt")
        n, stop, logprobs = _choices(body), _stops(body), body.get("logprobs") is not None
        requested = _max_tokens(body)
        prompt_ids = self._text_prompt(episode, prompt)
        _, outcomes = await self._sample(episode, prompt_ids, n, requested, stop, arrival)
        choices = []
        for k, (ids, log_probs, text, finish) in enumerate(outcomes):
            shown = _without_stop(text, stop) if finish == "stop" else text
            call = Call(prompt_ids, ids, log_probs, text, finish, self.policy.engine.weights_version)
            episode.served.append(_Served(call, None, None, prompt + shown, shown != text))
            choice = {"index": k, "text": shown, "finish_reason": finish, "logprobs": None}
            if logprobs:
                choice["logprobs"] = {"tokens": [self._token(i) for i in ids], "token_logprobs": log_probs,
                                      "top_logprobs": None, "text_offset": None}
            choices.append(choice)
        if episode.prompt is None:
            episode.prompt = prompt
        return _response("text_completion", self.model_name, choices, prompt_ids, outcomes)

    def _token(self, token_id: int) -> str:
        return self.policy.tokenizer.decode([token_id])

    def _chat_prompt(self, episode: AgentEpisode, raw: list, plain: list[dict[str, str]], tools: Any) -> list[int]:
        """The prompt's ids: a follow-up's from the recorded call it follows, else the
        whole conversation rendered (see the module docstring)."""
        from rlvr.policies import turns
        from rlvr.policies.chat_check import ChatTemplateMismatch

        last = max((j for j, m in enumerate(plain) if m["role"] == "assistant"), default=None)
        follows = None
        if last is not None and last + 1 < len(plain):
            key = chat.reply_key(raw[last])
            follows = next((s for s in reversed(episode.served) if s.messages is not None and s.key == key
                            and s.messages == plain[:last] and s.tools == tools), None)
        template = self.policy.tokenizer.get_chat_template()
        if follows is not None:
            history, template_tools = shown_tools(
                template, [*plain[:last], {"role": "assistant", "content": follows.call.text}], tools or [], "json")
            room = self._room(episode, len(follows.call.prompt_ids) + len(follows.call.completion_ids))
            try:
                _, ids = turns.observation_ids(self.policy, history, plain[last + 1:], room, template_tools)
            except ChatTemplateMismatch:  # the template renders the turns differently whole: rendered whole
                ids = None
                follows = None
            if follows is not None and ids is None:
                raise RequestError(400, "the new messages are longer than the episode's token budget or the "
                                        "model's positions leave room for", code="context_length_exceeded")
            if follows is not None:
                return [*follows.call.prompt_ids, *follows.call.completion_ids,
                        *turns.end_of_turn_ids(self.policy, follows.call.completion_ids), *ids]
        return self._encoded(*shown_tools(template, plain, tools or [], "json"))

    def _text_prompt(self, episode: AgentEpisode, prompt: str) -> list[int]:
        """A text prompt's ids: a follow-up (the prompt starts with a served call's prompt and
        completion text) from that call's ids, else the text encoded."""
        follows = next((s for s in reversed(episode.served) if s.messages is None and prompt.startswith(s.key)
                        and len(prompt) > len(s.key) and not s.stop_cut), None)
        if follows is None:
            return self._encoded(prompt)
        from rlvr.policies import turns

        room = self._room(episode, len(follows.call.prompt_ids) + len(follows.call.completion_ids))
        _, ids = turns.observation_ids(self.policy, [], prompt[len(follows.key):], room)
        if ids is None:
            raise RequestError(400, "the prompt runs past the episode's token budget", code="context_length_exceeded")
        return [*follows.call.prompt_ids, *follows.call.completion_ids, *ids]

    def _encoded(self, prompt: Any, tools: list[dict] | None = None) -> list[int]:
        from rlvr.errors import PromptError
        from rlvr.policies.prompts import prompt_token_ids

        policy = self.policy
        try:
            return prompt_token_ids(policy.tokenizer, [prompt], policy.add_special_tokens if isinstance(prompt, str)
                                    else False, 1, policy.max_positions, "request prompt", tools=tools)[0]
        except PromptError as err:
            raise RequestError(400, str(err), code="context_length_exceeded") from None

    def _room(self, episode: AgentEpisode, used: int) -> int:
        start = episode.first_prompt_length if episode.first_prompt_length is not None else used
        return max(0, episode.max_tokens - (used - start))

    async def _sample(self, episode: AgentEpisode, prompt_ids: list[int], n: int, requested: int | None,
                      stop: tuple[str, ...], arrival: int = 0) -> tuple[int, list[Outcome]]:
        """n completions of ``prompt_ids``, within the episode's budget and the model's positions,
        and the index of the first (the episode's completions counted in order)."""
        policy = self.policy
        if episode.first_prompt_length is None:
            episode.first_prompt_length = len(prompt_ids)
        max_new = min(requested or policy.sampling.max_new_tokens, policy.sampling.max_new_tokens,
                      self._room(episode, len(prompt_ids)))
        if policy.max_positions is not None:
            max_new = min(max_new, policy.max_positions - len(prompt_ids))
        if max_new < 1:
            episode.truncated = True
            raise RequestError(400, f"the episode has used its token budget ({episode.max_tokens} tokens after its "
                                    "first prompt, task.options.max_tokens) or the model's positions",
                               code="context_length_exceeded")
        first, episode.draws = episode.draws, episode.draws + n
        if episode.temperature > 0:
            seeds = [call_seed(episode.seed, first + k) for k in range(n)]
            jobs = [_Job(episode.id, prompt_ids, seed, episode.temperature, max_new, stop) for seed in seeds]
        else:  # greedy: n choices alike, one decoded
            jobs = [_Job(episode.id, prompt_ids, None, 0.0, max_new, stop)]
        for job in jobs:
            self._batcher.put(job)
        self._arriving.discard(arrival)
        outcomes = [await asyncio.wrap_future(job.future) for job in jobs]
        return first, outcomes * n if episode.temperature == 0 else outcomes


class _Batcher:
    """The thread that samples pending requests in batches: from the first request it
    waits until every live episode (``live()``) has one pending, while requests keep
    arriving (being read, ``arriving()``, or one queued within ``GAP`` seconds of the
    last), ``wait`` seconds at most (an agent
    may be running its tools), then sends them all to the engine, one call per
    (temperature, stop strings), each row cut to its own ``max_new``."""

    def __init__(self, policy: CausalLMPolicy, wait: float, live: Callable[[], int], arriving: Callable[[], int]
                 ) -> None:
        self.policy, self.wait, self.live, self.arriving = policy, wait, live, arriving
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rlvr-endpoint-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=60)
            self._thread = None

    def put(self, job: _Job) -> None:
        self._queue.put(job)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            jobs, start = [first], time.monotonic()
            last = start
            while len({job.episode for job in jobs}) < self.live():
                now = time.monotonic()
                if (now - last > GAP and not self.arriving()) or now - start > self.wait:
                    break  # none arriving (being read, or sent within GAP), or waited long enough
                # short waits: an episode that finishes meanwhile lowers the count waited for
                taken = self._take(jobs, POLL)
                if taken is None:
                    break
                if taken:
                    last = time.monotonic()
            while self._take(jobs, None):  # and whatever else is already waiting
                pass
            groups: dict[tuple, list[_Job]] = {}
            for job in jobs:
                groups.setdefault((job.temperature, job.stop), []).append(job)
            for (temperature, stop), group in groups.items():
                try:
                    self._generate(group, temperature, stop)
                except BaseException as err:  # noqa: BLE001 - every waiting request gets the error
                    for job in group:
                        if not job.future.done():
                            job.future.set_exception(err)

    calls = 0  # engine calls made so far

    def _take(self, jobs: list[_Job], timeout: float | None) -> bool | None:
        """Move one queued job into ``jobs`` (waiting ``timeout`` seconds; None: not at all):
        True when one was there, False when none, None at the stop mark (left queued)."""
        try:
            job = self._queue.get(timeout=timeout) if timeout is not None else self._queue.get_nowait()
        except queue.Empty:
            return False
        if job is None:
            self._queue.put(None)
            return None
        jobs.append(job)
        return True

    def _generate(self, jobs: list[_Job], temperature: float, stop: tuple[str, ...]) -> None:
        from rlvr.environments.episodes import turn_calls
        from rlvr.policies import turns

        policy = self.policy
        prefixes = [job.prompt_ids for job in jobs]
        room = [job.max_new for job in jobs]
        for rows, max_new in turn_calls([len(p) for p in prefixes], room, max(room), policy.max_positions):
            self.calls += 1
            seeds = None if temperature == 0 else torch.tensor([jobs[i].seed for i in rows], dtype=torch.long)
            with torch.no_grad():
                generation, texts = turns.next_turns(policy, [prefixes[i] for i in rows], temperature, max_new,
                                                     seeds, stop)
            lengths = generation.lengths.tolist()
            ids, log_probs = generation.response_ids.tolist(), generation.sample_log_probs.tolist()
            ends = set(policy.sampling.end_token_ids)
            for k, i in enumerate(rows):
                job, length, text = jobs[i], lengths[k], texts[k]
                if length > job.max_new:  # drawn with a roomier row: cut at its own limit
                    length = job.max_new
                    text = policy.tokenizer.decode(ids[k][:length], skip_special_tokens=True)
                ended = length > 0 and (ids[k][length - 1] in ends or length < job.max_new
                                        or any(s in text for s in stop + policy.sampling.stop_strings))
                job.future.set_result((ids[k][:length], log_probs[k][:length], text, "stop" if ended else "length"))


def call_seed(episode_seed: int, index: int) -> int:
    """The seed completion ``index`` of an episode draws from (its calls' choices counted in
    order): its draws depend on the episode's seed and its place alone, not on the batch."""
    from rlvr.engines.hf import keyed_uniforms

    return int(keyed_uniforms(torch.tensor([episode_seed]), index).item() * 2**62)


def _choices(body: dict[str, Any]) -> int:
    n = body.get("n", 1)
    if n is None:
        return 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_CHOICES:
        raise RequestError(400, f"'n' must be an integer from 1 to {MAX_CHOICES}, got {n!r}", param="n")
    return n


def _stops(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise RequestError(400, f"'stop' must be a non-empty string or a list of at most {MAX_STOPS}",
                           param="stop")
    return tuple(stops)


def _temperature(body: dict[str, Any]) -> float:
    value = body.get("temperature", 0.0)
    value = 0.0 if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 2:
        raise RequestError(400, f"'temperature' must be a number from 0 to 2, got {value!r:.40}", param="temperature")
    return float(value)


def _seed(body: dict[str, Any]) -> int:
    value = body.get("seed", 0)
    value = 0 if value is None else value
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"'seed' must be an integer, got {value!r:.40}", param="seed")
    return value


def _max_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise RequestError(400, f"'max_tokens' must be a positive integer, got {value!r}", param="max_tokens")
    return value


def _without_stop(text: str, stop: tuple[str, ...]) -> str:
    """``text`` without the request's stop string it ends with (OpenAI leaves it out)."""
    for s in stop:
        if text.endswith(s):
            return text[:-len(s)]
    return text


def _response(kind: str, model: str, choices: list, prompt_ids: list[int], outcomes: list) -> dict[str, Any]:
    completion = sum(len(o[0]) for o in outcomes)
    return {"id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{secrets.token_hex(8)}", "object": kind,
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": completion,
                      "total_tokens": len(prompt_ids) + completion}}
