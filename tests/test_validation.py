"""Bad values the CLI must refuse with one line naming the field, before any work.

Each case runs ``rlvr train`` with its run directory in tmp_path and checks: exit code 2,
one ``rlvr: error: ...`` line on stderr that names the field, and no run directory.
Sizes are just past their limits, so that before the checks existed a case ran (and
exited 0) or crashed cheaply, instead of exhausting memory.
"""

from __future__ import annotations

import pytest
import torch

from rlvr.cli import main

FAST = ["algo.epochs=1", "algo.inner_steps=1", "log.progress=false", "log.plot=false", "log.eval_at_start=false"]

CASES = [
    (["optim.lr=nan"], "optim.lr=nan must be a finite number"),
    (["optim.lr=.inf"], "optim.lr=inf must be a finite number"),
    (["policy.temperature=.nan"], "policy.temperature=nan must be a finite number"),
    (["rewards.timeout=.inf"], "rewards.timeout=inf must be a finite number"),
    (["algo.clip_eps=nan"], "algo.clip_eps=nan must be a finite number"),
    (["algo.adv_eps=-.inf"], "algo.adv_eps=-inf must be a finite number"),
    (["algo.adv_eps=0"], "algo.adv_eps=0.0 must be > 0"),
    (["rewards.functions=[{function: 'math:isfinite', weight: .nan}]"],
     "rewards.functions[0].weight=nan must be a finite number"),
    (["rewards.functions=[{function: 'math:isfinite', timeout: .inf}]"],
     "rewards.functions[0].timeout=inf must be positive seconds or null"),
    (["seed=-1"], "seed=-1 must be >= 0"),
    (["seed=4294967296"], "seed=4294967296 must be <= 4294967295"),
    (["threads=1025"], "threads=1025 must be <= 1024"),
    (["rewards.num_workers=257"], "rewards.num_workers=257 must be <= 256"),
    (["algo.group_size=65537"], "algo.group_size=65537 x 3 prompts = 196611 responses per epoch"),
    (["log.eval_samples=1025"], "log.eval_samples=1025 x log.eval_batch_size=64 = 65600 responses"),
    (["task.options={num_numbers: 1025, vocab_size: 2000, prompts: null}"],
     "task.options.num_numbers=1025 must be <= 1024"),
    (["task.options={vocab_size: 4097, prompts: null}"], "task.options.vocab_size=4097 must be <= 4096"),
    (["policy.options.embedding_dim=1700"], "policy.options.embedding_dim=1700 with task.options.num_numbers=3"),
    (["task.options.prompts=[[1, 0, 99999999999999999999]]"],
     "task.options.prompts[0]=[1, 0, 99999999999999999999]"),
    (["task.options.prompts=[[1.5, 0, 2]]"], "task.options.prompts[0]=[1.5, 0, 2]"),
    (["sft.num_examples=1048577"], "sft.num_examples=1048577 must be <= 1048576"),
    (["algo.lr=[unclosed"], "override 'algo.lr=[unclosed': not valid YAML"),
    (["optim.betas=[a, 0.9]"], "optim.betas=['a', 0.9] must be two numbers in [0, 1)"),
]


def run(capsys, args):
    """Exit code and stderr lines, less transformers' "Loading weights" progress bar."""
    code = main(["train", *args])
    lines = capsys.readouterr().err.strip().splitlines()
    return code, [line for line in lines if not line.startswith("Loading weights")]


@pytest.mark.parametrize("overrides, message", CASES, ids=[" ".join(o) for o, _ in CASES])
def test_bad_value_is_one_line_before_any_work(tmp_path, capsys, overrides, message):
    out = tmp_path / "run"
    code, lines = run(capsys, [f"out_dir={out}", *FAST, *overrides])
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("rlvr: error: ") and message in lines[0]
    assert not out.exists()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"seed: 1\n# caf\xe9\n", "not valid UTF-8 (invalid continuation byte at byte 13)"),
        (b"[" * 100_000, "nested too deeply"),
    ],
    ids=["latin-1", "deeply-nested"],
)
def test_unreadable_config_file_is_one_line(tmp_path, capsys, content, message):
    path, out = tmp_path / "c.yaml", tmp_path / "run"
    path.write_bytes(content)
    code, lines = run(capsys, [str(path), f"out_dir={out}", *FAST])
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith(f"rlvr: error: {path}: ") and message in lines[0]
    assert not out.exists()


