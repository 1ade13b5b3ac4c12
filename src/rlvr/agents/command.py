"""An agent that is a program: ``task.options.agent_command``, started once per episode.

The program is any command (``python my_agent.py``, a binary, a shell script): it reads its row as one line of JSON
on stdin, talks to the model through the environment's ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``, and writes its
reward as stdout's last line: a number, or a JSON object with ``reward`` (and ``solved``, and more numbers), as
``run(client, row)`` returns them. A non-zero exit, no reward line, or a run past the episode's time-out is the
episode's error (it abstains).

It runs in a jail where bubblewrap makes namespaces (``rlvr.base.processes.jail``; a relay inside, ``_RELAY``, passes
its loopback connections to the endpoint's Unix socket, the one way out), under ``rlvr.base.processes.supervise``
with ``memory_mb`` of address space and at most ``MAX_PROCESSES`` processes; it and all it started are killed when
the episode ends. docs/explanation/isolation.md says what each mechanism bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from rlvr.base.processes import ProcessCap, jail, kill_group, kill_tree, killed_by, supervised

MAX_OUTPUT_BYTES = 1 << 20  # of stdout kept (the reward is its last line) and of stderr (its tail, in the error)
_ERROR_CHARS = 300
_JAILED_SOCKET = "/tmp/rlvr-endpoint.sock"  # the endpoint's Unix socket, inside the jail

# Runs inside the jail: listen on the jail's loopback, relay each connection to the endpoint's Unix socket, start the
# agent (under its supervisor) with the base URL on that port, and exit with its exit code.
_RELAY = r"""
import asyncio, os, sys
socket_path, argv = sys.argv[1], sys.argv[2:]
path = os.environ.pop("RLVR_EPISODE_PATH")

async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()

async def relay(reader, writer):
    try:
        upstream_reader, upstream_writer = await asyncio.open_unix_connection(socket_path)
    except OSError:
        writer.close()
        return
    await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

async def main():
    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    env = dict(os.environ, OPENAI_BASE_URL=f"http://127.0.0.1:{port}{path}")
    try:
        agent = await asyncio.create_subprocess_exec(*argv, env=env)
    except OSError as err:
        print(f"cannot start the agent command: {err}", file=sys.stderr)
        return 127
    code = await agent.wait()
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell says it

sys.exit(asyncio.run(main()))
"""


def command_agent(command: str | Sequence[str], endpoint: Any, memory_mb: int = 2048) -> Callable[..., Any]:
    """An agent (``run(client, row)``, async) that runs ``command`` for each episode against ``endpoint`` (its URL
    and key come from the client the runner gives)."""
    argv = shlex.split(command) if isinstance(command, str) else [str(part) for part in command]
    if not argv:
        raise ValueError("the agent command is empty")

    async def run(client: Any, row: Any) -> Any:
        url, key = str(client.base_url).rstrip("/"), client.api_key
        data = (json.dumps(row) + "\n").encode()
        return _outcome(*await _run(argv, url, key, data, endpoint.unix_socket, memory_mb << 20))

    run.__name__ = os.path.basename(argv[0])
    return run


async def _run(argv: list[str], url: str, key: str, data: bytes, unix_socket: str | None, memory: int
               ) -> tuple[int, bytes, bytes]:
    """(exit code, stdout's last MAX_OUTPUT_BYTES, stderr's) of one run of ``argv``, jailed where ``jail()``
    can; killed with everything it started when this returns or is cancelled (the episode's time-out)."""
    options = jail()
    cap = ProcessCap()
    try:
        return await _run_capped(argv, url, key, data, unix_socket, memory, options, cap)
    finally:
        cap.close()


async def _run_capped(argv: list[str], url: str, key: str, data: bytes, unix_socket: str | None, memory: int,
                      options: tuple[str, ...] | None, cap: ProcessCap) -> tuple[int, bytes, bytes]:
    env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin", "OPENAI_API_KEY": key,
           "OPENAI_BASE_URL": url, "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8"}
    if options is not None:
        if unix_socket is None:
            raise RuntimeError("the endpoint has no Unix socket for a jailed agent command (it is not started)")
        cwd = os.getcwd()
        # the key and the episode's path reach the jail through a pipe (bwrap's --args), not the command line, which
        # every local user can read
        secret = ["--setenv", "OPENAI_API_KEY", key, "--setenv", "RLVR_EPISODE_PATH", urlsplit(url).path]
        reader, writer = os.pipe()
        os.write(writer, "\0".join(secret).encode() + b"\0")
        os.close(writer)
        program = [*options, "--args", str(reader), "--ro-bind", cwd, cwd, "--bind", unix_socket,
                   _JAILED_SOCKET, "--chdir", cwd, "--setenv", "PATH", env["PATH"], "--setenv", "LANG", "C.UTF-8",
                   "--", os.path.realpath(sys.executable), "-I", "-S", "-c", _RELAY, _JAILED_SOCKET,
                   *supervised(argv, memory, jailed=True)]
    else:
        program, reader = supervised(argv, memory), None
    pipe = asyncio.subprocess.PIPE
    try:
        process = await asyncio.create_subprocess_exec(*program, stdin=pipe, stdout=pipe, stderr=pipe, env=env,
                                                       start_new_session=True, preexec_fn=cap.join,
                                                       pass_fds=() if reader is None else (reader,))
    finally:
        if reader is not None:
            os.close(reader)
    tails = asyncio.gather(_tail(process.stdout), _tail(process.stderr))
    try:
        await _feed(process.stdin, data)
        code = await process.wait()
        kill_group(process.pid)  # what it left running would hold its pipes open
        out, err = await tails
        return code, out, err
    finally:
        if process.returncode is None:  # cut short: what it started and left, in a session of its own too
            kill_tree(process.pid)  # (its supervisor is their subreaper; one that ended killed them itself)
        kill_group(process.pid)  # it, and its group
        transport = getattr(process, "_transport", None)
        try:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await asyncio.shield(process.wait())
        finally:  # its pipes closed now (also when cancelled again while waiting), not after the loop is gone
            tails.cancel()
            if transport is not None:
                transport.close()


async def _feed(stdin: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a program that never reads its row
        stdin.write(data)
        await stdin.drain()
        stdin.close()


async def _tail(stream: asyncio.StreamReader) -> bytes:
    """All of ``stream`` read, its last MAX_OUTPUT_BYTES kept."""
    kept = bytearray()
    while chunk := await stream.read(65536):
        kept += chunk
        if len(kept) > 2 * MAX_OUTPUT_BYTES:
            del kept[:-MAX_OUTPUT_BYTES]
    return bytes(kept[-MAX_OUTPUT_BYTES:])


def _outcome(code: int, out: bytes, err: bytes) -> Any:
    """Its last stdout line as JSON (a number or an object), or a RuntimeError naming why there is none."""
    if code != 0:
        name = killed_by(code)
        why = f"exited with code {code}" if name is None else f"was killed by {name}"
        raise RuntimeError(f"the agent command {why}{_stderr(err)}")
    lines = out.decode("utf-8", errors="replace").strip().splitlines()
    if not lines:
        raise RuntimeError(f"the agent command wrote no reward on stdout{_stderr(err)}")
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        raise RuntimeError(f"the agent command's last line is not a number or JSON object: "
                           f"{lines[-1][:_ERROR_CHARS]!r}") from None


def _stderr(err: bytes) -> str:
    tail = err.decode("utf-8", errors="replace").strip()[-_ERROR_CHARS:]
    return f": {tail}" if tail else ""
