#!/usr/bin/env bash
# GPU check of the hf engine and rlvr's GRPO step on a lent GPU machine (benchmarks/gpu_check.py),
# then of the cluster parts (benchmarks/gpu_cluster_check.py):
# random-init Qwen2.5-0.5B shape in bfloat16, 8 prompts x 8 responses x 256 new tokens, rlvr's
# step against a hand-written one (HF generate + forward + backward + AdamW) in the same run.
#
#   bash benchmarks/gpu_check.sh            # on the GPU: ~2-4 minutes on an H200, stopped at 7.5
#   bash benchmarks/gpu_check.sh --smoke    # tiny shapes on the CPU, seconds (tests/policies runs it)
#
# Needs torch and transformers only (nothing is installed: the lent machine reaches no package
# registry); rlvr is taken from src/. Writes gpu_check.{json,md,log} to $OUT when set (the lent
# machine's result folder), else to /tmp/gpu_check_out/. Extra arguments go to gpu_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
out_dir="${OUT:-${TMPDIR:-/tmp}/gpu_check_out}"
mkdir -p "$out_dir"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
python -c 'import sys, torch, transformers
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available(), "transformers", transformers.__version__)'
if [[ " $* " != *" --smoke "* ]] && command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
fi
timeout 450 python benchmarks/gpu_check.py --out "$out_dir/gpu_check" "$@" 2>&1 | tee "$out_dir/gpu_check.log"
# The cluster parts: learners over NCCL (one per GPU), a sharded checkpoint, vLLM in a Ray rollout
# worker (skipped, and said so, without ray or vllm). --smoke: 2 gloo learners on the CPU.
smoke=""
[[ " $* " == *" --smoke "* ]] && smoke="--smoke"
timeout 240 python benchmarks/gpu_cluster_check.py $smoke --out "$out_dir/gpu_cluster_check" 2>&1 \
    | tee "$out_dir/gpu_cluster_check.log"
