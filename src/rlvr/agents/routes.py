"""The endpoint's HTTP routes (``rlvr.agents.server``): a Starlette app over an ``Endpoint``.

A request's key is checked before its body is read: on an episode's routes the key that episode's agent was given
(``Endpoint.key``), on the others the endpoint's ``api_key``. Then its body, read no further than ``max_body_bytes``,
must be a JSON object. A refusal is OpenAI-style error JSON; any other exception a 500 with its one line
(``rlvr.agents.listen.one_line_errors``).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from rlvr.agents import chat, listen, streaming
from rlvr.agents.chat import RequestError

Endpoint = Any  # rlvr.agents.server.Endpoint, which imports this module


def app(endpoint: Endpoint) -> Starlette:
    """The routes of the endpoint's module docstring, ``open_routes`` among them when it has them."""
    open_routes = [Route("/v1/chat/completions", open_call, methods=["POST"]),
                   Route("/v1/completions", open_call, methods=["POST"])] if endpoint.open_routes else []
    routes = [
        *open_routes,
        Route("/v1/models", models),
        Route("/episodes/{episode}/v1/models", models),
        Route("/episodes/{episode}/v1/chat/completions", episode_call, methods=["POST"]),
        Route("/episodes/{episode}/v1/completions", episode_call, methods=["POST"]),
    ]
    # any other exception: a 500 with its one line, answered inside Starlette's outermost layer, which would answer it
    # with a page of its own and raise it again for uvicorn to log
    served = Starlette(routes=routes, exception_handlers={HTTPException: refused, RequestError: refused},
                       middleware=[Middleware(listen.one_line_errors)])
    served.state.endpoint = endpoint
    return served


def _endpoint(request: Request) -> Endpoint:
    return request.app.state.endpoint


async def models(request: Request) -> JSONResponse:
    endpoint = _endpoint(request)
    authorised(request, endpoint, request.path_params.get("episode"))
    return JSONResponse({"object": "list", "data": [{"id": endpoint.model_name, "object": "model", "created": 0,
                                                     "owned_by": "rlvr"}]})


async def episode_call(request: Request) -> Any:
    endpoint = _endpoint(request)
    authorised(request, endpoint, request.path_params["episode"])
    episode = endpoint._live(request.path_params["episode"])
    with endpoint._arrival(request):
        body = await read_body(request, endpoint.max_body_bytes)
        stream = streaming.streamed(body)  # checked before anything is sampled
        return reply(await sampler(request)(episode, body, id(request)), *stream)


async def open_call(request: Request) -> Any:
    """A request of no episode (``open_routes``): an episode of its own, at the request's temperature (0 unless it
    says) and seed, over when it is answered."""
    endpoint = _endpoint(request)
    authorised(request, endpoint)
    body = await read_body(request, endpoint.max_body_bytes)
    stream = streaming.streamed(body)
    episode_id = endpoint.open(chat.seed(body), chat.temperature(body), endpoint.policy.max_positions or 2**20)
    try:
        with endpoint._arrival(request):
            response = await sampler(request)(endpoint._live(episode_id), body, id(request))
    finally:
        endpoint.finish(episode_id)
    return reply(response, *stream)


def sampler(request: Request) -> Callable[..., Any]:
    """The endpoint's method that answers the request's route."""
    endpoint = _endpoint(request)
    return endpoint._chat if request.url.path.endswith("/chat/completions") else endpoint._completion


def reply(response: dict[str, Any], stream: bool, usage: bool) -> Any:
    if not stream:
        return JSONResponse(response)
    return StreamingResponse(streaming.events(response, usage), media_type="text/event-stream")


async def refused(request: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, RequestError):  # Starlette's own (a 404 or 405 of no route)
        exc = RequestError(exc.status_code, str(exc.detail), kind="invalid_request_error")
    return JSONResponse(exc.body(), status_code=exc.status)


def authorised(request: Request, endpoint: Endpoint, episode_id: str | None = None) -> None:
    """RequestError (401) unless the request carries the key of ``episode_id`` (None: the endpoint's ``api_key``)."""
    given = request.headers.get("authorization", "")
    key = endpoint.api_key if episode_id is None else endpoint.key(episode_id)
    if not secrets.compare_digest(given.encode(), f"Bearer {key}".encode()):
        raise RequestError(401, "missing or wrong API key (each episode's agent is given a key of its own, good for "
                                "that episode's URL alone)", code="invalid_api_key", kind="authentication_error")


async def read_body(request: Request, max_bytes: int) -> dict[str, Any]:
    """The request's JSON object, read no further than ``max_bytes``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise RequestError(413, f"request body of {declared} bytes, more than {max_bytes}", code="request_too_large")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > max_bytes:
            raise RequestError(413, f"request body more than {max_bytes} bytes", code="request_too_large")
    try:
        body = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise RequestError(400, f"the body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object")
    return body
