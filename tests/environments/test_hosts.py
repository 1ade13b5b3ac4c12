"""Environment code in worker processes: every call under the contract (any exception, a
wrong type, a time limit) and, past the limit, killed whatever the code does; episodes that
hang time out together; the run's stop cuts the waits; nothing outlives the hosts."""

import os
import pathlib
import signal
import threading
import time

import pytest

from helpers import tagged
from rlvr.base.errors import STOPPING, CutShort
from rlvr.environments.base import Step
from rlvr.environments.workers import HARD_GRACE, EnvironmentFailed, EnvironmentHosts


class Echo:
    def reset(self, start):
        self.pid = os.getpid()
        return f"start {start}"

    def step(self, text):
        return Step(f"pid {self.pid}", 1.0, done=text == "stop", solved=True)

    def tools(self):
        return {"peek": self.peek, "stuck": self.stuck}

    def peek(self, what="x"):
        return f"peeked {what}"

    def stuck(self):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # no StepTimeout can reach it
        time.sleep(60)


class Stubborn(Echo):
    """A step no exception stops: SIGALRM blocked, as C code that never returns to Python."""

    def step(self, text):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(60)


class Dies(Echo):
    def step(self, text):
        os._exit(3)


class Unsendable(Echo):
    def step(self, text):
        return Step([{"role": "user", "content": lambda: None}], 1.0)  # an observation that does not pickle


class Sleeps(Echo):
    def step(self, text):
        time.sleep(60)


def started(env, rows, workers=8, seconds=5.0):
    hosts = EnvironmentHosts(env, workers)
    made = hosts.call([r for row in rows for r in ((row, "make", ()), (row, "reset", (row,)))], seconds)
    assert made == [x for row in rows for x in (env.__name__, f"start {row}")]
    return hosts


def test_each_episode_has_a_worker_of_its_own_and_a_row_keeps_its_environment():
    hosts = started(Echo, range(4))
    try:
        steps = hosts.call([(row, "step", ("go", False)) for row in range(4)], 5.0)
        pids = {observation for _, _, _, observation in steps}
        assert len(pids) == 4 and f"pid {os.getpid()}" not in pids  # not the trainer's
        assert hosts.call([(2, "tools", ()), (2, "tool", ("peek", (), {"what": "y"}))], 5.0) == [
            ["peek", "stuck"], "peeked y"]
        again = hosts.call([(2, "step", ("stop", False))], 5.0)
        assert again == [(1.0, True, True, None)]
    finally:
        hosts.close()


def test_a_step_no_exception_stops_is_killed_past_its_limit_and_the_others_answer():
    hosts = started(Echo, [0], workers=4)
    stubborn = started(Stubborn, range(3), workers=4)
    began = time.monotonic()
    outcomes = stubborn.call([(row, "step", ("go", False)) for row in range(3)], 0.3)
    took = time.monotonic() - began
    assert all(isinstance(o, EnvironmentFailed) and str(o) == "Stubborn.step: StepTimeout: no answer within 0.3 s "
               "(its worker was killed)" for o in outcomes)
    assert took < 0.3 + HARD_GRACE + 1.5  # together, not one after another (3 x 2.3 s)
    later = stubborn.call([(1, "step", ("go", False))], 0.3)
    assert "its environment is gone" in str(later[0]) and "Stubborn.step" in str(later[0])
    remade = stubborn.call([(1, "make", ()), (1, "reset", (1,))], 5.0)  # a new episode on the row: a new worker
    assert remade == ["Stubborn", "start 1"]
    assert hosts.call([(0, "step", ("go", False))], 5.0)[0][1] is False  # another hosts' worker: untouched
    stubborn.close()
    hosts.close()


def test_hanging_steps_time_out_together():
    hosts = started(Sleeps, range(6))
    began = time.monotonic()
    outcomes = hosts.call([(row, "step", ("go", False)) for row in range(6)], 0.4)
    took = time.monotonic() - began
    assert all("Sleeps.step: StepTimeout: no answer within 0.4 s" == str(o) for o in outcomes)
    assert took < 1.5  # six in one time limit, not 6 x 0.4 s
    assert hosts.call([(0, "step", ("go", False))], 0.4)  # the soft limit left the worker alive
    hosts.close()


def test_an_own_tool_no_exception_stops_is_killed_and_its_episode_cannot_go_on():
    hosts = started(Echo, [0])
    outcome = hosts.call([(0, "tool", ("stuck", (), {}))], 0.2)[0]
    assert isinstance(outcome, EnvironmentFailed) and str(outcome).startswith("stuck: StepTimeout")
    assert "its environment is gone" in str(hosts.call([(0, "step", ("go", False))], 1.0)[0])
    hosts.close()


