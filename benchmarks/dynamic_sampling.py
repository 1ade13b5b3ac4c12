"""Dynamic sampling (algo.dynamic_sampling) on the lecture's sorting toy, over seeds.

Four settings: the lecture's run (its 3 fixed prompts) and the same run on fresh random
prompts (``task.options.prompts=null``; 3 per epoch, 64 held-out), each without and with dynamic
sampling (at most 32 batches an epoch). Per setting: the share of groups with a nonzero delta
in the batches trained on (mean over epochs), the final epoch's mean reward, the greedy
solve rate at the end (on the training prompts for the fixed set, on the held-out ones
otherwise) and the batches sampled per epoch.

    python benchmarks/dynamic_sampling.py              # seeds 0-4
    python benchmarks/dynamic_sampling.py --seeds 0 1
"""

from __future__ import annotations

import argparse
import statistics

from rlvr.config import load_config
from rlvr.loop.trainer import train

QUIET = ["log.progress=false", "log.plot=false", "log.checkpoint_every=0", "log.eval_every=100"]
SETTINGS = {
    "lecture prompts": [],
    "lecture prompts + dynamic": ["algo.dynamic_sampling=true", "algo.max_sampling_tries=32"],
    "random prompts": ["task.options.prompts=null"],
    "random prompts + dynamic": ["task.options.prompts=null", "algo.dynamic_sampling=true",
                                 "algo.max_sampling_tries=32"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args()
    print(f"{'setting':<28} {'nonzero groups':>14} {'reward end':>10} {'greedy':>7} {'tries':>6}  greedy per seed")
    for name, overrides in SETTINGS.items():
        nonzero, reward, greedy, tries = [], [], [], []
        for seed in args.seeds:
            records = train(load_config(None, QUIET + overrides + [f"seed={seed}"]))
            firsts = [r for r in records if r["kind"] == "train" and r["step"] % 10 == 0]  # one per epoch
            nonzero.append(1 - statistics.mean(r["frac_zero_delta_groups"] for r in firsts))
            reward.append(firsts[-1]["reward_mean"])
            greedy.append([r for r in records if r["kind"] == "eval"][-1]["greedy_solve_rate"])
            tries.append(statistics.mean(r.get("dynamic/tries", 1.0) for r in firsts))
        print(f"{name:<28} {statistics.mean(nonzero):14.3f} {statistics.mean(reward):10.3f} "
              f"{statistics.mean(greedy):7.3f} {statistics.mean(tries):6.2f}  " + " ".join(f"{g:.2f}" for g in greedy),
              flush=True)


if __name__ == "__main__":
    main()
