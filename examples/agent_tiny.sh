#!/usr/bin/env bash
# An agent over HTTP learning on a CPU: examples/agents/calculator_agent.py (the openai
# client only: two or three calls an episode, one tool it runs itself) trains a tiny
# character LM through rlvr's endpoint. One random 2-layer model, the SFT warm start of
# examples/calculator_sft.yaml, 2000 training and 200 held-out sums of 5-digit numbers, then
# GRPO (examples/agent_tiny.yaml) for each seed; the held-out table and curves at the end.
#
#   pip install -e ".[lm,agents]"
#   bash examples/agent_tiny.sh             # RL seeds 0 1 2
#   SEEDS="0" bash examples/agent_tiny.sh
#
# Writes, from the repository root (and deletes first: the paths are fixed):
#   runs/agent_tiny/base, sft            the random model and its warm start
#   runs/agent_tiny/train.jsonl, eval.jsonl
#   runs/agent_tiny/seed<S>              one GRPO run per seed
#   runs/agent_tiny/times.txt, summary.txt, agent_tiny.png
set -euo pipefail
cd "$(dirname "$0")/.."
export MKL_CBWR="${MKL_CBWR:-AVX2}" ATEN_CPU_CAPABILITY="${ATEN_CPU_CAPABILITY:-avx2}"  # as multiturn_tiny.sh

SEEDS="${SEEDS:-0 1 2}"
ROOT=runs/agent_tiny
rm -rf "$ROOT"
mkdir -p "$ROOT"

source examples/stages.sh  # stage NAME COMMAND...: its log and wall time under $ROOT

python - "$ROOT" <<'PY'
import json, random, sys
rng = random.Random(0)
for name, n in (("train", 2000), ("eval", 200)):
    with open(f"{sys.argv[1]}/{name}.jsonl", "w") as f:
        for _ in range(n):
            f.write(json.dumps({"a": rng.randint(10000, 99999), "b": rng.randint(10000, 99999)}) + "\n")
PY
stage init-model rlvr init-model --out "$ROOT/base" --hidden-size 64 --intermediate-size 192 \
  --num-layers 2 --num-heads 4 --seed 0 --chars '0123456789 >+-*=()aclortu\n'
stage sft rlvr sft examples/calculator_sft.yaml "out_dir=$ROOT/sft" "policy.options.model=$ROOT/base"
for seed in $SEEDS; do
  stage "seed$seed" rlvr train examples/agent_tiny.yaml "seed=$seed" "out_dir=$ROOT/seed$seed"
done

python examples/recipe_summary.py "$ROOT" $SEEDS | tee "$ROOT/summary.txt"