def test_a_worker_that_dies_or_answers_what_cannot_be_sent_fails_its_call_named():
    for env, message in ((Dies, "Dies.step: lost its worker process (exit code 3)"),
                         (Unsendable, "Unsendable.step: its answer could not be sent back")):
        hosts = started(env, [0, 1])
        outcomes = hosts.call([(0, "step", ("go", True)), (1, "step", ("go", True))], 5.0)
        assert all(str(o).startswith(message) for o in outcomes), outcomes
        hosts.close()


def test_the_runs_stop_cuts_the_waits_at_once():
    hosts = started(Sleeps, range(3))
    pids = hosts._pool.pids()
    timer = threading.Timer(0.3, STOPPING.set)
    timer.start()
    try:
        began = time.monotonic()
        with pytest.raises(CutShort, match="a stop signal cut the episodes' waits"):
            hosts.call([(row, "step", ("go", False)) for row in range(3)], 30.0)
        took = time.monotonic() - began
    finally:
        timer.join()
        STOPPING.clear()
    assert took < 2.0  # not the 30 s limit
    assert not hosts._pool.pids()  # the workers in mid-call were killed: their replies would be stale
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert hosts.call([(0, "make", ()), (0, "reset", (0,))], 5.0) == ["Sleeps", "start 0"]  # new episodes go on
    hosts.close()


def test_more_episodes_than_workers_share_them_in_order():
    hosts = started(Echo, range(5), workers=2)
    pids = {row: hosts.call([(row, "step", ("go", False))], 5.0)[0][3] for row in range(5)}
    assert pids[0] == pids[2] == pids[4] != pids[1] == pids[3]
    hosts.close()


def test_closing_the_hosts_leaves_no_worker():
    hosts = started(Echo, range(3))
    pids = hosts._pool.pids()
    hosts.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_in_the_trainers_process_the_calls_keep_the_contract():
    hosts = started(Echo, [0], workers=0)
    assert hosts.call([(0, "step", ("go", False))], 1.0)[0][3] == f"pid {os.getpid()}"
    outcome = hosts.call([(0, "tool", ("peek", (), {"nope": 1}))], 1.0)[0]
    assert isinstance(outcome, EnvironmentFailed) and str(outcome).startswith("peek: TypeError")


def test_a_trainer_killed_mid_call_leaves_no_worker(tmp_path):
    """SIGKILL of the process that holds the hosts, while its workers are mid-step: they die too."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import sys, time
        sys.path[:0] = [{str(pathlib.Path(__file__).parent)!r}, {str(pathlib.Path(__file__).parents[1])!r}]
        from test_hosts import Sleeps, started
        hosts = started(Sleeps, range(3))
        print(" ".join(map(str, hosts._pool.pids())), flush=True)
        hosts.call([(row, "step", ("go", False)) for row in range(3)], 60.0)
    """)
    trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in trainer.stdout.readline().split()]
    assert len(pids) == 3
    time.sleep(0.3)  # mid-step
    trainer.kill()
    trainer.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead, only not yet reaped
        return stat.read().split(") ")[-1][0] != "Z"


# A process that ignores SIGTERM and says it has started: its pid, a line on the FIFO named by its second argument.
_SLEEPER = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "os.write(os.open(sys.argv[2], os.O_WRONLY), b'%d\\n' % os.getpid()); time.sleep(60)")


class Spawns(Echo):
    """A reset that leaves a daemon in a session of its own (a double fork) and children that ignore SIGTERM;
    its start is (a tag for their command lines, the FIFO each announces itself on)."""

    def reset(self, start):
        import subprocess
        import sys

        middle = os.fork()
        if middle == 0:  # starts the daemon, then leaves it to be orphaned
            try:
                subprocess.Popen([sys.executable, "-c", _SLEEPER, *start], start_new_session=True)
            finally:
                os._exit(0)
        os.waitpid(middle, 0)
        self.children = [subprocess.Popen([sys.executable, "-c", _SLEEPER, *start]) for _ in range(3)]
        return "started"


def _announced(fd, count, timeout=30.0):
    """The pids of the first ``count`` processes that announced themselves on ``fd`` (a line each)."""
    import select

    data = b""
    while len(data.split()) < count:
        assert select.select([fd], [], [], timeout)[0], f"{len(data.split())} of {count} processes started"
        data += os.read(fd, 4096)
    return [int(pid) for pid in data.split()]


def _wait_gone(pidfds, timeout=10.0):
    """Wait until every process of ``pidfds`` has exited (a pidfd reads once its process has)."""
    import select

    left = set(pidfds)
    while left:
        ready = select.select(list(left), [], [], timeout)[0]
        assert ready, f"{len(left)} processes still running"
        left -= set(ready)


