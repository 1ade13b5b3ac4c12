"""What many tests share, imported as ``from helpers import ...``: the quiet run settings, tiny
model sizes, a private Ray, the command line run in a child process (some modules blocked, as
without an extra), a train record, a run killed mid-way, and process probes. No rlvr import at
the top: test_skip_summary.py copies this file into a checkout without rlvr."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# A run that draws no progress bar and no figure (the tests read metrics, not pictures).
QUIET = ["log.progress=false", "log.plot=false"]


def comparable(records, *more: str):
    """Records minus wall-clock (time/*, tokens_per_sec*) and cluster/* fields, and the
    fields under the prefixes ``more`` (what only one of the runs compared measures)."""
    drop = ("time/", "tokens_per_sec", "cluster/", *more)
    return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in records]


# A line Ray's raylet sends to the driver's stderr (a full disk, say): Ray's, not rlvr's.
RAYLET_LINE = re.compile(r"^(\x1b\[[0-9;]*m)?\(raylet\)")


def rlvr_stderr(err: str) -> str:
    """What rlvr wrote to stderr: ``err`` less the raylet's own lines."""
    return "\n".join(line for line in err.strip().splitlines() if not RAYLET_LINE.match(line))


ROOT = Path(__file__).resolve().parents[1]  # the checkout
# GSM8K lives beside the checkout (../shared/data/gsm8k); its tests skip without it.
GSM8K_DATA = ROOT.parent / "shared" / "data" / "gsm8k"


# The sizes of the tiny language models the policy and engine tests build (``init_model``).
TINY = dict(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, max_positions=64)


# ChatML-like: every message "<|role|>\n{content}<eos>\n", the generation prompt "<|assistant|>\n".
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@contextlib.contextmanager
def private_ray(ray, num_cpus: int = 2):
    """``ray.init`` of a private local Ray, shut down after, its session folder removed (as a run removes its own).
    Its folder is the suite's (``ray_temp_dir``) and its dashboard port 0, the OS's pick: left
    unset, Ray gives its dashboard 8265, which anything else on the machine may hold."""
    from rlvr.cluster.session import remove_session

    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, dashboard_port=0, logging_level="ERROR")
    context = ray.get_runtime_context()
    session = Path(context.get_temp_dir()) / context.get_session_name()
    try:
        yield ray
    finally:
        ray.shutdown()
        remove_session(session)


# ---------------------------------------------------------------- the command line in a child process


def cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """``rlvr ARGS`` in a child process, stdout and stderr captured (pipes: not a terminal)."""
    return subprocess.run([sys.executable, "-m", "rlvr.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


# A sitecustomize that makes modules unimportable, as on a machine with the core install only.
BLOCKER = '''import sys
BLOCKED = {blocked!r}
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Blocker())
'''


def shell(command: str, cwd: Path, blocked: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``command`` (``rlvr`` in it: ``python -m rlvr``) in bash in ``cwd``, with ``blocked``
    modules unimportable."""
    import rlvr  # here, not at the top: this file is copied into a checkout without rlvr by test_skip_summary.py

    src = Path(rlvr.__file__).resolve().parents[1]  # the rlvr under test, for the commands run in subprocesses
    site = cwd / ".blocker"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=set(blocked)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(src)])}
    command = re.sub(r"(^|&& )rlvr ", rf"\1{sys.executable} -m rlvr ", command)
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def rlvr_cli(args: list[str], cwd: Path, blocked: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``rlvr ARGS`` in ``cwd`` with ``blocked`` modules unimportable."""
    return shell(shlex.join(["rlvr", *args]), cwd, blocked)


# ---------------------------------------------------------------- records


def train_record(epoch: int, **values) -> dict:
    """A train record of epoch ``epoch`` (its step the same), ``values`` added or replaced."""
    return {"kind": "train", "epoch": epoch, "step": epoch, "loss": 0.5, "reward_mean": 1.0, "solve_rate": 0.0,
            "frac_zero_delta_groups": 0.0, **values}


# ``rlvr train ARGV`` that says on stdout when it has written a checkpoint and a train record,
# the moments sigkill_mid_run waits on.
ANNOUNCING_TRAIN = """
import sys

import rlvr.runs.launch
from rlvr.cli import main
from rlvr.runs.metrics import JsonlSink

save, write = rlvr.runs.launch.save_checkpoint, JsonlSink.__call__


def save_then_say(*args, **kwargs):
    save(*args, **kwargs)
    print("rlvr-test: checkpoint", flush=True)


def write_then_say(self, record):
    write(self, record)
    if self.path.name == "metrics.jsonl" and record["kind"] == "train":
        print("rlvr-test: train", flush=True)


rlvr.runs.launch.save_checkpoint, JsonlSink.__call__ = save_then_say, write_then_say
sys.exit(main(["train", *sys.argv[1:]]))
"""


def sigkill_mid_run(args: list[str], run_dir: Path) -> None:
    """``rlvr train ARGS`` in a child process, killed with SIGKILL once its first checkpoint is in
    ``run_dir`` and a random number (0 to 5) of optimizer steps after it are recorded: the kill
    follows what the run did, not how long it took (a loaded machine only makes it later)."""
    import random
    import signal
    import threading

    steps_after = random.Random(os.getpid()).randint(0, 5)
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-c", ANNOUNCING_TRAIN, *args], stdout=subprocess.PIPE, stderr=err,
                                text=True)
        hung = threading.Timer(600, proc.kill)  # a run that hangs ends this wait (its stdout closes), not the suite
        hung.start()
        try:
            checkpointed, steps = False, 0
            for line in proc.stdout:
                if line == "rlvr-test: checkpoint\n":
                    checkpointed = True
                elif line == "rlvr-test: train\n" and checkpointed:
                    steps += 1
                if checkpointed and steps >= steps_after:
                    proc.send_signal(signal.SIGKILL)
                    break
            code = proc.wait()
        finally:
            hung.cancel()
            proc.stdout.close()
        err.seek(0)
        said = err.read()[-3000:]
    assert code == -signal.SIGKILL and checkpointed, f"not killed mid-run (exit {code}): {said}"


# A program that forks up to 300 sleeping children and prints how many it started: a process
# cap stops it short.
FORK_BOMB = """import os, time
started = 0
for _ in range(300):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    started += 1
print(started)
"""


def processes_capped(jailed: bool) -> bool:
    """Whether a program's processes are capped here: a pids cgroup can be made, or (in a jail)
    bwrap's user namespace holds a user other than root to RLIMIT_NPROC."""
    from rlvr.base.processes import ProcessCap

    cap = ProcessCap()
    made = cap.folder is not None
    cap.close()
    return made or (jailed and os.geteuid() != 0)


def tagged(tag: str) -> list[int]:
    """Pids of the live processes (a zombie is dead, only not yet reaped) whose command line holds ``tag``."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError):
            if (tag.encode() in Path(f"/proc/{name}/cmdline").read_bytes()
                    and Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"):
                found.append(int(name))
    return found


def chromium(profile: Path) -> list[str]:
    """Headless Chromium's command line, a fresh profile in the folder ``profile`` (the test skipped without
    Chromium)."""
    import pytest

    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("headless Chromium is not installed (apt-get install chromium; .ci/run does)")
    return [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile / 'profile'}"]
