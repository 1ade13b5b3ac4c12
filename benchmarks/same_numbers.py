"""Same numbers before and after a change: six jobs at a base revision and at the work
tree, records compared field by field (wall-clock fields aside).

    python benchmarks/same_numbers.py [--base REV]   # default base: HEAD
    python benchmarks/same_numbers.py --only lecture,sorting_best,compare   # some jobs

The jobs: ``rlvr train`` (the lecture's defaults), ``rlvr train examples/sorting_best.yaml``,
a 4-epoch GRPO run of a tiny ``rlvr init-model`` Llama on ``sort_text`` (clipped loss,
normalized deltas, G = 4, two inner steps), the same run with one Ray rollout worker and
two data-parallel learners (skipped, and said so, without ray), a dynamic-sampling run of
the toy on fresh prompts, and ``rlvr compare`` of the toy (every run it writes).
The base revision is checked out with
``git worktree`` into a temporary folder and run with its own sources, in a separate
process, on the same machine, one after the other; the tiny model is built once by the
work tree's ``init-model`` and used by both sides. Exit status 0 when every record agrees.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WALL_CLOCK = ("time/", "tokens_per_sec")


def jobs(model: Path) -> dict[str, list[str]]:
    """Job name -> ``rlvr`` arguments: a command (``train`` or ``compare``), an optional
    CONFIG, then overrides."""
    quiet = ["log.progress=false", "log.plot=false"]
    tiny_lm = [
        "task.name=sort_text", "task.prompts_per_epoch=4", "task.options={num_digits: 3, num_eval: 8}",
        "policy.name=causal_lm", f"policy.options={{model: '{model}', max_new_tokens: 7}}",
        "algo.epochs=4", "algo.inner_steps=2", "algo.group_size=4", "algo.loss=clipped",
        "algo.deltas=normalized", "optim.lr=1e-3", "optim.micro_batches=2", "log.eval_every=2",
        "log.eval_samples=2", "log.checkpoint_every=2", "seed=7", *quiet,
    ]
    out = {
        "lecture": ["train", *quiet],
        "sorting_best": ["train", "{tree}/examples/sorting_best.yaml", *quiet],  # each side's own spelling
        "sort_text_tiny_lm": ["train", *tiny_lm],
        "tiny_lm_cluster": ["train", *tiny_lm, "cluster.rollout_workers=1", "cluster.learners=2"],
        "dynamic_sampling": ["train", "task.prompts=null", "algo.dynamic_sampling=true", "algo.max_sampling_tries=8",
                             "algo.epochs=20", "log.eval_every=10", *quiet],
        "compare": ["compare", "algo.epochs=20", "log.eval_every=10", *quiet],
    }
    if importlib.util.find_spec("ray") is None:
        print("tiny_lm_cluster: skipped (no ray: pip install 'rlvr[ray]')")
        del out["tiny_lm_cluster"]
    return out


def rlvr(src: Path, args: list[str], cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(src)}
    code = "import sys; from rlvr.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"rlvr {' '.join(args)} failed ({src}):\n{done.stderr[-4000:]}")


def records(out: Path) -> list[dict]:
    """Every record of the job's runs (one run, or each run of a compare, by path)."""
    found = []
    for metrics in sorted(out.rglob("metrics.jsonl")):
        lines = metrics.read_text().splitlines()
        found += [{k: v for k, v in json.loads(line).items() if not k.startswith(WALL_CLOCK)} for line in lines]
    return found


def differences(base: list[dict], new: list[dict]) -> list[str]:
    if len(base) != len(new):
        return [f"{len(base)} records at the base, {len(new)} now"]
    out = []
    for i, (a, b) in enumerate(zip(base, new)):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                out.append(f"record {i}: {key!r} only {'now' if key in b else 'at the base'}")
            elif a[key] != b[key] and not (a[key] != a[key] and b[key] != b[key]):  # NaN == NaN here
                out.append(f"record {i} ({a.get('kind')}, step {a.get('step')}): {key} {a[key]!r} -> {b[key]!r}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="git revision to compare against (default HEAD)")
    parser.add_argument("--only", help="comma-separated job names (default: every job)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="same-numbers-") as tmp:
        tmp = Path(tmp)
        base_tree = tmp / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base_tree), args.base],
                       check=True)
        try:
            model = tmp / "model"
            rlvr(ROOT / "src", ["init-model", "--out", str(model), "--hidden-size", "32",
                                "--intermediate-size", "64", "--num-layers", "2", "--num-heads", "2"], tmp)
            failed = 0
            chosen = jobs(model)
            for name in set(chosen) - set(args.only.split(",")) if args.only else ():
                del chosen[name]
            for name, job_args in chosen.items():
                got = {}
                for side, tree in (("base", base_tree), ("now", ROOT)):
                    out = tmp / side / name
                    flags = ["--seeds", "0,1"] if job_args[0] == "compare" else []
                    side_args = [arg.replace("{tree}", str(tree)) for arg in job_args]
                    rlvr(tree / "src", [*side_args, f"out_dir={out}", f"name={name}", *flags], tmp)
                    got[side] = records(out)
                diff = differences(got["base"], got["now"])
                failed += bool(diff)
                verdict = "identical" if not diff else f"{len(diff)} differences"
                print(f"{name:<20} {len(got['now']):5d} records  {verdict}")
                for line in diff[:10]:
                    print("   ", line)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)], check=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
