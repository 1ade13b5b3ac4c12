"""The Tinker server's parts without the SDK: loss configs and refusals, the per-datum sums over padded batches, the
adapters, the memory check, checkpoint paths and the state folder, the tokenizer placed in the hub cache, and the
command's refusal without the ``tinker`` extra."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import rlvr_cli
from rlvr import core
from rlvr.tinker import losses
from rlvr.tinker.losses import LossError, datum_loss, loss_config
from rlvr.tinker.store import CheckpointPath, Store, StoreError

pytest.importorskip("transformers")
pytest.importorskip("peft")


# ---- losses -------------------------------------------------------------------------------------------------------


def test_loss_configs_take_defaults_and_refuse_what_a_loss_does_not_read():
    assert loss_config("ppo", None) == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert loss_config("dro", {"beta": 0.3}) == {"beta": 0.3}
    with pytest.raises(LossError, match="key\\(s\\) beta not read by loss_fn 'ppo'"):
        loss_config("ppo", {"beta": 0.1})
    with pytest.raises(LossError, match="must be numbers"):
        loss_config("dro", {"beta": "much"})
    with pytest.raises(LossError, match="'gspo' is not supported.*supported: cross_entropy"):
        loss_config("gspo", None)
    with pytest.raises(LossError, match="unknown loss_fn 'nll'"):
        loss_config("nll", None)


def test_ppo_thresholds_must_bracket_one():
    lp = torch.zeros(1, 2)
    inputs = {"advantages": torch.ones(1, 2), "logprobs": torch.zeros(1, 2)}
    with pytest.raises(LossError, match="clip_low_threshold <= 1 <= clip_high_threshold"):
        datum_loss("ppo", lp, inputs, torch.ones(1, 2, dtype=torch.bool),
                   {"clip_low_threshold": 1.2, "clip_high_threshold": 0.8})


@pytest.mark.parametrize("name", list(losses.LOSSES))
def test_a_padded_batch_sums_each_datum_as_it_would_alone(name):
    """Right-padding a shorter datum changes none of its sum: each datum's loss is its own positions' alone."""
    g = torch.Generator().manual_seed(0)
    lengths = (5, 3)
    alone, rows = [], []
    for n in lengths:
        lp = -torch.rand(1, n, generator=g) * 3
        inputs = {"weights": torch.rand(1, n, generator=g), "advantages": torch.randn(1, n, generator=g),
                  "logprobs": lp - 0.3 * torch.randn(1, n, generator=g)}
        config = loss_config(name, None)
        alone.append(datum_loss(name, lp, inputs, torch.ones(1, n, dtype=torch.bool), config))
        rows.append((lp, inputs))
    width = max(lengths)
    pad = {key: torch.stack([torch.nn.functional.pad(inputs[key][0], (0, width - n), value=7.0)
                             for (_, inputs), n in zip(rows, lengths)]) for key in rows[0][1]}
    lp = torch.stack([torch.nn.functional.pad(lp[0], (0, width - n), value=-9.0) for (lp, _), n in zip(rows, lengths)])
    mask = torch.arange(width)[None] < torch.tensor(lengths)[:, None]
    together = datum_loss(name, lp, pad, mask, loss_config(name, None))
    torch.testing.assert_close(together, torch.cat(alone), rtol=1e-6, atol=1e-6)


def test_cross_entropy_is_the_weighted_negative_log_likelihood_and_ratio_is_one_at_the_sampler():
    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    w = torch.tensor([[0.0, 1.0, 2.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    ce = datum_loss("cross_entropy", lp, {"weights": w}, mask, {})
    assert float(ce.detach()) == pytest.approx(2.0 + 1.0)
    a = torch.tensor([[0.5, -1.0, 2.0]])
    is_loss = datum_loss("importance_sampling", lp, {"advantages": a, "logprobs": lp.detach()}, mask, {})
    assert float(is_loss.detach()) == pytest.approx(-float(a.sum()))  # ratio 1: -sum A
    (grad,) = torch.autograd.grad(is_loss, lp)
    torch.testing.assert_close(grad, -a)  # at the sampler, the gradient of -A * p/q is -A (the policy gradient)
    per_token = core.policy_loss(lp, a, "ratio", lp.detach())[0]
    assert float(per_token.detach().sum()) == pytest.approx(float(is_loss.detach()))


# ---- models -------------------------------------------------------------------------------------------------------


def test_adapters_refuse_a_negative_rank_and_training_nothing():
    from rlvr.tinker.models import Adapters, ModelError

    with pytest.raises(ModelError, match="integer >= 0"):
        Adapters(rank=-1)
    with pytest.raises(ModelError, match="trains nothing"):
        Adapters(rank=4, train_mlp=False, train_attn=False, train_unembed=False)


def test_a_model_that_does_not_fit_in_memory_is_refused_before_it_loads(tiny_model, monkeypatch):
    from rlvr.tinker import service
    from rlvr.tinker.models import Adapters, ModelError
    from rlvr.tinker.names import served_model

    model = served_model(str(tiny_model))
    monkeypatch.setattr(service, "available_memory", lambda device: 1 << 20)
    with pytest.raises(ModelError, match="full fine-tuning\\) needs about .* GiB; 0.0 GiB is free"):
        service.check_memory(model, Adapters(rank=0), "cpu", live=2)
    monkeypatch.setattr(service, "available_memory", lambda device: 1 << 40)
    service.check_memory(model, Adapters(rank=0), "cpu", live=0)
    assert service.count_parameters(str(tiny_model)) == sum(
        p.numel() for p in __import__("transformers").AutoModelForCausalLM.from_pretrained(tiny_model).parameters())


def test_forward_in_several_passes_equals_one_pass_and_checkpoints_round_trip(tiny_model, tmp_path):
    from rlvr.tinker import models
    from rlvr.tinker.models import AdamStep, Adapters, Datum, ModelError, TrainingModel

    g = torch.Generator().manual_seed(1)
    datums = []
    for n in (7, 4, 9, 5):
        datums.append(Datum(torch.randint(3, 20, (n,), generator=g),
                            {"target_tokens": torch.randint(3, 20, (n,), generator=g), "weights": torch.rand(n)}))
    model = TrainingModel("tiny", str(tiny_model), Adapters(rank=4), seed=0)
    whole, metrics = model.forward(datums, "cross_entropy", None, backward=False)
    model.tokens_per_pass = 10
    assert len(models.passes(datums, 10)) > 1
    split, split_metrics = model.forward(datums, "cross_entropy", None, backward=False)
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert split_metrics["loss:sum"] == pytest.approx(metrics["loss:sum"], rel=1e-6)

    model.forward(datums, "cross_entropy", None, backward=True)
    assert model.optim_step(AdamStep(learning_rate=1e-2))["grad_norm:mean"] > 0
    model.save(tmp_path / "ckpt", with_optimizer=True)
    copy = TrainingModel("tiny", str(tiny_model), Adapters(rank=4), seed=5)
    copy.load(tmp_path / "ckpt", with_optimizer=True)
    assert all(torch.equal(a, b) for a, b in zip(model.trainable_state().values(), copy.trainable_state().values()))
    other = TrainingModel("tiny", str(tiny_model), Adapters(rank=2), seed=0)
    with pytest.raises(ModelError, match="checkpoint ckpt is of tiny with .*'rank': 4"):
        other.load(tmp_path / "ckpt", with_optimizer=False)
    (tmp_path / "ckpt" / "model.json").write_text("{not json")
    with pytest.raises(ModelError, match="damaged or not a checkpoint"):
        copy.load(tmp_path / "ckpt", with_optimizer=False)


# ---- the state folder -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path, why", [
    ("/etc/passwd", "not a tinker:// path"),
    ("tinker://run/weights", "is not tinker://<run id>/weights/<name>"),
    ("tinker://run/other/x", "is not tinker://<run id>/weights/<name>"),
    ("tinker://run/weights/..", "not a valid name"),
    ("tinker://../weights/x", "not a valid name"),
    ("tinker://run/weights/a b", "not a valid name"),
])
def test_checkpoint_paths_are_checked_before_they_touch_a_folder(path, why):
    with pytest.raises(StoreError, match=why):
        CheckpointPath.parse(path)


def test_the_store_lists_refuses_to_overwrite_and_deletes(tmp_path):
    store = Store(tmp_path)
    store.write_run("s1:train:0", {"base_model": "m", "adapters": {"rank": 4}, "seed": 0})
    path = CheckpointPath("s1:train:0", "weights", "first")
    partial = store.partial(path)
    (partial / "model.json").write_text(json.dumps({"base": "m", "adapters": {"rank": 4}}))
    store.publish(partial, path, overwrite=False)
    assert [c["tinker_path"] for c in store.checkpoints("s1:train:0")] == [str(path)]
    again = store.partial(path)
    with pytest.raises(StoreError, match="exists"):
        store.publish(again, path, overwrite=False)
    assert not again.exists()  # nothing half-written left behind
    store.delete(path)
    assert store.checkpoints("s1:train:0") == []
    with pytest.raises(StoreError, match="no checkpoint tinker://s1:train:0/weights/first"):
        store.existing(path)
    (tmp_path / "runs" / "s1:train:0" / "run.json").write_text("[]")
    with pytest.raises(StoreError, match="run.json is damaged"):
        store.read_run("s1:train:0")


def test_the_tokenizer_goes_into_the_hub_cache_once(tiny_model, tmp_path):
    from rlvr.tinker.names import ServedModel, place_tokenizer

    hub = "HuggingFaceTB/SmolLM2-135M-Instruct"
    model = ServedModel(hub, (hub,), str(tiny_model), hub)
    snapshot = place_tokenizer(model, str(tmp_path))
    assert snapshot is not None and (snapshot / "tokenizer.json").is_file()
    assert not (snapshot / "model.safetensors").exists()  # the tokenizer and config, never the weights
    ref = tmp_path / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "refs" / "main"
    assert ref.read_text() == snapshot.name
    assert place_tokenizer(model, str(tmp_path)) is None  # there already: left as it is
    local = ServedModel(str(tiny_model), (str(tiny_model),), str(tiny_model), str(tiny_model))
    assert place_tokenizer(local, str(tmp_path)) is None  # a folder's tokenizer loads from the folder


def test_rlvr_tinker_without_the_sdk_names_the_extra(tmp_path):
    done = rlvr_cli(["tinker", "--port", "0"], tmp_path, blocked=("tinker",))
    assert done.returncode == 2
    assert "rlvr tinker: the tinker package is not installed: pip install 'rlvr[tinker]'" in done.stderr
