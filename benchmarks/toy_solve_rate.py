"""Held-out greedy solve rate of configurations of the lecture's sorting task, over seeds.

Each configuration runs once per seed; the table shows how many of the 3 lecture
prompts greedy decoding solves at the end (mean and per seed), the final mean reward,
and the share of groups whose deltas were all zero in the last epoch (the stall).

    python benchmarks/toy_solve_rate.py                       # lecture default vs examples/sorting_best.yaml
    python benchmarks/toy_solve_rate.py --set algo.group_size=64 optim.lr=1e-2 --seeds 0,1,2,3,4
"""

from __future__ import annotations

import argparse
import statistics
import time

import rlvr
from rlvr.runs.metrics import summary

QUIET = ["log.progress=false", "log.plot=false", "log.checkpoint_every=0"]


def solve_rates(path: str | None, overrides: list[str], seeds: list[int]) -> dict:
    solved, rewards, stalls = [], [], []
    start = time.perf_counter()
    for seed in seeds:
        config = rlvr.load_config(path, QUIET + overrides + [f"seed={seed}"])
        s = summary(rlvr.train(config).records)
        options = config.task.options
        solved.append(round(s["eval_greedy_solve_rate"] * len(options["prompts"] or [0] * options["eval_size"])))
        rewards.append(s["reward_end"])
        stalls.append(s["frac_zero_delta_groups_end"])
    return {
        "solved": solved,
        "reward": statistics.mean(rewards),
        "stall": statistics.mean(stalls),
        "seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--config", action="append", default=None, help="YAML config (repeatable)")
    parser.add_argument("--set", nargs="*", default=None, help="overrides for one extra configuration")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs: list[tuple[str, str | None, list[str]]] = [("lecture default", None, [])]
    for path in args.config or (["examples/sorting_best.yaml"] if args.set is None else []):
        runs.append((path, path, []))
    if args.set:
        runs.append((" ".join(args.set), None, args.set))
    print(f"{'configuration':<60} {'solved of 3 per seed':<22} {'mean':>5} {'reward':>7} {'stall':>6} {'time':>6}")
    for label, path, overrides in runs:
        r = solve_rates(path, overrides, seeds)
        mean = statistics.mean(r["solved"])
        print(f"{label:<60} {str(r['solved']):<22} {mean:5.2f} {r['reward']:7.3f} {r['stall']:6.2f} "
              f"{r['seconds']:5.1f}s")


if __name__ == "__main__":
    main()
