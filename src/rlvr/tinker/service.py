"""The server's state and its one worker: sessions, training models, sampling sessions and futures.

Every request that touches a model (create, forward, backward, optimizer step, save, load, sample) becomes a job on
one FIFO queue, run in order by one worker thread that owns the models, as the hosted service queues them; its
reply is a request id, and the result is fetched with ``retrieve_future`` (held open up to ``POLL_SECONDS``, then
``try_again``). A job that fails is a failed future: category ``user`` for a request that cannot run (its message
names why), ``server`` for a fault of the server's.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlvr.environments.base import describe_error
from rlvr.tinker import wire
from rlvr.tinker.losses import LossError
from rlvr.tinker.models import Adapters, ModelError, TrainingModel, read_meta
from rlvr.tinker.names import ServedModel
from rlvr.tinker.sampling import Request, Samplers, Snapshot
from rlvr.tinker.store import CheckpointPath, Store, StoreError, checked_name

logger = logging.getLogger(__name__)

POLL_SECONDS = 40.0  # retrieve_future waits this long for a result before answering try_again (the SDK: 45)
KEPT_RESULTS = 4096  # finished futures kept for retrieval (the oldest dropped first)
KEPT_SNAPSHOTS = 16  # unsaved sampler weights kept in memory (the least recently used dropped first)
SESSION_TIMEOUT = 300.0  # seconds without a request or heartbeat (the SDK beats every 10) before a session ends
USER_ERRORS = (ModelError, LossError, StoreError, wire.WireError)

Result = bytes | dict


@dataclass
class Entry:
    done: asyncio.Future
    result: Result | None = None


@dataclass
class Session:
    id: str
    models: set[str] = field(default_factory=set)
    samplers: set[str] = field(default_factory=set)
    last_seen: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class RunInfo:
    """What ``get_info`` and ``training_runs`` say of a training model."""

    run_id: str
    base_model: str
    adapters: Adapters
    seed: int
    user_metadata: dict | None = None

    def record(self) -> dict:
        return {"base_model": self.base_model, "adapters": asdict(self.adapters), "seed": self.seed,
                "user_metadata": self.user_metadata}


class Service:
    def __init__(self, served: list[ServedModel], store: Store, device: str = "cpu"):
        self.served = {alias: model for model in served for alias in model.aliases}
        self.models = served
        self.store, self.device = store, device
        self.sessions: dict[str, Session] = {}
        self.runs: dict[str, RunInfo] = {}  # the live training models' descriptions (read by routes)
        self.owner: dict[str, Session] = {}  # the session of each live training model
        self.sampling_sessions: dict[str, Snapshot] = {}
        self._training: dict[str, TrainingModel] = {}  # the worker's alone
        self._samplers = Samplers(device)
        self._unsaved: collections.OrderedDict[int, Snapshot] = collections.OrderedDict()
        self._results: collections.OrderedDict[str, Entry] = collections.OrderedDict()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker = threading.Thread(target=self._work, name="rlvr-tinker-worker", daemon=True)
        self._worker.start()

    # ---- futures ------------------------------------------------------------------------

    def submit(self, job: Callable[[], Result]) -> str:
        """Queue ``job`` for the worker; its request id (call from the event loop)."""
        self._loop = asyncio.get_running_loop()
        request_id = str(uuid.uuid4())
        self._results[request_id] = Entry(self._loop.create_future())
        while len(self._results) > KEPT_RESULTS:
            self._results.popitem(last=False)
        self._jobs.put((request_id, job))
        return request_id

    async def retrieve(self, request_id: str) -> Result | None:
        """The job's result (a failure is ``{"error", "category"}``), ``try_again`` while it runs past
        ``POLL_SECONDS``; None for an id this server does not hold."""
        entry = self._results.get(request_id)
        if entry is None:
            return None
        try:
            await asyncio.wait_for(asyncio.shield(entry.done), POLL_SECONDS)
        except asyncio.TimeoutError:
            return {"type": "try_again", "request_id": request_id, "queue_state": "active"}
        return entry.result

    def _work(self) -> None:
        while True:
            request_id, job = self._jobs.get()
            if job is None:
                return
            try:
                result = job()
            except USER_ERRORS as err:
                result = {"error": str(err), "category": "user"}
            except (MemoryError, torch.OutOfMemoryError) as err:
                result = {"error": f"out of memory: {describe_error(err, 300)} (fewer or shorter datums per request, "
                                   "or fewer training clients at once)", "category": "user"}
            except Exception as err:  # noqa: BLE001 - a job's fault is its future's, never the worker's end
                logger.warning("rlvr tinker: a request failed: %s", describe_error(err, 300))
                result = {"error": f"the server failed: {describe_error(err, 300)}", "category": "server"}
            loop = self._loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._finish, request_id, result)

    def _finish(self, request_id: str, result: Result) -> None:
        entry = self._results.get(request_id)
        if entry is not None and not entry.done.done():
            entry.result = result
            entry.done.set_result(None)

    def close(self) -> None:
        self._jobs.put((None, None))

    # ---- sessions -----------------------------------------------------------------------

    def create_session(self) -> str:
        self.expire()
        session = Session(f"s{uuid.uuid4().hex[:12]}")
        self.sessions[session.id] = session
        return session.id

    def session(self, session_id: Any) -> Session:
        session = self.sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise StoreError(f"no session {session_id!r} on this server (create_session first; sessions do not "
                             "survive a restart, checkpoints do)")
        session.last_seen = time.monotonic()
        return session

    def expire(self, timeout: float = SESSION_TIMEOUT) -> None:
        """End the sessions whose client has gone silent (its process ended without closing them)."""
        now = time.monotonic()
        for session in list(self.sessions.values()):
            if now - session.last_seen > timeout:
                logger.info("rlvr tinker: session %s ended after %.0f s without a heartbeat", session.id, timeout)
                self.finish_session(session.id)

    def finish_session(self, session_id: str) -> None:
        """Release the session's training models and sampling sessions (their saved checkpoints stay)."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            return
        for sampler in session.samplers:
            self.sampling_sessions.pop(sampler, None)
        for model_id in session.models:
            self.runs.pop(model_id, None)
            self.owner.pop(model_id, None)

        def release() -> dict:
            for model_id in session.models:
                self._training.pop(model_id, None)
            return {}

        self.submit(release)

    def base(self, name: Any) -> ServedModel:
        model = self.served.get(name) if isinstance(name, str) else None
        if model is None:
            served = ", ".join(sorted({m.name for m in self.models}))
            raise ModelError(f"base model {name!r} is not served here; this server serves: {served}")
        return model

    # ---- training models (the worker's side) --------------------------------------------

    def model(self, model_id: Any) -> TrainingModel:
        found = self._training.get(model_id) if isinstance(model_id, str) else None
        if found is None:
            raise ModelError(f"no training model {model_id!r} on this server (released, or the server restarted: "
                             "load its checkpoint with create_training_client_from_state)")
        return found

    def new_model(self, session: Session, model_id: str, base: ServedModel, adapters: Adapters, seed: int,
                  user_metadata: dict | None) -> TrainingModel:
        check_memory(base, adapters, self.device, len(self._training))
        model = TrainingModel(base.name, base.folder, adapters, seed, self.device)
        info = RunInfo(model_id, base.name, adapters, seed, user_metadata)
        self.store.write_run(model_id, info.record())
        self._training[model_id] = model
        self.runs[model_id] = info
        self.owner[model_id] = session
        session.models.add(model_id)
        return model

    def save(self, model_id: str, name: str | None, kind: str, overwrite: bool) -> CheckpointPath:
        model = self.model(model_id)
        name = checked_name(name, "checkpoint name") if name is not None else \
            f"step{model.steps:06d}-{uuid.uuid4().hex[:6]}"
        path = CheckpointPath(model_id, kind, name)
        partial = self.store.partial(path)
        model.save(partial, with_optimizer=kind == "weights")
        self.store.publish(partial, path, overwrite)
        return path

    def load(self, model: TrainingModel, path: CheckpointPath, optimizer: bool) -> None:
        model.load(self.store.existing(path), optimizer)

    def run_of(self, path: CheckpointPath) -> RunInfo:
        """The run a checkpoint belongs to, from its model.json (the run may be another session's, or older
        than this server)."""
        meta = read_meta(self.store.existing(path))
        return RunInfo(path.run_id, meta["base"], Adapters(**meta["adapters"]), int(meta.get("seed", 0)))

    # ---- sampling -----------------------------------------------------------------------

    def snapshot_of_model(self, model_id: str) -> Snapshot:
        """The training model's current weights, held in memory (the last KEPT_SNAPSHOTS of them)."""
        model = self.model(model_id)
        base = self.base(model.base)
        snap = Snapshot(base.name, base.folder, model.adapters, model.trainable_state(), model.seed)
        self._unsaved[snap.id] = snap
        while len(self._unsaved) > KEPT_SNAPSHOTS:
            _, old = self._unsaved.popitem(last=False)
            old.state = None  # its sampling sessions now fail with a message saying why
        return snap

    def snapshot_of_path(self, path: CheckpointPath) -> Snapshot:
        """A checkpoint's weights, read from disk when first sampled."""
        run = self.run_of(path)
        base = self.base(run.base_model)
        return Snapshot(base.name, base.folder, run.adapters, {}, run.seed, checkpoint=self.store.existing(path))

    def snapshot_of_base(self, base: ServedModel) -> Snapshot:
        return Snapshot(base.name, base.folder, Adapters(rank=0), {}, 0)

    def sample(self, snapshot: Snapshot, request: Request) -> bytes:
        if snapshot.state is None:
            raise ModelError(f"these sampler weights were released: the server keeps the last {KEPT_SNAPSHOTS} "
                             "unsaved ones (save_weights_for_sampler with a name keeps them on disk)")
        if snapshot.id in self._unsaved:
            self._unsaved.move_to_end(snapshot.id)
        return wire.sample_result(self._samplers.sample(snapshot, request))

    def new_sampling_session(self, session: Session, seq: Any, snapshot: Snapshot) -> str:
        if not isinstance(seq, int):
            raise wire.WireError("sampling_session_seq_id must be an integer")
        sampler_id = f"{session.id}:sample:{seq}"
        self.sampling_sessions[sampler_id] = snapshot
        session.samplers.add(sampler_id)
        return sampler_id


