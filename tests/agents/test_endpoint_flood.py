"""The endpoint under a flood of idle connections: more than the trainer's descriptor limit,
over TCP and the Unix socket, none finishing its headers. The trainer (a child process with
a low descriptor limit, so that the flood is cheap) runs its agents' episodes through it
all the same, and logs no traceback."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

LIMIT = 256  # the trainer's descriptors
FLOOD = 400  # idle connections, half to each socket

TRAINER = """
import json, resource, sys
sys.path.insert(0, sys.argv[2])
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[3]), hard))
from agents_for_tests import two_calls
from rlvr.agents.runner import AgentLimits, run_agents
from rlvr.agents.server import Endpoint
from rlvr.policies.causal_lm import CausalLMPolicy

endpoint = Endpoint(CausalLMPolicy.from_pretrained(sys.argv[1], max_new_tokens=4))
endpoint.start()
print(json.dumps({"port": endpoint.port, "unix": endpoint.unix_socket}), flush=True)
sys.stdin.readline()  # the flood is open
runs = run_agents(endpoint, two_calls, [{"digit": 3}], 2, 1.0, [0, 1], AgentLimits(timeout=60, max_tokens=64))
print(json.dumps([[run.calls, run.error] for run in runs]), flush=True)
endpoint.close()
"""


def test_idle_connections_past_the_descriptor_limit_leave_the_run_alive(chat_model):
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(chat_model), str(Path(__file__).parent),
                                str(LIMIT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    flood = []
    try:
        address = json.loads(trainer.stdout.readline() or "{}")
        assert address, trainer.communicate(timeout=60)[1][-2000:]
        for k in range(FLOOD):
            family, target = ((socket.AF_INET, ("127.0.0.1", address["port"])) if k % 2
                              else (socket.AF_UNIX, address["unix"]))
            connection = socket.socket(family, socket.SOCK_STREAM)
            connection.settimeout(2)  # a listener that stopped accepting fills its queue: no wait on it
            flood.append(connection)
            try:
                connection.connect(target)
                connection.sendall(b"POST /episodes/x/v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # never ends
            except OSError:  # closed by the endpoint already, or not taken
                pass
        out, err = trainer.communicate("go\n", timeout=120)
    finally:
        for connection in flood:
            connection.close()
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    assert trainer.returncode == 0, err[-2000:]
    assert json.loads(out.splitlines()[-1]) == [[2, None]] * 2, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
