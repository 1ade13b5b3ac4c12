"""``rlvr export RUN_DIR --out DIR``: the trained model as a folder plain transformers loads."""

import pytest
import torch

import rlvr
from rlvr.cli import main
from rlvr.policies import build_policy

QUIET = ["log.progress=false", "log.plot=false", "log.eval_at_start=false"]


def length(completions, **kwargs):
    """A reward that differs within a group even for an untrained model: its responses' lengths."""
    return [len(c) / 10 for c in completions]


def lm_run(model, out, options=""):
    """Two epochs of a tiny LM on 3-digit sorting, lr high enough that the weights move visibly."""
    return rlvr.train(None, ["rewards.functions=['test_export:length']", "rewards.timeout=null",
        "task.name=sort_text", "task.options={num_digits: 3, num_eval: 4}", "task.prompts_per_epoch=2",
        "policy.name=causal_lm", f"policy.options={{model: '{model}', max_new_tokens: 6{options}}}",
        "algo.epochs=2", "algo.group_size=4", "optim.lr=1e-2", "log.eval_samples=1", "seed=3", *QUIET], out_dir=out)


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


IDS = torch.tensor([[1, 5, 4, 3, 16, 8]])  # <bos> and a few characters of the tiny vocabulary


def test_export_of_an_lm_run_loads_in_plain_transformers(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result = lm_run(tiny_model, tmp_path / "run")
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "model")]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    assert tokenizer.decode(tokenizer("3 1 2>")["input_ids"]) == "3 1 2>"
    trained = result.policy.module.eval()
    assert torch.equal(logits(model, IDS), logits(trained, IDS))  # the same weights, bit for bit
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert not torch.allclose(logits(model, IDS), logits(base, IDS))  # and not the untrained ones


def test_export_merges_lora_adapters(tiny_model, tmp_path):
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    result = lm_run(tiny_model, tmp_path / "run", ", lora: {r: 4, lora_alpha: 8}")
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "model")]) == 0
    assert not (tmp_path / "model" / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")  # no peft, no base model needed
    assert not any("lora" in name for name in model.state_dict())
    # merging W + B A x scale changes only rounding: the peft model's logits, to float32 precision
    torch.testing.assert_close(logits(model, IDS), logits(result.policy.module.eval(), IDS), rtol=1e-5, atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert (logits(model, IDS) - logits(base, IDS)).abs().max() > 1e-3  # the adapters trained


def test_export_of_the_positional_toy_is_a_state_dict(tmp_path):
    result = rlvr.train(None, ["algo.epochs=2", "algo.inner_steps=2", *QUIET], out_dir=tmp_path / "run")
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "toy")]) == 0
    assert sorted(p.name for p in (tmp_path / "toy").iterdir()) == ["config.yaml", "policy.pt"]
    state = torch.load(tmp_path / "toy" / "policy.pt", weights_only=True)
    policy = build_policy(rlvr.load_config(tmp_path / "toy" / "config.yaml"))
    policy.module.load_state_dict(state)
    for name, tensor in result.policy.module.state_dict().items():
        assert torch.equal(policy.module.state_dict()[name], tensor), name


def test_export_refuses_a_taken_folder_and_a_non_run(tmp_path, capsys):
    result = rlvr.train(None, ["algo.epochs=1", "algo.inner_steps=1", *QUIET], out_dir=tmp_path / "run")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    assert main(["export", str(result.run_dir), "--out", str(taken)]) == 2
    assert "already exists and is not an empty folder" in capsys.readouterr().err
    assert (taken / "keep.txt").read_text() == "mine"
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "not a run directory" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "y"), "--checkpoint", "step-9"]) == 2
    assert "--checkpoint step-9: not in" in capsys.readouterr().err and not (tmp_path / "y").exists()
