"""The dataset task's data files when they are wrong: every fault a one-line DataError or
ConfigError naming the file (and line), before any work; columns named like the gold
check's own settings; a gold check that can grade nothing stops the run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlvr.base.data import DataError, read_jsonl
from rlvr.base.errors import ConfigError, RunError
from rlvr.cli import main
from rlvr.config import load_config
from rlvr.config.compose import build_task
from rlvr.tasks.dataset import DatasetTask

ROWS = [{"prompt": f"q{i}", "answer": str(i)} for i in range(10)]
DIGITS = [{"prompt": f"{i} {i}", "answer": str(2 * i)} for i in range(10)]  # what the tiny model's tokenizer reads


def write_csv(path, text: str, encoding: str = "utf-8"):
    path.write_bytes(text.encode(encoding))
    return path


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def lm_run(tmp_path, tiny_model, options: str, *overrides: str) -> list[str]:
    """``rlvr train`` arguments for a tiny LM on the dataset task with ``options``."""
    return ["train", f"out_dir={tmp_path / 'run'}", "task.name=dataset", f"task.options={options}",
            "task.prompts_per_epoch=2", "policy.name=causal_lm", f"policy.options={{model: {tiny_model}, "
            "max_new_tokens: 3}", "algo.group_size=2", "algo.inner_steps=1", "algo.epochs=2", "log.eval_every=100",
            "log.progress=false", "log.plot=false", "log.eval_at_start=false", "threads=1", *overrides]


# ---------------------------------------------------------------- CSV


def test_a_csv_field_longer_than_csv_default_limit_is_read(tmp_path):
    long = "x" * (200 * 1024)  # over csv's own 128 KiB field limit, well under a JSONL line's 8 MiB
    path = write_csv(tmp_path / "d.csv", "prompt,answer\n" + "".join(f"{long}{i},{i}\n" for i in range(4)))
    task = DatasetTask(path, answer_column="answer", gold="exact", eval_fraction=0.25)
    assert {len(p["prompt"]) for p in task.fixed_prompts()["training prompt"]} == {len(long) + 1}
    import csv

    assert csv.field_size_limit() == 131072  # the process-wide limit is restored


def test_a_csv_field_over_the_line_limit_names_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setattr("rlvr.tasks.readers.MAX_LINE_BYTES", 1000)
    path = write_csv(tmp_path / "d.csv", "prompt,answer\nq,1\n" + "y" * 2000 + ",2\n")
    with pytest.raises(DataError, match=r"d.csv:3: not valid CSV \(field larger than field limit \(1000\)\)"):
        DatasetTask(path)


def test_a_csv_byte_order_mark_is_not_part_of_the_header(tmp_path):
    path = write_csv(tmp_path / "d.csv", "\ufeffprompt,answer\nq1,1\nq2,2\n")
    task = DatasetTask(path, answer_column="answer", gold="exact", eval_fraction=0.5)
    assert sorted(p["prompt"] for p in task.fixed_prompts()["training prompt"] + task.eval_prompts()) == ["q1", "q2"]


def test_a_csv_that_is_not_utf8_names_file_and_line(tmp_path):
    # "prompt,answer\n" and "q1,1\n" are 19 bytes: "q" is byte 19, latin-1 "é" byte 20
    path = write_csv(tmp_path / "d.csv", "prompt,answer\nq1,1\nq\xe92,2\n", encoding="latin-1")
    with pytest.raises(DataError, match=r"d.csv:3: not valid UTF-8 \(invalid continuation byte at byte 20\)"):
        DatasetTask(path)


def test_a_duplicated_csv_header_is_refused_naming_the_column(tmp_path):
    path = write_csv(tmp_path / "d.csv", "prompt,answer,answer\nq1,1,2\n")
    with pytest.raises(DataError, match=r"d.csv:1: column 'answer' appears twice in the header"):
        DatasetTask(path, answer_column="answer")


# ---------------------------------------------------------------- JSON, JSON Lines, datasets folders


def test_deeply_nested_json_names_the_file(tmp_path):
    path = tmp_path / "d.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DataError, match=r"d.json: invalid JSON \(nested too deeply\)"):
        DatasetTask(path)


def test_json_and_jsonl_with_a_byte_order_mark_read(tmp_path):
    (tmp_path / "d.json").write_text("\ufeff" + json.dumps(ROWS), encoding="utf-8")
    (tmp_path / "d.jsonl").write_text("\ufeff" + "".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    for name in ("d.json", "d.jsonl"):
        task = DatasetTask(tmp_path / name, answer_column="answer", gold="exact", eval_fraction=0.2)
        assert len(task.fixed_prompts()["training prompt"]) == 8, name


def test_an_empty_jsonl_says_what_it_expected(tmp_path):
    (tmp_path / "d.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match=r"d.jsonl: empty file; expected JSON objects, one per line$"):
        DatasetTask(tmp_path / "d.jsonl")
    with pytest.raises(DataError, match=r"d.jsonl: empty file; expected JSON objects with question: str$"):
        read_jsonl(tmp_path / "d.jsonl", {"question": str})


def test_a_damaged_datasets_folder_names_the_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "saved" / "state.json").write_text("not json")
    with pytest.raises(DataError, match=r"saved: a damaged datasets folder \(JSONDecodeError: Expecting value"):
        DatasetTask(tmp_path / "saved")


def test_a_damaged_parquet_file_names_the_file(tmp_path):
    pytest.importorskip("pyarrow")
    (tmp_path / "d.parquet").write_bytes(b"garbage")
    with pytest.raises(DataError, match=r"d.parquet: not a readable Parquet file \(ArrowInvalid"):
        DatasetTask(tmp_path / "d.parquet")


# ---------------------------------------------------------------- gold answers


@pytest.mark.parametrize("line, gold, message", [
    ('{"prompt": "q", "answer": NaN}', "math", r"d.jsonl:2: column 'answer' holds nan, not a gold answer"),
    ('{"prompt": "q", "answer": Infinity}', "numeric", r"d.jsonl:2: column 'answer' holds inf, not a gold answer"),
    ('{"prompt": "q", "answer": [1, 2]}', "exact",
     r"d.jsonl:2: column 'answer' should hold a gold answer \(text or a number\), got list \[1, 2\]"),
    ('{"prompt": "q", "answer": {"a": 1}}', "math", r"d.jsonl:2: .* got dict \{'a': 1\}"),
    ('{"prompt": "q", "answer": true}', "exact", r"d.jsonl:2: .* got bool True"),
    ('{"prompt": "q", "answer": "  "}', "exact", r"d.jsonl:2: column 'answer' is empty"),
    ('{"prompt": "q", "answer": "seven"}', "numeric",
     r"d.jsonl:2: column 'answer' holds 'seven', which gold='numeric' cannot read as a number"),
])
def test_a_gold_answer_no_check_can_read_is_refused_naming_file_line_and_value(tmp_path, line, gold, message):
    (tmp_path / "d.jsonl").write_text('{"prompt": "q", "answer": "1"}\n' + line + "\n")
    with pytest.raises(DataError, match=message):
        DatasetTask(tmp_path / "d.jsonl", answer_column="answer", gold=gold, eval_fraction=0.5)


def test_a_float_gold_in_a_csv_and_a_number_gold_are_fine(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", [{"prompt": "q", "answer": 2.5}, {"prompt": "r", "answer": 3}])
    task = DatasetTask(tmp_path / "d.jsonl", answer_column="answer", gold="numeric", eval_fraction=0.5)
    assert sorted(p["answer"] for p in task.fixed_prompts()["training prompt"] + task.eval_prompts()) == [2.5, 3]


# ---------------------------------------------------------------- the gold check's own settings


@pytest.mark.parametrize("column", ["check", "column", "extract"])
def test_a_column_named_like_a_gold_check_setting_does_not_replace_it(tmp_path, column):
    rows = [{"prompt": f"q{i}", "answer": str(i), column: "anything"} for i in range(4)]
    task = DatasetTask(write_jsonl(tmp_path / "d.jsonl", rows), answer_column="answer", gold="numeric",
                       extract="whole", eval_fraction=0.5)
    p = task.eval_prompts()[0]
    grades = task.grade([p], [[p["answer"], "x"]])
    assert grades.rewards.tolist() == [[1.0, 0.0]] and grades.correct.tolist() == [[True, False]]
    task.close()


def test_the_answer_column_cannot_be_the_prompt_column(tmp_path):
    config = load_config(None, ["task.name=dataset", "policy.name=causal_lm", "task.options={path: "
                                f"{write_jsonl(tmp_path / 'd.jsonl', ROWS)}, prompt_column: answer, "
                                "answer_column: answer}"])
    with pytest.raises(ConfigError, match=r"answer_column='answer' is the prompt column; the gold answers need"):
        build_task(config)


def test_a_gold_check_that_grades_none_of_a_batch_stops_it(tmp_path):
    task = DatasetTask(write_jsonl(tmp_path / "d.jsonl", ROWS), answer_column="answer", gold="exact",
                       eval_fraction=0.5)

    def broken(completions, answer, extract):
        raise KeyError("gold")

    task._gold = type(task._gold)(broken, "answer", "whole")  # a check that fails on every response
    prompts = task.eval_prompts()[:2]
    with pytest.raises(RunError, match=r"the gold check 'gold' graded none of the 4 responses of a batch \("
                                       r"abstained 0, errors 4, timeouts 0, invalid 0.*nothing can be learned"
                                       r".*answer_column='answer' hold answers gold='exact' can read"):
        task.grade(prompts, [["1", "2"], ["3", "4"]])
    task.close()


def test_a_run_whose_gold_check_grades_nothing_stops_with_one_line(tmp_path, tiny_model, capsys, monkeypatch):
    """Through the CLI: the first epoch's batch is all abstentions, so the run stops (exit
    2) with one line, instead of training on nothing and exiting 0."""
    import rlvr.tasks.dataset as dataset

    monkeypatch.setitem(dataset.GOLD_CHECKS, "exact", lambda completions, answer, extract: [None] * len(completions))
    options = f"{{path: {write_jsonl(tmp_path / 'd.jsonl', DIGITS)}, answer_column: answer, gold: exact}}"
    assert main(lm_run(tmp_path, tiny_model, options, "rewards.timeout=null")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rlvr: error: the gold check 'gold' graded none of the 4 responses"), err
    assert "abstained 4" in err[-1]


# ---------------------------------------------------------------- prompts and options


def test_a_prompt_too_long_for_the_model_is_named_by_file_and_line(tmp_path):
    from rlvr.modeling import init_model
    from rlvr.policies.causal_lm import CausalLMPolicy, PromptError
    from rlvr.tasks import check_prompts_fit

    model = init_model(tmp_path / "m", hidden_size=16, intermediate_size=16, num_layers=1, num_heads=1,
                       chars="abcdefghijklmnopqrstuvwxyz0123456789 ", max_positions=32)
    rows = [{"prompt": "short one", "answer": "1"}, {"prompt": "b" * 40, "answer": "2"}]
    (tmp_path / "eval.jsonl").write_text("\n" + "".join(json.dumps(r) + "\n" for r in rows))  # a blank first line
    task = DatasetTask(write_jsonl(tmp_path / "d.jsonl", ROWS), eval_path=tmp_path / "eval.jsonl",
                       answer_column="answer", gold="exact")
    with pytest.raises(PromptError, match=r"eval.jsonl:3: eval prompt 1 \('bbbb.*40 tokens \+ max_new_tokens 8"):
        check_prompts_fit(task, CausalLMPolicy.from_pretrained(str(model), max_new_tokens=8))
    task.close()


def test_eval_fraction_as_text_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"task.options.eval_fraction: expected float, got 'half'"):
        load_config(None, ["task.name=dataset", "policy.name=causal_lm", "task.options={path: "
                           f"{write_jsonl(tmp_path / 'd.jsonl', ROWS)}, eval_fraction: half}}"])


@pytest.mark.parametrize("name, content", [
    ("d.json", "[" * 100_000),
    ("d.csv", "prompt,answer,answer\nq,1,2\n"),
    ("d.jsonl", '{"prompt": "q", "answer": NaN}\n'),
], ids=["nested-json", "duplicated-csv-header", "nan-gold"])
def test_bad_data_stops_the_cli_before_any_work_leaving_no_run_directory(tmp_path, tiny_model, capsys, name,
                                                                        content):
    (tmp_path / name).write_text(content, encoding="utf-8")
    options = f"{{path: {tmp_path / name}, answer_column: answer, gold: exact, eval_fraction: 0.5}}"
    assert main(lm_run(tmp_path, tiny_model, options)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlvr: error: task.options for 'dataset': ") and name in err[0], err
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- the working directory


def test_a_module_in_the_working_directory_hiding_an_installed_package_is_named(tmp_path, monkeypatch):
    from rlvr.base.data import check_not_shadowed

    (tmp_path / "datasets.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "datasets", raising=False)
    with pytest.raises(ConfigError, match=r"datasets.py in the working directory is imported as 'datasets' in "
                                          r"place of the installed package .*rename it"):
        check_not_shadowed(["datasets"])
    (tmp_path / "saved").mkdir()
    with pytest.raises(ConfigError, match=r"imported as 'datasets'"):
        DatasetTask(tmp_path / "saved")


def test_a_local_yaml_py_is_explained_by_the_cli(tmp_path):
    (tmp_path / "yaml.py").write_text("")  # python -m puts the working directory first on the path
    proc = subprocess.run([sys.executable, "-m", "rlvr.cli", "config"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"rlvr: error: {tmp_path / 'yaml.py'} in the working directory is imported as "
                                   "'yaml' in place of the installed package (Python looks in the working directory "
                                   "first); rename it")
