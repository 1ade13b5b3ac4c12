import dataclasses
import re
from pathlib import Path
from typing import get_type_hints

import pytest
import yaml

from rlvr.cli import main
from rlvr.config import BOUNDS, Config, ConfigError, config_from_dict, load_config, parse_overrides
from rlvr.core import DELTA_MODES


def test_defaults_are_the_lecture_experiment():
    c = load_config()
    assert dataclasses.asdict(c.task.options) == {
        "num_numbers": 3, "vocab_size": 5, "reward": "inclusion_ordering", "allow_repeats": False,
        "prompts": [[1, 0, 2], [3, 2, 4], [1, 2, 3]], "eval_size": 64, "eval_seed": 1234}
    assert (c.algo.group_size, c.algo.epochs, c.algo.inner_steps) == (10, 100, 10)
    assert c.policy.options.embedding_dim == 10 and c.optim.name == "adam" and c.optim.lr == 1e-3
    assert c.algo.kl_coef == 0


def test_overrides_beat_the_file_which_beats_the_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "algo": {"group_size": 16, "loss": "clipped"}, "optim": {"lr": "1e-2"},
    }))
    c = load_config(path, ["algo.group_size=32", "task.options.prompts=null", "policy.temperature=2"])
    assert c.algo.group_size == 32  # the override, not the file's 16
    assert c.algo.loss == "clipped" and c.optim.lr == 0.01  # the file's (YAML 1.1 reads 1e-2 as a string)
    assert c.algo.epochs == 100 and c.optim.name == "adam"  # untouched: the defaults
    assert c.task.options.prompts is None and c.policy.temperature == 2.0 and isinstance(c.policy.temperature, float)
    again = config_from_dict(yaml.safe_load(c.to_yaml()))
    assert again == c



