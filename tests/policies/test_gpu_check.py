"""benchmarks/gpu_check.sh, the check a lent GPU machine runs, on its CPU smoke path."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_smoke_writes_its_results(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path)}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--smoke"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(result["paths"]) == {"rlvr", "hand-written"}
    for path in result["paths"].values():
        assert path["generate_s"] > 0 and path["update_s"] > 0 and path["score_s"] >= 0
        assert path["step_s"] > 0 and path["generate_tokens_per_s"] > 0
    # float32 scoring of the same tokens, cached vs one forward: rounding only (bfloat16 weights
    # and activations on both sides, so the same bf16 kernels; 1e-3 leaves room for that)
    assert result["rlvr_sample_vs_scored_log_probs"]["max_abs"] < 1e-3
    assert "hand-written / rlvr step time" in (tmp_path / "gpu_check.md").read_text()
    assert (tmp_path / "gpu_check.log").read_text().startswith("GPU check")
    cluster = json.loads((tmp_path / "gpu_cluster_check.json").read_text())
    learners = cluster["learners_and_sharded_checkpoint"]
    assert learners["status"] == "passed" and learners["world_size"] == 2 and learners["backend"] == "gloo"
    assert learners["ranks_agree"] and learners["checkpoint_round_trip"]
    shares = [r["parameter_bytes"] for r in learners["ranks"]]
    assert all(0.4 < s / sum(shares) < 0.6 for s in shares)  # FSDP: each rank holds about half
    assert cluster["vllm_rollout_worker"]["status"] == "skipped"
