"""Reward workers (``rlvr.base.workers``): worker processes, and what they start, never outlive the trainer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlvr.rewards import RewardRunner, RewardSpec

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def start_child_reward(completions, pid_file, hang, **kwargs):
    """Starts a child process that outlives the call, writes its pid, then hangs or returns."""
    child = subprocess.Popen(["sleep", "60"])
    Path(pid_file[0]).write_text(str(child.pid))
    if hang[0]:
        time.sleep(60)
    return [1.0] * len(completions)


def _alive(pid: int) -> bool:
    """Running (a zombie is dead: it waits only for its parent to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _descendants(pid: int) -> set[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        try:
            parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (ValueError, OSError):  # not a process, or one that just ended
            continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def _wait_until(condition, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def _kill_all(pids: set[int]) -> None:
    """Clean up what a failing test left running."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_children_of_a_call_die_with_its_worker(tmp_path):
    pid_file = tmp_path / "pid"
    children = set()
    try:
        with RewardRunner([RewardSpec(start_child_reward, timeout=0.5)], num_workers=1) as runner:
            # the call hangs: its worker is killed at the limit, and the child it started with it
            stats = runner(["p"], ["a"], {"pid_file": [str(pid_file)], "hang": [True]}).stats
            assert stats["start_child_reward"].timeouts == 1
            children.add(int(pid_file.read_text()))
            _wait_until(lambda: not any(map(_alive, children)), 1.0)
            assert not any(map(_alive, children))
            # the call returns, its child runs on until the runner closes
            assert runner(["p"], ["a"], {"pid_file": [str(pid_file)], "hang": [False]}).rewards.tolist() == [1.0]
            last = int(pid_file.read_text())
            children.add(last)
            assert _alive(last)
        _wait_until(lambda: not _alive(last), 1.0)
        assert not _alive(last)
    finally:
        _kill_all(children)


TRAINER = """
import os, subprocess, sys, time
import torch
from rlvr.rewards import RewardRunner, RewardSpec

def tensor_reward(completions, **kwargs):  # sending tensors back used to leave a pymp-* folder
    return [torch.tensor(1.0) for _ in completions]

def child_reward(completions, pid_file, **kwargs):  # starts a child, then hangs
    child = subprocess.Popen(["sleep", "60"])
    with open(pid_file[0] + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.rename(pid_file[0] + ".tmp", pid_file[0])
    time.sleep(60)

specs = [RewardSpec(tensor_reward, timeout=60.0), RewardSpec(child_reward, timeout=60.0)]
RewardRunner(specs, num_workers=2)(["p"], ["a"], {"pid_file": [sys.argv[1]]})
"""


def test_workers_and_their_children_die_with_a_killed_trainer(tmp_path):
    (tmp_path / "trainer.py").write_text(TRAINER)
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    pid_file = tmp_path / "pids"
    trainer = subprocess.Popen(
        [sys.executable, str(tmp_path / "trainer.py"), str(pid_file)], env={**os.environ, "TMPDIR": str(private_tmp)}
    )
    started = set()
    try:
        _wait_until(lambda: pid_file.exists() or trainer.poll() is not None, 60.0)
        assert trainer.poll() is None, "the trainer script failed"
        worker, child = map(int, pid_file.read_text().split())
        started = _descendants(trainer.pid)  # both workers, the child and any helper process
        assert {worker, child} < started
        trainer.kill()
        trainer.wait()
        _wait_until(lambda: not any(map(_alive, started)), 3.0)
        assert [pid for pid in started if _alive(pid)] == []
        assert list(private_tmp.glob("pymp-*")) == []
    finally:
        trainer.kill()
        _kill_all(started)
