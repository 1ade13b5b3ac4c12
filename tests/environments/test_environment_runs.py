"""Environment tasks in whole runs: from the command line and from Python (an rlvr
environment and a TRL-style class), with sandboxed tools, episodes in samples.md and the
report, episode metrics, bad options, and a run killed with SIGKILL resuming to the same
records."""

import json
import os
import pathlib
import time

import pytest

import rlvr
from helpers import sigkill_mid_run
from rlvr.base.errors import ConfigError
from rlvr.cli import main
from rlvr.environments import Step
from rlvr.runs.metrics import read_records, without_timings

pytest.importorskip("transformers")


def guessing(model, out, *more):
    return [f"out_dir={out}", "task.name=environment", "task.options.environment=guessing",
            "task.options.environment_options={high: 8, feedback: interval}", "task.options.max_turns=3",
            "task.options.max_tokens=24", "task.options.eval_size=4", "task.prompts_per_epoch=2",
            "policy.name=causal_lm", f"policy.options.model={model}", "policy.options.max_new_tokens=3",
            "algo.group_size=3", "algo.epochs=3", "algo.inner_steps=1", "log.eval_every=2", "log.eval_samples=2",
            "log.progress=false", "log.plot=false", "seed=3", *more]


def test_a_guessing_run_from_the_command_line_shows_its_episodes(tiny_model, tmp_path):
    out = tmp_path / "run"
    assert main(["train", *guessing(tiny_model, out)]) == 0
    records = read_records(out)
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 3 and all(1 <= r["episode/turns"] <= 3 for r in train)
    assert all(r["reward/episode_return/scored"] == 6 for r in train)
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["epoch"] for r in evals] == [0, 2, 3] and all("greedy_episode/turns" in r for r in evals)
    table = [r for r in records if r["kind"] == "samples"][-1]["rows"]
    assert table[0]["prompt"] == "1-8>"  # the episode's first observation, not its seed
    turns = table[0]["response"]
    assert turns[0]["role"] == "policy" and turns[0]["trained"] and any(not t["trained"] for t in turns)
    markdown = (out / "samples.md").read_text()
    assert "policy (trained):" in markdown and "environment:" in markdown
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert "policy (trained): &#x27;" in page and "environment: &#x27;" in page  # the turns, escaped


class Echo:
    """Say the number you were given; solved when the first turn is it."""

    def reset(self, start):
        self.target = str(start["target"])
        return start["prompt"]

    def step(self, text):
        right = text.strip() == self.target
        return Step(reward=float(right), done=True, solved=right)


class TRLCounter:
    """A TRL-style environment class: ``reset(**row)``, public methods as tools, a reward attribute."""

    def reset(self, **row):
        self.reward, self.calls = 0.0, 0
        return None

    def count(self, text: str) -> str:
        """Count the characters of text.

        Args:
            text: what to count
        """
        self.calls += 1
        self.reward = 1.0
        return str(len(text))


