"""Time ``rlvr compare``'s runs (3 delta modes x 5 seeds on the lecture's sorting toy,
the default 100 epochs x 10 inner steps) run one by one (``rlvr.loop.trainer.train``) against
one batched computation (``rlvr.loop.batched.train_batched``), and one run of the
lecture-style reference loop (benchmarks/lecture_toy.py). Process CPU time, one thread
count for all, in this process; the batched records are checked equal to the one-by-one
ones (timings aside) before anything is printed.

    python benchmarks/batched_compare.py                # 15 runs, 1 repeat
    python benchmarks/batched_compare.py --repeats 3    # medians of 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import rlvr
from rlvr.loop.batched import TIMING_KEYS, train_batched
from rlvr.loop.trainer import train

sys.path.insert(0, str(Path(__file__).parent))
from lecture_toy import LECTURE_PROMPTS, baseline_run  # noqa: E402

MODES = ("raw", "centered", "normalized")


def compare_configs(seeds: int, threads: int, epochs: int | None) -> list[rlvr.Config]:
    """The runs ``rlvr compare`` makes (defaults but for the progress bar)."""
    extra = [f"algo.epochs={epochs}"] if epochs else []
    return [rlvr.load_config(None, [f"algo.deltas={m}", f"seed={s}", f"name={m}-seed{s}", "log.progress=false",
                                    f"threads={threads}", *extra])
            for m in MODES for s in range(seeds)]


def cpu_seconds(fn):
    start = time.process_time()
    result = fn()
    return time.process_time() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=None, help="override algo.epochs (default: compare's 100)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    configs = compare_configs(args.seeds, args.threads, args.epochs)
    epochs = configs[0].algo.epochs
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {len(configs)} runs of {epochs} epochs x "
          f"{configs[0].algo.inner_steps} steps, median CPU seconds of {args.repeats}")
    train_batched(configs[:2])  # warm-up (and the matmul checks' cache)
    baseline_run("centered", LECTURE_PROMPTS, 10, 5, 10, 10)
    alone_t, batched_t, lecture_t = [], [], []
    for _ in range(args.repeats):  # interleaved, so machine noise hits all alike
        seconds, alone = cpu_seconds(lambda: [train(c) for c in configs])
        alone_t.append(seconds)
        seconds, batched = cpu_seconds(lambda: train_batched(configs))
        batched_t.append(seconds)
        seconds, _ = cpu_seconds(lambda: baseline_run("centered", LECTURE_PROMPTS, 10, 5, epochs, 10))
        lecture_t.append(seconds)
        strip = [[{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in run] for run in (*alone, *batched)]
        if strip[: len(configs)] != strip[len(configs):]:
            raise SystemExit("batched records differ from the one-by-one records")
    a, b, lec = (statistics.median(t) for t in (alone_t, batched_t, lecture_t))
    print(f"{len(configs)} runs one by one   {a:7.3f} s")
    print(f"{len(configs)} runs batched      {b:7.3f} s   one-by-one / batched {a / b:5.2f}x")
    print(f"1 lecture-style run  {lec:7.3f} s   batched / lecture run {b / lec:5.2f} (goal < 1)")


if __name__ == "__main__":
    main()
