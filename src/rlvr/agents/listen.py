"""The endpoint's listening side: uvicorn bounded and quiet.

Agents may open as many connections as they like, each a descriptor of the trainer's: the endpoint accepts them
itself and holds at most ``max_connections`` (at the cap the least recently active idle one is closed), each
request read whole within ``read_timeout`` seconds. Nothing reaches uvicorn's log as a traceback.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import functools
import logging
import os
import socket
import tempfile
from collections.abc import Callable
from typing import Any

from rlvr.agents.chat import RequestError
from rlvr.environments.base import describe_error

logger = logging.getLogger(__name__)

READ_TIMEOUT = 30.0  # seconds to read one request whole, from its connection (or the last reply) on
MAX_CONNECTIONS = 4096  # held at once, however high the descriptor limit
BACKLOG = 2048  # connections the kernel queues for the endpoint to accept
RETRY = 1.0  # seconds before accepting again when the process is out of descriptors (as asyncio waits)
SHORT_OF = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def connection_cap() -> int:
    """Connections the endpoint holds at once by default: a quarter of the process's descriptor limit (the rest is
    the trainer's)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(8, min(MAX_CONNECTIONS, soft // 4))


def sockets(host: str, port: int) -> tuple[socket.socket, socket.socket, tempfile.TemporaryDirectory]:
    """A TCP socket listening on ``host``:``port`` and a Unix socket in a private folder (under /tmp: a socket's
    path has room for about 100 characters)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    tcp = socket.create_server((host, port), family=family, backlog=BACKLOG)
    folder = tempfile.TemporaryDirectory(prefix="rlvr-endpoint-", dir="/tmp" if os.path.isdir("/tmp") else None)
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        unix.bind(os.path.join(folder.name, "endpoint.sock"))
        unix.listen(BACKLOG)
    except OSError:
        unix.close()
        tcp.close()
        folder.cleanup()
        raise
    return tcp, unix, folder


class Guard:
    """The connections of one server, least recently active first, each with its deadline to read its request."""

    def __init__(self, max_connections: int, read_timeout: float) -> None:
        self.max_connections, self.read_timeout = max_connections, read_timeout
        self.held: collections.OrderedDict[Any, asyncio.TimerHandle | None] = collections.OrderedDict()
        self._closed: asyncio.Event | None = None  # set when one closes (the server's loop)

    async def room(self) -> None:
        """Returns once fewer than ``max_connections`` are held: at the cap, the least recently active of those
        waiting for a request is closed (else one that ends is waited for)."""
        while len(self.held) >= self.max_connections:
            idle = next((c for c in self.held if waiting(c) and not c.transport.is_closing()), None)
            if idle is not None:
                self.drop(idle)
            self._closed = self._closed or asyncio.Event()
            self._closed.clear()
            await self._closed.wait()

    def made(self, connection: Any) -> None:
        self.held[connection] = None
        self.arm(connection)

    def lost(self, connection: Any) -> None:
        self.disarm(connection)
        self.held.pop(connection, None)
        if self._closed is not None:
            self._closed.set()

    def active(self, connection: Any) -> None:
        if connection in self.held:
            self.held.move_to_end(connection)

    def arm(self, connection: Any) -> None:
        """From now on, ``read_timeout`` seconds to read the connection's next request whole."""
        self.disarm(connection)
        if connection in self.held:
            self.held[connection] = connection.loop.call_later(self.read_timeout, self._late, connection)

    def disarm(self, connection: Any) -> None:
        deadline = self.held.get(connection)
        if deadline is not None:
            deadline.cancel()
            self.held[connection] = None

    def drop(self, connection: Any) -> None:
        """Closed at once (its descriptor on the loop's next turn, when ``lost`` is called)."""
        self.disarm(connection)
        connection.transport.abort()

    def _late(self, connection: Any) -> None:
        cycle = connection.cycle
        if cycle is None or cycle.more_body or cycle.response_complete:  # headers or body still coming
            self.drop(connection)