def test_rlvr_train_takes_an_environment_class_and_rows_from_a_file(tiny_model, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{i}=", "target": i}) + "\n" for i in range(12)))
    config = {"task": {"prompts_per_epoch": 2, "options": {"data": str(rows), "eval_size": 4, "max_turns": 2,
                                                           "max_tokens": 12}},
              "policy": {"name": "causal_lm", "options": {"model": str(tiny_model), "max_new_tokens": 3}},
              "algo": {"epochs": 2, "group_size": 2, "inner_steps": 1}, "log": {"progress": False, "eval_every": 1}}
    result = rlvr.train(config, environment_factory=Echo)
    assert result.config.task.name == "environment"
    train = [r for r in result.records if r["kind"] == "train"]
    assert len(train) == 2 and all(r["episode/turns"] == 1 for r in train)
    # a TRL-style class: its public method is a tool the policy may call (plain style: count(...))
    result = rlvr.train(config, environment_factory=TRLCounter, reward_funcs=[calls_made])
    train = [r for r in result.records if r["kind"] == "train"]
    assert all("episode/tool_calls" in r for r in train)
    # reward functions get environments, as TRL passes them: each episode's instance as it ended
    assert all(r["reward/calls_made/scored"] == 4 and r["reward/calls_made/errors"] == 0
               and r["reward/calls_made/mean"] <= r["episode/tool_calls"] for r in train), train


def calls_made(prompts, completions, environments, **kwargs):
    """The tool calls each episode's environment counted (read from ``environments``)."""
    assert len(environments) == len(completions)
    return [float(env.calls) for env in environments]


def test_the_policys_tool_calls_run_in_the_sandbox_and_their_results_come_back_as_tokens(tmp_path, monkeypatch):
    import torch

    from rlvr.engines import Generation
    from rlvr.environments.episodes import EpisodeLimits, run_episodes
    from rlvr.environments.games import CalculatorArithmetic
    from rlvr.environments.tools import TOOLS, ToolBox
    from rlvr.environments.workers import EnvironmentHosts
    from rlvr.modeling import init_model
    from rlvr.policies import turns
    from rlvr.policies.causal_lm import CausalLMPolicy

    model = tmp_path / "model"
    init_model(model, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, seed=0,
               chars="0123456789 >+-*=()aclortu\n")
    policy = CausalLMPolicy.from_pretrained(str(model), max_new_tokens=24)
    def scripted(policy, prefixes, temperature, max_new_tokens, seeds):  # call the tool, then answer its result
        texts = []
        for prefix in prefixes:
            text = policy.tokenizer.decode(prefix, skip_special_tokens=True)
            texts.append(text.split("= ")[-1].strip() if "= " in text else f"calculator({text.rstrip('=')})")
        ids = [policy.tokenizer(t, add_special_tokens=False)["input_ids"] + [policy.tokenizer.eos_token_id]
               for t in texts]
        width = max(map(len, ids))
        response = torch.tensor([row + [policy.pad_id] * (width - len(row)) for row in ids])
        mask = torch.arange(width) < torch.tensor([len(row) for row in ids])[:, None]
        return Generation(response, mask, torch.zeros(response.shape)), texts

    monkeypatch.setattr(turns, "next_turns", scripted)
    with ToolBox({"calculator": TOOLS["calculator"]}, timeout=5.0) as box:
        episodes = run_episodes(policy, EnvironmentHosts(lambda: CalculatorArithmetic(digits=5)), [1, 2, 3], 2, 1.0,
                                torch.Generator().manual_seed(0), EpisodeLimits(3, 64), box)
    assert all(e.solved and e.tool_calls == 1 and e.tool_errors == 0 and e.policy_turns == 2 for e in episodes)
    tool = episodes[0].turns[1]
    assert tool.role == "tool" and not tool.trained and tool.text.startswith("= ") and tool.ids
    assert tool.ids == policy.tokenizer(tool.text, add_special_tokens=False)["input_ids"]
    from rlvr.tasks.environment import episode_metrics

    assert episode_metrics(episodes)["episode/tool_calls"] == 1.0


@pytest.mark.parametrize("options, message", [
    (["task.options.environment=nope"], "not a ready environment"),
    (["task.options.tools=[abacus]"], "unknown tool 'abacus'"),
    (["task.options.environment_factory=no_such_module:Env"], "no_such_module"),
    (["task.options.max_turns=0"], "task.options.max_turns"),
    (["task.options.environment_options={hihg: 8}"], "hihg"),
])
def test_bad_environment_options_are_named_before_any_work(tiny_model, tmp_path, options, message):
    with pytest.raises(ConfigError, match=message):
        rlvr.check({"task": {"name": "environment"}, "policy": {"name": "causal_lm",
                                                                "options": {"model": str(tiny_model)}}}, options)


def test_a_killed_environment_run_resumes_to_the_same_records(tiny_model, tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    args = ["algo.epochs=40", "log.checkpoint_every=1", "log.eval_every=10"]
    assert main(["train", *guessing(tiny_model, straight, *args)]) == 0
    sigkill_mid_run(guessing(tiny_model, killed, *args), killed)
    assert main(["train", f"resume={killed}"]) == 0
    assert without_timings(read_records(straight)) == without_timings(read_records(killed))


def test_the_readmes_environment_example_runs_as_written(tmp_path, monkeypatch, capsys):
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "environments.md").read_text()
    [block] = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "environment_factory=" in b]
    scope: dict = {}
    monkeypatch.chdir(tmp_path)
    exec(block, scope)  # the project's own documentation
    records = scope["result"].records
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 10 and all(1 <= r["episode/turns"] <= 8 for r in train)
    assert "policy (trained):" in (tmp_path / "runs" / "countdown" / "samples.md").read_text()
    assert "{'kind': 'eval'" in capsys.readouterr().out  # it prints a metrics record, not a samples table


