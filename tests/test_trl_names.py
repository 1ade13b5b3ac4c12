"""TRL's names in a config are refused with rlvr's; algo.preset; the causal-LM defaults."""

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import yaml

from rlvr.config import ConfigError, load_config, presets
from rlvr.config.trl_names import TRL_NAMES, VERL_NAMES, foreign_hint, markdown_table

DOCS = Path(__file__).resolve().parents[1] / "docs" / "how-to" / "from-trl.md"
LM = ["task.name=sort_text", "policy.name=causal_lm", "policy.options.model=m"]


@pytest.mark.parametrize("override, message", [
    ("num_generations=8", "unknown key 'num_generations'; 'num_generations' is TRL's name; rlvr calls this "
                          "algo.group_size"),
    ("algo.beta=0.04", "unknown key 'algo.beta'; 'beta' is TRL's name; rlvr calls this algo.kl_coef"),
    ("optim.learning_rate=1e-6", "rlvr calls this optim.lr"),
    ("loss_type=dr_grpo", "unknown key 'loss_type'; 'loss_type' is TRL's name; use algo.preset=dr_grpo"),
    ("loss_type=sapo", "rlvr calls this algo.preset"),  # a value the table does not translate
    ("report_to=wandb", "'report_to' is TRL's name; use log.tracker=wandb"),
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


def _targets():
    """(foreign name, rlvr setting) of every entry and every value it translates."""
    for table in (TRL_NAMES, VERL_NAMES):
        for name, entry in table.items():
            if entry.rlvr is not None:
                yield name, entry.rlvr
            for target in entry.values.values():
                if not target.startswith("none"):
                    yield name, target.split(" ")[0]


def test_every_rlvr_name_in_the_tables_exists():
    """Each target is a setting of the config (an option of some policy or task for
    *.options.*), and a value it names is one the setting allows, so no hint sends a user
    to a name or value that is refused in turn."""
    from rlvr.config import CausalLMOptions, Config
    from rlvr.tasks import TASKS

    config = Config().to_dict()
    options = {"policy": {f.name for f in dataclasses.fields(CausalLMOptions)},
               "task": {o for cls in TASKS.values() for o in cls.options}}
    for foreign, target in _targets():
        if target.startswith("resume="):
            continue
        path, _, value = target.partition("=")
        parts = path.split(".")
        if parts[1:2] == ["options"] and len(parts) > 2:
            assert parts[2] in options[parts[0]], f"{foreign} -> {target}"
            continue
        section = getattr(Config(), parts[0]) if len(parts) == 2 else None
        node = config
        for part in parts:
            assert isinstance(node, dict) and part in node, f"{foreign} -> {target}"
            node = node[part]
        if value and section is not None:
            rules = next(f.metadata for f in dataclasses.fields(section) if f.name == parts[1])
            allowed = rules.get("choices") or (("true", "false") if isinstance(node, bool) else None)
            assert allowed is None or value in allowed, f"{foreign} -> {target}"


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.rollout.n=8", "unknown key 'actor_rollout_ref.rollout.n'; 'actor_rollout_ref.rollout.n' is "
                                      "verl's name; rlvr calls this algo.group_size"),
    ("data.train_batch_size=32", "rlvr calls this task.prompts_per_epoch"),
    ("actor_rollout_ref.actor.optim.lr=1e-6", "rlvr calls this optim.lr"),
    ("algorithm.kl_ctrl.kl_coef=0.001", "rlvr calls this algo.kl_coef"),
    ("actor_rollout_ref.actor.clip_ratio_low=0.2", "rlvr calls this algo.clip_eps"),
    ("actor_rollout_ref.actor.clip_ratio_high=0.28", "rlvr calls this algo.clip_eps_high"),
    ("data.max_response_length=512", "rlvr calls this policy.options.max_new_tokens"),
    ("trainer.total_epochs=15", "rlvr calls this algo.epochs"),
    ("algorithm.adv_estimator=grpo", "use algo.deltas=normalized (or algo.preset=grpo"),
    ("algorithm.adv_estimator=rloo", "use algo.deltas=leave_one_out"),
    ("actor_rollout_ref.actor.loss_agg_mode=token-mean", "use algo.aggregation=token_mean"),
    ("clip_ratio_high=0.28", "unknown key 'clip_ratio_high'; 'actor_rollout_ref.actor.clip_ratio_high' is verl's "
                             "name; rlvr calls this algo.clip_eps_high"),  # verl's by its last part alone
])
def test_a_verl_name_is_refused_with_the_rlvr_name(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value)


