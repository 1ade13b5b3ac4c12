"""The Tinker REST API's routes (``/api/v1/...``, as the ``tinker`` SDK calls them) over a ``Service``.

Errors answer in the SDK's shapes: ``{"detail": ...}`` with a 4xx status for a request refused at once (401: the
key, 400: a malformed body, 404: a route, run or checkpoint that is not here), and a failed future
``{"error": ..., "category": "user" | "server"}`` for a request that fails in the worker.
"""

from __future__ import annotations

import hmac
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

from rlvr.tinker import wire
from rlvr.tinker.models import AdamStep, Adapters
from rlvr.tinker.service import SESSION_TIMEOUT, USER_ERRORS, RunInfo, Service
from rlvr.tinker.store import CheckpointPath, StoreError, checked_name
from rlvr.tinker.wire import WireError, field

MAX_JSON_BYTES = 64 << 20
PREFIX = "/api/v1"


def error(status: int, detail: str) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse({"detail": detail}, status_code=status)


async def body_bytes(request: Any, limit: int) -> bytes:
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise WireError(f"the request body has {size} bytes, more than the {limit} this route takes")
    data = await request.body()
    if len(data) > limit:
        raise WireError(f"the request body has more than the {limit} bytes this route takes")
    return data


async def json_body(request: Any) -> dict:
    data = await body_bytes(request, MAX_JSON_BYTES)
    if not data:
        return {}
    try:
        body = json.loads(data)
    except ValueError as err:
        raise WireError(f"the request body is not JSON: {err}") from None
    if not isinstance(body, dict):
        raise WireError("the request body must be a JSON object")
    return body


def handles(function: Callable[..., Awaitable[Any] | Any], method: str = "POST") -> Callable:
    """An endpoint calling ``function`` with the JSON body (and the path's parameters), its refusals as 4xx."""
    from starlette.responses import JSONResponse, Response

    async def endpoint(request: Any) -> Any:
        try:
            body = await json_body(request) if method in ("POST", "PUT") else {}
            out = function(body, **request.path_params)
            if hasattr(out, "__await__"):
                out = await out
        except StoreError as err:
            return error(404, str(err))
        except USER_ERRORS as err:
            return error(400, str(err))
        if isinstance(out, bytes):
            return Response(out, media_type="application/x-protobuf")
        return out if isinstance(out, Response) else JSONResponse(out)

    return endpoint


