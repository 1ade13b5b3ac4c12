"""Time to accuracy: the arithmetic recipe with rlvr and with TRL's GRPOTrainer, the training
time each needs to reach two held-out accuracies: TRL's final one, and a fixed one.

Both train SmolLM2-135M-Instruct (the recipe's model) on ``examples/smollm2_arithmetic.yaml``'s
data with its settings: chat prompts of two-digit sums, the reward 1 when the reply's last
number is the sum (rlvr's ``exact_match`` with ``extract="last_number"``, which TRL's run
loads from rlvr's file), G = 8, 4 prompts a step, temperature 0.8, 16 new tokens, AdamW at
lr 1e-5 with clipping at 1.0, no KL, ``--steps`` steps at ``--threads`` threads. Each side
answers the held-out questions greedily before training and every ``--eval-every`` steps,
scored by the same check. Both sides are timed by the same code (``training_clock.py``): the
wall clock of the run from just before it loads its data and the model (the same saved folder
on both sides), less the wall clock of its evaluations, read as each evaluation begins, and
read again just after each optimizer step (kept in the saved file). rlvr trains in this
process (its evaluations timed by wrapping its rollout source's ``evaluate``, its steps its
learner's ``optimizer_step``), TRL in its own interpreter (``trl_step.py``, both in trainer
callbacks; ``--trl-python``: ``python -m venv /tmp/trl-venv && /tmp/trl-venv/bin/pip install
torch==2.13.0 trl==1.16.0 datasets``); each interpreter's start and imports are outside both
times. rlvr draws the questions in its seeded shuffle, TRL in the file's order (the file is in
random order).

The targets are TRL's accuracy at its last evaluation and ``--fixed-target``; for each side
the script prints the training seconds at its first evaluation at or above each, and rlvr /
TRL (goal: at most 0.5). ``--rlvr-steps`` lets rlvr train longer than TRL's ``--steps`` to
reach them, and rlvr stops at the first evaluation at or above both. ``--save`` writes both
curves (and the settings) to a JSON file; ``--trl-curve`` reuses the TRL curve of such a file
made with the same settings instead of running TRL again (``--trl-only`` makes such a file
without running rlvr); ``--summarize`` prints the table of
several saved seeds and the median ratio on each target.

    python benchmarks/time_to_accuracy.py --trl-python /tmp/trl-venv/bin/python
    python benchmarks/time_to_accuracy.py --trl-python ... --steps 40 --eval-every 5 --rlvr-steps 80 \
        --seed 3 --save tta-3.json
    python benchmarks/time_to_accuracy.py --trl-python ... --steps 40 --eval-every 5 --rlvr-steps 80 \
        --seed 3 --trl-curve tta-3.json --save tta-3b.json
    python benchmarks/time_to_accuracy.py --summarize tta-*.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from training_clock import TrainingClock

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "smollm2_arithmetic.yaml"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trl-python", help="an interpreter with trl installed")
    parser.add_argument("--steps", type=int, default=120, help="optimizer steps of each run")
    parser.add_argument("--eval-every", type=int, default=10, help="held-out evaluation every k steps")
    parser.add_argument("--eval-size", type=int, default=256, help="held-out questions (the first of the eval file)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rlvr-steps", type=int, default=None, help="rlvr's optimizer steps (default: --steps)")
    parser.add_argument("--save", default=None, help="write both curves and the settings to this JSON file")
    parser.add_argument("--trl-curve", default=None, help="reuse the TRL curve of a --save file (same settings)")
    parser.add_argument("--trl-only", action="store_true", help="run TRL alone and --save its curve (for "
                                                                  "--trl-curve later)")
    parser.add_argument("--fixed-target", type=float, default=0.65, help="the second target accuracy")
    parser.add_argument("--summarize", nargs="+", metavar="FILE", help="print the table of these --save files")
    args = parser.parse_args()
    if not args.summarize and not args.trl_python:
        parser.error("give --trl-python (or --summarize FILE ...)")
    if args.trl_only and not args.save:
        parser.error("--trl-only needs --save FILE")
    return args


SETTINGS = ("steps", "eval_every", "eval_size", "threads", "seed")  # what a reused TRL curve must match
TIMING = "wall clock less evaluations"  # how a saved curve was timed: curves timed otherwise do not compare


class TimedEvaluations:
    """rlvr's rollout source with each evaluation bracketed by the clock; the rest is the source's.
    With ``stop_at``, the run is asked to stop (its own stop request) after the first evaluation
    at or above it."""

    def __init__(self, source, clock: TrainingClock, stop_at: float | None = None) -> None:
        self._source, self._clock, self._stop_at = source, clock, stop_at

    def evaluate(self, st, task):
        with self._clock.evaluation():
            records = self._source.evaluate(st, task)
        if self._stop_at is not None:
            accuracies = [r["greedy_solve_rate"] for r in records or () if r.get("kind") == "eval"]
            if accuracies and accuracies[-1] >= self._stop_at:
                st.stop_requested = True
        return records

    def __getattr__(self, name: str):
        return getattr(self._source, name)


class TimedSteps:
    """rlvr's learner with the clock read just after each optimizer step; the rest is the learner's."""

    def __init__(self, learner, clock: TrainingClock) -> None:
        self._learner, self._clock = learner, clock

    def optimizer_step(self, st, rollout):
        record = self._learner.optimizer_step(st, rollout)
        self._clock.step_ended()
        return record

    def __getattr__(self, name: str):
        return getattr(self._learner, name)


def rlvr_curve(recipe, overrides: list[str], stop_at: float | None = None,
               clock: TrainingClock | None = None) -> list[tuple[float, float]]:
    """(training seconds so far, held-out greedy accuracy) at each evaluation of rlvr's run of
    ``recipe`` (a YAML path or a Config) with ``overrides``, in memory (no run directory);
    ``stop_at``: stop after the first evaluation at or above it."""
    from rlvr.api import resolve_config
    from rlvr.loop.trainer import seams, setup, train
    from rlvr.modeling import quiet_libraries

    config = resolve_config(recipe, overrides)
    with quiet_libraries():
        clock = clock or TrainingClock()  # started just before the data and the model load
        task, st = setup(config)
        source, learner = seams(config, None, None)
        try:
            records = train(config, state=(task, st), source=TimedEvaluations(source, clock, stop_at),
                            learner=TimedSteps(learner, clock))
        finally:
            task.close()
    accuracies = [r["greedy_solve_rate"] for r in records if r["kind"] == "eval"]
    return list(zip(clock.at_evaluations, accuracies, strict=True))


def rlvr_overrides(args: argparse.Namespace, model: Path) -> list[str]:
    """The recipe's settings for this benchmark: its steps, evaluations and threads, the saved model."""
    return [f"algo.epochs={args.rlvr_steps or args.steps}", f"log.eval_every={args.eval_every}",
            "log.eval_samples=1", f"task.options.num_eval={args.eval_size}", "log.checkpoint_every=0",
            f"threads={args.threads}", f"seed={args.seed}", f"policy.options.model={model}"]


