"""Soak run: a long sorting-toy training run whose user reward functions fail at random.

Three misbehaving functions from ``faulty_rewards`` run beside the built-in reward:
one raises on ~20% of calls, one hangs (60 s sleep) on ~5%, one returns NaN on ~10%.
Each call has a time limit; hung workers are killed and replaced. The run must finish,
and the summary shows the faults it survived.

    python benchmarks/soak_training.py                  # 40 epochs, 0.5 s limit
    python benchmarks/soak_training.py --epochs 200 --timeout 1.0
"""

from __future__ import annotations

import argparse
import time

import rlvr
from rlvr.runs.metrics import summary

FUNCTIONS = "['faulty_rewards:flaky', 'faulty_rewards:sometimes_hangs', 'faulty_rewards:sometimes_nan']"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--timeout", type=float, default=0.5)
    args = parser.parse_args()
    config = rlvr.load_config(None, [
        f"algo.epochs={args.epochs}", "algo.inner_steps=2", "task.options.prompts=null", "task.options.vocab_size=10",
        "task.options.num_numbers=4", "task.prompts_per_epoch=8", "task.options.eval_size=4", "log.eval_samples=2",
        "log.eval_every=1000", "log.progress=false", "log.plot=false",
        f"rewards.functions={FUNCTIONS}", f"rewards.timeout={args.timeout}",
    ])
    start = time.perf_counter()
    records = rlvr.train(config).records
    wall = time.perf_counter() - start
    epochs = [r for r in records if r["kind"] == "train" and r["step"] % config.algo.inner_steps == 0]
    totals: dict[str, float] = {}
    for r in epochs:
        for key, value in r.items():
            if key.startswith("reward/") and key.split("/")[-1] in ("errors", "timeouts", "invalid", "scored"):
                totals[key] = totals.get(key, 0.0) + value
    s = summary(records)
    print(f"finished {len(epochs)} of {args.epochs} epochs in {wall:.1f} s "
          f"(reward {s['reward_start']:.3f} -> {s['reward_end']:.3f})")
    for key in sorted(totals):
        print(f"  {key:<40} {int(totals[key]):>7}")
    assert len(epochs) == args.epochs, "the run did not finish"


if __name__ == "__main__":
    main()
