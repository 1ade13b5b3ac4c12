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

``--staleness`` runs, on prompts of 3 to 7 digits (``task.options.min_digits``: prompts of
several difficulties and answers of several lengths; its own SFT warm start), the ways that
keep a staleness bound of 2 optimizer steps (one epoch) with batches wanted two epochs
ahead, weights in flight, TIS cap 2:

- ``drop``: batches submitted two epochs ahead; one older than the bound when its training
  starts is dropped and sampled again (``cluster.stale_policy=drop``);
- ``admit``: admission control: submitted only one epoch ahead, so none is too old;
- ``partial``: admission, and weights published mid-batch taken between tokens
  (``cluster.partial_rollouts``).

and prints for each samples/s (trained samples), the mean sample age, the share of sampled
batches thrown away, the held-out greedy exact match, the length and solve-rate shift
(trained minus sampled, over the run) and the share of tokens sampled by weights newer than
those their response started with (partial rollouts at work).

``--staleness --model smollm2-135m-instruct`` runs the same ways on a real model
(examples/smollm2_arithmetic.yaml: 4 prompts x 8 responses an epoch, two inner steps,
clipped loss, up to 48 new tokens, 64 held-out sums), where generating a batch takes longer
than an optimizer step, so weights do arrive mid-batch.

It prints samples per second of each, the ratio of async to each single-process run, and
the held-out greedy exact match at the end (200 held-out prompts) per seed, so a speed-up is
not bought with learning. Ray's start-up is inside the async time; ``steady`` leaves out the
first epoch of every run (model loading, Ray's start, the first batch).

    python benchmarks/async_speed.py                     # 3 seeds, 100 epochs each
    python benchmarks/async_speed.py --seeds 0 --epochs 20
    python benchmarks/async_speed.py --staleness --seeds 0 1 --epochs 60
    python benchmarks/async_speed.py --staleness --model smollm2-135m-instruct --seeds 0 --epochs 12
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
BOUND = ["threads=1", "cluster.rollout_workers=1", "cluster.max_staleness=2", "cluster.max_staleness_steps=2",
         "cluster.weights_in_flight=true", "algo.tis_cap=2"]
STALENESS_WAYS = {
    "single t1": ["threads=1"],
    "drop": [*BOUND, "cluster.stale_policy=drop"],
    "admit": BOUND,
    "partial": [*BOUND, "cluster.partial_rollouts=true"],
}


# prompts of 3 to 7 digits, answers up to 13 characters and EOS
MIXED = ["task.options.min_digits=3", "task.options.num_digits=7", "policy.options.max_new_tokens=16"]
# a real model: sums, two optimizer steps a batch, long enough replies that a batch outlasts a step
REAL = ["algo.inner_steps=2", "algo.loss=clipped", "policy.options.max_new_tokens=48", "task.options.num_eval=64",
        "log.eval_batch_size=64"]


def warm_start(mixed: bool = False) -> Path:
    """The SFT model the RL runs start from (made once, then reused); ``mixed``: on
    prompts of 3 to 7 digits."""
    root = ROOT / "mixed" if mixed else ROOT
    model = root / "sft" / "model"
    if not (model / "config.json").exists():
        run = [sys.executable, "-m", "rlvr.cli"]
        subprocess.run(run + ["init-model", "--out", str(root / "base"), "--hidden-size", "64",
                              "--intermediate-size", "192", "--num-layers", "2", "--num-heads", "4", "--seed", "0"],
                       check=True)
        subprocess.run(run + ["sft", str(EXAMPLES / "sort_text_sft.yaml"), f"out_dir={root / 'sft'}",
                              f"policy.options.model={root / 'base'}", "log.progress=false",
                              *(MIXED if mixed else [])], check=True)
    return model


def run(way: str, seed: int, epochs: int, model: Path | str, mixed: bool = False) -> dict:
    """One run of ``way``: on sort_text from the warm start ``model``, or on the real model
    ``model`` (a name: the smollm2_arithmetic recipe)."""
    real = isinstance(model, str)
    overrides = QUIET + [f"seed={seed}", f"algo.epochs={epochs}", f"log.eval_every={epochs}",
                         "log.eval_at_start=false", f"policy.options.model={model}",
                         *(REAL if real else MIXED if mixed else []), *{**WAYS, **STALENESS_WAYS}[way]]
    recipe = "smollm2_arithmetic.yaml" if real else "sort_text_tiny.yaml"
    config = load_config(str(EXAMPLES / recipe), overrides)
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
    trained = [r for r in records if r["kind"] == "train"]
    ages = [r.get("cluster/staleness_steps", 0.0) for r in trained]
    last = trained[-1]
    dropped = last.get("cluster/dropped_stale_total", 0.0)  # batches sampled and thrown away
    return {"samples": samples, "samples_per_s": samples / seconds, "steady": steady, "seconds": seconds,
            "greedy": end["greedy_solve_rate"], "age": statistics.mean(ages), "discarded": dropped / (epochs + dropped),
            "length_shift": last.get("async/length_shift", 0.0), "solve_shift": last.get("async/solve_shift", 0.0),
            "continued": statistics.mean(r.get("cluster/tokens_continued", 0.0) for r in trained)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--staleness", action="store_true", help="drop against admit and partial rollouts")
    parser.add_argument("--model", default=None, help="with --staleness: a real model (smollm2-135m-instruct) "
                                                      "on the arithmetic recipe, in place of the tiny sort_text one")
    args = parser.parse_args()
    if args.staleness:
        return compare_staleness(args.seeds, args.epochs, args.model or warm_start(mixed=True))
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



def compare_staleness(seeds: list[int], epochs: int, model: Path | str) -> None:
    results: dict[str, list[dict]] = {way: [] for way in STALENESS_WAYS}
    for seed in seeds:
        for way in STALENESS_WAYS:  # interleaved, so a slow spell of the machine hits every way alike
            results[way].append(run(way, seed, epochs, model, mixed=True))
            r = results[way][-1]
            print(f"seed {seed} {way:<9} {r['seconds']:7.1f} s  {r['samples_per_s']:6.1f} samples/s  "
                  f"steady {r['steady']:6.1f}  "
                  f"age {r['age']:.2f}  discarded {r['discarded']:.3f}  greedy {r['greedy']:.3f}  "
                  f"length shift {r['length_shift']:+.3f}  solve shift {r['solve_shift']:+.4f}  "
                  f"tokens continued {r['continued']:.3f}", flush=True)
    task = f"{model} on sums" if isinstance(model, str) else "prompts of 3-7 digits"
    print(f"\n{epochs} epochs x {results['admit'][0]['samples'] // epochs} trained samples per run, seeds {seeds}, "
          f"{task}, wall clock, a bound of 2 steps")
    print(f"{'way':<9} {'samples/s':>10} {'steady':>7} {'age':>6} {'discarded':>10} {'greedy':>7} "
          f"{'length shift':>13} {'solve shift':>12} {'continued':>10}")
    for way, rs in results.items():
        mean = {key: statistics.mean(r[key] for r in rs) for key in rs[0]}
        print(f"{way:<9} {mean['samples_per_s']:10.1f} {mean['steady']:7.1f} {mean['age']:6.2f} "
              f"{mean['discarded']:10.3f} "
              f"{mean['greedy']:7.3f} {mean['length_shift']:+13.3f} {mean['solve_shift']:+12.4f} "
              f"{mean['continued']:10.3f}")
    for way in ("admit", "partial"):
        pairs = list(zip(results[way], results["drop"]))
        ratio = statistics.mean(x["samples_per_s"] / y["samples_per_s"] for x, y in pairs)
        steady = statistics.mean(x["steady"] / y["steady"] for x, y in pairs)
        print(f"{way} / drop: {ratio:.2f}x samples/s ({steady:.2f}x steady)")


if __name__ == "__main__":
    main()