def trl_curve(args: argparse.Namespace, folder: Path, config) -> tuple[list[tuple[float, float]], dict]:
    """(training seconds so far, held-out greedy accuracy) at each evaluation of TRL's run."""
    from rlvr.base.data import read_jsonl
    from rlvr.rewards.verifiers import exact_match

    options = config.task.options
    train = read_jsonl(ROOT / options.path, {})
    held_out = read_jsonl(ROOT / options.eval_path, {})[:args.eval_size]
    rows = [{"prompt": row["prompt"], "answer": str(row["answer"])} for row in train]
    (folder / "rows.json").write_text(json.dumps(rows))
    (folder / "eval.json").write_text(json.dumps([row["prompt"] for row in held_out]))
    command = [args.trl_python, str(Path(__file__).with_name("trl_step.py")), "--model", str(folder / "model"),
               "--rows-file", str(folder / "rows.json"), "--eval-file", str(folder / "eval.json"),
               "--eval-every", str(args.eval_every), "--prompts", str(config.task.prompts_per_epoch),
               "--group-size", str(config.algo.group_size),
               "--new-tokens", str(config.policy.options.max_new_tokens),
               "--steps", str(args.steps), "--threads", str(args.threads), "--seed", str(args.seed),
               "--temperature", str(config.policy.temperature), "--lr", str(config.optim.lr),
               "--max-grad-norm", str(config.optim.max_grad_norm)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"TRL run failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    answers = [str(row["answer"]) for row in held_out]
    curve = []
    for evaluation in result["evals"]:
        right = exact_match(evaluation["completions"], answers, extract="last_number")
        curve.append((evaluation["seconds"], sum(right) / len(right)))
    return curve, result


def first_at(curve: list[tuple[float, float]], target: float) -> float | None:
    return next((seconds for seconds, accuracy in curve if accuracy >= target), None)


def targets(trl: list[tuple[float, float]], fixed: float) -> list[tuple[str, float]]:
    return [("TRL's final", trl[-1][1]), ("fixed", fixed)]


def ratio(saved: dict, target: float) -> tuple[float | None, float | None, float | None]:
    """TRL's and rlvr's training seconds to ``target`` and rlvr / TRL (None where not reached;
    no ratio where TRL reached it before training)."""
    trl_s, ours_s = first_at(saved["trl"], target), first_at(saved["rlvr"], target)
    if trl_s is None or ours_s is None or trl_s == 0:
        return trl_s, ours_s, None
    return trl_s, ours_s, ours_s / trl_s


def summarize(files: list[str], fixed: float) -> None:
    """Each saved seed's times to both targets, and the median rlvr / TRL on each (a seed where
    rlvr did not reach a target counts as an infinite ratio there)."""
    runs = []
    for name in files:
        saved = json.loads(Path(name).read_text())
        if saved.get("timing") != TIMING:
            raise SystemExit(f"{name} was not timed as the {TIMING}")
        runs.append((name, saved))
    for label, _ in targets([(0.0, 0.0)], fixed):
        print(f"target: {label}" + (f" {fixed:.3f}" if label == "fixed" else " held-out accuracy"))
        print(f"  {'seed':>4} {'target':>6} {'TRL (s)':>8} {'rlvr (s)':>8} {'rlvr/TRL':>8}  file")
        ratios = []
        for name, saved in runs:
            target = dict(targets(saved["trl"], fixed))[label]
            trl_s, ours_s, r = ratio(saved, target)
            ratios.append(r if r is not None else float("inf"))
            show = [f"{x:.0f}" if x is not None else "-" for x in (trl_s, ours_s)]
            print(f"  {saved['settings']['seed']:>4} {target:>6.3f} {show[0]:>8} {show[1]:>8} "
                  f"{(f'{r:.2f}x' if r is not None else 'none'):>8}  {name}")
        ratios.sort()
        middle = len(ratios) // 2
        median = ratios[middle] if len(ratios) % 2 else (ratios[middle - 1] + ratios[middle]) / 2
        print(f"  median rlvr / TRL over {len(ratios)} seeds: {median:.2f}x")


def main() -> None:
    args = parse_args()
    if args.summarize:
        summarize(args.summarize, args.fixed_target)
        return
    os.chdir(ROOT)  # the recipe's paths are the repository root's
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.config import load_config
    from rlvr.policies.hf_model import locate_model

    found = subprocess.run([args.trl_python, "-c", "import trl"], capture_output=True)
    if found.returncode != 0:
        raise SystemExit(f"{args.trl_python} cannot import trl: {found.stderr.decode()[-300:]}")
    settings = {name: getattr(args, name) for name in SETTINGS}
    reused = None
    if args.trl_curve:
        reused = json.loads(Path(args.trl_curve).read_text())
        if reused.get("settings") != settings:
            raise SystemExit(f"{args.trl_curve} was made with {reused.get('settings')}, not {settings}")
        if reused.get("timing") != TIMING:
            raise SystemExit(f"{args.trl_curve} was timed as the sum of TRL's steps, not as the {TIMING}: "
                             "run TRL again (without --trl-curve)")
    config = load_config(RECIPE)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        source = locate_model(config.policy.options.model)  # the converted GGUF: a plain folder TRL loads
        AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).save_pretrained(folder / "model")
        AutoTokenizer.from_pretrained(source).save_pretrained(folder / "model")
        print(f"SmolLM2-135M-Instruct, the arithmetic recipe: {args.steps} steps, held-out greedy accuracy on "
              f"{args.eval_size} questions every {args.eval_every}, {args.threads} threads, seed {args.seed}",
              flush=True)
        if reused is None:
            trl, result = trl_curve(args, folder, config)
            versions = {"trl": result["trl"], "transformers": result["transformers"]}
            trl_steps = result.get("at_steps", [])
        else:
            trl, versions = [tuple(point) for point in reused["trl"]], reused["versions"]
            trl_steps = reused.get("trl_at_steps", [])
        if args.trl_only:
            Path(args.save).write_text(json.dumps({"settings": settings, "timing": TIMING, "versions": versions,
                                                   "trl": trl, "trl_at_steps": trl_steps}))
            print("  TRL " + " ".join(f"{s:.0f}s:{a:.3f}" for s, a in trl))
            return
        stop_at = max(target for _, target in targets(trl, args.fixed_target))
        clock = TrainingClock()
        ours = rlvr_curve(RECIPE, rlvr_overrides(args, folder / "model"), stop_at, clock)
    saved = {"settings": settings, "timing": TIMING, "versions": versions, "trl": trl, "rlvr": ours,
             "rlvr_steps": args.rlvr_steps or args.steps, "trl_at_steps": trl_steps, "rlvr_at_steps": clock.at_steps}
    if args.save:
        Path(args.save).write_text(json.dumps(saved))
    print(f"TRL {versions['trl']}, transformers {versions['transformers']} (its venv)"
          + (f"; TRL's curve from {args.trl_curve}" if reused else ""))
    for name, curve in (("rlvr", ours), ("TRL", trl)):
        print(f"  {name:<5} " + " ".join(f"{s:.0f}s:{a:.3f}" for s, a in curve))
    for label, target in targets(trl, args.fixed_target):
        trl_s, ours_s, r = ratio(saved, target)
        print(f"target: {label} held-out accuracy {target:.3f}")
        if trl_s is None:
            print(f"  TRL does not reach it (its best: {max(a for _, a in trl):.3f})")
            continue
        print(f"  TRL reaches it after {trl_s:.0f} s of training")
        if trl_s == 0:
            print("  (TRL reached it before training: there is no time to compare)")
        elif ours_s is None:
            print(f"  rlvr does not reach it in {len(clock.at_steps)} steps (its best: "
                  f"{max(a for _, a in ours):.3f})")
        else:
            print(f"  rlvr reaches it after {ours_s:.0f} s: rlvr / TRL {r:.2f}x")


if __name__ == "__main__":
    main()