def waiting(connection: Any) -> bool:
    """Whether the connection holds no request: before its first, or between two."""
    return connection.cycle is None or connection.cycle.response_complete


def guarded_protocol(guard: Guard) -> type:
    """uvicorn's HTTP/1.1 protocol, its connections kept by ``guard``."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Guarded(H11Protocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            guard.made(self)

        def connection_lost(self, exc: Exception | None) -> None:
            guard.lost(self)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            guard.active(self)
            super().data_received(data)

        def handle_events(self) -> None:
            super().handle_events()
            # the request is read whole; a cycle whose response is complete is the last request's, kept until
            # the next one's headers are read, so the next one's first bytes leave its deadline armed
            cycle = self.cycle
            if cycle is not None and not cycle.more_body and not cycle.response_complete:
                guard.disarm(self)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                guard.arm(self)  # the next request on this connection is read within the same time

    return Guarded


def one_line_errors(app: Any, name: str = "the agent endpoint", reply: Callable[[str], Any] | None = None) -> Any:
    """``app`` (ASGI) with every exception answered as a 500 of the exception's one line (where nothing has been
    sent yet; else the reply is cut short), and raised no further: not a Starlette middleware, whose outermost
    layer would raise it again for the server to log with its traceback. ``reply(line)``: the 500's response
    (default: OpenAI's error shape); ``name`` says whose it was in the log."""
    from starlette.requests import ClientDisconnect
    from starlette.responses import JSONResponse

    def openai_error(line: str) -> Any:
        return JSONResponse(RequestError(500, line, kind="server_error").body(), status_code=500)

    answer = reply or openai_error

    async def guarded(scope: dict, receive: Any, send: Any) -> None:
        started = False

        async def sending(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await app(scope, receive, sending)
        except Exception as exc:  # noqa: BLE001 - the request's failure is its reply, never the server's
            line = describe_error(exc, 300).replace("\n", " ")
            if not isinstance(exc, ClientDisconnect):  # a client gone (or dropped) is no fault of the server's
                logger.warning("%s answered 500: %s", name, line)
            if not started and scope["type"] == "http":
                await answer(line)(scope, receive, send)

    return guarded


def serve(server: Any, listening: list[socket.socket], guard: Guard) -> None:
    """Run the uvicorn ``server`` in the calling thread's own event loop (errors logged as one line each) on the
    connections accepted from ``listening`` within ``guard``'s cap."""

    def one_line(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        logger.warning("the agent endpoint: %s%s", context.get("message", "error"),
                       f" ({describe_error(exc, 300)})" if exc is not None else "")

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(one_line)
        config = server.config
        if not config.loaded:
            config.load()
        protocol = functools.partial(config.http_protocol_class, config=config, server_state=server.server_state,
                                     app_state={})
        accepting = [asyncio.ensure_future(_accept(listener, protocol, guard, server)) for listener in listening]
        try:
            await server.serve(sockets=[])  # no listener of its own: the connections are handed to it
        finally:
            for task in accepting:
                task.cancel()
            for listener in listening:
                listener.close()

    asyncio.run(main())


async def _accept(listener: socket.socket, protocol: Any, guard: Guard, server: Any) -> None:
    """Connections from ``listener``, one at a time, each once ``guard`` has room for it."""
    loop = asyncio.get_running_loop()
    listener.setblocking(False)
    while not server.should_exit:
        await guard.room()
        try:
            connection, _ = await loop.sock_accept(listener)
        except OSError as err:  # out of descriptors (the trainer's other files, say), or a connection reset
            if err.errno in SHORT_OF:
                logger.warning("the agent endpoint could not accept a connection: %s", describe_error(err, 200))
                await asyncio.sleep(RETRY)
            continue
        try:
            await loop.connect_accepted_socket(protocol, connection)
        except Exception as err:  # noqa: BLE001 - one connection's failure is no reason to stop accepting
            connection.close()
            logger.warning("the agent endpoint dropped a connection: %s", describe_error(err, 200))
