"""The learners are the source of truth: with data-parallel learners and rollout workers the
driver holds no weights, optimizer state or reference (rlvr.cluster.driver_holds_weights);
the learners score the samples, hold the reference, publish the weights to the workers and
write them into checkpoints, and worker 0 evaluates."""

import os
from pathlib import Path

import pytest
import torch

from rlvr.config import ConfigError, load_config
from rlvr.runs.metrics import read_records

TOY = ["log.progress=false", "log.plot=false", "algo.loss=clipped", "algo.kl_coef=0.05", "algo.epochs=3",
       "algo.inner_steps=2", "log.eval_every=3", "log.checkpoint_every=0"]
WEIGHTLESS = ["cluster.learners=2", "cluster.rollout_workers=1"]
KEYS = ("loss", "pg_loss", "kl", "clip_frac", "grad_norm", "reward_mean", "solve_rate", "lr",
        "greedy_solve_rate", "sampled_reward")


@pytest.fixture(scope="module")
def ray_local():
    """A private Ray whose workers import this module (its reward function ``length``)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray = pytest.importorskip("ray")
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).parent), before) if p)
    try:
        from helpers import private_ray  # here: the workers import this module, and have no helpers

        with private_ray(ray):
            yield ray
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = before


def length(completions, **kwargs):
    """A reward that differs within a group even for an untrained model: its responses' lengths."""
    return [len(c) / 10 for c in completions]


def assert_follows(records, reference, rel=1e-4, abs=1e-6):
    """Same records (kind, epoch, step), the numbers within the data-parallel tolerance."""
    assert [(r["kind"], r["epoch"], r["step"]) for r in records] == [
        (r["kind"], r["epoch"], r["step"]) for r in reference]
    for a, b in zip(records, reference):
        for key in KEYS:
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=rel, abs=abs), (b["kind"], b["step"], key)


def test_the_driver_holds_no_weights_and_the_run_follows_the_single_process_run(ray_local):
    import rlvr
    from rlvr.api import run_loop as train

    local = rlvr.train(load_config(None, TOY))
    seen = []

    def on_epoch_end(st):
        seen.append((all(p.is_meta for p in st.policy.module.parameters()), st.ref_module, len(st.optimizer.state)))

    held = train(load_config(None, TOY + WEIGHTLESS), on_epoch_end=on_epoch_end)
    assert seen == [(True, None, 0)] * 3  # no weights, no reference, no Adam state in the driver, every epoch
    assert_follows(held, local.records)
    assert [r["epoch"] for r in held if r["kind"] == "eval"] == [0, 3]  # evaluated on a rollout worker

    result = rlvr.train(load_config(None, TOY + WEIGHTLESS))  # the caller gets the trained weights
    assert not any(p.is_meta for p in result.policy.module.parameters())
    for key, value in local.policy.module.state_dict().items():
        torch.testing.assert_close(result.policy.module.state_dict()[key], value, rtol=1e-4, atol=1e-6)


def lm(tiny_model, *extra):
    return ["task.name=sort_text", "task.options={num_digits: 3, num_eval: 4}", "task.prompts_per_epoch=2",
            "policy.name=causal_lm", f"policy.options={{model: '{tiny_model}', max_new_tokens: 7}}",
            "algo.group_size=4", "algo.loss=clipped", "algo.kl_coef=0.05", "optim.lr=1e-3", "log.eval_every=2",
            "rewards.functions=['test_driver_weights:length']", "rewards.timeout=null",
            "log.eval_samples=1", "log.entropy=false", "log.progress=false", "log.plot=false", "threads=1",
            *extra]


def test_fsdp_learners_checkpoint_the_reference_and_resume_in_one_process(ray_local, tiny_model, tmp_path):
    """FSDP learners with a rollout worker: the checkpoint's weights, Adam state and KL
    reference are the learners' shards; resumed in one process (which reads them whole,
    the reference included), the run follows the straight single-process run."""
    pytest.importorskip("transformers")
    from rlvr.cli import main

    straight, split = tmp_path / "straight", tmp_path / "split"
    base = lm(tiny_model, "algo.inner_steps=2", "log.checkpoint_every=1", "algo.ref_update_every=3")
    assert main(["train", f"out_dir={straight}", "algo.epochs=4", *base]) == 0
    assert main(["train", f"out_dir={split}", "algo.epochs=2", "cluster.learner_strategy=fsdp", *WEIGHTLESS,
                 *base]) == 0
    assert main(["train", f"resume={split}", "algo.epochs=4", "cluster.learners=1", "cluster.rollout_workers=0"]) == 0
    a, b = ([r for r in read_records(d / "metrics.jsonl") if r["kind"] == "train"] for d in (split, straight))
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(8))
    # the reference made at epoch 0 is kept to epoch 3: the resumed run's KL after epoch 2 is measured against it
    assert_follows(a, b, rel=1e-3, abs=1e-5)


def test_a_one_process_checkpoint_resumes_on_learners_without_the_driver_loading_it(ray_local, tmp_path):
    """A checkpoint written by one process (weights, Adam state and reference in trainer.pt)
    resumed with learners and a rollout worker: the learners take the state, the driver keeps
    none, and the run goes on as the straight run."""
    from rlvr.cli import main

    straight, split = tmp_path / "straight", tmp_path / "split"
    base = [o for o in TOY if not o.startswith(("algo.epochs", "log.checkpoint_every"))] + ["log.checkpoint_every=1"]
    assert main(["train", f"out_dir={straight}", "algo.epochs=4", *base]) == 0
    assert main(["train", f"out_dir={split}", "algo.epochs=2", *base]) == 0
    assert main(["train", f"resume={split}", "algo.epochs=4", *WEIGHTLESS]) == 0
    a, b = ([r for r in read_records(d / "metrics.jsonl") if r["kind"] == "train"] for d in (split, straight))
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(8))
    assert_follows(a, b)


def test_the_collective_broadcast_is_refused_when_the_driver_holds_no_weights():
    with pytest.raises(ConfigError, match="holds no weights when the learners do"):
        load_config(None, TOY + WEIGHTLESS + ["cluster.weight_sync=collective"])
