"""Config keys and values refused up front: unknown keys named with the setting meant, all
at once; config.yaml holding only the settings that apply; task options and chat
templates that would hang or crash later refused in seconds, with no run directory."""

from __future__ import annotations

import dataclasses
import inspect
import json
import time
from typing import get_type_hints

import pytest
import yaml

from rlvr.cli import main
from rlvr.config import ConfigError, config_from_dict, load_config, merge
from rlvr.tasks import TASKS

LM = ["task.name=sort_text", "policy.name=causal_lm", "policy.options.model=m"]
QUIET = ["log.progress=false", "log.plot=false"]
# the settings of the sorting task's and the positional policy's options that were keys of their sections
SORTING_ONLY = {"task": ("reward", "num_numbers", "vocab_size", "prompts", "allow_repeats", "eval_size"),
                "policy": ("embedding_dim", "embedding_std")}


def refused(capsys, args):
    """The one line ``rlvr ARGS`` exits 2 with."""
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlvr: error: ") and err.count("\n") == 1, err
    return err


# ---------------------------------------------------------------- unknown keys


@pytest.mark.parametrize("base, override, meant", [
    ([], "epochs=3", "did you mean 'algo.epochs'?"),
    ([], "lr=0.1", "did you mean 'optim.lr' or 'sft.lr'?"),
    ([], "group_size=4", "did you mean 'algo.group_size'?"),
    (LM, "model=m", "did you mean 'policy.options.model'?"),
    ([], "model=m", "did you mean 'policy.options.model' (with policy.name=causal_lm)?"),
    (LM, "max_new_tokens=8", "did you mean 'policy.options.max_new_tokens'?"),
    ([], "algo.lr=0.1", "did you mean 'optim.lr' or 'sft.lr'?"),
    (LM, "policy.model=m", "did you mean 'policy.options.model'?"),
    ([], "task.path=d.jsonl", "did you mean 'task.options.path' (with task.name=dataset)?"),
    ([], "epoch=3", "did you mean 'algo.epochs'?"),  # nearer to a setting elsewhere than to a top-level name
    ([], "algo.lossx=clipped", "did you mean 'algo.loss'?"),  # a typo in its section: the path to type
    ([], "algo.epocs=3", "did you mean 'algo.epochs'?"),
])
def test_a_bare_or_misplaced_name_points_to_the_setting(base, override, meant):
    with pytest.raises(ConfigError) as err:
        load_config(None, [*base, override])
    assert str(err.value) == f"unknown key {override.split('=')[0]!r}; {meant}"


def test_an_option_that_is_a_setting_elsewhere_points_to_it(capsys):
    """policy.options has no temperature; the policy's temperature is policy.temperature."""
    err = refused(capsys, ["config", *LM, "policy.options.temperature=0.7"])
    assert "policy.options: unknown option 'temperature'; did you mean 'policy.temperature'?" in err
    err = refused(capsys, ["config", "task.name=dataset", "policy.name=causal_lm", "policy.options.model=m",
                           "task.options={path: d.jsonl, seed: 3}"])
    assert "task.options: unknown option 'seed'; did you mean 'seed' (top level)?" in err


def test_every_unknown_key_of_a_file_is_named_in_one_error(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "epochs": 3, "lr": 0.1,
        "task": {"name": "sort_text", "path": "x"},
        "policy": {"name": "causal_lm", "options": {"model": "m", "temperature": 0.7}},
        "algo": {"group_sise": 4}}, sort_keys=False))
    err = refused(capsys, ["config", str(path)])
    assert err == (
        "rlvr: error: 5 unknown keys: "
        "(1) unknown key 'epochs'; did you mean 'algo.epochs'? "
        "(2) unknown key 'lr'; did you mean 'optim.lr' or 'sft.lr'? "
        "(3) unknown key 'task.path'; did you mean 'task.options.path' (with task.name=dataset)? "
        "(4) unknown key 'algo.group_sise'; did you mean 'algo.group_size'? "
        "(5) policy.options: unknown option 'temperature'; did you mean 'policy.temperature'?\n")


