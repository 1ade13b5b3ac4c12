"""``rlvr export RUN_DIR --out DIR``: the trained model as a folder plain transformers loads."""

import pytest
import torch

import rlvr
from rlvr.cli import main
from rlvr.config.compose import build_policy

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


def test_export_writes_through_a_temporary_folder_of_its_own(tmp_path, capsys):
    result = rlvr.train(None, ["algo.epochs=1", "algo.inner_steps=1", *QUIET], out_dir=tmp_path / "run")
    theirs = tmp_path / ".tmp-mine"  # a name the old export took for its own and deleted
    theirs.mkdir()
    (theirs / "keep.txt").write_text("theirs")
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "mine")]) == 0
    assert (theirs / "keep.txt").read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-mine", "mine", "run"]  # nothing left behind
    checkpoints = sorted((result.run_dir / "checkpoints").iterdir())
    for inside in (result.run_dir / "checkpoints" / "step-999999999", result.run_dir / "model"):
        assert main(["export", str(result.run_dir), "--out", str(inside)]) == 2
        assert f"--out {inside}: inside the run directory" in capsys.readouterr().err and not inside.exists()
    assert sorted((result.run_dir / "checkpoints").iterdir()) == checkpoints


def test_lora_export_merges_into_the_base_model_the_run_loaded(tmp_path, monkeypatch, capsys):
    pytest.importorskip("peft")
    import shutil

    from transformers import AutoModelForCausalLM

    from rlvr.modeling import init_model

    for folder, seed in (("trained", 0), ("elsewhere", 1)):  # two different models, both named "model" relatively
        init_model(tmp_path / folder / "model", hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                   seed=seed)
    monkeypatch.chdir(tmp_path / "trained")
    result = lm_run("model", tmp_path / "run", ", lora: {r: 4, lora_alpha: 8}")
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "merged")]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    torch.testing.assert_close(logits(model, IDS), logits(result.policy.module.eval(), IDS), rtol=1e-5, atol=1e-5)
    # the base moved, and another model took its place: refused, naming both; --base finds it where it is now
    shutil.move(tmp_path / "trained" / "model", tmp_path / "moved")
    shutil.copytree(tmp_path / "elsewhere" / "model", tmp_path / "trained" / "model")
    capsys.readouterr()
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "again")]) == 2
    error, = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert f"base model {tmp_path / 'trained' / 'model'} (sha256 " in error
    assert f"is not the one the run trained its adapters on, {tmp_path / 'trained' / 'model'} (sha256 " in error
    assert not (tmp_path / "again").exists()
    moved = ["--base", str(tmp_path / "moved")]
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "again"), *moved]) == 0
    torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(tmp_path / "again"), IDS),
                               logits(model, IDS), rtol=0, atol=0)


def test_export_copies_only_the_manifests_files_and_refuses_a_link(tiny_model, tmp_path, capsys):
    result = lm_run(tiny_model, tmp_path / "run")
    newest = sorted((result.run_dir / "checkpoints").iterdir())[-1]
    (newest / "model" / "notes.txt").write_text("not the manifest's")
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "model")]) == 0
    assert not (tmp_path / "model" / "notes.txt").exists()
    secret = tmp_path / "secret.txt"
    secret.write_text("outside the run")
    for checkpoint in (result.run_dir / "checkpoints").iterdir():
        (checkpoint / "model" / "leak.txt").symlink_to(secret)
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "linked")]) == 2
    assert "model/leak.txt is a symbolic link" in capsys.readouterr().err
    assert not (tmp_path / "linked").exists()


def test_export_says_which_checkpoint_it_took_when_the_newest_is_damaged(tmp_path):
    result = rlvr.train(None, ["algo.epochs=2", "algo.inner_steps=1", "log.checkpoint_every=1", *QUIET],
                        out_dir=tmp_path / "run")
    older, newest = sorted((result.run_dir / "checkpoints").iterdir())[-2:]
    (newest / "trainer.pt").unlink()
    with pytest.warns(UserWarning) as caught:
        assert main(["export", str(result.run_dir), "--out", str(tmp_path / "toy")]) == 0
    said = [str(w.message) for w in caught]
    assert f"skipping checkpoint {newest}: trainer.pt is missing" in said
    assert f"exporting {older.name}, the newest checkpoint that verifies" in said