def lm_args(model, options="", task="{num_digits: 3, num_eval: 8}"):
    return ["task.name=sort_text", f"task.options={task}", "task.prompts_per_epoch=2", "algo.group_size=2",
            "policy.name=causal_lm", f"policy.options={{model: '{model}', max_new_tokens: 7{options}}}",
            "log.eval_samples=2"]


LM_CASES = [
    (", device: cuda", "policy.options: device='cuda' but CUDA is not available"),
    (", device: 'cuda:7'", "policy.options: device='cuda:7' but CUDA is not available"),
    (", device: gpu", "policy.options.device='gpu' is not a torch device"),
    (", max_new_tokens: 64", "max_new_tokens=64 leaves no room for a prompt: the model has 64 positions"),
]


@pytest.mark.parametrize("options, message", LM_CASES, ids=[o for o, _ in LM_CASES])
def test_bad_policy_option_is_one_line_before_any_work(tmp_path, capsys, monkeypatch, llama_dir, options, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "run"
    code, lines = run(capsys, [f"out_dir={out}", *FAST, *lm_args(llama_dir, options)])
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("rlvr: error: ") and message in lines[0]
    assert not out.exists()


def test_eval_prompt_longer_than_the_model_is_one_line_before_any_work(tmp_path, capsys, llama_dir):
    """Prompts of 2 * 30 characters + 7 new tokens > 64 positions: the first eval prompt
    fails the check, before the run directory is created."""
    out = tmp_path / "run"
    code, lines = run(capsys, [f"out_dir={out}", *FAST, *lm_args(llama_dir, task="{num_digits: 30, num_eval: 8}")])
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("rlvr: error: eval prompt 0 (")
    assert "60 tokens + max_new_tokens 7 = 67 > 64" in lines[0]
    assert not out.exists()


def test_fixed_prompts_are_checked_before_any_work(tmp_path, llama_dir):
    """check_prompts_fit: GSM8K's training and eval files are known up front, so a long
    question anywhere in them is found before training; so is a character the char
    tokenizer lacks in a generated task's eval set."""
    import json

    from rlvr.modeling import init_model
    from rlvr.policies.causal_lm import CausalLMPolicy, PromptError
    from rlvr.tasks import check_prompts_fit
    from rlvr.tasks.gsm8k import Gsm8kTask
    from rlvr.tasks.sort_text import SortTextTask

    def jsonl(name, questions):
        path = tmp_path / name
        path.write_text("".join(json.dumps({"question": q, "answer": "#### 1"}) + "\n" for q in questions))
        return path

    letters = init_model(tmp_path / "letters", hidden_size=16, intermediate_size=16, num_layers=1, num_heads=1,
                         chars="abcdefghijklmnopqrstuvwxyzQA0123456789 :\n?", max_positions=64)
    policy = CausalLMPolicy.from_pretrained(str(letters), max_new_tokens=8)
    # "Question: " + 40 characters + "\nAnswer:" = 58 tokens, + 8 new ones > 64
    train, evals = jsonl("train.jsonl", ["what is one", "a" * 39 + "?"]), jsonl("eval.jsonl", ["one"])
    with Gsm8kTask(train, evals, template="plain", num_workers=1) as task:
        with pytest.raises(PromptError,
                           match=r"training prompt 1 \('Question: a.*58 tokens \+ max_new_tokens 8 = 66 > 64"):
            check_prompts_fit(task, policy)
    with Gsm8kTask(evals, evals, template="plain", num_workers=1) as task:
        check_prompts_fit(task, policy)

    no_arrow = init_model(tmp_path / "no_arrow", hidden_size=16, intermediate_size=16, num_layers=1, num_heads=1,
                          chars="0123456789 ", max_positions=64)
    with SortTextTask(num_digits=3, num_eval=4) as task:
        check_prompts_fit(task, CausalLMPolicy.from_pretrained(str(llama_dir), max_new_tokens=8))
        with pytest.raises(PromptError, match=r"eval prompt 0 \('\d \d \d>'\): character '>' at index 5"):
            check_prompts_fit(task, CausalLMPolicy.from_pretrained(str(no_arrow), max_new_tokens=8))