# ---------------------------------------------------------------- config.yaml


def test_an_lm_config_leaves_out_the_sorting_settings(capsys):
    config = load_config(None, LM)
    written = yaml.safe_load(config.to_yaml())
    for section, names in SORTING_ONLY.items():
        assert not set(names) & (set(written[section]) | set(written[section]["options"])), section
    assert main(["config", *LM]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    for section, names in SORTING_ONLY.items():
        assert not set(names) & (set(shown[section]) | set(shown[section]["options"])), section
    sorting = yaml.safe_load(load_config().to_commented_yaml())  # each option the sorting run takes, listed
    for section, names in SORTING_ONLY.items():
        assert set(names) <= set(sorting[section]["options"]), section


def test_a_written_config_reads_back_as_the_same_config(tmp_path):
    """An ignored setting (a warning names it) keeps its default, so the config built is
    the one its config.yaml loads back as; the same arguments again are the same run."""
    with pytest.warns(UserWarning, match=r"task.num_numbers=7 is ignored"):
        config = load_config(None, [*LM, "task.num_numbers=7", "task.prompts=null", "policy.embedding_dim=4"])
    assert not hasattr(config.task.options, "num_numbers") and not hasattr(config.policy.options, "embedding_dim")
    path = tmp_path / "config.yaml"
    path.write_text(config.to_yaml())
    assert load_config(path) == config
    sorting = load_config(None, ["task.options.num_numbers=4", "task.options.prompts=null",
                                 "policy.options.embedding_std=0.3"])
    path.write_text(sorting.to_yaml())
    assert load_config(path) == sorting and load_config(path).task.options.num_numbers == 4


def test_the_keys_the_options_took_over_are_read_into_them():
    """A config (a run directory's among them) that gives the sorting task's and the
    positional policy's settings in their sections is the config that gives them in the
    options; given in both places, one line says so; the later of a file and an override wins."""
    old = load_config(None, ["task.num_numbers=4", "task.vocab_size=6", "task.prompts=null", "task.reward=exact",
                             "task.allow_repeats=true", "task.eval_size=8", "policy.embedding_dim=4",
                             "policy.embedding_std=0.5"])
    new = load_config(None, ["task.options={num_numbers: 4, vocab_size: 6, prompts: null, reward: exact, "
                             "allow_repeats: true, eval_size: 8}",
                             "policy.options={embedding_dim: 4, embedding_std: 0.5}"])
    assert old == new and new.task.options.num_numbers == 4 and new.policy.options.embedding_dim == 4
    with pytest.raises(ConfigError, match=r"^task.num_numbers is task.options.num_numbers: give it once$"):
        config_from_dict({"task": {"num_numbers": 4, "options": {"num_numbers": 5}}})
    assert merge({"task": {"options": {"prompts": None}}}, {"task": {"prompts": [[0, 1, 2]]}}) == {
        "task": {"options": {}, "prompts": [[0, 1, 2]]}}
    assert merge({"task": {"prompts": None}}, {"task": {"options": {"prompts": [[0, 1, 2]]}}}) == {
        "task": {"options": {"prompts": [[0, 1, 2]]}}}


def test_an_lm_run_with_an_ignored_setting_resumes(tmp_path, tiny_model, capsys):
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match="task.vocab_size=9 is ignored"):
        assert main(["train", f"out_dir={out}", *QUIET, "task.name=sort_text", "task.prompts_per_epoch=2",
                     "task.options={num_digits: 3, num_eval: 4}", "policy.name=causal_lm",
                     f"policy.options={{model: {tiny_model}, max_new_tokens: 4}}", "algo.group_size=2",
                     "algo.epochs=1", "log.eval_every=2", "threads=1", "task.vocab_size=9"]) == 0
    stored = yaml.safe_load((out / "config.yaml").read_text())
    assert "vocab_size" not in stored["task"] and "embedding_dim" not in stored["policy"]
    assert main(["train", f"resume={out}", "algo.epochs=2"]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(r["epoch"] for r in records if r.get("kind") == "train") == 1


# ---------------------------------------------------------------- task options


def test_every_task_option_declares_its_rules():
    """Each keyword argument of each text task is declared (help, and bounds where it has
    a size), and its annotation is a type the config's check knows."""
    for name, cls in TASKS.items():
        if name == "sorting":
            continue
        parameters = set(inspect.signature(cls).parameters)
        assert set(cls.options) == parameters, name
        assert all(rules["help"] for rules in cls.options.values()), name
        assert set(get_type_hints(cls.__init__)) >= parameters, name


@pytest.mark.parametrize("task, options, message", [
    ("sort_text", "{num_digits: 1000000000}", "task.options.num_digits=1000000000 must be <= 1024"),
    ("sort_text", "{num_eval: 0}", "task.options.num_eval=0 must be >= 1"),
    ("sort_text", "{num_eval: many}", "task.options.num_eval: expected int, got 'many' (str)"),
    ("arithmetic", "{num_eval: 0}", "task.options.num_eval=0 must be >= 1"),
    ("arithmetic", "{max_ops: 100000}", "task.options.max_ops=100000 must be <= 64"),
    ("arithmetic", "{eval_seed: -1}", "task.options.eval_seed=-1 must be >= 0"),
    ("dataset", "{path: d.jsonl, eval_fraction: 1.5}", "task.options.eval_fraction=1.5 must be < 1"),
    ("dataset", "{path: d.jsonl, gold: fuzzy}", "task.options.gold='fuzzy' is not allowed; choose one of: math"),
    ("dataset", "{answer_column: answer}", "task.options.path is required by task.name='dataset'"),
    ("dataset", "{path: d.jsonl, num_eval: 0}", "task.options.num_eval=0 must be >= 1"),
    ("reasoning_gym", "{dataset: chain_sum, size: 0}", "task.options.size=0 must be >= 1"),
    ("gsm8k", "{train_path: a, eval_path: b, grader_timeout: 0}", "task.options.grader_timeout=0.0 must be > 0"),
])
def test_a_task_option_out_of_bounds_fails_fast_without_a_run_directory(tmp_path, capsys, task, options, message):
    out = tmp_path / "run"
    start = time.monotonic()
    err = refused(capsys, ["train", f"out_dir={out}", *QUIET, f"task.name={task}", "policy.name=causal_lm",
                           "policy.options.model=m", f"task.options={options}"])
    assert message in err
    assert time.monotonic() - start < 10 and not out.exists()
    assert message in refused(capsys, ["config", f"task.name={task}", "policy.name=causal_lm",
                                       "policy.options.model=m", f"task.options={options}"])


def test_num_eval_zero_for_a_model_that_exists_leaves_no_run(tmp_path, tiny_model, capsys):
    """Formerly the run started and crashed at its first evaluation, leaving its directory."""
    out = tmp_path / "run"
    err = refused(capsys, ["train", f"out_dir={out}", *QUIET, "task.name=sort_text", "algo.epochs=1",
                           "task.options={num_digits: 3, num_eval: 0}", "policy.name=causal_lm",
                           f"policy.options={{model: {tiny_model}, max_new_tokens: 4}}"])
    assert "task.options.num_eval=0 must be >= 1" in err and not out.exists()


# ---------------------------------------------------------------- chat templates


HOSTILE = {
    "{{ 'a' * 2000000000 }}": "makes str * 2000000000 of 2,000,000,000 items; the limit is 1,048,576",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}": "ran past 2.0 s",
    "{% set s = 'x' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}": "ran past 2.0 s",
    "{{ 'a' | center(2000000000) }}": "of 2,000,000,000 items",
    "{{ '{:>2000000000}'.format('a') }}": "formats with a width past 1,048,576",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}":
        "makes a concatenation of",
}


