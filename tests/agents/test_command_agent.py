"""Agent commands: a program per episode, its row on stdin, the endpoint through
OPENAI_BASE_URL, its reward on stdout; jailed where bubblewrap runs (its only way out is
the endpoint), and every way it can fail named as its episode's error."""

import asyncio
import sys
import textwrap

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from helpers import FORK_BOMB, processes_capped, tagged  # noqa: E402
from rlvr.agents.command import command_agent  # noqa: E402
from rlvr.base.processes import jail  # noqa: E402

AGENT = textwrap.dedent("""
    import json, os, sys
    import openai

    row = json.loads(sys.stdin.readline())
    client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    reply = client.chat.completions.create(model="any", messages=[{"role": "user", "content": f"Say {row['digit']}"}])
    text = reply.choices[0].message.content
    print("some chatter first")
    print(json.dumps({"reward": float(str(row["digit"]) in text), "solved": False, "length": len(text)}))
""")


@pytest.fixture(scope="module")
def endpoint(chat_model):
    from rlvr.agents.server import Endpoint
    from rlvr.policies.causal_lm import CausalLMPolicy

    served = Endpoint(CausalLMPolicy.from_pretrained(str(chat_model), max_new_tokens=6))
    served.start()
    yield served
    served.close()


def run(endpoint, program, tmp_path, row, timeout=60.0, memory_mb=2048):
    """One episode of ``program`` (Python source, run as ``python agent.py`` in ``tmp_path``):
    (what it returned, the endpoint's record of its calls)."""
    (tmp_path / "agent.py").write_text(program)
    agent = command_agent([sys.executable, "agent.py"], endpoint, memory_mb)
    episode = endpoint.open(seed=3, temperature=1.0, max_tokens=100)
    client = openai.AsyncOpenAI(base_url=endpoint.url(episode), api_key=endpoint.key(episode))
    try:
        return asyncio.run(asyncio.wait_for(agent(client, row), timeout)), endpoint.finish(episode)
    except BaseException:
        endpoint.finish(episode)
        raise


@pytest.mark.parametrize("jailed", [True, False])
def test_a_command_reads_its_row_calls_the_endpoint_and_writes_its_reward(endpoint, tmp_path, monkeypatch, jailed):
    if jailed and jail() is None:
        pytest.skip("bwrap is not installed (CI installs bubblewrap)")
    if not jailed:
        monkeypatch.setattr("rlvr.agents.command.jail", lambda: None)
    monkeypatch.chdir(tmp_path)
    returned, record = run(endpoint, AGENT, tmp_path, {"digit": 4})
    assert set(returned) == {"reward", "solved", "length"} and returned["solved"] is False
    assert len(record.calls) == 1  # its one call, recorded token in token out
    assert returned["length"] == len(endpoint.policy.tokenizer.decode(record.calls[0].completion_ids,
                                                                       skip_special_tokens=True))


