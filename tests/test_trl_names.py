"""TRL's names in a config are refused with rlvr's; algo.preset; the causal-LM defaults."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from rlvr import presets
from rlvr.config import ConfigError, load_config
from rlvr.trl_names import TRL_NAMES, markdown_table, trl_hint

DOCS = Path(__file__).resolve().parents[1] / "docs" / "trl.md"
LM = ["task.name=sort_text", "policy.name=causal_lm", "policy.options.model=m"]


@pytest.mark.parametrize("override, message", [
    ("num_generations=8", "unknown key 'num_generations'; 'num_generations' is TRL's name; rlvr calls this "
                          "algo.group_size"),
    ("algo.beta=0.04", "unknown key 'algo.beta'; 'beta' is TRL's name; rlvr calls this algo.kl_coef"),
    ("optim.learning_rate=1e-6", "rlvr calls this optim.lr"),
    ("loss_type=dr_grpo", "rlvr calls this algo.preset"),
    ("report_to=wandb", "rlvr calls this log.tracker"),
    ("max_prompt_length=512", "'max_prompt_length' is TRL's name; rlvr has no equivalent: prompts are never "
                              "truncated"),
])
def test_a_trl_name_is_refused_with_the_rlvr_name(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value)


def test_the_names_the_brief_lists_all_have_an_entry():
    listed = ["num_generations", "beta", "epsilon", "epsilon_high", "loss_type", "scale_rewards", "num_iterations",
              "max_completion_length", "learning_rate", "report_to", "per_device_train_batch_size", "temperature",
              "max_prompt_length", "num_train_epochs", "gradient_accumulation_steps", "max_grad_norm",
              "warmup_steps", "lr_scheduler_type", "seed", "output_dir"]
    assert set(listed) <= set(TRL_NAMES)


def test_every_rlvr_name_in_the_table_exists():
    """Each target is a field of the config (a policy option for policy.options.*), so no
    hint sends a user to a name that is refused in turn."""
    from rlvr.config import POLICY_OPTIONS, Config

    config = Config().to_dict()
    for trl, entry in TRL_NAMES.items():
        if entry.rlvr is None or entry.rlvr.startswith("resume="):
            continue
        path = entry.rlvr.split("=")[0].split(".")
        if path[:2] == ["policy", "options"] and len(path) > 2:
            assert path[2] in POLICY_OPTIONS["causal_lm"], trl
            continue
        node = config
        for part in path:
            assert isinstance(node, dict) and part in node, f"{trl} -> {entry.rlvr}"
            node = node[part]


def test_a_name_that_is_not_trls_keeps_the_did_you_mean():
    assert trl_hint("group_sise") is None
    with pytest.raises(ConfigError, match="did you mean 'group_size'"):
        load_config(None, ["algo.group_sise=3"])


def test_the_docs_table_is_the_code_table():
    text = DOCS.read_text()
    assert markdown_table() in text
    assert presets.markdown_table() in text
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == len(TRL_NAMES) + len(presets.ALGO_PRESETS)  # no hand-written row beside them


def test_a_preset_sets_its_fields_and_given_fields_win():
    dapo = load_config(None, ["algo.preset=dapo"]).algo
    assert (dapo.deltas, dapo.loss, dapo.aggregation, dapo.clip_eps, dapo.clip_eps_high, dapo.kl_coef) == (
        "normalized", "clipped", "token_mean", 0.2, 0.28, 0.0)
    mine = load_config(None, ["algo.preset=dapo", "algo.clip_eps_high=0.3", "algo.deltas=centered"]).algo
    assert (mine.clip_eps_high, mine.deltas, mine.aggregation) == (0.3, "centered", "token_mean")
    assert load_config(None, ["algo.preset=grpo"]).algo.kl_coef == 0.04
    assert load_config(None, ["algo.preset=rloo"]).algo.deltas == "leave_one_out"
    assert load_config(None, ["algo.preset=dr_grpo"]).algo.aggregation == "seq_mean_token_sum"


def test_the_lecture_preset_is_the_defaults():
    assert load_config(None, ["algo.preset=lecture"]).algo == dataclasses.replace(load_config().algo, preset="lecture")


def test_a_preset_config_round_trips_through_yaml(tmp_path):
    config = load_config(None, ["algo.preset=dr_grpo", "algo.clip_eps=0.1"])
    path = tmp_path / "c.yaml"
    path.write_text(config.to_yaml())
    assert load_config(path) == config


def test_an_unknown_preset_is_named():
    with pytest.raises(ConfigError, match="algo.preset='grpoo' is not allowed; choose one of: lecture, grpo"):
        load_config(None, ["algo.preset=grpoo"])


def test_causal_lm_runs_take_lm_defaults_unless_given(tmp_path):
    lm = load_config(None, LM)
    assert (lm.optim.lr, lm.optim.max_grad_norm, lm.algo.inner_steps) == (1e-5, 1.0, 2)
    given = load_config(None, [*LM, "optim.lr=1e-3", "algo.inner_steps=4", "optim.max_grad_norm=null"])
    assert (given.optim.lr, given.optim.max_grad_norm, given.algo.inner_steps) == (1e-3, None, 4)
    toy = load_config()
    assert (toy.optim.lr, toy.optim.max_grad_norm, toy.algo.inner_steps) == (1e-3, None, 10)  # the lecture's
    path = tmp_path / "lm.yaml"
    path.write_text(yaml.safe_dump({"policy": {"name": "causal_lm", "options": {"model": "m"}},
                                    "task": {"name": "sort_text"}, "optim": {"lr": 2e-4}}))
    from_file = load_config(path)
    assert (from_file.optim.lr, from_file.algo.inner_steps) == (2e-4, 2)  # the file's lr, the LM's inner steps
