"""Kill soak: runs killed (SIGKILL) or stopped (SIGTERM) at random moments, then resumed,
must end exactly where an uninterrupted run ends, and leave no process behind.

Two workloads, both with reward functions that fail at random (``faulty_rewards``:
one raises, one returns NaN, one hangs past its time limit): the sorting toy and a
tiny character LM on text sorting (written offline with ``rlvr.modeling.init_model``).
Each is first run straight through the CLI. Then, run after run, each process is sent
one signal at a moment drawn from four kinds:

  startup       while Python, torch and the model load (maybe before config.yaml)
  early         training under way, before the first checkpoint
  checkpoint    while a checkpoint is being written (a ``.tmp-step-*`` folder exists)
  random        at a random point of the run

and continued as a person would (``resume=RUN_DIR`` when config.yaml is there, else
the same command again) until one process finishes. Each run must equal the
straight run: its metrics.jsonl records without wall-clock fields, and its final
weights. After every process ends, no process of its group (reward workers) may
remain. Prints the counts; exits 1 if a run differs or a process was left over.

A third workload kills a process mid tool call: it runs the policy's kind of programs
through the python tool's ``ToolBox`` (one forks a daemon in a session of its own, one
sleeps, one prints) and is SIGKILLed while a program runs; then no program of it (found
by a tag in their command lines) and no tool folder may remain. A tiny model does not
call tools by itself, so this drives the tool box as an episode does, not a training run.

    python benchmarks/kill_soak.py                 # 10 signals, ~2-3 min on 2 cores
    python benchmarks/kill_soak.py --kills 40 --seed 1
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from rlvr.runs.checkpoint import list_checkpoints, load_latest
from rlvr.runs.metrics import read_records, without_timings

FAULTS = ("['faulty_rewards:flaky', 'faulty_rewards:sometimes_nan', "
          "'faulty_rewards:sometimes_hangs']")
# A hang costs its time limit; 1 s is far above a normal call even on a loaded machine,
# so which calls time out does not depend on the load (the runs must be equal).
COMMON = [f"rewards.functions={FAULTS}", "rewards.timeout=1.0", "log.progress=false", "log.plot=false",
          "log.eval_every=1000", "log.eval_samples=2", "log.checkpoint_every=2", "seed=11"]
TOY = ["algo.epochs=12", "algo.inner_steps=3", "algo.group_size=4", "algo.loss=clipped", "task.options.prompts=null",
       "task.options.vocab_size=10", "task.options.num_numbers=4", "task.prompts_per_epoch=4",
       "task.options.eval_size=4"]
MOMENTS = ("startup", "early", "checkpoint", "random")


def lm_args(model: Path) -> list[str]:
    return ["task.name=sort_text", "task.prompts_per_epoch=2", "task.options={num_digits: 3, num_eval: 4}",
            "policy.name=causal_lm", f"policy.options={{model: '{model}', max_new_tokens: 5}}",
            "algo.epochs=8", "algo.inner_steps=2", "algo.group_size=4", "algo.loss=clipped"]


def start(args: list[str]) -> subprocess.Popen:
    # A session of its own: its process group is the run and every process it starts.
    # this folder on its path: the faulty reward functions live here
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.abspath(__file__)),
                                                        os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "rlvr.cli", "train", *args], start_new_session=True, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:  # gone meanwhile
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def leftovers(proc: subprocess.Popen, grace: float = 3.0) -> int:
    """Processes of ``proc``'s group still alive ``grace`` s after it ended (then killed)."""
    deadline = time.monotonic() + grace
    while (left := group_members(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(left)


def wait_for(proc: subprocess.Popen, ready, timeout: float = 120.0) -> bool:
    """Poll ``ready()`` (every ~0.5 ms) until it holds; False if ``proc`` ended first."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if ready():
            return True
        time.sleep(0.0005)
    return False


def writing_checkpoint(run_dir: Path) -> bool:
    try:
        return any(e.name.startswith(".tmp-step-") for e in os.scandir(run_dir / "checkpoints"))
    except OSError:
        return False


def has_records(run_dir: Path) -> bool:
    try:
        return (run_dir / "metrics.jsonl").stat().st_size > 0
    except OSError:
        return False


def signal_at(proc: subprocess.Popen, run_dir: Path, moment: str, signum: int, rng: random.Random,
              startup: float, duration: float) -> bool:
    """Send ``signum`` at ``moment``; False when the process finished first."""
    if moment == "startup":
        time.sleep(rng.uniform(0.0, startup))
    elif moment == "early":
        wait_for(proc, lambda: has_records(run_dir) and not list_checkpoints(run_dir))
    elif moment == "checkpoint":
        wait_for(proc, lambda: writing_checkpoint(run_dir))
    else:
        wait_for(proc, lambda: has_records(run_dir))
        time.sleep(rng.uniform(0.0, duration))
    if proc.poll() is not None:
        return False
    proc.send_signal(signum)
    return True


def same_run(a: Path, b: Path) -> bool:
    if without_timings(read_records(a)) != without_timings(read_records(b)):
        return False
    wa, wb = load_latest(a)[1]["policy"], load_latest(b)[1]["policy"]
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def plans(rng: random.Random) -> Iterator[tuple[str, int]]:
    """(moment, signal) pairs: every pair once per round of eight, in a random order."""
    pairs = list(itertools.product(MOMENTS, (signal.SIGKILL, signal.SIGTERM)))
    while True:
        yield from rng.sample(pairs, len(pairs))


def soak(name: str, args: list[str], root: Path, kills: int, rng: random.Random, plan: Iterator[tuple[str, int]],
         counts: collections.Counter) -> None:
    """Straight run of ``args``, then runs sent ``kills`` signals in all, each checked."""
    straight = root / f"{name}-straight"
    clock = time.monotonic()
    proc = start([f"out_dir={straight}", *args])
    wait_for(proc, lambda: has_records(straight), timeout=300)
    startup = time.monotonic() - clock
    _, err = proc.communicate()
    duration = time.monotonic() - clock - startup
    counts["leftover processes"] += leftovers(proc)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: the straight run failed ({proc.returncode}):\n{err}")
    print(f"{name}: straight run {startup:.1f} s to the first record, {duration:.1f} s training", flush=True)
    for run in range(1_000_000):
        if kills <= 0:
            return
        run_dir = root / f"{name}-{run}"
        signals = rng.randint(1, min(3, kills))
        kills -= signals
        events = []
        while True:
            resume = (run_dir / "config.yaml").is_file()
            proc = start([f"resume={run_dir}"] if resume else [f"out_dir={run_dir}", *args])
            counts["resumes"] += resume
            sent = None
            if signals > 0:
                moment, signum = next(plan)
                if moment == "early" and list_checkpoints(run_dir):
                    moment = "random"  # past the first checkpoint already
                if signal_at(proc, run_dir, moment, signum, rng, startup, duration):
                    sent = f"{signal.Signals(signum).name}@{moment}"
                    counts["SIGKILL" if signum == signal.SIGKILL else "SIGTERM"] += 1
                    counts[f"  at {moment}"] += 1
                    counts["  hit a checkpoint write"] += writing_checkpoint(run_dir)
                else:
                    counts["signals missed (run finished first)"] += 1
                signals -= 1
            _, err = proc.communicate()
            counts["leftover processes"] += leftovers(proc)
            events.append(f"{sent or 'no signal'}->{proc.returncode}")
            if proc.returncode == 0:
                break
            if sent is None:
                raise SystemExit(f"{name}-{run}: failed without a signal ({proc.returncode}):\n{err}")
            counts["  SIGTERM exited 143 (stopped, checkpointed)"] += proc.returncode == 143
        equal = same_run(straight, run_dir)
        counts["runs"] += 1
        counts["equal runs"] += equal
        print(f"  {name}-{run}: {', '.join(events)}: {'equal' if equal else 'DIFFERS'}", flush=True)


_TOOL_TRAINER = """
import sys
from rlvr.environments.base import ToolCall
from rlvr.environments.tools import TOOLS, ToolBox
tag = sys.argv[1]
sleeper = f"import os, sys; os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {tag!r}])"
daemon = f"import os\\nif os.fork() == 0:\\n    os.setsid()\\n    {sleeper}\\nprint('forked')"
with ToolBox({"python": TOOLS["python"]}, timeout=30, num_workers=2) as box:
    print(box._folder, flush=True)
    while True:
        box.run([ToolCall("python", {"code": daemon}), ToolCall("python", {"code": sleeper}),
                 ToolCall("python", {"code": "print('x' * 1000)"})])
"""


def tagged(tag: str) -> list[int]:
    """Live processes whose command line holds ``tag``."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(entry.path, "stat").read_text()
                if tag.encode() in Path(entry.path, "cmdline").read_bytes() and stat[stat.rindex(")") + 2] != "Z":
                    found.append(int(entry.name))
    return found


def tool_soak(kills: int, rng: random.Random, counts: collections.Counter) -> None:
    """Processes running python-tool calls, each SIGKILLed while a program runs."""
    for kill in range(kills):
        tag = f"rlvr-soak-tool-{os.getpid()}-{kill}"
        proc = subprocess.Popen([sys.executable, "-c", _TOOL_TRAINER, tag], start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        folder = Path(proc.stdout.readline().strip())
        wait_for(proc, lambda: tagged(tag), timeout=60)  # noqa: B023 (called at once)
        time.sleep(rng.uniform(0.0, 0.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 5
        while (tagged(tag) or folder.exists()) and time.monotonic() < deadline:  # noqa: B023
            time.sleep(0.05)
        left = tagged(tag)
        counts["tool calls SIGKILLed"] += 1
        counts["leftover processes"] += len(left) + leftovers(proc, grace=0)
        counts["leftover tool folders"] += folder.exists()
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)
        print(f"  tools-{kill}: SIGKILL mid call: {len(left)} processes and "
              f"{int(folder.exists())} folders left", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=10, help="signals in all, split between the two workloads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument("--tool-kills", type=int, default=4, help="processes killed mid tool call")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="rlvr-kill-soak-"))
    counts: collections.Counter = collections.Counter()
    clock = time.monotonic()
    try:
        plan = plans(rng)
        soak("toy", COMMON + TOY, root, (args.kills + 1) // 2, rng, plan, counts)
        from rlvr.modeling import init_model

        model = init_model(root / "model", hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2)
        soak("lm", COMMON + lm_args(model), root, args.kills // 2, rng, plan, counts)
        tool_soak(args.tool_kills, rng, counts)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\n{time.monotonic() - clock:.0f} s")
    for key in ("SIGKILL", "SIGTERM", *(f"  at {m}" for m in MOMENTS), "  hit a checkpoint write",
                "  SIGTERM exited 143 (stopped, checkpointed)", "signals missed (run finished first)",
                "resumes", "runs", "equal runs", "tool calls SIGKILLed", "leftover processes",
                "leftover tool folders"):
        print(f"  {key:<46} {counts[key]:>4}")
    if counts["equal runs"] != counts["runs"] or counts["leftover processes"] or counts["leftover tool folders"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
