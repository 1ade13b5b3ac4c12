"""Asynchronous training (cluster.max_staleness=1) against the single-process run, same run.

The task is the tiny text-sorting example (examples/sort_text_tiny.yaml, from the SFT warm
start of examples/sort_text_sft.yaml, both made here first under runs/async_speed/). For each
seed it trains the same number of epochs (the same total samples) three ways and times each
whole ``train`` call in wall-clock seconds:

- ``single t1``: one process, one torch thread (generation and training take turns);
- ``single t2``: one process, two torch threads;
- ``async k=1``: one Ray rollout worker (one thread) generating epoch e+1's batch with the
  weights of the start of epoch e while this process (one thread) trains on epoch e; TIS cap 2;
- ``in flight k=2``: the same worker up to two batches ahead, each started with the newest
  weights, published after every optimizer step (``cluster.weights_in_flight``); TIS cap 2.

It prints samples per second of each, the ratio of async to each single-process run, and
the held-out greedy exact match at the end (200 held-out prompts) per seed, so a speed-up is
not bought with learning. Ray's start-up is inside the async time; ``steady`` leaves out the
first epoch of every run (model loading, Ray's start, the first batch).

    python benchmarks/async_speed.py                     # 3 seeds, 100 epochs each
    python benchmarks/async_speed.py --seeds 0 --epochs 20
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rlvr.api import run_loop as train
from rlvr.config import load_config

ROOT = Path("runs/async_speed")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
QUIET = ["log.progress=false", "log.plot=false", "log.checkpoint_every=0"]
WAYS = {
    "single t1": ["threads=1"],
    "single t2": ["threads=2"],
    "async k=1": ["threads=1", "cluster.rollout_workers=1", "cluster.max_staleness=1", "algo.tis_cap=2"],
    "in flight k=2": ["threads=1", "cluster.rollout_workers=1", "cluster.max_staleness=2",
                      "cluster.weights_in_flight=true", "algo.tis_cap=2"],
}


def warm_start() -> Path:
    """The SFT model the RL runs start from (made once, then reused)."""
    model = ROOT / "sft" / "model"
    if not (model / "config.json").exists():
        run = [sys.executable, "-m", "rlvr.cli"]
        subprocess.run(run + ["init-model", "--out", str(ROOT / "base"), "--hidden-size", "64",
                              "--intermediate-size", "192", "--num-layers", "2", "--num-heads", "4", "--seed", "0"],
                       check=True)
        subprocess.run(run + ["sft", str(EXAMPLES / "sort_text_sft.yaml"), f"out_dir={ROOT / 'sft'}",
                              f"policy.options.model={ROOT / 'base'}", "log.progress=false"], check=True)
    return model


def run(way: str, seed: int, epochs: int, model: Path) -> dict:
    overrides = QUIET + [f"seed={seed}", f"algo.epochs={epochs}", f"log.eval_every={epochs}",
                         "log.eval_at_start=false", f"policy.options.model={model}", *WAYS[way]]
    config = load_config(str(EXAMPLES / "sort_text_tiny.yaml"), overrides)
    starts: list[float] = []  # wall clock at each train record

    def on_record(record: dict) -> None:
        if record["kind"] == "train":
            starts.append(time.perf_counter())

    clock = time.perf_counter()
    records = train(config, on_record=on_record)
    seconds = time.perf_counter() - clock
    samples = epochs * config.task.prompts_per_epoch * config.algo.group_size
    steps_per_epoch = config.algo.inner_steps
    first_epoch_end = starts[steps_per_epoch - 1]
    steady = (epochs - 1) * config.task.prompts_per_epoch * config.algo.group_size / (starts[-1] - first_epoch_end)
    end = [r for r in records if r["kind"] == "eval"][-1]
    ages = [r.get("cluster/staleness_steps", 0.0) for r in records if r["kind"] == "train"]
    return {"samples_per_s": samples / seconds, "steady": steady, "seconds": seconds,
            "greedy": end["greedy_solve_rate"], "age": statistics.mean(ages)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=100)
    args = parser.parse_args()
    model = warm_start()
    results: dict[str, list[dict]] = {way: [] for way in WAYS}
    for seed in args.seeds:
        for way in WAYS:  # interleaved, so a slow spell of the machine hits every way alike
            results[way].append(run(way, seed, args.epochs, model))
            r = results[way][-1]
            print(f"seed {seed} {way:<13} {r['seconds']:7.1f} s  {r['samples_per_s']:7.1f} samples/s  "
                  f"steady {r['steady']:7.1f}  held-out greedy {r['greedy']:.3f}  "
                  f"mean sample age {r['age']:.2f} steps", flush=True)
    print(f"\n{args.epochs} epochs x 256 samples per run, seeds {args.seeds}, wall clock, 2-core machine")
    print(f"{'way':<13} {'samples/s':>10} {'steady':>8} {'age':>6} {'greedy mean':>12}  greedy per seed")
    for way, rs in results.items():
        print(f"{way:<13} {statistics.mean(r['samples_per_s'] for r in rs):10.1f} "
              f"{statistics.mean(r['steady'] for r in rs):8.1f} {statistics.mean(r['age'] for r in rs):6.2f} "
              f"{statistics.mean(r['greedy'] for r in rs):12.3f}  " + " ".join(f"{r['greedy']:.3f}" for r in rs))
    for way in ("async k=1", "in flight k=2"):
        a = results[way]
        for base in ("single t1", "single t2"):
            b = results[base]
            ratio = statistics.mean(x["samples_per_s"] / y["samples_per_s"] for x, y in zip(a, b))
            steady = statistics.mean(x["steady"] / y["steady"] for x, y in zip(a, b))
            print(f"{way} / {base}: {ratio:.2f}x samples/s ({steady:.2f}x steady)  (goal 1.5x)")


if __name__ == "__main__":
    main()
