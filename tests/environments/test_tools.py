"""rlvr.environments.tools and tool_parsing: calls parsed from a turn, the ready tools, and
ToolBox, whose calls fail with a message (raise, hang, fork, allocate, print a lot) and
leave nothing behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import FORK_BOMB, processes_capped, tagged
from rlvr.base.errors import ConfigError
from rlvr.base.processes import jail
from rlvr.environments.base import ToolCall, ToolError, ToolResult
from rlvr.environments.sandbox import run_python
from rlvr.environments.tool_parsing import (
    PLAIN_ARGUMENT,
    TOOL_STYLES,
    calculator,
    call_arguments,
    format_tool_results,
    parse_tool_calls,
    tool_schema,
)
from rlvr.environments.tools import TOOLS, ToolBox

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="limits and /proc are Linux's")

KNOWN = ("calculator", "python")


# parsing


def test_json_calls_in_order_with_arguments_as_object_or_string():
    text = (
        'Let me add. <tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>\n'
        '<tool_call>\n{"name": "python", "arguments": "{\\"code\\": \\"print(3)\\"}"}\n</tool_call> done'
    )
    calls, errors = parse_tool_calls(text, "json", KNOWN)
    assert calls == [ToolCall("calculator", {"expression": "1+2"}), ToolCall("python", {"code": "print(3)"})]
    assert errors == []


def test_json_malformed_and_unknown_calls_are_failed_results():
    text = (
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"</tool_call>'  # a brace short
        '<tool_call>{"name": "search", "arguments": {}}</tool_call>'
        '<tool_call>["calculator"]</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": "[1]"}</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2"}}</tool_call>'
    )
    calls, errors = parse_tool_calls(text, "json", KNOWN)
    assert calls == [ToolCall("calculator", {"expression": "2"})]  # the good call still runs
    assert [e.error for e in errors] == [True] * 4
    assert "invalid JSON" in errors[0].content
    assert errors[1] == ToolResult("search", "unknown tool 'search'; tools: calculator, python", True)
    assert "expected {" in errors[2].content
    assert "arguments must be an object, not list" in errors[3].content


def test_json_call_cut_at_its_stop_string_still_parses():
    # an engine that stops at "</tool_call>" leaves it out of the text
    text = '<tool_call>{"name": "calculator", "arguments": {"expression": "7"}}'
    calls, errors = parse_tool_calls(text, "json", KNOWN)
    assert calls == [ToolCall("calculator", {"expression": "7"})] and errors == []
    calls, errors = parse_tool_calls('<tool_call>{"name": "calc', "json", KNOWN)
    assert calls == [] and "no </tool_call>" in errors[0].content
    assert parse_tool_calls("no call here, just {json}", "json", KNOWN) == ([], [])


def test_plain_calls_take_the_text_to_the_matching_paren():
    text = "so calculator(12345+67890) and calculator((1+2)*3) then\npython(print(1))"
    calls, errors = parse_tool_calls(text, "plain", KNOWN)
    assert calls == [
        ToolCall("calculator", {PLAIN_ARGUMENT: "12345+67890"}),
        ToolCall("calculator", {PLAIN_ARGUMENT: "(1+2)*3"}),
        ToolCall("python", {PLAIN_ARGUMENT: "print(1)"}),
    ]
    assert errors == []


def test_plain_text_without_a_known_call_is_no_call():
    assert parse_tool_calls("12+7=19 f(3) mycalculator(2) x.calculator(2) calculator (2)", "plain", KNOWN) == ([], [])
    calls, errors = parse_tool_calls("calculator(1+(2\ncalculator(4)", "plain", KNOWN)
    assert calls == [ToolCall("calculator", {PLAIN_ARGUMENT: "4"})]  # the unclosed call is on its own line
    assert errors == [ToolResult("calculator", "malformed tool call: no ')' closes calculator(", True)]


def test_call_arguments_give_a_plain_call_its_first_parameter():
    assert call_arguments({PLAIN_ARGUMENT: "1+2"}) == (("1+2",), {})
    assert call_arguments({"expression": "1+2"}) == ((), {"expression": "1+2"})
    (call,), _ = parse_tool_calls("calculator(6*7)", "plain", KNOWN)
    args, kwargs = call_arguments(call.arguments)
    assert calculator(*args, **kwargs) == "42"


def test_results_read_back_in_each_style():
    results = [ToolResult("calculator", "80235"), ToolResult("python", "ValueError: x", error=True)]
    assert format_tool_results(results, "plain") == "= 80235\n= error: ValueError: x\n"
    assert format_tool_results(results, "json") == (
        "<tool_response>\n80235\n</tool_response>\n<tool_response>\nerror: ValueError: x\n</tool_response>\n"
    )
    assert set(TOOL_STYLES) == {"json", "plain"} and all(style.help for style in TOOL_STYLES.values())
    with pytest.raises(ConfigError, match="did you mean 'json'"):
        parse_tool_calls("", "jsn", KNOWN)


def test_tool_schema_from_docstring_and_from_signature():
    pytest.importorskip("transformers")
    schema = tool_schema(calculator)
    assert schema["function"]["name"] == "calculator"
    assert schema["function"]["parameters"]["properties"]["expression"]["type"] == "string"
    assert schema["function"]["parameters"]["required"] == ["expression"]
    assert "arithmetic" in schema["function"]["description"]

    def lookup(key: int, table: str = "a"):  # no Args section: transformers refuses it, the signature serves
        """Look a key up."""

    fallback = tool_schema(lookup)["function"]
    assert fallback["description"] == "Look a key up."
    assert fallback["parameters"] == {
        "type": "object", "properties": {"key": {"type": "integer"}, "table": {"type": "string"}}, "required": ["key"]
    }


# calculator


def test_calculator_is_exact_on_big_integers_and_decimals():
    a, b = 1234567890123456789012345678901234567890, 9876543210987654321098765432109876543210
    assert calculator(f"{a} + {b}") == str(a + b) == "11111111101111111110111111111011111111100"
    assert calculator(f"{a} * -{b}") == str(-a * b)
    assert calculator("2 ** 100") == str(2**100)
    assert calculator("0.1 + 0.2") == "0.3"  # decimals, not binary floats
    assert calculator("(2.5 - 1) * 3 ** 4") == "121.5"
    assert calculator("7 / 2") == "3.5" and calculator("6 / 3") == "2"
    assert calculator("-7 // 2") == "-4" and calculator("-7 % 3") == "2"  # Python's floor, for ints...
    assert calculator("-7.5 // 2") == "-4" and calculator("-7.5 % 2") == "0.5"  # ...and decimals alike
    assert calculator("2 ** -2") == "0.25"
    assert calculator("1 / 3") == "0." + "3" * 50  # 50 significant digits
    assert len(calculator("(10 ** 999) ** 10")) == 9991  # within the bound


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("2 ** 1001", "exponent over 1000"),
        ("(10 ** 900) ** 12", "over 10000 digits"),  # refused before it is computed
        ("(10 ** 999) ** 10 * (10 ** 999) ** 10", "over 10000 digits"),
        ("__import__('os').system('true')", "not allowed"),
        ("x + 1", "not allowed"),
        ("True + 1", "not allowed"),
        ("'a' * 3", "not allowed"),
        ("1 +", "not an arithmetic expression"),
        ("1" * 1001, "over 1000 characters"),
        ("-" * 990 + "1", "nested too deeply"),
    ],
)
def test_calculator_refuses(expression, message):
    started = time.perf_counter()
    with pytest.raises(ValueError, match=message):
        calculator(expression)
    assert time.perf_counter() - started < 1.0  # refused, not computed


def test_calculator_division_by_zero():
    with pytest.raises(ZeroDivisionError):
        calculator("1 / (2 - 2)")
    with pytest.raises(ZeroDivisionError):
        calculator("0 ** -1")


# the python tool


def test_python_prints_and_reports_its_error(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("RLVR_SECRET", "hunter2")
    assert TOOLS["python"]("print(6 * 7)") == "42\n"
    assert run_python("import os; print(os.environ.get('RLVR_SECRET'))") == "None\n"  # an empty environment
    with pytest.raises(ToolError) as failed:
        run_python("print('before'); raise ValueError('boom')")
    text = str(failed.value)
    assert text.startswith("before\n") and "ValueError: boom" in text and text.endswith("[exit code 1]")
    with pytest.raises(ToolError, match="PermissionError: no network access"):
        run_python("import socket; socket.create_connection(('127.0.0.1', 9))")
    assert list(tmp_path.iterdir()) == []  # its folders are gone


def _fails(code: str, **limits) -> str:
    with pytest.raises(ToolError) as failed:
        run_python(code, **limits)
    return str(failed.value)


def test_python_limits():
    assert "CPU time limit of 1s" in _fails("while True: pass", cpu_seconds=1)
    assert "MemoryError" in _fails("x = bytearray(2 * 10**9)", memory_mb=200)
    assert _fails("print('x' * 10000)", max_output_chars=100) == (
        "x" * 100 + "\n[output cut: 10001 bytes in all, the limit is 100 characters]")
    flood = _fails("print('x' * 10**6)", max_output_chars=100)  # past 64 KiB the program is stopped
    assert flood.startswith("x" * 50 + "\n[output cut: ") and flood.endswith("[stopped: it printed past 65536 bytes]")
    assert "OSError: [Errno 27] File too large" in _fails("open('f', 'w').write('x' * 10**6)", max_output_chars=100)
    started = time.perf_counter()
    assert _fails("import time; time.sleep(30)", timeout=0.5) == "[timed out after 0.5s]"
    assert time.perf_counter() - started < 5


# the python tool's jail (bubblewrap): what a program starts ends with it, no network, no host files

jailed = pytest.mark.skipif(jail() is None, reason="bwrap is not installed (CI installs bubblewrap)")
_SLEEPER = "import os, sys; os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {tag!r}])"


@jailed
def test_a_program_leaves_no_process_even_in_a_session_of_its_own(tmp_path):
    tag = f"rlvr-daemon-{os.getpid()}-{time.monotonic_ns()}"
    daemon = f"""import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        {_SLEEPER.format(tag=tag)}
    os._exit(0)