class ChatStart:
    """A chat episode in the tiny model's characters; ``reset`` gives what ``start`` says."""

    prompt: object = [{"role": "user", "content": "1+2"}]

    def reset(self, start):
        return self.prompt

    def step(self, text):
        return Step(None, 1.0, done=True)


class NumberStart(ChatStart):
    prompt = 42


def _chat_run(tmp_path, factory, *more):
    return main(["train", f"out_dir={tmp_path / 'run'}", "task.name=environment",
                 f"task.options.environment_factory=test_environment_runs:{factory}", "task.options.max_tokens=32",
                 "policy.name=causal_lm",
                 "algo.epochs=1", "log.progress=false", "log.plot=false", *more])


def test_a_start_check_failure_is_one_line_naming_what_to_fix(tiny_model, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    no_end = "{% for m in messages %}{{ m.content }}={% endfor %}"
    assert _chat_run(tmp_path, "ChatStart", f"policy.options={{model: '{tiny_model}', chat_template: '{no_end}'}}") == 2
    err = capsys.readouterr().err
    assert "writes no end-of-turn text" in err and "set policy.options.chat_template to a template" in err
    assert "Traceback" not in err and "end_of_turn=" not in err
    assert _chat_run(tmp_path, "NumberStart", f"policy.options.model={tiny_model}") == 2
    err = capsys.readouterr().err
    assert "NumberStart.reset: TypeError: reset returned int 42, not text or a list of messages" in err
    assert "Traceback" not in err
    assert "chat template" not in err


class CannotMake(ChatStart):
    def __init__(self):
        raise ValueError("the board needs a size")


def test_an_environment_that_cannot_be_made_is_one_line_before_any_work(tiny_model, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    assert _chat_run(tmp_path, "CannotMake", f"policy.options.model={tiny_model}") == 2
    err = capsys.readouterr().err
    assert err.strip() == "rlvr: error: eval start 0: making the environment: ValueError: the board needs a size"
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


class HangsAfterMarking(ChatStart):
    """A step that hangs for a minute, after marking (a file) that it started."""

    prompt = "1+2="

    def step(self, text):
        pathlib.Path(os.environ["RLVR_TEST_MARK"]).touch()
        time.sleep(60)


def test_a_stop_signal_cuts_the_wait_on_hanging_environments(tiny_model, tmp_path, monkeypatch, capsys):
    """SIGTERM while every episode's step hangs (a 60 s time limit): the waits end at once,
    the run writes its checkpoint and stops, rather than waiting out the limit each batch."""
    import signal
    import threading

    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).parent))
    mark = tmp_path / "stepping"
    monkeypatch.setenv("RLVR_TEST_MARK", str(mark))

    def stop_once_stepping():
        while not mark.exists():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_once_stepping, daemon=True).start()
    began = time.monotonic()
    code = _chat_run(tmp_path, "HangsAfterMarking", f"policy.options.model={tiny_model}", "algo.epochs=3",
                     "task.options.step_timeout=60")
    assert code == 128 + signal.SIGTERM
    assert time.monotonic() - began < 30  # not the 60 s limit
    assert "checkpoint written" in capsys.readouterr().err
    assert list((tmp_path / "run").glob("checkpoints/*"))
    assert not (tmp_path / "run" / "metrics.jsonl").read_text().strip()  # the cut batch was dropped, not trained
