"""The suite's Ray is its own: its folder is the session's (``RAY_TMPDIR``), not the
``/tmp/ray`` every other Ray on the machine shares, and it holds no fixed port."""

import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray


def test_the_suites_ray_has_a_folder_of_its_own_and_no_fixed_port(ray_local, ray_temp_dir):
    psutil = pytest.importorskip("psutil")
    context = ray_local.get_runtime_context()
    temp_dir = Path(context.get_temp_dir())
    assert temp_dir.is_relative_to(ray_temp_dir) and not temp_dir.is_relative_to("/tmp/ray")
    assert os.environ["RAY_TMPDIR"] == str(ray_temp_dir)  # so the runs tests start in processes of their own too
    session = str(temp_dir / context.get_session_name())
    commands, listening = {}, set()
    for process in psutil.Process().children(recursive=True):
        try:
            command = " ".join(process.cmdline())
            if session in command:
                commands[process.pid] = command
                listening |= {c.laddr.port for c in process.net_connections("inet") if c.status == psutil.CONN_LISTEN}
        except psutil.Error:  # ended meanwhile (an idle worker)
            continue
    assert any("dashboard.py" in command for command in commands.values()), commands  # Ray's processes were found
    given = {option for command in commands.values() for option in re.findall(r"--[\w-]*port[\w-]*=\d+", command)}
    assert "--port=0" in given  # the dashboard's: 8265 unless given
    # ray.init has no setting for the dashboard agent's HTTP port (52365): the ray extra's Ray
    # (without the dashboard's packages) opens no HTTP server there, which this checks.
    fixed = {option for option in given if not option.endswith("=0")}
    assert {option for option in fixed if not option.startswith("--listen-port=")} == set(), fixed
    assert not listening & {int(option.split("=")[1]) for option in fixed}, (fixed, listening)