@pytest.mark.skipif(jail() is None, reason="bwrap is not installed (CI installs bubblewrap)")
def test_a_jailed_command_reaches_the_endpoint_and_nothing_else(endpoint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    probe = textwrap.dedent(f"""
        import json, os, socket, sys
        sys.stdin.readline()
        try:
            socket.create_connection(("127.0.0.1", {endpoint.port}), timeout=2)  # the host's loopback
            host = "reached"
        except OSError as err:
            host = type(err).__name__
        try:
            open("written.txt", "w")
            wrote = True
        except OSError:
            wrote = False
        key = os.environ["OPENAI_API_KEY"].encode()
        shown = [open(f"/proc/{{p}}/cmdline", "rb").read() for p in os.listdir("/proc") if p.isdigit()]
        print(json.dumps({{"reward": 0.5, "host": host, "wrote": wrote, "pid": os.getpid(),
                          "key_in_argv": any(key in line for line in shown),
                          "base": os.environ["OPENAI_BASE_URL"].startswith("http://127.0.0.1:")}}))
    """)
    returned, _ = run(endpoint, probe, tmp_path, {})
    assert returned["host"] != "reached" and returned["wrote"] is False  # no way out but the endpoint; cwd read-only
    assert returned["base"] and returned["pid"] < 10  # its own PID namespace
    assert returned["key_in_argv"] is False  # the key is in no command line (the relay's, its own)
    returned, record = run(endpoint, AGENT, tmp_path, {"digit": 2})  # and the endpoint is reachable
    assert len(record.calls) == 1 and "reward" in returned


@pytest.mark.parametrize(("program", "message"), [
    ("import sys; sys.stderr.write('no key given'); sys.exit(3)", "the agent command exited with code 3: no key given"),
    ("print('done')", "the agent command's last line is not a number or JSON object: 'done'"),
    ("pass", "the agent command wrote no reward on stdout"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "the agent command was killed by SIGKILL"),
])
def test_a_failing_command_is_named(endpoint, tmp_path, monkeypatch, program, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError) as raised:
        run(endpoint, program, tmp_path, {})
    assert str(raised.value) == message


def test_a_command_past_its_time_is_killed_with_what_it_started(endpoint, tmp_path, monkeypatch):
    import os
    import time
    import uuid

    monkeypatch.chdir(tmp_path)
    tag = f"rlvr-test-{uuid.uuid4().hex}"
    program = textwrap.dedent(f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "{tag}"])
        time.sleep(60)
    """)

    def running():
        found = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                found += tag.encode() in open(f"/proc/{pid}/cmdline", "rb").read()
            except OSError:
                pass
        return found

    (tmp_path / "agent.py").write_text(program)
    agent = command_agent([sys.executable, "agent.py"], endpoint)
    episode = endpoint.open(seed=3, temperature=1.0, max_tokens=100)

    async def until_its_child_runs_then_cancelled():
        task = asyncio.ensure_future(agent(openai.AsyncOpenAI(base_url=endpoint.url(episode), api_key="k"), {}))
        for _ in range(200):
            await asyncio.sleep(0.05)
            if running():
                break
        seen = running()
        task.cancel()  # what the episode's time-out does
        with pytest.raises(asyncio.CancelledError):
            await task
        return seen

    try:
        assert asyncio.run(until_its_child_runs_then_cancelled()) == 1
    finally:
        endpoint.finish(episode)
    deadline = time.monotonic() + 5
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running()  # the program's own child went with it


def test_the_runs_stop_signal_cuts_a_batch_of_agents_short(endpoint, tmp_path, monkeypatch):
    """The first Ctrl-C (STOPPING) cancels every running episode at once, hung agents and
    agent commands alike, and raises CutShort: the trainer drops the batch; no episode stays
    live at the endpoint."""
    import threading
    import time

    from rlvr.agents.runner import AgentLimits, run_agents
    from rlvr.base.errors import STOPPING, CutShort

    monkeypatch.chdir(tmp_path)
    (tmp_path / "agent.py").write_text("import time; time.sleep(60)")

    async def hangs(client, row):
        await asyncio.sleep(3600)

    for agent in (hangs, command_agent([sys.executable, "agent.py"], endpoint)):
        timer = threading.Timer(0.5, STOPPING.set)
        timer.start()
        began = time.monotonic()
        try:
            with pytest.raises(CutShort, match="a stop signal cut the agents' episodes short"):
                run_agents(endpoint, agent, [{"digit": 1}, {"digit": 2}], 2, 1.0, [1, 2, 3, 4],
                           AgentLimits(timeout=60))
        finally:
            timer.cancel()
            STOPPING.clear()
        assert time.monotonic() - began < 10
        assert not endpoint._episodes  # every episode finished


def test_unjailed_a_daemon_in_a_session_of_its_own_ends_with_the_command(endpoint, tmp_path, monkeypatch):
    import uuid

    monkeypatch.setattr("rlvr.agents.command.jail", lambda: None)
    monkeypatch.chdir(tmp_path)
    tag = f"rlvr-test-{uuid.uuid4().hex}"
    program = textwrap.dedent(f"""
        import os, subprocess, sys
        middle = os.fork()
        if middle == 0:  # a daemon: a double fork into a session of its own
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "{tag}"], start_new_session=True)
            os._exit(0)
        os.waitpid(middle, 0)
        print(1.0)
    """)
    assert run(endpoint, program, tmp_path, {})[0] == 1.0
    assert tagged(tag) == []


@pytest.mark.parametrize("jailed", [True, False])
def test_a_command_holds_at_most_max_processes(endpoint, tmp_path, monkeypatch, jailed):
    from rlvr.base.processes import MAX_PROCESSES

    if not processes_capped(jailed) or (jailed and jail() is None):
        pytest.skip("no pids cgroup here, and RLIMIT_NPROC binds neither root nor a program outside a jail")
    if not jailed:
        monkeypatch.setattr("rlvr.agents.command.jail", lambda: None)
    monkeypatch.chdir(tmp_path)
    started = run(endpoint, FORK_BOMB, tmp_path, {})[0]
    assert 0 < started < MAX_PROCESSES  # a fork bomb stops at the cap: 300 without one


@pytest.mark.skipif(jail() is None, reason="bwrap is not installed (CI installs bubblewrap)")
def test_a_jailed_command_runs_in_a_virtual_environment_and_a_checkout_under_tmp(tmp_path):
    """A venv and a checkout under /tmp (the jail's private /tmp must not hide them): ``python``
    on PATH is the venv's, with its prefix."""
    import os
    import pathlib
    import shutil
    import socket
    import subprocess

    venv, checkout = tmp_path / "venv", tmp_path / "checkout"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    shutil.copytree(pathlib.Path(__file__).resolve().parents[2] / "src", checkout / "src")
    (checkout / "agent.py").write_text("import json, sys; sys.stdin.readline(); print(json.dumps(sys.prefix))")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "endpoint.sock"))  # the endpoint's socket, never called here
    script = textwrap.dedent(f"""
        import asyncio, types
        from rlvr.agents.command import command_agent
        agent = command_agent("python agent.py", types.SimpleNamespace(unix_socket={str(tmp_path / "endpoint.sock")!r}))
        client = types.SimpleNamespace(base_url="http://127.0.0.1:1/v1/episodes/e", api_key="k")
        print(asyncio.run(agent(client, {{}})))
    """)
    env = dict(os.environ, PYTHONPATH=str(checkout / "src"))
    try:
        done = subprocess.run([str(venv / "bin" / "python"), "-c", script], cwd=checkout, env=env, capture_output=True,
                              text=True, timeout=120)
    finally:
        listener.close()
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == str(venv)