RS = "algorithm.rollout_correction.rollout_rs"


@pytest.mark.parametrize("value, method", [
    ("token_k1", "token_mis"), ("seq_sum_k1", "seq_mis"), ("seq_mean_k1", "geo_mask"),  # verl's names today
    ("token", "token_mis"), ("sequence", "seq_mis"), ("geometric", "geo_mask"),  # older verl's
])
def test_verl_s_rejection_options_old_and_new_name_rlvr_s_method(value, method):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"{RS}={value}"])
    assert str(err.value) == f"unknown key {RS!r}; {RS!r} is verl's name; use algo.is_correction={method}"


@pytest.mark.parametrize("value, settings", [
    ("0.8_1.5", "algo.is_low=0.666667 algo.is_high=1.25"),  # -log r in [log 0.8, log 1.5]: r in [1/1.5, 1/0.8]
    ("0.5_2.0", "algo.is_low=0.5 algo.is_high=2"),
    (2, "algo.is_high=2"),  # U alone: [1/U, U], as older verl's upper bound U with its default lower bound
    (1.5, "algo.is_high=1.5"),
])
def test_verl_s_rejection_threshold_is_the_ratio_bounds_inverted(value, settings):
    assert foreign_hint(f"{RS}_threshold", value) == f"'{RS}_threshold' is verl's name; use {settings}"


def test_verl_s_k1_rejection_keeps_what_the_translated_bounds_keep():
    """verl keeps log L <= k1 <= log U with k1 = -log r per token (token_k1), summed over the
    response (seq_sum_k1) or averaged (seq_mean_k1); the hinted method and bounds keep the same."""
    from rlvr.core import off_policy_correction

    lower, upper = 0.8, 1.5
    settings = foreign_hint(f"{RS}_threshold", f"{lower}_{upper}").split("use ")[1]
    bounds = {k.removeprefix("algo.is_"): float(v) for k, v in (part.split("=") for part in settings.split())}
    g = torch.Generator().manual_seed(0)
    log_ratio = 0.3 * torch.randn(64, 7, generator=g, dtype=torch.float64)
    mask = torch.rand(64, 7, generator=g) > 0.2
    k1 = -log_ratio
    stats = {"token_k1": k1, "seq_sum_k1": (k1 * mask).sum(-1, keepdim=True),
             "seq_mean_k1": (k1 * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)}
    for option, stat in stats.items():
        keep = ((stat >= math.log(lower)) & (stat <= math.log(upper))).expand_as(mask) & mask
        method = foreign_hint(RS, option).split("algo.is_correction=")[1]
        c = off_policy_correction(method, log_ratio, torch.zeros_like(log_ratio), mask, **bounds)
        assert keep.any() and (mask & ~keep).any(), option  # not vacuous: some kept, some dropped
        assert torch.equal(~c.masked & mask, keep), option
        load_config(None, [f"algo.is_correction={method}", *settings.split()])  # settings rlvr takes