@pytest.mark.parametrize("template", HOSTILE)
def test_a_chat_template_past_its_limits_is_refused_in_seconds(capsys, template):
    start = time.monotonic()
    err = refused(capsys, ["config", *LM, f"policy.options.chat_template={json.dumps(template)}"])
    assert err.startswith("rlvr: error: policy.options.chat_template ") and HOSTILE[template] in err
    assert time.monotonic() - start < 10


def test_a_training_run_with_a_hostile_template_leaves_no_run(tmp_path, tiny_model, capsys):
    """Chat prompts render while the run is built, before its directory exists."""
    from rlvr.policies.template_sandbox import render_template

    rows = [{"prompt": [{"role": "user", "content": str(i)}], "answer": str(i)} for i in range(8)]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "run"
    template = "{{ 'a' * 2000000000 }}"
    start = time.monotonic()
    err = refused(capsys, ["train", f"out_dir={out}", *QUIET, "task.name=dataset", "policy.name=causal_lm",
                           f"task.options={{path: {data}, answer_column: answer, gold: exact}}",
                           f"policy.options={{model: {tiny_model}, max_new_tokens: 2, "
                           f"chat_template: {json.dumps(template)}}}"])
    assert "the chat template (policy.options.chat_template, or the tokenizer's own) makes str * 2000000000" in err
    assert time.monotonic() - start < 30 and not out.exists()
    # a template within its limits renders as transformers renders it
    from transformers.utils.chat_template_utils import render_jinja_template

    good = ("{%- for m in messages %}{{ '<|' + m.role + '|>' + m.content | trim }}{% if not loop.last %}\n"
            "{% endif %}{%- endfor %}{% if add_generation_prompt %}{{ bos_token }}{% endif %}")
    chat = [{"role": "system", "content": "be brief "}, {"role": "user", "content": "2+2?"}]
    ours = render_template(good, messages=chat, add_generation_prompt=True, bos_token="<s>")
    theirs = render_jinja_template([chat], chat_template=good, add_generation_prompt=True, bos_token="<s>")[0][0]
    assert ours == theirs == "<|system|>be brief<|user|>2+2?<s>"  # trim_blocks: no newline after a block tag


