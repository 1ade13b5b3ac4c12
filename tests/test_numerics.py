"""Non-finite losses or gradients skip the step; too many in a row stop the run."""

import torch

from helpers import QUIET
from rlvr.cli import main
from rlvr.config import load_config
from rlvr.loop.trainer import setup, train
from rlvr.policies.positional import PositionalPolicy
from rlvr.runs.checkpoint import load_latest


def poison(monkeypatch, bad_calls):
    """Make the training steps' log-probs NaN on the given call numbers (0-based) of
    PositionalPolicy.log_probs (the naive loss scores nothing else)."""
    original = PositionalPolicy.log_probs
    calls = {"n": 0}

    def log_probs(self, samples, temperature=1.0, with_entropy=False):
        lp, ent = original(self, samples, temperature, with_entropy)
        calls["n"] += 1
        return (lp * float("nan") if calls["n"] - 1 in bad_calls else lp), ent

    monkeypatch.setattr(PositionalPolicy, "log_probs", log_probs)


def test_nan_step_is_skipped_and_weights_stay_finite(monkeypatch, caplog):
    poison(monkeypatch, bad_calls={3})  # the 4th inner step of epoch 0
    config = load_config(None, QUIET + ["algo.epochs=2"])
    task, st = setup(config)
    before = [p.detach().clone() for p in st.policy.module.parameters()]
    records = [r for r in train(config, state=(task, st)) if r["kind"] == "train"]
    assert [r["skipped_step"] for r in records[:5]] == [0.0, 0.0, 0.0, 1.0, 0.0]
    assert "non-finite loss" in caplog.text and "grad of" in caplog.text
    for p, b in zip(st.policy.module.parameters(), before):
        assert torch.isfinite(p).all() and not torch.equal(p, b)


def test_consecutive_nan_steps_stop_with_the_checkpoint_intact(monkeypatch, tmp_path, capsys):
    out = tmp_path / "run"
    # Epochs 0-1 are fine (20 steps) and checkpointed; from step 25 on every step is NaN.
    poison(monkeypatch, bad_calls=set(range(25, 10_000)))
    code = main(["train", f"out_dir={out}", "algo.epochs=10", "log.checkpoint_every=2", "optim.max_bad_steps=3",
                 *QUIET])
    assert code == 3
    assert "3 consecutive steps with non-finite values" in capsys.readouterr().err
    checkpoint, payload = load_latest(out)
    assert payload["epoch"] == 2
    assert all(torch.isfinite(v).all() for v in payload["policy"].values())
