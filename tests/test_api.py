"""The Python API (``rlvr.train``, ``rlvr.check``) and the friendlier command line."""

import subprocess
import sys

import pytest
import torch
import yaml

import rlvr
import rlvr.loop.trainer
from rlvr.cli import main
from rlvr.config import ConfigError
from rlvr.runs.metrics import read_records, without_timings

SMALL = {"algo": {"epochs": 2, "inner_steps": 2}, "log": {"progress": False, "plot": False}}


def test_rlvr_train_is_the_api_and_the_loop_stays_in_the_trainer():
    import rlvr.api

    assert rlvr.train is rlvr.api.train and rlvr.loop.trainer.train is not rlvr.train
    assert rlvr.TrainResult is rlvr.api.TrainResult


def test_a_dict_a_yaml_path_and_a_config_train_the_same(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    from_dict = rlvr.train(SMALL)
    from_path = rlvr.train(path)
    from_config = rlvr.train(rlvr.load_config(path))
    assert from_dict.run_dir is None and from_dict.config.algo.epochs == 2
    train = [r for r in from_dict.records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [0, 1, 2, 3]  # 2 epochs x 2 inner steps
    assert without_timings(from_path.records) == without_timings(from_dict.records)
    assert without_timings(from_config.records) == without_timings(from_dict.records)
    for name, tensor in from_dict.policy.module.state_dict().items():
        assert torch.equal(from_path.policy.module.state_dict()[name], tensor), name


def test_overrides_apply_on_top_and_a_config_passed_in_is_not_changed():
    config = rlvr.load_config(None, ["algo.epochs=1", "algo.inner_steps=1", "log.progress=false"])
    result = rlvr.train(config, ["algo.inner_steps=3"])
    assert result.config.algo.inner_steps == 3 and config.algo.inner_steps == 1
    assert len([r for r in result.records if r["kind"] == "train"]) == 3


def test_out_dir_writes_the_run_directory_the_cli_writes(tmp_path):
    args = ["algo.epochs=2", "algo.inner_steps=2", "log.progress=false", "log.plot=false", "seed=4"]
    result = rlvr.train(None, args, out_dir=tmp_path / "api")
    assert main(["train", *args, f"out_dir={tmp_path / 'cli'}"]) == 0
    assert result.run_dir == tmp_path / "api"
    assert sorted(p.name for p in result.run_dir.iterdir()) == sorted(p.name for p in (tmp_path / "cli").iterdir())
    assert without_timings(read_records(result.run_dir)) == without_timings(read_records(tmp_path / "cli"))
    assert without_timings(result.records) == without_timings(read_records(tmp_path / "cli"))
    # the policy returned is the trained one: the same weights as the same run in memory
    in_memory = rlvr.train(None, args)
    for name, tensor in in_memory.policy.module.state_dict().items():
        assert torch.equal(result.policy.module.state_dict()[name], tensor), name


def test_config_out_dir_also_makes_a_run_directory(tmp_path):
    result = rlvr.train({**SMALL, "out_dir": str(tmp_path / "run")})
    assert result.run_dir == tmp_path / "run" and (result.run_dir / "metrics.jsonl").is_file()


def constant_one(completions, **kwargs):
    return [1.0] * len(completions)


def test_reward_funcs_are_callables_added_to_the_task_rewards():
    """Same seed, same samples: each response's reward is the task's plus exactly 1.

    Needs ``rewards.functions`` to take callables (rlvr.rewards.loading and the config's
    check of that list)."""
    base = rlvr.train(SMALL)
    plus = rlvr.train(SMALL, reward_funcs=[constant_one])
    assert plus.config.rewards.functions == [constant_one]
    first = [r for r in base.records if r["kind"] == "train"][0]
    first_plus = [r for r in plus.records if r["kind"] == "train"][0]
    assert first_plus["reward_mean"] == pytest.approx(first["reward_mean"] + 1.0, abs=1e-12)
    assert first_plus["reward/constant_one/mean"] == 1.0


def test_a_run_directory_names_a_callable_reward_by_module_and_name(tmp_path):
    """config.yaml holds no Python object: the function is written as 'module:name'."""
    result = rlvr.train(SMALL, reward_funcs=[constant_one], out_dir=tmp_path / "run")
    written = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    assert written["rewards"]["functions"] == ["test_api:constant_one"]


@pytest.mark.parametrize("call, message", [
    (lambda: rlvr.train(42), "config: expected a Config, a mapping or a YAML path, got int"),
    (lambda: rlvr.train("missing.yaml"), "config file not found: missing.yaml"),
    (lambda: rlvr.train(None, "algo.epochs=1"), "overrides: expected a list of 'key=value' strings"),
    (lambda: rlvr.train(None, reward_funcs=constant_one), "reward_funcs: expected a list of functions"),
    (lambda: rlvr.train(None, reward_funcs=["m:f"]), "reward_funcs[0]='m:f' is not callable"),
    (lambda: rlvr.train({"algo": {"num_generations": 4}}), "rlvr calls this algo.group_size"),
])
def test_bad_arguments_are_one_line_errors(call, message):
    with pytest.raises(ConfigError) as err:
        call()
    assert message in str(err.value)


# ---------------------------------------------------------------- the command line

LM = ["task.name=sort_text", "policy.name=causal_lm"]


@pytest.mark.parametrize("items, message", [
    ([*LM, "policy.options={model: x, engine: foo}"], "policy.options.engine='foo' is not allowed"),
    ([*LM, "policy.options={model: x, max_new_tokens: 0}"], "policy.options.max_new_tokens=0 must be >= 1"),
    ([*LM, "policy.options={model: x, dtype: float8}"], "policy.options.dtype='float8' is not allowed"),
    ([*LM, "policy.options={model: x, device: gpu0}"], "policy.options.device='gpu0' is not a torch device"),
    ([*LM, "policy.options={model: x, engine: vllm, engine_options: {dtype: float64}}"],
     "engine_options.dtype='float64' is not allowed"),
    ([*LM, "task.options={num_digits: 0}"], "task.options.num_digits=0 must be >= 1"),
    (["rewards.functions=['no_such_module_here:f']"], "rewards.functions[0]: reward function"),
])
def test_config_command_refuses_what_train_refuses(capsys, items, message):
    """Without loading the model ('x' does not exist): the checks ``train`` makes first."""
    assert main(["config", *items]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlvr: error: ") and message in err and err.count("\n") == 1


def test_a_sorting_setting_given_for_a_text_task_is_a_warning():
    with pytest.warns(UserWarning, match="task.reward='position_match' is ignored: it is for task.name='sorting' only"):
        rlvr.load_config(None, [*LM, "task.reward=position_match"])
    with pytest.warns(UserWarning, match="policy.embedding_dim=12 is ignored"):
        rlvr.load_config(None, [*LM, "policy.embedding_dim=12"])


@pytest.mark.skipif(any(m in sys.modules for m in ("wandb",)), reason="wandb is imported")
def test_a_missing_tracker_package_is_one_line_before_any_run_directory(tmp_path, capsys):
    import importlib.util

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed")
    out = tmp_path / "run"
    assert main(["train", f"out_dir={out}", "log.tracker=wandb"]) == 2
    assert capsys.readouterr().err == ("rlvr: error: log.tracker='wandb': the wandb package is not installed: "
                                       "pip install 'rlvr[wandb]'\n")
    assert not out.exists()


@pytest.mark.parametrize("command", ["train", "compare", "sft", "init-model", "config", "plot", "export"])
def test_each_command_help_shows_its_options_and_an_example(capsys, command):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert f"usage: rlvr {command}" in out and "options:" in out
    assert "\nexample:\n  rlvr " in out or "\nexamples:\n  rlvr " in out


def test_python_dash_m_rlvr_runs_the_command_and_warnings_are_one_line():
    proc = subprocess.run([sys.executable, "-m", "rlvr", "config", "algo.preset=dapo", *LM, "policy.options.model=x",
                           "task.reward=position_match"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "  aggregation: token_mean" in proc.stdout and "  clip_eps_high: 0.28" in proc.stdout
    assert proc.stderr == ("rlvr: warning: task.reward='position_match' is ignored: it is for task.name='sorting' "
                           "only, not 'sort_text'\n")


def test_the_readme_python_api_example_runs(tiny_model, tmp_path, capsys):
    """The Python API page's example as written, on the tiny model, cut to one short epoch."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "how-to" / "python-api.md").read_text()
    block = re.findall(r"```python\n(.*?)```", page, flags=re.S)[0]
    short = ('"algo": {"preset": "grpo", "epochs": 1, "group_size": 2}, "task": {"name": "sort_text", '
             '"prompts_per_epoch": 2, "options": {"num_digits": 3, "num_eval": 2}}, '
             '"log": {"progress": False, "plot": False, "eval_samples": 1}')
    for old, new in [("MODEL_DIR_OR_HUB_NAME", str(tiny_model)), ("runs/mine", str(tmp_path / "mine")),
                     ('"algo": {"preset": "grpo"}', short), ('{"task": {"name": "sort_text"},', "{")]:
        assert old in block
        block = block.replace(old, new)
    scope: dict = {}
    exec(block, scope)  # the project's own documentation
    result = scope["result"]
    assert result.run_dir == tmp_path / "mine" and result.config.algo.loss == "clipped"
    assert "reward/short/mean" in [r for r in result.records if r["kind"] == "train"][0]