def check_memory(base: ServedModel, adapters: Adapters, device: str, live: int) -> None:
    """ModelError when a training model of ``base`` would not fit in the memory left (fp32 weights; gradients and
    two Adam moments for each trained one)."""
    parameters = count_parameters(base.folder)
    if parameters is None:
        return
    trained = parameters if adapters.rank == 0 else 0
    need = 4 * (parameters + 3 * trained) + (256 << 20)
    free = available_memory(device)
    if free is not None and need > free:
        how = "full fine-tuning" if adapters.rank == 0 else f"LoRA rank {adapters.rank}"
        raise ModelError(f"a training model of {base.name} ({how}) needs about {need / 2**30:.1f} GiB; "
                         f"{free / 2**30:.1f} GiB is free with {live} training model(s) loaded (finish a session "
                         "to release its models, or use LoRA)")


def count_parameters(folder: str) -> int | None:
    """The parameters in ``folder``'s safetensors files (read from their headers), None when there are none."""
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        with safe_open(str(file), "pt") as f:
            for key in f.keys():
                shape = f.get_slice(key).get_shape()
                total += int(torch.Size(shape).numel())
    return total


def available_memory(device: str) -> int | None:
    """Bytes free on ``device``: the GPU's, or the machine's available memory."""
    if torch.device(device).type == "cuda":
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None if not hasattr(os, "sysconf") else os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
