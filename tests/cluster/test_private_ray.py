"""The suite's Ray and a run's own are their own: the suite's folder is the session's
(``RAY_TMPDIR``), not the ``/tmp/ray`` every other Ray on the machine shares, and neither
holds a fixed port."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray


def ray_processes(session: str) -> tuple[dict[int, str], set[int]]:
    """The command lines of this process's descendants that belong to the Ray ``session``
    (by pid), and the ports they listen on."""
    psutil = pytest.importorskip("psutil")
    commands, listening = {}, set()
    for process in psutil.Process().children(recursive=True):
        try:
            command = " ".join(process.cmdline())
            if session in command:
                commands[process.pid] = command
                listening |= {c.laddr.port for c in process.net_connections("inet") if c.status == psutil.CONN_LISTEN}
        except psutil.Error:  # ended meanwhile (an idle worker)
            continue
    return commands, listening


def assert_no_fixed_port(commands: dict[int, str], listening: set[int]) -> None:
    assert any("dashboard.py" in command for command in commands.values()), commands  # Ray's processes were found
    given = {option for command in commands.values() for option in re.findall(r"--[\w-]*port[\w-]*=\d+", command)}
    assert "--port=0" in given  # the dashboard's: 8265 unless given
    # ray.init has no setting for the dashboard agent's HTTP port (52365): the ray extra's Ray
    # (without the dashboard's packages) opens no HTTP server there, which this checks.
    fixed = {option for option in given if not option.endswith("=0")}
    assert {option for option in fixed if not option.startswith("--listen-port=")} == set(), fixed
    assert not listening & {int(option.split("=")[1]) for option in fixed}, (fixed, listening)


def test_the_suites_ray_has_a_folder_of_its_own_and_no_fixed_port(ray_local, ray_temp_dir):
    pytest.importorskip("psutil")
    context = ray_local.get_runtime_context()
    temp_dir = Path(context.get_temp_dir())
    assert temp_dir.is_relative_to(ray_temp_dir) and not temp_dir.is_relative_to("/tmp/ray")
    assert os.environ["RAY_TMPDIR"] == str(ray_temp_dir)  # so the runs tests start in processes of their own too
    assert_no_fixed_port(*ray_processes(str(temp_dir / context.get_session_name())))


_RUNS_OWN_RAY = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from test_private_ray import ray_processes
from rlvr.cluster.session import Cluster
from rlvr.config import load_config

cluster = Cluster(load_config(None, ["cluster.address=null"]), None)  # no actors: Ray alone
try:
    commands, listening = ray_processes(str(cluster.session_dir))
finally:
    cluster.close()
print(json.dumps([commands, sorted(listening)]))
"""


def test_a_runs_own_ray_holds_no_fixed_port():
    """A run that starts its Ray (in a process of its own: the suite's is initialised here)
    gives its dashboard the OS's pick of port, not Ray's default 8265 that another Ray or
    program on the machine may hold."""
    pytest.importorskip("psutil")
    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="rt", dir="/tmp"),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        done = subprocess.run([sys.executable, "-c", _RUNS_OWN_RAY, os.path.dirname(__file__)], env=env,
                              capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    commands, listening = json.loads(done.stdout.strip().splitlines()[-1])
    assert_no_fixed_port(commands, set(listening))