class Api:
    """The routes' handlers over ``service``: each takes the JSON body (and the path's parameters)."""

    def __init__(self, service: Service):
        self.service = service

    def future(self, job: Callable[[], Any], **extra: Any) -> dict:
        return {"request_id": self.service.submit(job), **extra}

    # ---- the client's set-up ------------------------------------------------------------

    def client_config(self, body: dict) -> dict:
        # chunks of one forward_backward arrive one after another, so gradients add up in the same order each run
        return {"parallel_fwdbwd_chunks": False, "proto_compress_fwdbwd": False}

    def capabilities(self, body: dict) -> dict:
        return {"supported_models": [{"model_name": alias, "max_context_length": None, "trainable": True,
                                      "sampleable": True} for m in self.service.models for alias in m.aliases]}

    def create_session(self, body: dict) -> dict:
        return {"type": "create_session", "session_id": self.service.create_session()}

    def heartbeat(self, body: dict) -> Any:
        self.service.expire()
        session = self.service.sessions.get(body.get("session_id"))
        if session is None:  # 410: the SDK stops beating for it
            return error(410, f"session {body.get('session_id')!r} has ended (closed, silent for "
                              f"{SESSION_TIMEOUT:.0f} s, or the server restarted)")
        session.last_seen = time.monotonic()
        return {"type": "session_heartbeat"}

    def finish(self, body: dict, session_id: str) -> dict:
        self.service.finish_session(session_id)
        return {}

    # ---- training models ----------------------------------------------------------------

    def create_model(self, body: dict) -> dict:
        session = self.service.session(body.get("session_id"))
        model_id = f"{session.id}:train:{field(body, 'model_seq_id', int)}"
        base = self.service.base(body.get("base_model"))
        lora = field(body, "lora_config", dict, {})
        adapters = Adapters(rank=field(lora, "rank", int, 32, "lora_config"),
                            train_mlp=field(lora, "train_mlp", bool, True, "lora_config"),
                            train_attn=field(lora, "train_attn", bool, True, "lora_config"),
                            train_unembed=field(lora, "train_unembed", bool, True, "lora_config"))
        seed = field(lora, "seed", int, 0, "lora_config")
        _adam_only(body)
        metadata = field(body, "user_metadata", dict, None)

        def job() -> dict:
            self.service.new_model(session, model_id, base, adapters, seed, metadata)
            return {"type": "create_model", "model_id": model_id}

        return self.future(job, model_id=model_id)

    def info(self, run: RunInfo) -> dict:
        base = self.service.base(run.base_model)
        return {"type": "get_info", "model_id": run.run_id,
                "model_data": {"arch": "causal_lm", "model_name": base.name, "tokenizer_id": base.tokenizer_id},
                "is_lora": run.adapters.rank > 0, "lora_rank": run.adapters.rank or None, "model_name": base.name}

    def get_info(self, body: dict) -> dict:
        model_id = body.get("model_id")
        run = self.service.runs.get(model_id)
        if run is None:
            raise StoreError(f"no training model {model_id!r} on this server")
        return self.info(run)

    async def forward_backward(self, request: Any) -> Any:
        try:
            data = wire.decompress(await body_bytes(request, wire.MAX_BODY_BYTES),
                                   request.headers.get("content-encoding"))
            if "json" in request.headers.get("content-type", ""):
                raise WireError("forward_backward takes the SDK's protobuf body (tinker>=0.38)")
            train = wire.train_request(data)
        except WireError as err:
            return error(400, str(err))

        def job() -> bytes:
            model = self.service.model(train.model_id)
            log_probs, metrics = model.forward(train.datums, train.loss_fn, train.config,
                                               backward=not train.forward_only)
            return wire.train_result(log_probs, metrics)

        from starlette.responses import JSONResponse

        return JSONResponse(self.future(job))

    def optim_step(self, body: dict) -> dict:
        params = field(body, "adam_params", dict, None) or field(body, "optim_params", dict, {})
        kind = params.get("type", "adam")
        if kind not in ("adam", "adamw"):
            raise WireError(f"optimizer {kind!r} is not supported by rlvr's Tinker server (Adam is)")
        number = (int, float)
        step = AdamStep(**{key: float(field(params, key, number, default, "adam_params"))
                           for key, default in vars(AdamStep()).items()})
        model_id = body.get("model_id")

        def job() -> dict:
            return {"type": "optim_step", "metrics": self.service.model(model_id).optim_step(step)}

        return self.future(job)

    def save_weights(self, body: dict) -> dict:
        model_id, name = body.get("model_id"), field(body, "path", str, None)

        def job() -> dict:
            path = self.service.save(model_id, name, "weights", bool(body.get("overwrite")))
            return {"type": "save_weights", "path": str(path)}

        return self.future(job)

    def save_for_sampler(self, body: dict) -> dict:
        model_id, name = body.get("model_id"), field(body, "path", str, None)
        seq = body.get("sampling_session_seq_id")
        if name is None and seq is None:
            raise WireError("save_weights_for_sampler needs a path or a sampling_session_seq_id")

        def job() -> dict:
            if name is not None:
                path = self.service.save(model_id, name, "sampler_weights", True)
                return {"type": "save_weights_for_sampler", "path": str(path)}
            snapshot = self.service.snapshot_of_model(model_id)
            sampler = self.service.new_sampling_session(self.service.owner[model_id], seq, snapshot)
            return {"type": "save_weights_for_sampler", "path": None, "sampling_session_id": sampler}

        return self.future(job)

    def load_weights(self, body: dict) -> dict:
        path = CheckpointPath.parse(body.get("path"))
        optimizer = bool(body.get("optimizer"))
        if body.get("session_id") is not None:  # a new training model, from the checkpoint
            session = self.service.session(body.get("session_id"))
            model_id = f"{session.id}:train:{field(body, 'model_seq_id', int)}"

            def job() -> dict:
                run = self.service.run_of(path)
                base = self.service.base(run.base_model)
                model = self.service.new_model(session, model_id, base, run.adapters, run.seed,
                                               field(body, "user_metadata", dict, None))
                self.service.load(model, path, optimizer)
                return {"type": "load_weights", "path": str(path)}
        else:
            model_id = body.get("model_id")

            def job() -> dict:
                self.service.load(self.service.model(model_id), path, optimizer)
                return {"type": "load_weights", "path": str(path)}

        return self.future(job, model_id=model_id)

    # ---- sampling -----------------------------------------------------------------------

    def create_sampling_session(self, body: dict) -> dict:
        session = self.service.session(body.get("session_id"))
        if body.get("model_path") is not None:
            snapshot = self.service.snapshot_of_path(CheckpointPath.parse(body["model_path"]))
        else:
            snapshot = self.service.snapshot_of_base(self.service.base(body.get("base_model")))
        sampler = self.service.new_sampling_session(session, body.get("sampling_session_seq_id"), snapshot)
        return {"type": "create_sampling_session", "sampling_session_id": sampler}

    def get_sampler(self, body: dict, sampler_id: str) -> dict:
        snapshot = self.service.sampling_sessions.get(sampler_id)
        if snapshot is None:
            raise StoreError(f"no sampling session {sampler_id!r} on this server")
        path = None
        if snapshot.checkpoint is not None:
            path = f"tinker://{snapshot.checkpoint.parent.parent.name}/{snapshot.checkpoint.parent.name}/" \
                   f"{snapshot.checkpoint.name}"
        return {"sampler_id": sampler_id, "base_model": snapshot.base, "model_path": path}

    def asample(self, body: dict) -> dict:
        sampler_id = body.get("sampling_session_id")
        if sampler_id is not None:
            snapshot = self.service.sampling_sessions.get(sampler_id)
            if snapshot is None:
                raise StoreError(f"no sampling session {sampler_id!r} on this server")
        elif body.get("model_path") is not None:
            snapshot = self.service.snapshot_of_path(CheckpointPath.parse(body["model_path"]))
        else:
            snapshot = self.service.snapshot_of_base(self.service.base(body.get("base_model")))
        request = wire.sample_request(body)  # refused here, before it queues, when it asks for what is not served
        return self.future(lambda: self.service.sample(snapshot, request),
                           sample_sequence_ids=[f"seq-{uuid.uuid4().hex[:16]}"
                                                for _ in range(max(request.num_samples, 0))])

    # ---- futures ------------------------------------------------------------------------

    async def retrieve(self, body: dict) -> Any:
        request_id = body.get("request_id")
        result = await self.service.retrieve(request_id) if isinstance(request_id, str) else None
        if result is None:
            raise StoreError(f"no request {request_id!r} on this server (it restarted, or the result was "
                             "retrieved long ago)")
        return result

    # ---- runs and checkpoints -----------------------------------------------------------

    def run_record(self, run_id: str) -> dict:
        live = self.service.runs.get(run_id)
        if live is None:
            record = self.service.store.read_run(run_id)
            try:
                live = RunInfo(run_id, record["base_model"], Adapters(**record["adapters"]),
                               int(record.get("seed", 0)), record.get("user_metadata"))
            except (KeyError, TypeError, ValueError) as err:
                raise StoreError(f"training run {run_id!r}: its run.json is damaged ({type(err).__name__})") from None
        metadata = live.user_metadata if isinstance(live.user_metadata, dict) else {}
        checkpoints = self.service.store.checkpoints(run_id)
        last = {kind: next((c for c in reversed(checkpoints) if c["checkpoint_type"] == kind), None)
                for kind in ("training", "sampler")}
        stamp = checkpoints[-1]["time"] if checkpoints else datetime.now(timezone.utc).isoformat()
        return {"training_run_id": run_id, "base_model": live.base_model, "model_owner": "local",
                "is_lora": live.adapters.rank > 0, "lora_rank": live.adapters.rank or None, "corrupted": False,
                "last_request_time": stamp, "last_checkpoint": last["training"],
                "last_sampler_checkpoint": last["sampler"],
                "user_metadata": {str(k): str(v) for k, v in metadata.items()} or None}

    def training_runs(self, body: dict) -> dict:
        runs = [self.run_record(run_id) for run_id in self.service.store.run_ids()]
        return {"training_runs": runs, "cursor": {"offset": 0, "limit": len(runs), "total_count": len(runs)}}

    def training_run(self, body: dict, run_id: str) -> dict:
        return self.run_record(checked_name(run_id, "run id"))

    def checkpoints(self, body: dict, run_id: str) -> dict:
        return {"checkpoints": self.service.store.checkpoints(checked_name(run_id, "run id"))}

    def all_checkpoints(self, body: dict) -> dict:
        found = [c for run_id in self.service.store.run_ids() for c in self.service.store.checkpoints(run_id)]
        return {"checkpoints": found, "cursor": {"offset": 0, "limit": len(found), "total_count": len(found)}}

    def delete_checkpoint(self, body: dict, run_id: str, checkpoint: str) -> Any:
        self.service.store.delete(CheckpointPath.parse(f"tinker://{run_id}/{checkpoint}"))
        from starlette.responses import Response

        return Response(status_code=204)

    def weights_info(self, body: dict) -> dict:
        run = self.service.run_of(CheckpointPath.parse(body.get("tinker_path")))
        a = run.adapters
        return {"base_model": run.base_model, "optimizer_config": {"type": "adamw"}, "is_lora": a.rank > 0,
                "lora_rank": a.rank or None, "train_unembed": a.train_unembed, "train_mlp": a.train_mlp,
                "train_attn": a.train_attn}


