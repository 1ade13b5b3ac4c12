"""Runs summed up as the command line prints them: a row per run, the diagnostics, the means over seeds, and each
run directory's label in a plot."""

from __future__ import annotations

from pathlib import Path

from rlvr.config import load_config
from rlvr.loop.diagnostics import gold_notes, hacking_warnings, prompt_summary
from rlvr.loop.evaluation import eval_prompts_label
from rlvr.rewards.combine import failure_warnings
from rlvr.runs.metrics import summary
from rlvr.tasks.environment import error_warnings

COLUMNS = (
    ("reward_start", "reward start"),
    ("reward_end", "reward end"),
    ("solve_rate_end", "solve rate"),
    ("frac_zero_delta_groups_end", "zero-delta groups"),
    ("eval_greedy_solve_rate", "greedy"),
    ("eval_sampled_solve_rate", "sampled"),
)


def print_summary(runs: dict[str, list], eval_label: str = "held-out prompts") -> None:
    """One row per run; the eval columns say what they are on (``eval_prompts_label``)."""
    where = "training prompts" if eval_label == "training prompts" else "held-out"
    labels = [f"{label}, {where}" if key.startswith("eval_") else label for key, label in COLUMNS]
    width = max(len(n) for n in runs) + 2
    cells = [max(18, len(label) + 2) for label in labels]
    print("".join([f"{'run':<{width}}"] + [f"{label:>{w}}" for label, w in zip(labels, cells)]))
    for name, records in runs.items():
        s = summary(records)
        print("".join([f"{name:<{width}}"] + [f"{s.get(key, float('nan')):>{w}.3f}"
                                               for (key, _), w in zip(COLUMNS, cells)]))
    for name, records in runs.items():  # why a run stalls, and whether its reward is being gamed
        line = prompt_summary(records)
        if line:
            print(f"{name}: {line}")
        for note in gold_notes(records):
            print(f"{name}: {note}")
        for warning in hacking_warnings(records):
            print(f"warning: {name}: {warning}")
        for warning in failure_warnings(records):  # a reward that failed on most calls gave the run no signal
            print(f"warning: {name}: {warning}")
        for warning in error_warnings(records):  # episodes whose environment failed: their rewards abstained
            print(f"warning: {name}: {warning}")


def print_mode_means(by_mode: dict[str, list], eval_label: str = "held-out prompts") -> None:
    print("\nmean over seeds")
    for mode, runs in by_mode.items():
        sums = [summary(r) for r in runs]
        reward = sum(s["reward_end"] for s in sums) / len(sums)
        greedy = sum(s.get("eval_greedy_solve_rate", 0.0) for s in sums) / len(sums)
        print(f"  {mode:<12} reward end {reward:7.3f}   greedy solve rate on the {eval_label} {greedy:6.3f}")


def plot_labels(run_dirs: list[str]) -> tuple[list[str], str]:
    """Each run directory's legend label (its name and seed) and what their evaluation is on ("eval prompts" when
    the runs disagree or say nothing)."""
    labels, evals = [], set()
    for d in map(Path, run_dirs):
        config = load_config(d / "config.yaml") if (d / "config.yaml").is_file() else None
        labels.append(d.name if config is None else f"{d.name} (seed {config.seed})")
        evals.add(None if config is None else eval_prompts_label(config))
    return labels, evals.pop() if len(evals) == 1 and None not in evals else "eval prompts"