@pytest.mark.parametrize("mode, settings", [
    ("sequence_mask", "algo.is_correction=seq_mask_is with algo.tis_cap=C (TRL's default, C = 3)"),
    ("sequence_truncate", "algo.is_correction=seq_tis with algo.tis_cap=C"),
    ("token_truncate", "algo.is_correction=token_tis with algo.tis_cap=C"),
    ("token_mask", "algo.is_correction=icepop with algo.is_high=C"),
])
def test_trl_s_importance_sampling_modes_name_rlvr_s_method(mode, settings):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"vllm_importance_sampling_mode={mode}"])
    assert f"'vllm_importance_sampling_mode' is TRL's name; use {settings}" in str(err.value)
    assert foreign_hint("vllm_importance_sampling_correction", True) == (
        "'vllm_importance_sampling_correction' is TRL's name; use algo.is_correction=seq_mask_is with "
        "algo.tis_cap=3 (TRL's default mode and cap)")
    assert "rlvr calls this algo.tis_cap" in foreign_hint("vllm_importance_sampling_clip_max", 3.0)


def test_a_verl_section_is_refused_setting_by_setting(tmp_path):
    path = tmp_path / "verl.yaml"
    path.write_text(yaml.safe_dump({
        "actor_rollout_ref": {"rollout": {"n": 8, "tensor_model_parallel_size": 2}, "actor": {"ppo_epochs": 1}},
        "algorithm": {"adv_estimator": "grpo"}}, sort_keys=False))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message.startswith("4 unknown keys: (1) unknown key 'actor_rollout_ref.rollout.n'; ")
    assert "(2) unknown key 'actor_rollout_ref.rollout.tensor_model_parallel_size'; a verl setting rlvr has no " \
           "equivalent of" in message
    assert "(3) unknown key 'actor_rollout_ref.actor.ppo_epochs'; 'actor_rollout_ref.actor.ppo_epochs' is verl's " \
           "name; rlvr calls this algo.inner_steps" in message
    assert "(4) unknown key 'algorithm.adv_estimator'; 'algorithm.adv_estimator' is verl's name; use " \
           "algo.deltas=normalized" in message
    assert "\n" not in message


def test_a_translated_value_is_the_setting_it_names():
    """scale_rewards=false is TRL's centered deltas; a value the table does not know gets the setting's name."""
    assert foreign_hint("scale_rewards", False) == "'scale_rewards' is TRL's name; use algo.deltas=centered"
    assert foreign_hint("scale_rewards", "group") == "'scale_rewards' is TRL's name; use algo.deltas=normalized"
    assert foreign_hint("loss_type", "sapo").startswith("'loss_type' is TRL's name; rlvr calls this algo.preset (")
    assert foreign_hint("algorithm.norm_adv_by_std_in_grpo", False) == (
        "'algorithm.norm_adv_by_std_in_grpo' is verl's name; use algo.deltas=centered (or algo.preset=dr_grpo)")
    assert foreign_hint("n", 8) is None  # verl's rollout.n and val_kwargs.n: its last part alone is not verl's name


def test_a_name_that_is_not_trls_keeps_the_did_you_mean():
    assert foreign_hint("group_sise") is None
    with pytest.raises(ConfigError, match="did you mean 'algo.group_size'"):
        load_config(None, ["algo.group_sise=3"])


def test_the_docs_table_is_the_code_table():
    text = DOCS.read_text()
    assert markdown_table("TRL") in text and markdown_table("verl") in text
    assert presets.markdown_table() in text
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == len(TRL_NAMES) + len(VERL_NAMES) + len(presets.ALGO_PRESETS)  # no hand-written row


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


def test_cispo_defaults_to_trl_s_open_lower_clip():
    config = load_config(None, ["algo.loss=cispo"])
    assert config.algo.clip_eps is None and config.algo.clip_eps_high == 0.2
    assert load_config(None, ["algo.loss=cispo", "algo.clip_eps=0.3"]).algo.clip_eps == 0.3
    with pytest.raises(ConfigError, match="algo.clip_eps=null"):
        load_config(None, ["algo.loss=clipped", "algo.clip_eps=null"])


def test_trl_s_cispo_epsilon_high_is_the_cap_itself():
    assert "epsilon_high - 1" in foreign_hint("epsilon_high")