def app(service: Service, api_key: str | None) -> Any:
    """The ASGI app: every route the SDK and the cookbook call, a 404 naming any other, behind the key."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    api = Api(service)
    routes = [
        Route(f"{PREFIX}/client/config", handles(api.client_config), methods=["POST"]),
        Route(f"{PREFIX}/client/dynamic_config", handles(lambda body: {}), methods=["POST"]),
        Route(f"{PREFIX}/healthz", handles(lambda body: {"status": "ok"}, "GET"), methods=["GET"]),
        Route(f"{PREFIX}/get_server_capabilities", handles(api.capabilities, "GET"), methods=["GET"]),
        Route(f"{PREFIX}/create_session", handles(api.create_session), methods=["POST"]),
        Route(f"{PREFIX}/session_heartbeat", handles(api.heartbeat), methods=["POST"]),
        Route(f"{PREFIX}/sessions/{{session_id}}/finish", handles(api.finish), methods=["POST"]),
        Route(f"{PREFIX}/telemetry", handles(lambda body: {"status": "accepted"}), methods=["POST"]),
        Route(f"{PREFIX}/create_model", handles(api.create_model), methods=["POST"]),
        Route(f"{PREFIX}/get_info", handles(api.get_info), methods=["POST"]),
        Route(f"{PREFIX}/forward_backward", api.forward_backward, methods=["POST"]),
        Route(f"{PREFIX}/optim_step", handles(api.optim_step), methods=["POST"]),
        Route(f"{PREFIX}/save_weights", handles(api.save_weights), methods=["POST"]),
        Route(f"{PREFIX}/save_weights_for_sampler", handles(api.save_for_sampler), methods=["POST"]),
        Route(f"{PREFIX}/load_weights", handles(api.load_weights), methods=["POST"]),
        Route(f"{PREFIX}/create_sampling_session", handles(api.create_sampling_session), methods=["POST"]),
        Route(f"{PREFIX}/samplers/{{sampler_id}}", handles(api.get_sampler, "GET"), methods=["GET"]),
        Route(f"{PREFIX}/asample", handles(api.asample), methods=["POST"]),
        Route(f"{PREFIX}/retrieve_future", handles(api.retrieve), methods=["POST"]),
        Route(f"{PREFIX}/cancel_future", handles(lambda body: {}), methods=["POST"]),
        Route(f"{PREFIX}/training_runs", handles(api.training_runs, "GET"), methods=["GET"]),
        Route(f"{PREFIX}/training_runs/{{run_id}}", handles(api.training_run, "GET"), methods=["GET"]),
        Route(f"{PREFIX}/training_runs/{{run_id}}/checkpoints", handles(api.checkpoints, "GET"), methods=["GET"]),
        Route(f"{PREFIX}/training_runs/{{run_id}}/checkpoints/{{checkpoint:path}}",
              handles(api.delete_checkpoint, "DELETE"), methods=["DELETE"]),
        Route(f"{PREFIX}/checkpoints", handles(api.all_checkpoints, "GET"), methods=["GET"]),
        Route(f"{PREFIX}/weights_info", handles(api.weights_info), methods=["POST"]),
    ]

    inner = Starlette(routes=routes, exception_handlers={404: _not_here, 405: _not_allowed})
    return guarded(inner, api_key)




async def _not_here(request: Any, exc: Any) -> Any:
    return error(404, f"rlvr's Tinker server does not serve {request.method} {request.url.path} "
                      "(docs/reference/tinker.md lists the routes it serves)")


async def _not_allowed(request: Any, exc: Any) -> Any:
    return error(405, f"{request.url.path} does not take {request.method}")


def guarded(inner: Any, api_key: str | None) -> Any:
    """``inner`` behind the key check (``X-API-Key`` or a bearer token), every exception answered as a 500 of its
    one line (never a traceback)."""
    from rlvr.agents.listen import one_line_errors

    def failed(line: str) -> Any:
        return error(500, f"the server failed: {line}")

    checked = one_line_errors(inner, "rlvr tinker", failed)

    async def outer(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and api_key is not None:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            given = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), api_key.encode()):
                return await error(401, "missing or wrong API key: pass the key rlvr tinker printed "
                                        "(TINKER_API_KEY)")(scope, receive, send)
        await checked(scope, receive, send)

    return outer


def _adam_only(body: dict) -> None:
    config = body.get("optimizer_config") or {"type": "adamw"}
    if not isinstance(config, dict) or config.get("type", "adamw") != "adamw":
        raise WireError(f"optimizer_config {config!r} is not supported by rlvr's Tinker server (adamw is)")