def test_the_config_check_leaves_errors_of_the_template_own_to_real_prompts(capsys):
    """A template that refuses some chats (raise_exception) is not refused up front."""
    template = "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}x"
    assert main(["config", *LM, f"policy.options.chat_template={json.dumps(template)}"]) == 0
    capsys.readouterr()
    assert "not a valid Jinja template" in refused(capsys, ["config", *LM, "policy.options.chat_template='{% for %}'"])


def test_the_task_and_policy_sections_hold_what_is_general_and_their_options_the_rest():
    from rlvr.config import PolicyConfig, TaskConfig
    from rlvr.config.sections import PositionalOptions
    from rlvr.tasks.sorting import SortingTask

    assert {f.name for f in dataclasses.fields(TaskConfig)} == {"name", "prompts_per_epoch", "options"}
    assert {f.name for f in dataclasses.fields(PolicyConfig)} == {"name", "temperature", "options"}
    assert set(SORTING_ONLY["task"]) <= set(SortingTask.options)
    assert {f.name for f in dataclasses.fields(PositionalOptions)} == set(SORTING_ONLY["policy"])


def test_what_a_new_user_types_is_refused_with_the_way_on(capsys):
    # an environment task with the default policy: the error names the policy to set
    assert "policy.name=causal_lm" in refused(capsys, ["config", "task.name=environment"])
    # TRL's reward_funcs, at the top or in rewards: the rlvr setting is named
    for key in ("reward_funcs", "rewards.reward_funcs"):
        assert "rlvr calls this rewards.functions" in refused(capsys, ["config", f"{key}=[m:f]"])
    # a value YAML cannot read: how to quote it
    assert "quote it: name='\"...\"'" in refused(capsys, ["config", "name=a: b: c"])


def test_a_chat_template_override_is_its_text():
    template = "{% for m in messages %}{{ m.content }}{% endfor %}"  # YAML alone: "found character '%'"
    config = load_config(None, [*LM, f"policy.options.chat_template={template}"])
    assert config.policy.options.chat_template == template
