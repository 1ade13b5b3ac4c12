"""The policy served over HTTP during rollouts, recording every token it samples.

The design: ``docs/explanation/agents.md`` (``rlvr.agents.server``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import secrets
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rlvr.agents import chat, listen
from rlvr.agents.batcher import Batcher, Job, Outcome, call_seed
from rlvr.agents.calls import AgentEpisode, Call, Served
from rlvr.agents.chat import MAX_CHOICES, RequestError
from rlvr.environments.tool_parsing import shown_tools

if TYPE_CHECKING:
    from rlvr.policies.causal_lm import CausalLMPolicy


MAX_CALLS = 256  # an episode's calls by default (each choice of a request one)


class Endpoint:
    """The policy served on ``host``:``port`` (0: a free port) while started; episodes opened by ``open`` and read
    back by ``finish``. ``api_key``: the key of the open routes and ``/v1/models``; an episode's agent gets
    ``key(episode_id)``."""

    def __init__(self, policy: CausalLMPolicy, host: str = "127.0.0.1", port: int = 0,
                 max_body_bytes: int = 1 << 20, batch_wait: float = 1.0, model_name: str = "rlvr-policy",
                 open_routes: bool = False, max_calls: int = MAX_CALLS, max_sampled_tokens: int | None = None,
                 max_connections: int | None = None, read_timeout: float = listen.READ_TIMEOUT) -> None:
        self.policy, self.host, self.port = policy, host, port
        self.max_body_bytes, self.model_name, self.open_routes = max_body_bytes, model_name, open_routes
        self.max_calls, self.max_sampled_tokens = max_calls, max_sampled_tokens
        self.max_connections, self.read_timeout = max_connections, read_timeout
        self.api_key = "rlvr-" + secrets.token_hex(16)
        self._secret = secrets.token_bytes(32)  # the episodes' keys are derived from it and their ids
        self._episodes: dict[str, AgentEpisode] = {}
        self._sampled: dict[str, int] = {}  # per live episode: tokens sampled or reserved by requests in flight
        self._lock = threading.Lock()
        self._arriving: set[int] = set()  # requests read but not yet queued for the engine (the server's thread)
        self._batcher = Batcher(policy, batch_wait, lambda: len(self._episodes), lambda: len(self._arriving))
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.unix_socket: str | None = None  # its path while started

    # ---- life ---------------------------------------------------------------------

    def start(self) -> None:
        """Listen (once) on ``host``:``port`` and on ``unix_socket``; the port is known when this returns."""
        if self._server is not None:
            return
        import uvicorn

        tcp, unix, self._folder = listen.sockets(self.host, self.port)
        self.unix_socket = os.path.join(self._folder.name, "endpoint.sock")
        self.port = tcp.getsockname()[1]
        guard = listen.Guard(self.max_connections or listen.connection_cap(), self.read_timeout)
        config = uvicorn.Config(self.app(), log_level="warning", lifespan="off", access_log=False,
                                http=listen.guarded_protocol(guard))
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=listen.serve, args=(self._server, [tcp, unix], guard),
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

    def key(self, episode_id: str) -> str:
        """The API key an episode's agent is given: good for that episode's URL alone."""
        return "rlvr-" + hmac.new(self._secret, episode_id.encode(), "sha256").hexdigest()[:32]

    # ---- episodes -----------------------------------------------------------------

    def open(self, seed: int, temperature: float, max_tokens: int) -> str:
        """A new live episode's id. Its draws come from ``seed``; ``max_tokens``: the tokens after its first prompt
        it may use, sampled and appended."""
        episode = AgentEpisode(secrets.token_hex(8), seed, temperature, max_tokens)
        with self._lock:
            self._episodes[episode.id] = episode
            self._sampled[episode.id] = 0
        return episode.id

    def finish(self, episode_id: str) -> AgentEpisode:
        """The episode's record; later requests to it are refused (404)."""
        with self._lock:
            self._sampled.pop(episode_id, None)
            return self._episodes.pop(episode_id)

    def _live(self, episode_id: str) -> AgentEpisode:
        with self._lock:
            episode = self._episodes.get(episode_id)
        if episode is None:
            raise _not_live(episode_id)
        return episode

    def _record(self, episode: AgentEpisode, served: list[Served], prompt: Any) -> None:
        """Add a request's calls to the episode's record while it is live (not once ``finish`` returned it)."""
        with self._lock:
            if episode.id not in self._episodes:
                raise _not_live(episode.id)
            episode.served.extend(served)
            if episode.prompt is None:
                episode.prompt = prompt

    # ---- HTTP (``rlvr.agents.routes``) ----------------------------------------------

    def app(self) -> Any:
        """The endpoint's ASGI app: its routes, every exception a 500 with its one line."""
        from rlvr.agents import routes

        return routes.app(self)

    @contextlib.contextmanager
    def _arrival(self, request: Any) -> Iterator[None]:
        """The request counts as arriving (the batcher waits for it) until its jobs are queued or it fails."""
        self._arriving.add(id(request))
        try:
            yield
        finally:
            self._arriving.discard(id(request))

    # ---- the calls ----------------------------------------------------------------

    async def _chat(self, episode: AgentEpisode, body: dict[str, Any], arrival: int = 0) -> dict[str, Any]:
        if not getattr(self.policy.tokenizer, "chat_template", None):
            raise RequestError(400, "the policy's tokenizer has no chat template: use /completions with text")
        raw = body.get("messages")
        plain = chat.messages(raw)
        tools = body.get("tools")
        names = chat.tool_names(tools)
        n, stop, logprobs = chat.n_choices(body), chat.stops(body), bool(body.get("logprobs"))
        requested = chat.max_tokens(body)
        prompt_ids = self._chat_prompt(episode, raw, plain, tools)
        first, outcomes = await self._sample(episode, prompt_ids, n, requested, stop, arrival)
        choices, served = [], []
        for k, (ids, log_probs, text, finish) in enumerate(outcomes):
            shown = chat.without_stop(text, stop) if finish == "stop" else text
            message, called = chat.reply(shown, names, f"call_{first + k}_")
            call = Call(prompt_ids, ids, log_probs, text, finish, self.policy.engine.weights_version)
            served.append(Served(call, plain, tools, chat.reply_key(message), shown != text))
            choice = {"index": k, "message": message, "finish_reason": called or finish, "logprobs": None}
            if logprobs:
                choice["logprobs"] = {"content": [{"token": self._token(i), "logprob": lp, "bytes": None,
                                                   "top_logprobs": []} for i, lp in zip(ids, log_probs)]}
            choices.append(choice)
        self._record(episode, served, plain)
        return chat.response("chat.completion", self.model_name, choices, prompt_ids, outcomes)

    async def _completion(self, episode: AgentEpisode, body: dict[str, Any], arrival: int = 0) -> dict[str, Any]:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise RequestError(400, "'prompt' must be a non-empty string", param="prompt")
        n, stop, logprobs = chat.n_choices(body), chat.stops(body), body.get("logprobs") is not None
        requested = chat.max_tokens(body)
        prompt_ids = self._text_prompt(episode, prompt)
        _, outcomes = await self._sample(episode, prompt_ids, n, requested, stop, arrival)
        choices, served = [], []
        for k, (ids, log_probs, text, finish) in enumerate(outcomes):
            shown = chat.without_stop(text, stop) if finish == "stop" else text
            call = Call(prompt_ids, ids, log_probs, text, finish, self.policy.engine.weights_version)
            served.append(Served(call, None, None, prompt + shown, shown != text))
            choice = {"index": k, "text": shown, "finish_reason": finish, "logprobs": None}
            if logprobs:
                choice["logprobs"] = {"tokens": [self._token(i) for i in ids], "token_logprobs": log_probs,
                                      "top_logprobs": None, "text_offset": None}
            choices.append(choice)
        self._record(episode, served, prompt)
        return chat.response("text_completion", self.model_name, choices, prompt_ids, outcomes)

    def _token(self, token_id: int) -> str:
        return self.policy.tokenizer.decode([token_id])

    def _chat_prompt(self, episode: AgentEpisode, raw: list, plain: list[dict[str, str]], tools: Any) -> list[int]:
        """The prompt's ids: a follow-up's from the recorded call it follows (its exact tokens), else the whole
        conversation rendered (docs/explanation/agents.md)."""
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
            # a template that renders the turns differently whole: the conversation rendered whole
            with contextlib.suppress(ChatTemplateMismatch):
                _, ids = turns.observation_ids(self.policy, history, plain[last + 1:], room, template_tools)
                if ids is None:
                    raise RequestError(400, "the new messages are longer than the episode's token budget or the "
                                            "model's positions leave room for", code="context_length_exceeded")
                return [*follows.call.prompt_ids, *follows.call.completion_ids,
                        *turns.end_of_turn_ids(self.policy, follows.call.completion_ids), *ids]
        return self._encoded(*shown_tools(template, plain, tools or [], "json"))

    def _text_prompt(self, episode: AgentEpisode, prompt: str) -> list[int]:
        """A text prompt's ids: a follow-up (it starts with a served call's prompt and completion text) from that
        call's ids, else the text encoded."""
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
        from rlvr.base.errors import PromptError
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
        """n completions of ``prompt_ids`` within the episode's budget and the model's positions, and the index of
        the first (the episode's completions counted in order)."""
        policy = self.policy
        if episode.first_prompt_length is None:
            episode.first_prompt_length = len(prompt_ids)
        max_new = min(requested or policy.sampling.max_new_tokens, policy.sampling.max_new_tokens,
                      self._room(episode, len(prompt_ids)))
        if policy.max_positions is not None:
            max_new = min(max_new, policy.max_positions - len(prompt_ids))
        if max_new < 1:
            raise self._truncated(episode, RequestError(
                400, f"the episode has used its token budget ({episode.max_tokens} tokens after its first prompt, "
                     "task.options.max_tokens) or the model's positions", code="context_length_exceeded"))
        jobs_count = n if episode.temperature > 0 else 1  # greedy: n choices alike, one decoded
        max_new = self._reserve(episode, n, jobs_count, max_new)
        first, episode.draws = episode.draws, episode.draws + n
        seeds = [call_seed(episode.seed, first + k) for k in range(n)] if episode.temperature > 0 else [None]
        jobs = [Job(episode.id, prompt_ids, seed, episode.temperature, max_new, stop) for seed in seeds]
        outcomes: list[Outcome] = []
        try:
            for job in jobs:
                self._batcher.put(job)
            self._arriving.discard(arrival)
            for job in jobs:
                outcomes.append(await asyncio.wrap_future(job.future))
        finally:  # what was reserved and not sampled goes back
            self._release(episode, max_new * len(jobs) - sum(len(o[0]) for o in outcomes))
        return first, outcomes * n if episode.temperature == 0 else outcomes

    def _reserve(self, episode: AgentEpisode, n: int, jobs: int, max_new: int) -> int:
        """``max_new`` cut to what is left of the episode's sampled tokens, shared by ``jobs`` completions, and
        reserved for them until done (an episode's requests run at once); RequestError (the episode truncated) past
        its calls or sampled tokens, or once it is finished. Under the lock: ``finish`` runs on the trainer's thread."""
        budget = self.max_sampled_tokens or MAX_CHOICES * episode.max_tokens
        with self._lock:
            if episode.id not in self._sampled:
                raise _not_live(episode.id)
            left = budget - self._sampled[episode.id]
            if episode.draws + n > self.max_calls:
                reason = (f"the episode has used its budget of calls ({self.max_calls}, task.options.max_calls; "
                          f"each choice of a request one): {episode.draws} made, {n} more asked")
            elif left < jobs:
                reason = (f"the episode has used its budget of sampled tokens ({budget} in all its calls, "
                          "task.options.max_sampled_tokens)")
            else:
                max_new = min(max_new, left // jobs)
                self._sampled[episode.id] += max_new * jobs
                return max_new
            episode.truncated = True
        raise RequestError(400, reason, code="episode_budget_exceeded")

    def _release(self, episode: AgentEpisode, tokens: int) -> None:
        """Give back ``tokens`` reserved and not sampled (to a live episode)."""
        with self._lock:
            if episode.id in self._sampled:
                self._sampled[episode.id] -= tokens

    def _truncated(self, episode: AgentEpisode, error: RequestError) -> RequestError:
        """``error``, the episode marked truncated; a finished episode is left as ``finish`` returned it (404)."""
        with self._lock:
            if episode.id not in self._episodes:
                return _not_live(episode.id)
            episode.truncated = True
        return error


def _not_live(episode_id: str) -> RequestError:
    return RequestError(404, f"no live episode {episode_id!r}: requests belong to an episode while its agent runs",
                        code="episode_not_found")
