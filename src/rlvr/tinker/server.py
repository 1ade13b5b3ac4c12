"""A Tinker server: the service and its routes on uvicorn, in the calling thread (``serve``, the command's; a
signal stops it) or beside it (``Running``, for tests and benchmarks)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from rlvr.tinker.names import ServedModel, place_tokenizer
from rlvr.tinker.routes import app
from rlvr.tinker.service import Service
from rlvr.tinker.store import Store


def listener(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def serve(service: Service, sock: socket.socket, api_key: str) -> None:
    """Serve until SIGINT or SIGTERM (raised again once the server has stopped)."""
    import uvicorn

    config = uvicorn.Config(app(service, api_key), log_level="warning", access_log=False, lifespan="off",
                            timeout_keep_alive=75)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        service.close()
        sock.close()


class Running:
    """A server on ``host``:``port`` (0: a free port) in a thread of its own until ``close``; ``url`` is its
    base URL."""

    def __init__(self, models: list[ServedModel], state_dir: Path, api_key: str, device: str = "cpu",
                 host: str = "127.0.0.1", port: int = 0, place_tokenizers: bool = True):
        import uvicorn

        if place_tokenizers:
            for model in models:
                place_tokenizer(model)
        self.service = Service(models, Store(Path(state_dir)), device)
        self._socket = listener(host, port)
        self.url = url_of(self._socket)
        config = uvicorn.Config(app(self.service, api_key), log_level="warning", access_log=False, lifespan="off",
                                timeout_keep_alive=75)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name="rlvr-tinker-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self.service.close()
        self._socket.close()

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
