"""The held-out numbers and curves of examples/multiturn_tiny.sh's runs.

    python examples/multiturn_summary.py runs/multiturn_tiny 0 1 2

Prints, per environment and RL seed, the held-out greedy solve rate and mean policy turns
per episode at the start of RL (the SFT model) and at the end, and the sampled solve rate
(pass@1); draws every run's held-out curves to ROOT/multiturn_tiny.png.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rlvr.runs.metrics import read_records

RUNS = {"guessing": "guessing game (1..16, 4 turns)", "calculator": "5-digit addition, calculator tool",
        "notool": "5-digit addition, no tool"}


def evals(run_dir: Path) -> list[dict]:
    return [r for r in read_records(run_dir) if r.get("kind") == "eval"]


def main() -> None:
    root, seeds = Path(sys.argv[1]), sys.argv[2:]
    print(f"{'held-out, greedy':<36} {'seed':>4} {'solve start':>11} {'solve end':>9} {'turns start':>11} "
          f"{'turns end':>9} {'pass@1 end':>10}")
    for prefix, label in RUNS.items():
        for seed in seeds:
            records = evals(root / f"{prefix}-seed{seed}")
            first, last = records[0], records[-1]
            print(f"{label:<36} {seed:>4} {first['greedy_solve_rate']:11.3f} {last['greedy_solve_rate']:9.3f} "
                  f"{first['greedy_episode/turns']:11.2f} {last['greedy_episode/turns']:9.2f} {last['pass@1']:10.3f}")
    plot(root, seeds)


def plot(root: Path, seeds: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (solve, turns) = plt.subplots(1, 2, figsize=(10, 3.8))
    colors = {"guessing": "tab:blue", "calculator": "tab:green", "notool": "tab:red"}
    for prefix, label in RUNS.items():
        for i, seed in enumerate(seeds):
            records = evals(root / f"{prefix}-seed{seed}")
            epochs = [r["epoch"] for r in records]
            kwargs = {"color": colors[prefix], "alpha": 0.8, "label": label if i == 0 else None}
            solve.plot(epochs, [r["greedy_solve_rate"] for r in records], marker="o", **kwargs)
            turns.plot(epochs, [r["greedy_episode/turns"] for r in records], marker="o", **kwargs)
    solve.set(title="held-out greedy solve rate", xlabel="RL epoch", ylim=(-0.02, 1.02))
    turns.set(title="policy turns per held-out episode", xlabel="RL epoch")
    solve.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(root / "multiturn_tiny.png", dpi=100)


if __name__ == "__main__":
    main()
