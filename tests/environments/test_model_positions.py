"""An episode's budget against the model: task.options.max_tokens and each episode's prompt
must fit the model's positions, refused in one line before any work; episodes near the
limit never run past it (a GPT-2's position table has no row past it)."""

import pytest

from rlvr.cli import main

pytest.importorskip("transformers")


def model(tmp_path, arch, positions):
    from rlvr.modeling import init_model

    return init_model(tmp_path / f"{arch}-{positions}", arch=arch, hidden_size=32, intermediate_size=64,
                      num_layers=2, num_heads=2, max_positions=positions, seed=0)


def guessing(path, *more):
    return ["train", "task.name=environment", "task.options.environment=guessing", "task.options.eval_size=2",
            "task.options.max_turns=20", "task.prompts_per_epoch=4", "policy.name=causal_lm",
            f"policy.options.model={path}", "algo.group_size=4", "algo.epochs=2", "algo.inner_steps=1",
            "log.eval_samples=1", "log.eval_every=100", "log.eval_at_start=false", "log.progress=false",
            "log.plot=false", *more]


@pytest.mark.parametrize(("arch", "positions", "more", "message"), [
    ("gpt2", 64, ["policy.options.max_new_tokens=8"],  # task.options.max_tokens: 256 by default
     "task.options.max_tokens=256: an episode's prompt and its 256 tokens after it must fit the model's 64 "
     "positions; lower task.options.max_tokens below 64"),
    ("llama", 256, [], "task.options.max_tokens=256: an episode's prompt and its 256 tokens after it must fit the "
                       "model's 256 positions"),
    ("llama", 64, ["policy.options.max_new_tokens=8", "task.options.max_tokens=60"],
     "episode prompt of start 0 ('1-32>'): 5 tokens + max_tokens 60 = 65 > 64, the model's positions; shorten the "
     "prompt or lower task.options.max_tokens"),
])
def test_a_budget_past_the_models_positions_is_refused_before_a_run_directory(tmp_path, monkeypatch, capsys, arch,
                                                                               positions, more, message):
    path = model(tmp_path, arch, positions)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()  # what writing the model printed
    assert main(guessing(path, "out_dir=run", *more)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rlvr: error: {message}") and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_episodes_near_a_gpt2s_positions_run_within_them(tmp_path):
    """Turns of 40 tokens in episodes of 56 after a 5-token prompt, 64 positions: a batch's
    episode with little room left would have drawn past them with the roomiest one's 40."""
    path = model(tmp_path, "gpt2", 64)
    for seed in (0, 1):
        out = tmp_path / f"run{seed}"
        assert main(guessing(path, f"out_dir={out}", "policy.options.max_new_tokens=40",
                             "task.options.max_tokens=56", f"seed={seed}")) == 0


def test_turn_calls_keep_every_row_within_the_positions():
    from rlvr.environments.episodes import turn_calls

    # prefixes of 6, 50 and 30 tokens with 50, 6 and 26 tokens of room, 56 positions, turns of 40 at most
    calls = turn_calls([6, 50, 30], [50, 6, 26], 40, 56)
    assert calls == [([0], 40), ([2], 26), ([1], 6)]
    for rows, max_new in calls:
        assert all([6, 50, 30][i] + max_new <= 56 for i in rows)
    assert turn_calls([6, 50, 30], [50, 6, 26], 40, None) == [([0, 1, 2], 40)]  # no positions stated: one call