time.sleep(0.5)
print("left a daemon")
"""
    assert run_python(daemon) == "left a daemon\n"
    assert tagged(tag) == []


@jailed
def test_a_program_reaches_no_host_socket_and_no_host_file(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    port = server.getsockname()[1]
    (tmp_path / "secret.txt").write_text("the run's")
    refused = _fails(f"import _socket; s = _socket.socket(); s.connect(('127.0.0.1', {port}))")
    assert "ConnectionRefusedError" in refused or "unreachable" in refused
    with pytest.raises(BlockingIOError):
        server.accept()  # nothing came
    server.close()
    # the checkout is not in the jail, nor what /tmp holds but the prefixes the jail binds (a venv under /tmp)
    checkout = Path(__file__).resolve().parents[2]
    bound = {Path(p).resolve().parts[2] for p in (sys.prefix, sys.base_prefix) if Path(p).resolve().parts[1] == "tmp"}
    code = (f"import os; print(os.path.exists({str(tmp_path)!r}), os.path.exists({str(checkout / 'src')!r}), "
            "sorted(os.listdir('/tmp')))")
    assert run_python(code) == f"False False {sorted({'work'} | bound)}\n"
    assert "Read-only file system" in _fails(f"open({str(Path(sys.base_prefix) / 'x')!r}, 'w')")


@pytest.mark.parametrize("jailed", [True, False])
def test_a_program_holds_at_most_max_processes(monkeypatch, jailed):
    from rlvr.base.processes import MAX_PROCESSES, ProcessCap, _pids_folder

    if not processes_capped(jailed):
        pytest.skip("no pids cgroup can be made here, and RLIMIT_NPROC does not bind root")
    if jailed and jail() is None:
        pytest.skip("bwrap is not installed (CI installs bubblewrap)")
    if not jailed:
        monkeypatch.setattr("rlvr.environments.sandbox.jail", lambda: None)
    made, init = [], ProcessCap.__init__

    def recorded(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self.folder)

    monkeypatch.setattr(ProcessCap, "__init__", recorded)
    started = int(run_python(FORK_BOMB, timeout=30))
    assert 0 < started < MAX_PROCESSES  # a fork bomb stops at the cap: 300 without one
    (folder,) = made
    if folder is None:  # no cgroup here: the jail's RLIMIT_NPROC held it
        assert jailed and os.geteuid() != 0
    else:  # its cgroup, made below this process's own (cgroup v1 or v2), is removed
        parent = _pids_folder()
        assert os.path.dirname(folder) == parent and os.path.isdir(parent)
        assert not [name for name in os.listdir(parent) if name.startswith(f"rlvr-{os.getpid()}-")]


def test_unjailed_a_daemon_in_a_session_of_its_own_ends_with_the_program(monkeypatch):
    monkeypatch.setattr("rlvr.environments.sandbox.jail", lambda: None)
    tag = f"rlvr-daemon-{os.getpid()}-{time.monotonic_ns()}"
    daemon = f"""import os, subprocess, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        {_SLEEPER.format(tag=tag)}
    os._exit(0)