def test_options_merge_as_their_types_say(tmp_path):
    """Typed option sections (task.options, policy.options) merge key by key; a mapping (a
    LoRA config: keyword arguments) merges one level deep, each value replaced whole."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "task": {"name": "sort_text", "options": {"num_digits": 4, "num_eval": 8}},
        "policy": {"name": "causal_lm", "options": {"model": "m", "max_new_tokens": 9, "lora": {"r": 8, "alpha": 16},
                                                    "engine": "vllm", "engine_options": {"max_num_seqs": 4}}},
    }))
    c = load_config(path, ["task.options={num_eval: 3}", "policy.options={top_k: 5}", "policy.options.lora.r=4",
                           "policy.options.engine_options.dtype=float32"])
    assert (c.task.options.num_digits, c.task.options.num_eval) == (4, 3)
    o = c.policy.options
    assert (o.model, o.max_new_tokens, o.top_k, o.lora) == ("m", 9, 5, {"r": 4, "alpha": 16})
    assert (o.engine_options.max_num_seqs, o.engine_options.dtype) == (4, "float32")
    assert config_from_dict(yaml.safe_load(c.to_yaml())) == c

@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.deltas=bogus"], "algo.deltas='bogus' is not allowed; choose one of: raw, centered"),
        (["algo.lossx=naive"], "did you mean 'algo.loss'"),
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

    assert main(["config", "algo.group_size=64", "task.options.prompts=null"]) == 0
    text = capsys.readouterr().out
    assert "group_size: 64  # G: responses sampled per prompt [> 0]" in text
    assert f"deltas: centered  # delta mode [{' | '.join(DELTA_MODES)}]" in text  # from the core's registry
    assert "num_numbers: 3  # numbers per prompt (n) [>= 2, <= 1024]" in text  # the task's option, documented
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert load_config(path) == load_config(None, ["algo.group_size=64", "task.options.prompts=null"])


def _declared_rules():
    """(path, value, message): a value just past each rule a field declares, in every section,
    and each rule of the default task's and policy's options."""
    from rlvr.config.sections import PositionalOptions
    from rlvr.tasks.sorting import SortingTask

    hints = get_type_hints(Config)
    top = [f for f in dataclasses.fields(Config) if not dataclasses.is_dataclass(hints[f.name])]
    sections = [(f"{f.name}.", dataclasses.fields(hints[f.name]))
                for f in dataclasses.fields(Config) if dataclasses.is_dataclass(hints[f.name])]
    sections.append(("policy.options.", dataclasses.fields(PositionalOptions)))
    declared = [(prefix + f.name, f.metadata) for prefix, section in [("", top), *sections] for f in section]
    declared += [(f"task.options.{key}", rules) for key, rules in SortingTask.options.items()]
    for path, metadata in declared:
        if "choices" in metadata:
            yield path, "bogus", f"{path}='bogus' is not allowed; choose one of: "
        for rule, (_, word) in BOUNDS.items():
            if rule in metadata:
                bound = metadata[rule]
                past = {"min": bound - 1, "max": bound + 1}.get(rule, bound)  # above, below: the bound itself
                yield path, past, f" must be {word} {bound}"


RULES = list(_declared_rules())


def test_rules_are_declared_on_the_fields():
    paths = {path for path, _, _ in RULES}
    assert len(RULES) >= 45 and {"algo.deltas", "algo.clip_eps", "optim.lr", "seed", "task.options.num_numbers",
                                 "policy.options.embedding_dim"} <= paths


@pytest.mark.parametrize("path, value, message", RULES, ids=[f"{p}={v}" for p, v, _ in RULES])
def test_every_declared_rule_is_enforced(path, value, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        load_config(None, [f"{path}={value}"])
    assert str(err.value).startswith(f"{path}=")


def test_sorting_only_rules_do_not_apply_to_text_tasks():
    with pytest.warns(UserWarning, match="task.num_numbers=1 is ignored: it is for task.name='sorting' only"):
        config = load_config(None, ["task.name=sort_text", "policy.name=causal_lm", "task.num_numbers=1"])
    assert not hasattr(config.task.options, "num_numbers")  # unused by text tasks: ignored (a warning)


@pytest.mark.parametrize(
    "options, message",
    [
        ("policy.options={model: x, modl: y}", "policy.options: unknown option 'modl'; did you mean 'model'?"),
        ("task.options={num_digit: 3}", "unknown option 'num_digit'; did you mean 'num_digits'?"),
    ],
)
def test_config_command_checks_task_and_policy_options(capsys, options, message):
    """Without loading a model or data: the model 'x' does not exist."""
    from rlvr.cli import main

    assert main(["config", "task.name=sort_text", "policy.name=causal_lm", options]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlvr: error: ") and message in err


@pytest.mark.parametrize("algo, uses_reference, kl_in_reward, needs_old_log_probs", [
    ({}, False, False, False),  # the lecture's: naive loss, no KL, no TIS
    ({"loss": "clipped"}, False, False, True),  # the ratio needs pi_old
    ({"tis_cap": 2.0}, False, False, True),  # TIS weights pi_old / pi_sampler
    ({"kl_coef": 0.1}, True, False, False),  # KL in the loss: the reference, no pi_old
    ({"kl_coef": 0.1, "kl_in": "reward"}, True, True, True),  # k1 = log pi_old - log ref
    ({"kl_coef": 0.0, "kl_in": "reward"}, False, False, False),  # no penalty: nothing in the reward
])
def test_algo_derived_facts(algo, uses_reference, kl_in_reward, needs_old_log_probs):
    a = config_from_dict({"algo": algo}).algo
    assert (a.uses_reference, a.kl_in_reward, a.needs_old_log_probs) == (
        uses_reference, kl_in_reward, needs_old_log_probs)


def test_config_checks_an_environment_factory_without_calling_it(tmp_path, monkeypatch, capsys):
    """``rlvr config`` names a factory's bad options from its signature and runs none of its code."""
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran"
    options = f"task.options={{environment_factory: 'os:system', environment_options: {{command: 'touch {marker}'}}}}"
    assert main(["config", "task.name=environment", "policy.name=causal_lm", options]) == 0
    assert not marker.exists()
    wrong = "task.options={environment_factory: 'os:system', environment_options: {cmd: x}}"
    assert main(["config", "task.name=environment", "policy.name=causal_lm", wrong]) == 2
    assert "environment_options: system does not take them" in capsys.readouterr().err
    assert not marker.exists()


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path, capsys):
    rows = ["task: {name: environment, options: {environment_options: {x: *g}}}", "policy: {name: causal_lm}"]
    levels = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for name, below in zip("bcdefg", "abcdef"):
        levels.append(f"{name}: &{name} [{', '.join([f'*{below}'] * 9)}]")
    path = tmp_path / "bomb.yaml"
    path.write_text("anchors:\n" + "\n".join(f"  {line}" for line in levels) + "\n" + "\n".join(rows) + "\n")
    assert main(["config", str(path)]) == 2
    assert f"{path}: not valid YAML (its aliases expand to more than 100000 values)" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["../../escaped", "/tmp/elsewhere", "a/../../b"])
def test_a_run_name_that_leaves_runs_is_refused(tmp_path, monkeypatch, capsys, name):
    monkeypatch.chdir(tmp_path)
    assert main(["train", f"name={name}", "algo.epochs=1"]) == 2
    assert f"name={name!r}: a run's name is a folder under runs/" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [] and not Path("/tmp/elsewhere").exists()


def test_rlvr_config_lists_the_tasks_options_with_their_defaults_and_reloads(tmp_path, capsys):
    args = ["task.name=environment", "policy.name=causal_lm", "task.options.max_turns=3"]
    assert main(["config", *args]) == 0
    printed = capsys.readouterr().out
    assert "    step_timeout: 30.0  # seconds one call into the environment" in printed
    assert "    max_turns: 3  # policy turns at most per episode" in printed
    (tmp_path / "printed.yaml").write_text(printed)
    again = load_config(tmp_path / "printed.yaml")
    assert again.task.options.max_turns == 3 and again.task.options.step_timeout == 30.0
    assert main(["config", str(tmp_path / "printed.yaml")]) == 0
