import pytest
import yaml

from rlvr.config import Config, ConfigError, config_from_dict, load_config, parse_overrides


def test_defaults_are_the_lecture_experiment():
    c = load_config()
    assert c.task.prompts == [[1, 0, 2], [3, 2, 4], [1, 2, 3]]
    assert (c.algo.group_size, c.algo.epochs, c.algo.inner_steps) == (10, 100, 10)
    assert c.policy.embedding_dim == 10 and c.optim.name == "adam" and c.optim.lr == 1e-3
    assert c.task.reward == "inclusion_ordering" and c.algo.kl_coef == 0


def test_yaml_round_trip_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"algo": {"group_size": 16, "loss": "clipped"}, "optim": {"lr": 0.01}}))
    c = load_config(path, ["algo.group_size=32", "task.prompts=null", "policy.temperature=2"])
    assert c.algo.group_size == 32 and c.algo.loss == "clipped" and c.optim.lr == 0.01
    assert c.task.prompts is None and c.policy.temperature == 2.0
    again = config_from_dict(yaml.safe_load(c.to_yaml()))
    assert again == c


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.deltas=bogus"], "algo.deltas='bogus' is not allowed; choose one of: raw, centered"),
        (["algo.lossx=naive"], "did you mean 'loss'"),
        (["algo.group_size=1"], "algo.group_size=1 with algo.deltas='centered'"),
        (["optim.lr=-0.1"], "optim.lr=-0.1 must be > 0"),
        (["optim.lr=fast"], "optim.lr: expected float, got 'fast'"),
        (["task.name=chess"], "task.name='chess' is not allowed"),
        (["optim.micro_batches=7"], "does not divide the 30 responses"),
        (["algo.clip_eps=1.5"], "algo.clip_eps=1.5 must be < 1"),
        (["algox.lr=1"], "unknown key 'algox'; did you mean 'algo'"),
        (["algo.epochs"], "is not key=value"),
        (["optim.lr=1e999"], "optim.lr=inf must be a finite number"),  # a string to YAML 1.1, inf to float()
        (["optim.lr=1" + "0" * 400], "optim.lr=1000"),  # an int past the float range
    ],
)
def test_invalid_configs_name_the_field(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value)


def test_group_of_one_is_fine_without_a_baseline():
    assert load_config(None, ["algo.group_size=1", "algo.deltas=raw"]).algo.group_size == 1


def test_clipped_loss_with_one_inner_step_warns():
    with pytest.warns(UserWarning, match="ratio pi/pi_old is always 1"):
        load_config(None, ["algo.loss=clipped", "algo.inner_steps=1"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_parse_overrides_nests_and_parses_yaml_values():
    assert parse_overrides(["a.b=1", "a.c=[1, 2]", "d=x"]) == {"a": {"b": 1, "c": [1, 2]}, "d": "x"}


def test_run_dir_default():
    assert str(Config().run_dir) == "runs/lecture"


def test_every_example_config_validates():
    from pathlib import Path

    examples = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))
    assert len(examples) >= 4
    for path in examples:
        load_config(path)


def test_commented_yaml_documents_every_field_and_round_trips(tmp_path, capsys):
    from rlvr.cli import main

    assert main(["config", "algo.group_size=64", "task.prompts=null"]) == 0
    text = capsys.readouterr().out
    assert "group_size: 64  # G: responses sampled per prompt" in text
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert load_config(path) == load_config(None, ["algo.group_size=64", "task.prompts=null"])