@pytest.mark.parametrize("stop", ["close", "time-out"])
def test_what_environment_code_starts_ends_with_its_worker_daemons_too(stop, tmp_path):
    tag = f"rlvr-env-daemon-{os.getpid()}-{time.monotonic_ns()}"
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    announcements = os.open(fifo, os.O_RDWR)  # a write end of its own too: never at EOF between writers
    hosts = EnvironmentHosts(Spawns, 2)
    pidfds = []
    try:
        assert hosts.call([(0, "make", ()), (0, "reset", ((tag, str(fifo)),))], 30.0) == ["Spawns", "started"]
        pids = _announced(announcements, 4)  # the daemon and three children
        pidfds = [os.pidfd_open(pid) for pid in pids]  # before the kill: a pid reused later is not theirs
        assert sorted(tagged(tag)) == sorted(pids)
        if stop == "close":
            hosts.close()
        else:  # a step past its limit: the worker and all below it are killed
            hosts.call([(0, "tool", ("stuck", (), {}))], 0.2)
        _wait_gone(pidfds)
        assert tagged(tag) == []
    finally:
        hosts.close()
        for fd in [announcements, *pidfds]:
            os.close(fd)


class Maps(Echo):
    def step(self, text):
        import mmap

        mmap.mmap(-1, 2 << 30)  # 2 GiB of address space (no memory touched)
        return Step("mapped", 1.0)


def test_an_environment_worker_has_its_address_space_cap():
    from rlvr.tasks.environment import EnvironmentTask

    assert EnvironmentTask(environment_memory_mb=300).hosts.memory_mb == 300
    capped, free = EnvironmentHosts(Maps, 1, memory_mb=256), EnvironmentHosts(Maps, 1)
    try:
        for hosts in (capped, free):
            hosts.call([(0, "make", ()), (0, "reset", (0,))], 30.0)
        (failed,) = capped.call([(0, "step", ("go", False))], 30.0)
        assert str(failed) == "Maps.step: OSError: [Errno 12] Cannot allocate memory"
        assert free.call([(0, "step", ("go", False))], 30.0)[0][3] == "mapped"
    finally:
        capped.close()
        free.close()


class Floods(Echo):
    def step(self, text):
        return Step("x" * 10**7 if text == "text" else [{"role": "user", "content": str(i) * 600} for i in range(3)],
                    0.0)

    def tools(self):
        return {"flood": lambda: "z" * 10**7}


@pytest.mark.parametrize("workers", [2, 0])
def test_observations_and_tool_text_are_cut_to_the_budget_before_they_cross(workers):
    hosts = EnvironmentHosts(Floods, workers)
    hosts.max_chars = 1000
    try:
        hosts.call([(0, "make", ()), (0, "reset", (0,))], 30.0)
        text, chat, tool = hosts.call([(0, "step", ("text", False)), (0, "step", ("chat", True)),
                                       (0, "tool", ("flood", (), {}))], 30.0)
        assert text[3] == "x" * 1001  # one past the budget: it still reads as too long
        assert chat[3] == [{"role": "user", "content": "0" * 600}, {"role": "user", "content": "1" * 401}]
        assert tool == "z" * 1001
    finally:
        hosts.close()


def test_an_answer_past_the_reply_limit_ends_its_episode_named(monkeypatch):
    import pickle

    from rlvr.base import workers
    from rlvr.environments import workers as hosts_module

    monkeypatch.setattr(hosts_module, "reply_limit", lambda max_chars: 1000)  # the worker checks it before sending
    hosts = EnvironmentHosts(Floods, 1)
    try:
        hosts.call([(0, "make", ()), (0, "reset", (0,))], 30.0)
        (said,) = hosts.call([(0, "step", ("chat", True))], 30.0)
        assert str(said).startswith("Floods.step: its answer is 1,") and str(said).endswith(
            " bytes pickled, more than the 1,000 a worker may send back")
    finally:
        hosts.close()
    monkeypatch.setattr(workers, "answer_bytes", lambda answer, limit: pickle.dumps(answer))  # the trainer's read alone
    hosts = EnvironmentHosts(Floods, 1)
    try:
        hosts.call([(0, "make", ()), (0, "reset", (0,))], 30.0)
        (read,) = hosts.call([(0, "step", ("chat", True))], 30.0)
        assert str(read) == "Floods.step: its answer is more than the 1,000 bytes a worker may send"
        assert "its environment is gone" in str(hosts.call([(0, "step", ("chat", True))], 30.0)[0])
    finally:
        hosts.close()
