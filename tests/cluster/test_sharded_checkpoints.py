"""Sharded checkpoints (rlvr.cluster.sharded): data-parallel learners write a checkpoint's
weights and optimizer state with DCP; the run resumes from them with one process or with
another number of learners, and exports and reports from them."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from rlvr.cli import main
from rlvr.runs.checkpoint import SHARDED_DIR, SHARDED_KEY, list_checkpoints, load_payload, verify
from rlvr.runs.metrics import read_records

pytestmark = pytest.mark.ray

KEYS = ("loss", "grad_norm", "reward_mean", "kl")


def train_records(run_dir):
    return [r for r in read_records(run_dir / "metrics.jsonl") if r["kind"] == "train"]


def assert_follows(run_dir, straight, rel, abs):
    """The optimizer steps of ``run_dir`` (split, then resumed) agree with the straight run's."""
    a, b = train_records(run_dir), train_records(straight)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        for key in KEYS:
            if key in rb:
                assert ra[key] == pytest.approx(rb[key], rel=rel, abs=abs), (run_dir.name, rb["step"], key)


def assert_sharded(checkpoint):
    """The learners' DCP folder named in the manifest and verified; neither weights nor
    optimizer state in trainer.pt, no model folder written by the driver."""
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert manifest[SHARDED_KEY] == SHARDED_DIR and f"{SHARDED_DIR}/.metadata" in manifest
    assert any(name.endswith(".distcp") for name in manifest)
    payload = load_payload(checkpoint / "trainer.pt")
    assert payload["policy"] is None and payload["optimizer"] is None
    assert not (checkpoint / "model").exists() and verify(checkpoint) is None


def test_a_sharded_checkpoint_is_refused_when_a_shard_is_damaged(tmp_path):
    from rlvr.runs.checkpoint import save_checkpoint

    def write_shards(folder):
        folder.mkdir()
        (folder / "__0_0.distcp").write_bytes(b"weights")

    saved = save_checkpoint(tmp_path, "step-000000001", {"epoch": 1}, write_sharded=write_shards)
    assert verify(saved) is None
    (saved / SHARDED_DIR / "__0_0.distcp").write_bytes(b"weightz")
    assert verify(saved) == f"{SHARDED_DIR}/__0_0.distcp does not match its checksum"
    shutil.rmtree(saved / SHARDED_DIR)
    assert "missing" in verify(saved)


TOY = ["log.progress=false", "log.plot=false", "algo.loss=clipped", "algo.kl_coef=0.05", "algo.inner_steps=2",
       "log.eval_every=3", "log.checkpoint_every=1"]


def test_ddp_learners_checkpoint_sharded_resume_in_one_process_export_and_report(ray_local, tmp_path):
    """The positional toy on two replicas: the checkpoint is sharded (the replicas' equal
    tensors written once); export writes its weights; resumed in one process the run follows
    the single-process run (to the rounding test_learners allows: the gradient is summed in
    another order); report reads the run."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["train", f"out_dir={straight}", "algo.epochs=3", *TOY]) == 0
    assert main(["train", f"out_dir={split}", "algo.epochs=2", "cluster.learners=2", *TOY]) == 0
    assert_sharded(list_checkpoints(split)[-1])
    exported = tmp_path / "toy"
    assert main(["export", str(split), "--out", str(exported)]) == 0  # from the learners' shards (step 4)
    weights = torch.load(exported / "policy.pt", weights_only=True)
    at_four = load_payload(straight / "checkpoints" / "step-000000004" / "trainer.pt")["policy"]
    assert weights.keys() == at_four.keys()
    for key, value in at_four.items():  # Adam's steps pass the gradient's rounding on damped (test_learners)
        torch.testing.assert_close(weights[key], value, rtol=0, atol=1e-6)

    assert main(["train", f"resume={split}", "algo.epochs=3", "cluster.learners=1"]) == 0
    assert_follows(split, straight, rel=1e-4, abs=1e-6)
    assert main(["report", str(split), "--out", str(tmp_path / "report.html")]) == 0
    assert "reward" in (tmp_path / "report.html").read_text()


def lm(tiny_model):
    from helpers import QUIET

    return [*QUIET, "task.name=sort_text", "task.options={num_digits: 3, num_eval: 4}", "task.prompts_per_epoch=2",
            "policy.name=causal_lm", f"policy.options={{model: '{tiny_model}', max_new_tokens: 7}}",
            "algo.inner_steps=2", "algo.group_size=4", "algo.loss=clipped", "optim.lr=1e-3", "log.eval_every=3",
            "log.eval_samples=1", "log.checkpoint_every=1", "log.entropy=false", "threads=1"]


def test_fsdp_checkpoint_resumes_in_one_process_and_on_three_learners_and_exports(ray_local, tiny_model, tmp_path):
    """FSDP over two learners, checkpointed after 2 of 3 epochs, resumed in one process (the
    shards read whole) and on three learners (resharded): both follow the single-process run
    to the tolerance test_learners gives FSDP; export merges the shards into a model folder."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    base = lm(tiny_model)
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["train", f"out_dir={straight}", "algo.epochs=3", *base]) == 0
    assert main(["train", f"out_dir={split}", "algo.epochs=2", "cluster.learners=2", "cluster.learner_strategy=fsdp",
                 *base]) == 0
    assert_sharded(list_checkpoints(split)[-1])
    exported = tmp_path / "model"
    assert main(["export", str(split), "--out", str(exported)]) == 0
    model = AutoModelForCausalLM.from_pretrained(str(exported))
    at_four = AutoModelForCausalLM.from_pretrained(str(straight / "checkpoints" / "step-000000004" / "model"))
    for (name, value), expected in zip(model.state_dict().items(), at_four.state_dict().values()):
        torch.testing.assert_close(value, expected, rtol=0, atol=1e-5, msg=name)
    assert (exported / "tokenizer_config.json").is_file()

    split3 = tmp_path / "split3"
    shutil.copytree(split, split3)
    assert main(["train", f"resume={split}", "algo.epochs=3", "cluster.learners=1"]) == 0
    assert main(["train", f"resume={split3}", "algo.epochs=3", "cluster.learners=3"]) == 0
    for run_dir in (split, split3):
        assert_follows(run_dir, straight, rel=1e-3, abs=1e-5)
    assert (list_checkpoints(split)[-1] / "model").is_dir()  # resumed in one process: the usual checkpoint
    assert_sharded(list_checkpoints(split3)[-1])
