"""Optional installs (``rlvr.base.extras``): the core install runs the main job, and a missing extra is one
line naming it, before any work."""

import re
import sys

import pytest

import rlvr
from helpers import rlvr_cli

OPTIONAL = ("transformers", "tokenizers", "huggingface_hub", "safetensors", "peft", "datasets", "pyarrow",
            "reasoning_gym", "ray", "math_verify")
LM_MISSING = "the transformers package is not installed: pip install 'rlvr[lm]'"
TINY_LM = ["policy.name=causal_lm", "policy.options={model: m, max_new_tokens: 4}"]


@pytest.mark.parametrize("args, blocked, line", [
    (["init-model", "--out", "runs/m"], OPTIONAL, f"init-model: {LM_MISSING}"),
    (["train", "examples/your_own_data.yaml"], OPTIONAL, f"policy.name='causal_lm': {LM_MISSING}"),
    (["config", "examples/your_own_data.yaml"], OPTIONAL, f"policy.name='causal_lm': {LM_MISSING}"),
    (["sft", "examples/sort_text_sft.yaml"], OPTIONAL, f"policy.name='causal_lm': {LM_MISSING}"),
    (["train", "task.name=reasoning_gym", "task.options={dataset: basic_arithmetic}", *TINY_LM], OPTIONAL,
     f"policy.name='causal_lm': {LM_MISSING}"),
    (["train", "task.name=reasoning_gym", "task.options={dataset: basic_arithmetic}", *TINY_LM], ("reasoning_gym",),
     "task.name='reasoning_gym': the reasoning_gym package is not installed: pip install 'rlvr[reasoning-gym]'"),
    (["config", "task.name=reasoning_gym", "task.options={dataset: basic_arithmetic}", *TINY_LM], ("reasoning_gym",),
     "task.name='reasoning_gym': the reasoning_gym package is not installed: pip install 'rlvr[reasoning-gym]'"),
    (["train", "cluster.rollout_workers=2"], OPTIONAL,
     "cluster.rollout_workers=2: the ray package is not installed: pip install 'rlvr[ray]'"),
    (["train", "task.name=dataset", "task.options={path: d.parquet}", *TINY_LM], ("pyarrow",),
     "the pyarrow package is not installed: pip install 'rlvr[data]'"),
    (["config", "task.name=dataset", "task.options={path: d.parquet}", *TINY_LM], ("pyarrow",),
     "task.name='dataset': the pyarrow package is not installed: pip install 'rlvr[data]'"),
])
def test_a_missing_extra_is_one_line_naming_it_before_any_work(workdir, args, blocked, line):
    (workdir / "d.parquet").write_bytes(b"PAR1")  # read only once pyarrow is there
    done = rlvr_cli(args, workdir, blocked)
    assert (done.returncode, done.stderr) == (2, f"rlvr: error: {line}\n")
    assert not (workdir / "runs").exists()  # no run directory, no model folder


def test_the_main_job_needs_no_extra(workdir):
    done = rlvr_cli(["train", "algo.epochs=1", "log.plot=false"], workdir, OPTIONAL)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (workdir / "runs" / "lecture" / "metrics.jsonl").is_file()


def test_rlvr_check_names_the_missing_extra(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    with pytest.raises(rlvr.ConfigError, match=re.escape("cluster.learners=2: the ray package is not installed: "
                                                         "pip install 'rlvr[ray]'")):
        rlvr.check({"cluster": {"learners": 2}})


def test_a_lora_export_without_peft_is_one_line(lora_run):
    where, _ = lora_run
    done = rlvr_cli(["export", "runs/lora", "--out", "merged2"], where, ("peft",))
    assert (done.returncode, done.stderr) == (
        2, "rlvr: error: merging a LoRA run's adapters: the peft package is not installed: pip install 'rlvr[lora]'\n")
    assert not (where / "merged2").exists()
