"""The agent task in whole runs: agents written against the openai client train, their
calls join into one sequence, a failing or hanging agent's episode abstains, and a batch
whose every agent failed stops the run naming the first error."""

import json
import re

import pytest

from rlvr.cli import main
from rlvr.runs.metrics import read_records

pytest.importorskip("openai")
pytest.importorskip("starlette")


def agent_run(model, tmp_path, agent, *more, command=None):
    """A short run of ``agents_for_tests:<agent>``, or of the program ``command``; (exit code, run dir)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"digit": d}) + "\n" for d in range(10)))
    out = tmp_path / "run"
    which = f"task.options.agent_command={command}" if command else f"task.options.agent=agents_for_tests:{agent}"
    code = main(["train", f"out_dir={out}", "task.name=agent", which,
                 f"task.options.data={data}", "task.options.eval_size=2", "task.options.max_tokens=64",
                 "task.prompts_per_epoch=2", "policy.name=causal_lm", f"policy.options.model={model}",
                 "policy.options.max_new_tokens=4", "algo.group_size=3", "algo.epochs=2", "algo.inner_steps=1",
                 "log.eval_every=2", "log.progress=false", "log.plot=false", "seed=1", *more])
    return code, out


def test_an_agent_of_two_calls_trains_on_one_joined_sequence(chat_model, tmp_path):
    code, out = agent_run(chat_model, tmp_path, "two_calls")
    assert code == 0
    records = read_records(out)
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 2
    for r in train:
        assert r["episode/calls"] == 2 and r["episode/segments"] == 1 and r["episode/split"] == 0
        assert r["agent/replies"] == 2 and r["episode/env_errors"] == 0
        assert r["reward/episode_return/scored"] == 6
        assert 0 < r["episode/policy_tokens"] <= 8  # two replies of at most 4 tokens: only they train
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["epoch"] for r in evals] == [0, 2] and all("greedy_solve_rate" in r for r in evals)
    samples = (out / "samples.md").read_text()
    assert "Say" in samples
    # the context between the calls (the follow-up user turn) shows as the model read it
    assert "environment: ''" not in samples and re.search(r"environment: '[^']*Again\.", samples)


def test_an_agent_that_rewrites_its_history_trains_each_segment(chat_model, tmp_path):
    """Two calls whose second does not extend the first (a summary): two segments, two rows
    of the batch, each with the episode's reward; nothing abstains."""
    code, out = agent_run(chat_model, tmp_path, "rewrites", "algo.epochs=1", "log.eval_every=5")
    assert code == 0
    (train,) = [r for r in read_records(out) if r["kind"] == "train"]
    assert train["episode/calls"] == 2 and train["episode/segments"] == 2 and train["episode/split"] == 1
    assert train["episode/env_errors"] == 0 and train["reward/episode_return/scored"] == 6
    assert 0 < train["episode/policy_tokens"] <= 4  # the first segment's tokens (a row of its own)


def test_a_plain_function_agent_with_the_sync_client(chat_model, tmp_path):
    code, out = agent_run(chat_model, tmp_path, "plain_agent", "algo.epochs=1", "log.eval_every=5")
    assert code == 0
    (train,) = [r for r in read_records(out) if r["kind"] == "train"]
    assert train["episode/calls"] == 1 and 0 <= train["reward_mean"] <= 3 / 8


def test_failing_and_hanging_agents_abstain_and_a_batch_of_failures_stops_the_run(chat_model, tmp_path, capsys):
    code, out = agent_run(chat_model, tmp_path / "odd", "fails_on_odd", "algo.epochs=1", "log.eval_every=5",
                          "task.prompts_per_epoch=8")
    assert code == 0
    (train,) = [r for r in read_records(out) if r["kind"] == "train"]
    assert 0 < train["episode/env_errors"] < 1 and "odd digit" in train["episode/error"]
    code, out = agent_run(chat_model, tmp_path / "hangs", "hangs", "algo.epochs=1", "log.eval_every=5",
                          "task.options.episode_timeout=0.5")
    assert code == 2
    assert "episode_timeout=0.5" in capsys.readouterr().err
    code, out = agent_run(chat_model, tmp_path / "fails", "always_fails", "algo.epochs=1")
    assert code == 2
    err = capsys.readouterr().err
    assert "every one of the" in err and "ValueError: no tools today" in err


