#!/usr/bin/env bash
# Multi-turn episodes end to end on a CPU: one random tiny LM, then for each of two
# environments an SFT warm start and GRPO with a few RL seeds:
#   * the guessing game (examples/guessing_*.yaml): a number in 1..16, the environment
#     answering each wrong guess with the range still open, at most 4 turns;
#   * 5-digit addition with a calculator tool (examples/calculator_*.yaml), and the same
#     model and task without the tool, the baseline.
# About 9 minutes on 2 CPU cores for 3 seeds (docs/how-to/multiturn_tiny.md has the measured numbers).
#
#   bash examples/multiturn_tiny.sh          # RL seeds 0 1 2
#   SEEDS="0" bash examples/multiturn_tiny.sh
#
# Writes, from the repository root (and deletes first: the paths are fixed):
#   runs/multiturn_tiny/base                     random 2-layer character LM (init seed 0)
#   runs/multiturn_tiny/guessing-sft, guessing-seed<S>
#   runs/multiturn_tiny/calculator-sft, calculator-seed<S>
#   runs/multiturn_tiny/notool-sft, notool-seed<S>     the calculator task without the tool
#   runs/multiturn_tiny/times.txt, summary.txt   wall seconds per stage, held-out numbers
#   runs/multiturn_tiny/multiturn_tiny.png       held-out curves of every RL run
set -euo pipefail
cd "$(dirname "$0")/.."

# The same kernels on every x86-64 CPU with AVX2 (see examples/sort_text_tiny.sh: the CPU's
# own choice of kernels rounds differently, and short SFT runs amplify it).
export MKL_CBWR="${MKL_CBWR:-AVX2}" ATEN_CPU_CAPABILITY="${ATEN_CPU_CAPABILITY:-avx2}"

SEEDS="${SEEDS:-0 1 2}"
ROOT=runs/multiturn_tiny
rm -rf "$ROOT"
mkdir -p "$ROOT"
NOTOOL=(task.options.tools=[] task.options.environment_options.use_tools=false task.options.max_turns=1)

source examples/stages.sh  # stage NAME COMMAND...: its log and wall time under $ROOT

stage init-model rlvr init-model --out "$ROOT/base" --hidden-size 64 --intermediate-size 192 \
  --num-layers 2 --num-heads 4 --seed 0 --chars '0123456789 >+-*=()aclortu\n'
stage guessing-sft rlvr sft examples/guessing_sft.yaml
stage calculator-sft rlvr sft examples/calculator_sft.yaml
stage notool-sft rlvr sft examples/calculator_sft.yaml "out_dir=$ROOT/notool-sft" "${NOTOOL[@]}"
for seed in $SEEDS; do
  stage "guessing-seed$seed" rlvr train examples/guessing_tiny.yaml "seed=$seed" "out_dir=$ROOT/guessing-seed$seed"
  stage "calculator-seed$seed" rlvr train examples/calculator_tiny.yaml "seed=$seed" \
    "out_dir=$ROOT/calculator-seed$seed"
  stage "notool-seed$seed" rlvr train examples/calculator_tiny.yaml "seed=$seed" "out_dir=$ROOT/notool-seed$seed" \
    "policy.options.model=$ROOT/notool-sft/model" "${NOTOOL[@]}"
done

python examples/multiturn_summary.py "$ROOT" $SEEDS | tee "$ROOT/summary.txt"
