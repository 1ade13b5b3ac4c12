"""What a new user meets first: the core install without extras, run names, a tiny model's
vocabulary, the README's reasoning-gym line, and a console free of library noise."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import rlvr
from conftest import QUIET
from rlvr.cli import main

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(rlvr.__file__).resolve().parents[1]  # the rlvr under test, for the commands run in subprocesses
OPTIONAL = ("transformers", "tokenizers", "huggingface_hub", "safetensors", "peft", "datasets", "pyarrow",
            "reasoning_gym", "ray", "math_verify")
# A sitecustomize that makes modules unimportable, as on a machine with the core install only.
BLOCKER = '''import sys
BLOCKED = {blocked!r}
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Blocker())
'''
LM_MISSING = "the transformers package is not installed: pip install 'rlvr[lm]'"


def shell(command: str, cwd: Path, blocked: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``command`` (``rlvr`` in it: ``python -m rlvr``) in bash in ``cwd``, with ``blocked``
    modules unimportable."""
    site = cwd / ".blocker"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=set(blocked)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(SRC)])}
    command = re.sub(r"(^|&& )rlvr ", rf"\1{sys.executable} -m rlvr ", command)
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def rlvr_cli(args: list[str], cwd: Path, blocked: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``rlvr ARGS`` in ``cwd`` with ``blocked`` modules unimportable."""
    return shell(shlex.join(["rlvr", *args]), cwd, blocked)


@pytest.fixture
def workdir(tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    return tmp_path


TINY_LM = ["policy.name=causal_lm", "policy.options={model: m, max_new_tokens: 4}"]


@pytest.mark.parametrize("args, blocked, line", [
    (["init-model", "--out", "runs/m"], OPTIONAL, f"init-model: {LM_MISSING}"),
    (["train", "examples/your_own_data.yaml"], OPTIONAL, f"policy.name='causal_lm': {LM_MISSING}"),
    (["config", "examples/your_own_data.yaml"], OPTIONAL, f"policy.name='causal_lm': {LM_MISSING}"),
    (["sft", "examples/sort_text_sft.yaml"], OPTIONAL, f"policy.name='causal_lm': {LM_MISSING}"),
    (["train", "task.name=reasoning_gym", "task.options={dataset: basic_arithmetic}", *TINY_LM], OPTIONAL,
     f"policy.name='causal_lm': {LM_MISSING}"),
    (["train", "task.name=reasoning_gym", "task.options={dataset: basic_arithmetic}", *TINY_LM], ("reasoning_gym",),
     "task.name='reasoning_gym': the reasoning_gym package is not installed: pip install 'rlvr[reasoning-gym]'"),
    (["config", "task.name=reasoning_gym", "task.options={dataset: basic_arithmetic}", *TINY_LM], ("reasoning_gym",),
     "task.name='reasoning_gym': the reasoning_gym package is not installed: pip install 'rlvr[reasoning-gym]'"),
    (["train", "cluster.rollout_workers=2"], OPTIONAL,
     "cluster.rollout_workers=2: the ray package is not installed: pip install 'rlvr[ray]'"),
    (["train", "task.name=dataset", "task.options={path: d.parquet}", *TINY_LM], ("pyarrow",),
     "the pyarrow package is not installed: pip install 'rlvr[data]'"),
    (["config", "task.name=dataset", "task.options={path: d.parquet}", *TINY_LM], ("pyarrow",),
     "task.name='dataset': the pyarrow package is not installed: pip install 'rlvr[data]'"),
])
def test_a_missing_extra_is_one_line_naming_it_before_any_work(workdir, args, blocked, line):
    (workdir / "d.parquet").write_bytes(b"PAR1")  # read only once pyarrow is there
    done = rlvr_cli(args, workdir, blocked)
    assert (done.returncode, done.stderr) == (2, f"rlvr: error: {line}\n")
    assert not (workdir / "runs").exists()  # no run directory, no model folder


def test_the_main_job_needs_no_extra(workdir):
    done = rlvr_cli(["train", "algo.epochs=1", "log.plot=false"], workdir, OPTIONAL)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (workdir / "runs" / "lecture" / "metrics.jsonl").is_file()


def test_rlvr_check_names_the_missing_extra(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    with pytest.raises(rlvr.ConfigError, match=re.escape("cluster.learners=2: the ray package is not installed: "
                                                         "pip install 'rlvr[ray]'")):
        rlvr.check({"cluster": {"learners": 2}})


# ---------------------------------------------------------------- run names


@pytest.mark.parametrize("overrides, run_dir", [
    ([], "runs/lecture"),
    (["algo.deltas=normalized"], "runs/lecture"),  # the sorting toy: the lecture's run
    (["task.name=sort_text", "policy.name=causal_lm", "policy.options.model=runs/tiny_lm"], "runs/sort_text-tiny_lm"),
    (["task.name=arithmetic", "policy.name=causal_lm", "policy.options.model=runs/s/sft/model/"],
     "runs/arithmetic-sft"),  # rlvr sft's RUN_DIR/model: the run's folder
    (["task.name=sort_text", "policy.name=causal_lm", "policy.options.model=Qwen/Qwen2.5-0.5B"],
     "runs/sort_text-Qwen2.5-0.5B"),
    (["name=mine", "task.name=sort_text", "policy.name=causal_lm", "policy.options.model=runs/tiny_lm"], "runs/mine"),
])
def test_a_run_is_named_after_its_task_and_model_unless_named(overrides, run_dir):
    config = rlvr.load_config(None, overrides)
    assert str(config.run_dir) == run_dir
    assert rlvr.load_config(None, [f"name={config.name}", *overrides]) == config  # the name written back loads alike


# ---------------------------------------------------------------- a tiny model's vocabulary


def test_every_character_the_prompts_lack_is_named_at_once(tiny_model):
    from rlvr.policies.causal_lm import CausalLMPolicy, PromptError

    policy = CausalLMPolicy.from_pretrained(str(tiny_model), max_new_tokens=4)
    prompts = ["12>", "1#2a>", *["3>"] * 1100, "x\n2>"]  # the last two past the first chunk of 1024
    message = ("prompt 1 ('1#2a>'): character '#' at index 1 is not in the tokenizer's vocabulary; all 4 characters "
               "of the prompts that it lacks: '#ax\\n'")
    with pytest.raises(PromptError, match=re.escape(message)):
        policy.check_prompts(prompts)


def test_init_model_help_shows_defaults_and_chars_take_a_newline(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["init-model", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "model width (default: 128)" in text and "(default: '0123456789 >+-*=()')" in text
    assert main(["init-model", "--out", str(tmp_path / "m"), "--chars", "12\\n", "--hidden-size", "8",
                 "--intermediate-size", "8", "--num-layers", "1", "--num-heads", "2"]) == 0
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "m"))
    assert tokenizer.decode(tokenizer("1\n2", add_special_tokens=False)["input_ids"]) == "1\n2"
    assert len(tokenizer) == 3 + 3  # pad, bos, eos and '1', '2', newline
    assert main(["init-model", "--out", str(tmp_path / "m2"), "--chars", "11"]) == 2  # one line, no traceback
    assert "init-model: chars must be distinct single characters" in capsys.readouterr().err


@pytest.mark.slow
def test_readme_reasoning_gym_lines_run_as_written(workdir):
    pytest.importorskip("reasoning_gym")
    text = (ROOT / "README.md").read_text()
    section = text[text.index("**Train on generated problems**"):]
    command = re.search(r"\n\n    (rlvr init-model [^\n]*)\n", section)[1]
    done = shell(command + " algo.epochs=1", workdir)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = (workdir / "runs" / "reasoning_gym_tiny" / "metrics.jsonl").read_text()
    assert '"kind": "train"' in metrics and '"reward/score/scored": 16' in metrics  # 4 prompts x 4, all graded


# ---------------------------------------------------------------- the console


NOISE = ("Loading weights", "Writing model shards", "deprecated", "Warning")


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """init-model, then a 1-epoch LoRA run on it, through the CLI: (workdir, stderr of both)."""
    pytest.importorskip("peft")
    where = tmp_path_factory.mktemp("lora")
    command = ("rlvr init-model --out m --hidden-size 16 --intermediate-size 32 --num-layers 1 --num-heads 2 && "
               "rlvr train task.name=sort_text 'task.options={num_digits: 3, num_eval: 2}' policy.name=causal_lm "
               "'policy.options={model: m, max_new_tokens: 6, lora: {r: 2}}' algo.epochs=1 algo.group_size=2 "
               "task.prompts_per_epoch=2 out_dir=runs/lora " + " ".join(QUIET))
    done = shell(command, where)
    assert done.returncode == 0, done.stderr[-2000:]
    return where, done.stderr


def test_lm_commands_print_no_library_noise(lora_run):
    where, stderr = lora_run
    done = rlvr_cli(["export", "runs/lora", "--out", "merged"], where)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (where / "merged" / "config.json").is_file()
    for text in (stderr, done.stderr):
        assert not [word for word in NOISE if word in text], text


def test_a_lora_export_without_peft_is_one_line(lora_run):
    where, _ = lora_run
    done = rlvr_cli(["export", "runs/lora", "--out", "merged2"], where, ("peft",))
    assert (done.returncode, done.stderr) == (
        2, "rlvr: error: merging a LoRA run's adapters: the peft package is not installed: pip install 'rlvr[lora]'\n")
    assert not (where / "merged2").exists()


def test_the_quiet_console_is_undone_after_the_command(tiny_model, tmp_path):
    import warnings

    from transformers.utils import logging as hf_logging

    filters = list(warnings.filters)
    assert hf_logging.is_progress_bar_enabled()
    assert main(["train", "task.name=sort_text", "task.options={num_digits: 3, num_eval: 2}", "policy.name=causal_lm",
                 f"policy.options={{model: {tiny_model}, max_new_tokens: 6}}", "algo.epochs=1", "algo.group_size=2",
                 "task.prompts_per_epoch=2", f"out_dir={tmp_path / 'run'}", *QUIET]) == 0
    assert hf_logging.is_progress_bar_enabled() and warnings.filters == filters


def test_the_python_api_prints_no_library_noise(tiny_model, tmp_path):
    config = {"task": {"name": "sort_text", "prompts_per_epoch": 2, "options": {"num_digits": 3, "num_eval": 2}},
              "policy": {"name": "causal_lm", "options": {"model": str(tiny_model), "max_new_tokens": 6}},
              "algo": {"epochs": 1, "group_size": 2}, "log": {"progress": False, "plot": False}}
    script = f"import rlvr\nrlvr.train({config!r}, out_dir={str(tmp_path / 'run')!r})\n"
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not [word for word in NOISE if word in done.stderr], done.stderr