def test_an_agent_command_trains(chat_model, tmp_path, monkeypatch):
    """task.options.agent_command: a program per episode (jailed where bwrap runs), reading
    its row on stdin and writing its reward on stdout, trains as a Python agent does."""
    import sys

    monkeypatch.chdir(tmp_path)
    (tmp_path / "agent.py").write_text(
        "import json, sys, openai\n"
        "row = json.loads(sys.stdin.readline())\n"
        "reply = openai.OpenAI(max_retries=0).chat.completions.create(\n"
        "    model='m', messages=[{'role': 'user', 'content': f\"Say {row['digit']}\"}])\n"
        "print(json.dumps({'reward': float(str(row['digit']) in reply.choices[0].message.content)}))\n")
    code, out = agent_run(chat_model, tmp_path, None, "algo.group_size=2", "algo.epochs=1", "log.eval_every=5",
                          command=f"{sys.executable} agent.py")
    assert code == 0
    (train,) = [r for r in read_records(out) if r["kind"] == "train"]
    assert train["episode/calls"] == 1 and train["episode/env_errors"] == 0
    assert train["reward/episode_return/scored"] == 4


def test_a_missing_agent_is_one_line_before_any_work(chat_model, tmp_path, capsys):
    code, _ = agent_run(chat_model, tmp_path, "nosuch")
    assert code == 2
    assert "task.options.agent: 'agents_for_tests:nosuch': module 'agents_for_tests' has no 'nosuch'" in \
        capsys.readouterr().err
    code, _ = agent_run(chat_model, tmp_path, "two_calls", "task.options.agent_command=python agent.py")
    assert code == 2
    assert "task.options: give one of agent ('module:function') and agent_command (a program), not both" in \
        capsys.readouterr().err
    from rlvr.base.errors import ConfigError
    from rlvr.tasks.agent import AgentTask

    data = tmp_path / "rows.jsonl"
    for command, message in [("python 'x", "task.options.agent_command: No closing quotation"),
                             ([], "task.options.agent_command: expected a command line"),
                             (None, "give one of agent ('module:function') and agent_command (a program), "
                                    "not neither")]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            AgentTask(str(data), agent_command=command)


def test_the_example_agent_and_its_config_run(tmp_path, monkeypatch):
    """examples/agent_tiny.yaml with examples/agents/calculator_agent.py, shortened, on a random
    model over its characters: the agent's calls join into one sequence per episode."""
    import random
    from pathlib import Path

    from rlvr.modeling import init_model

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)  # the example's agent is found from the repository root, as its script runs it
    model = init_model(tmp_path / "model", hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                       chars="0123456789 >+-*=()aclortu\n")
    rng = random.Random(0)
    for name in ("train", "eval"):
        (tmp_path / f"{name}.jsonl").write_text("".join(
            json.dumps({"a": rng.randint(10000, 99999), "b": rng.randint(10000, 99999)}) + "\n" for _ in range(4)))
    out = tmp_path / "run"
    assert main(["train", "examples/agent_tiny.yaml", f"out_dir={out}", f"policy.options.model={model}",
                 f"task.options.data={tmp_path / 'train.jsonl'}", f"task.options.eval_data={tmp_path / 'eval.jsonl'}",
                 "task.prompts_per_epoch=2", "algo.group_size=2", "algo.epochs=1", "log.eval_samples=1"]) == 0
    train = [r for r in read_records(out) if r["kind"] == "train"][0]  # the first of its 2 inner steps
    assert train["episode/segments"] == 1 and 1 <= train["episode/calls"] <= 3
    assert "agent/tool_calls" in train


def test_a_failing_agent_names_its_line_and_the_batch_it_failed_in(chat_model, tmp_path, capsys):
    """The error names the innermost line of the user's code the exception passed through,
    and whether every agent failed in the held-out evaluation or in a training batch."""
    import inspect

    import agents_for_tests

    lines, first = inspect.getsourcelines(agents_for_tests.always_fails)
    line = first + next(k for k, text in enumerate(lines) if "raise" in text)
    where = f"agents_for_tests.py:{line} in always_fails: raise ValueError(\"no tools today\"))"
    code, _ = agent_run(chat_model, tmp_path / "eval", "always_fails", "algo.epochs=1")
    assert code == 2
    err = capsys.readouterr().err
    assert "episodes of the held-out evaluation ended with an error of its agent's" in err
    assert re.search(r"the agent raised ValueError: no tools today \(at \S*" + re.escape(where), err)
    code, _ = agent_run(chat_model, tmp_path / "train", "always_fails", "algo.epochs=1", "log.eval_at_start=false")
    assert code == 2
    err = capsys.readouterr().err
    assert "episodes of a training batch ended with an error of its agent's" in err and where in err