os.wait()
print("left a daemon")
"""
    assert run_python(daemon) == "left a daemon\n"
    assert tagged(tag) == []


def _kills_its_supervisor(tag):
    """A program that starts a daemon in a session of its own, waits until it runs (its end of
    the pipe closes at its exec), then kills its supervisor (the same user may)."""
    return f"""import os, signal
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    {_SLEEPER.format(tag=tag)}
os.close(w)
os.read(r, 1)
os.kill(os.getppid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("cgroup", [True, False])
def test_unjailed_a_program_that_kills_its_supervisor_leaves_a_daemon_unless_a_cgroup_holds_it(monkeypatch, cgroup):
    """The fallback without bwrap, as docs/explanation/reliability.md says: the process cap's cgroup ends
    every process the program started, its supervisor gone or not; without one, a daemon
    started before the supervisor was killed outlives the call."""
    import signal
    import types

    monkeypatch.setattr("rlvr.environments.sandbox.jail", lambda: None)
    if cgroup and not processes_capped(False):
        pytest.skip("no pids cgroup can be made here")
    if not cgroup:
        monkeypatch.setattr("rlvr.environments.sandbox.ProcessCap",
                            lambda: types.SimpleNamespace(folder=None, join=lambda: None, close=lambda: None))
    tag = f"rlvr-daemon-{os.getpid()}-{time.monotonic_ns()}"
    with pytest.raises(ToolError, match=r"killed by SIGKILL"):
        run_python(_kills_its_supervisor(tag))
    left = tagged(tag)
    for pid in left:  # what escaped, ended here
        os.kill(pid, signal.SIGKILL)
    assert (left == []) == cgroup


def test_without_bwrap_it_says_so_once_and_runs_unjailed(monkeypatch):
    jail.cache_clear()
    monkeypatch.setattr("shutil.which", lambda name: None)
    try:
        with pytest.warns(UserWarning, match=r"without a namespace sandbox: bwrap is not installed "
                                             r"\(Debian: apt-get install bubblewrap\)"):
            assert jail() is None
        assert run_python("print(1)") == "1\n"
    finally:
        jail.cache_clear()


_TRAINER = """
import sys
from rlvr.environments.base import ToolCall
from rlvr.environments.tools import TOOLS, ToolBox
box = ToolBox({"python": TOOLS["python"]}, timeout=60)
print(box._folder, flush=True)
box.run([ToolCall("python", {"code": sys.argv[1]})])
"""


@jailed
def test_a_trainer_killed_mid_call_leaves_no_program_and_no_folder():
    import signal

    tag = f"rlvr-killed-{os.getpid()}-{time.monotonic_ns()}"
    trainer = subprocess.Popen([sys.executable, "-c", _TRAINER, _SLEEPER.format(tag=tag)], stdout=subprocess.PIPE,
                               text=True)
    folder = Path(trainer.stdout.readline().strip())
    deadline = time.monotonic() + 30
    while not tagged(tag) and time.monotonic() < deadline:  # the program is running
        time.sleep(0.02)
    assert tagged(tag) and folder.is_dir()
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    deadline = time.monotonic() + 10
    while (tagged(tag) or folder.exists()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert tagged(tag) == [] and not folder.exists()


def test_the_python_tool_takes_the_boxs_limits():
    with ToolBox({"python": TOOLS["python"]}, timeout=1.0, memory_mb=100, max_output_chars=50) as box:
        codes = ("import time; time.sleep(5)", "x = bytearray(300 * 2**20)", "print('y' * 60)",
                 "print(len(bytearray(2**20)))")
        slow, big, long, fine = box.run([ToolCall("python", {"code": code}) for code in codes])
    assert slow == ToolResult("python", "timed out after 1s", True)
    assert big.error and "MemoryError" in big.content  # 512 MB, the tool's own default, would hold it
    assert long.error and long.content.endswith("[output cut: 61 bytes in all, the limit is 50 characters]")
    assert fine == ToolResult("python", "1048576\n")


# ToolBox: module-level tools, as a worker started with "spawn" would need them


def fail():
    raise KeyError("nope")


def hang():
    time.sleep(60)


def greet(name, punctuation="!"):
    print("hello", end=" ")
    return f"{name}{punctuation}"


def leave_children(pid_file, then_hang=False):
    """Starts a child in a session of its own and a forked one, writes their pids, returns or hangs."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    forked = os.fork()
    if forked == 0:
        time.sleep(60)
        os._exit(0)
    Path(pid_file).write_text(f"{child.pid} {forked}")
    if then_hang:
        time.sleep(60)
    return "started"


def big():
    return "x" * 10**7


def chatty():
    for _ in range(10**5):
        print("a line")


def hog():
    return len(bytearray(2 * 10**9))


def connect():
    socket.create_connection(("127.0.0.1", 9))


def leave():
    os._exit(3)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _descendants() -> set[int]:
    parents = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            parents[int(name)] = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            pass
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


BOX_TOOLS = dict(TOOLS, fail=fail, hang=hang, greet=greet, leave_children=leave_children, big=big, chatty=chatty,
                 hog=hog, connect=connect, leave=leave)


# a call's time limit: short, since the hanging tools wait it out, and long enough for a jailed
# python to start on a loaded machine (two test workers on two cores)
BOX_TIMEOUT = 2


@pytest.fixture(scope="module")
def box():
    with ToolBox(BOX_TOOLS, timeout=BOX_TIMEOUT, memory_mb=300, max_output_chars=1000, num_workers=2) as tool_box:
        yield tool_box


def _works(box: ToolBox) -> None:
    assert box.run([ToolCall("calculator", {PLAIN_ARGUMENT: "1+1"})]) == [ToolResult("calculator", "2")]


def test_toolbox_runs_a_batch_in_order(box):
    a, b = 10**39 + 7, 2 * 10**39 + 5
    calls = [
        ToolCall("calculator", {"expression": f"{a} + {b}"}),
        ToolCall("greet", {"name": "Ada", "punctuation": "?"}),
        ToolCall("search", {}),
        ToolCall("greet", {"nom": "Ada"}),
        ToolCall("python", {"code": "print(2 ** 10)"}),
        ToolCall("fail"),
    ]
    results = box.run(calls)
    assert [r.name for r in results] == [c.name for c in calls]
    assert results[0] == ToolResult("calculator", str(a + b))
    assert results[1] == ToolResult("greet", "hello Ada?")  # printed, then returned
    assert results[2].error and results[2].content.startswith("unknown tool 'search'")
    assert results[3].error and results[3].content.startswith("bad arguments: ")
    assert results[4] == ToolResult("python", "1024\n")
    assert results[5] == ToolResult("fail", "KeyError: 'nope'", True)


def test_plain_turn_through_the_box(box):
    calls, errors = parse_tool_calls("calculator(12345+67890)", "plain", box.names)
    assert format_tool_results(box.run(calls) + errors, "plain") == "= 80235\n"
    calls, _ = parse_tool_calls("calculator(1/0)", "plain", box.names)
    assert format_tool_results(box.run(calls), "plain") == "= error: ZeroDivisionError: division by zero\n"


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("hang", f"timed out after {BOX_TIMEOUT}s"),
        ("hog", "MemoryError"),
        ("connect", "PermissionError: tools have no network access"),
        ("leave", "its process exited with code 3 and no result"),
    ],
)
def test_toolbox_failures_are_messages(box, name, content):
    assert box.run([ToolCall(name)]) == [ToolResult(name, content, True)]
    _works(box)


@pytest.mark.parametrize("name", ["big", "chatty"])
def test_toolbox_bounds_output(box, name):
    (result,) = box.run([ToolCall(name)])
    assert result.error and len(result.content) < 1100
    assert result.content.endswith(" characters, the limit is 1000]")
    assert result.content.startswith("x" * 1000 if name == "big" else "a line\na line\n")
    _works(box)


@pytest.mark.parametrize("then_hang", [False, True])
def test_toolbox_call_leaves_no_process(box, tmp_path, then_hang):
    pid_file = tmp_path / "pids"
    (result,) = box.run([ToolCall("leave_children", {"pid_file": str(pid_file), "then_hang": then_hang})])
    assert result == (ToolResult("leave_children", f"timed out after {BOX_TIMEOUT}s", True) if then_hang
                      else ToolResult("leave_children", "started"))
    pids = [int(pid) for pid in pid_file.read_text().split()]
    assert len(pids) == 2 and not any(_alive(pid) for pid in pids)
    _works(box)


def test_close_leaves_no_process_or_file(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = _descendants()
    with ToolBox(BOX_TOOLS, timeout=BOX_TIMEOUT, num_workers=2) as tool_box:
        results = tool_box.run([ToolCall("python", {"code": "open('f', 'w').write('x'); print(1)"}), ToolCall("hang")])
        assert [r.content for r in results] == ["1\n", f"timed out after {BOX_TIMEOUT}s"]
        assert _descendants() - before  # the workers and their reaper
    assert not any(_alive(pid) for pid in _descendants() - before)
    assert list(tmp_path.iterdir()) == []


def test_json_nested_too_deeply_is_a_malformed_call():
    """The JSON parser recurses once per bracket: a policy's 100,000 brackets are a malformed
    call, not a RecursionError that ends the run."""
    deep = "[" * 100_000 + "]" * 100_000
    for body in (deep, '{"name": "calculator", "arguments": "' + deep + '"}'):
        calls, errors = parse_tool_calls(f"<tool_call>{body}</tool_call>", "json", {"calculator"})
        assert calls == []
        assert len(errors) == 1 and errors[0].error
        assert "nested too deeply" in errors[0].content
