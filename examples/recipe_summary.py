"""The held-out numbers and curves of a recipe's seeds (examples/smollm2_recipe.sh).

    python examples/recipe_summary.py runs/smollm2_arithmetic 0 1 2

Reads ROOT/seed<S>/metrics.jsonl for each seed; prints, per seed, the held-out greedy solve
rate (the task's gold check) before training and at each evaluation, the sampled solve rate
(pass@1) and the greedy reward at the end, then the mean and the spread (min-max, sample
standard deviation) over the seeds; draws every seed's held-out curve and training reward to
ROOT/<ROOT's name>.png.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from rlvr.runs.metrics import read_records

SMOOTH = 5  # steps the training reward is averaged over in the plot


def evals(run_dir: Path) -> list[dict]:
    return [r for r in read_records(run_dir) if r.get("kind") == "eval"]


def spread(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} (min {min(values):.3f}, max {max(values):.3f}, sd {sd:.3f})"


def main() -> None:
    root, seeds = Path(sys.argv[1]), sys.argv[2:]
    starts, ends = [], []
    for seed in seeds:
        records = evals(root / f"seed{seed}")
        first, last = records[0], records[-1]
        curve = " ".join(f"{r['epoch']}:{r['greedy_solve_rate']:.3f}" for r in records)
        print(f"seed {seed}: held-out greedy {first['greedy_solve_rate']:.3f} -> {last['greedy_solve_rate']:.3f} "
              f"(epoch:greedy {curve}); at the end pass@1 {last['pass@1']:.3f}, greedy reward "
              f"{last['greedy_reward']:.3f}")
        starts.append(first["greedy_solve_rate"])
        ends.append(last["greedy_solve_rate"])
    print(f"before training, over {len(seeds)} seeds: {spread(starts)}")
    print(f"after training, over {len(seeds)} seeds:  {spread(ends)}")
    print(f"gain in points: {spread([100 * (b - a) for a, b in zip(starts, ends)])}")
    plot(root, seeds)


def plot(root: Path, seeds: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (held_out, train) = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, seed in enumerate(seeds):
        records = read_records(root / f"seed{seed}")
        evaluations = [r for r in records if r.get("kind") == "eval"]
        epochs = [r["epoch"] for r in evaluations]
        held_out.plot(epochs, [r["greedy_solve_rate"] for r in evaluations], marker="o", color=f"C{i}",
                      label=f"seed {seed}, greedy")
        held_out.plot(epochs, [r["pass@1"] for r in evaluations], linestyle=":", color=f"C{i}",
                      label=f"seed {seed}, sampled")
        rewards = [r["reward_mean"] for r in records if r.get("kind") == "train"]
        train.plot(range(len(rewards)), moving_mean(rewards, SMOOTH), color=f"C{i}", label=f"seed {seed}")
    held_out.set(title=f"{root.name}: held-out solve rate", xlabel="epoch (optimizer steps)", ylim=(-0.02, 1.02))
    train.set(title=f"training reward (mean of the batch, over {SMOOTH} steps)", xlabel="epoch (optimizer steps)",
              ylim=(-0.02, 1.02))
    held_out.legend(fontsize=7)
    train.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(root / f"{root.name}.png", dpi=100)


def moving_mean(values: list[float], width: int) -> list[float]:
    """The mean of each value and the ``width - 1`` before it (fewer at the start)."""
    return [statistics.mean(values[max(0, i - width + 1):i + 1]) for i in range(len(values))]


if __name__ == "__main__":
    main()
