"""verifiers environments trained unchanged: examples/vf_arithmetic (a taskset in verifiers'
own style) through verifiers' chat harness, whose model calls reach the run's endpoint, its
@vf.reward the reward. Run with ``-m verifiers`` in an environment with verifiers (.ci/run
makes one: verifiers 0.4 asks for openai<3)."""

import os
import re
import shutil
import sys

import pytest

from rlvr.cli import main
from rlvr.runs.metrics import read_records

pytestmark = pytest.mark.verifiers
pytest.importorskip("verifiers")
pytest.importorskip("starlette")


@pytest.fixture
def uv_on_path(monkeypatch):
    """verifiers runs its harness with uv: the one beside this interpreter."""
    folder = os.path.dirname(sys.executable)
    if shutil.which("uv", path=folder) is None:
        pytest.skip("verifiers' harness needs uv beside the interpreter (pip install uv)")
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")


def test_a_verifiers_taskset_trains_with_its_own_reward(chat_model, tmp_path, monkeypatch, uv_on_path):
    monkeypatch.chdir(os.path.join(os.path.dirname(__file__), "..", ".."))  # examples/vf_arithmetic
    out = tmp_path / "run"
    code = main(["train", f"out_dir={out}", "task.name=verifiers", "task.options.taskset=examples/vf_arithmetic",
                 "task.options.taskset_options={num_tasks: 12, min_operand: 0, max_operand: 4}",
                 "task.options.eval_size=2", "task.options.max_tokens=32", "task.prompts_per_epoch=2",
                 "policy.name=causal_lm", f"policy.options.model={chat_model}", "policy.options.max_new_tokens=4",
                 "algo.group_size=2", "algo.epochs=1", "algo.inner_steps=1", "log.eval_every=5",
                 "log.progress=false", "log.plot=false", "seed=1"])
    assert code == 0
    (train,) = [r for r in read_records(out) if r["kind"] == "train"]
    assert train["episode/env_errors"] == 0 and train["episode/calls"] == 1 and train["episode/segments"] == 1
    assert 0 < train["episode/policy_tokens"] <= 4
    evals = [r for r in read_records(out) if r["kind"] == "eval"]
    assert evals and all(r["greedy_episode/env_errors"] == 0 for r in evals)


def scripted_runs(chat_model, monkeypatch, taskset, taskset_options, answer, max_tokens, rows=None):
    """Episodes of ``taskset`` run directly, the policy scripted: each call's reply is
    ``answer(prompt text)``, then EOS. The rows, their runs and the tokenizer."""
    from rlvr.agents.runner import run_agents
    from rlvr.policies.causal_lm import CausalLMPolicy
    from rlvr.tasks.verifiers_env import VerifiersTask

    monkeypatch.chdir(os.path.join(os.path.dirname(__file__), "..", ".."))
    task = VerifiersTask(taskset, taskset_options, solved_reward="correct", eval_size=2, max_tokens=max_tokens)
    policy = task.policy_for(CausalLMPolicy.from_pretrained(str(chat_model), max_new_tokens=8))
    tok = policy.lm.tokenizer

    def scripted(jobs, temperature, stop):
        for job in jobs:
            said = answer(tok.decode(job.prompt_ids))
            ids = tok.encode(said, add_special_tokens=False) + [tok.eos_token_id]
            job.future.set_result((ids, [-1.0] * len(ids), said, "stop"))

    monkeypatch.setattr(task.endpoint._batcher, "_generate", scripted)
    rows = task.train_rows[:rows]
    try:
        task.endpoint.start()
        runs = run_agents(task.endpoint, task.agent, rows, 1, 1.0, list(range(len(rows))), task.limits)
    finally:
        task.close()
    return rows, runs, tok


def test_the_reward_is_the_tasksets_rubric_of_what_the_policy_said(chat_model, monkeypatch, uv_on_path):
    """Episodes run directly, the policy scripted to answer right on even rows and wrong on
    odd ones: verifiers' @vf.reward gives 1 and 0, and the recorded completion is the answer."""

    def answer(text):
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)", text)[-1])
        return str(a + b + (a % 2))  # wrong where a is odd

    rows, runs, tok = scripted_runs(chat_model, monkeypatch, "examples/vf_arithmetic", {"num_tasks": 8}, answer, 32)
    for row, run in zip(rows, runs):
        a = int(re.findall(r"What is (\d+)", row["prompt"])[0])
        assert run.error is None and run.calls == 1
        assert run.turns[-1].reward == float(a % 2 == 0) == run.metrics["correct"] == float(run.solved)
        assert tok.decode(run.turns[-1].ids, skip_special_tokens=True) == str(row["answer"] + a % 2)
    assert {run.turns[-1].reward for run in runs} == {0.0, 1.0}  # both kinds of row were drawn


def test_an_unknown_taskset_is_named_before_any_work(chat_model, tmp_path, capsys):
    code = main(["train", f"out_dir={tmp_path / 'run'}", "task.name=verifiers", "task.options.taskset=no_such_taskset",
                 "policy.name=causal_lm", f"policy.options.model={chat_model}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "no_such_taskset" in err and "not found" in err


FAILING_TASKSET = '''
import verifiers.v1 as vf

__all__ = ["FailingTaskset"]


class FailingTask(vf.Task[vf.TaskData]):
    @vf.reward(weight=1.0)
    async def graded(self, trace: vf.Trace) -> float:
        raise ValueError("no sums today")


class FailingTaskset(vf.Taskset[FailingTask, vf.TasksetConfig]):
    def load(self):
        return [FailingTask(vf.TaskData(prompt=f"Say {i}."), self.config.task) for i in range(4)]
'''


def test_an_episode_verifiers_reports_as_failed_abstains_with_its_error_named(chat_model, tmp_path, uv_on_path):
    from rlvr.agents.runner import run_agents
    from rlvr.policies.causal_lm import CausalLMPolicy
    from rlvr.tasks.verifiers_env import VerifiersTask

    (tmp_path / "vf_failing").mkdir()
    (tmp_path / "vf_failing" / "__init__.py").write_text(FAILING_TASKSET)
    task = VerifiersTask(str(tmp_path / "vf_failing"), eval_size=1, max_tokens=32)
    task.policy_for(CausalLMPolicy.from_pretrained(str(chat_model), max_new_tokens=4))
    try:
        task.endpoint.start()
        (run,) = run_agents(task.endpoint, task.agent, task.train_rows[:1], 1, 1.0, [0], task.limits)
    finally:
        task.close()
    assert run.error is not None and "no sums today" in run.error
    assert run.calls == 1  # the policy answered; the taskset's scoring failed


def test_a_second_user_turn_joins_the_first_into_one_segment(chat_model, monkeypatch, uv_on_path):
    """examples/vf_followup: the taskset's Env asks a sum, then asks to add a number to the
    reply. Both calls reach the endpoint through verifiers' relay and join into one
    segment: the second call's prompt is the first's prompt and completion, then the user's
    turn; its reward is the taskset's, on the second reply."""

    def answer(text):
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)", text)[-1])
        added = re.findall(r"Now add (\d+)", text)
        return str(a + b + (int(added[-1]) if added else 0))

    rows, runs, tok = scripted_runs(chat_model, monkeypatch, "examples/vf_followup", {"num_tasks": 6}, answer, 256,
                                    rows=2)
    for row, run in zip(rows, runs):
        assert run.error is None and run.calls == 2 and run.segments == 1
        assert run.turns[-1].reward == 1.0 == run.metrics["correct"] and run.solved
        roles = [turn.role for turn in run.turns]
        assert roles == ["policy", "environment", "policy"]
        assert f"Now add {row['add']}" in tok.decode(run.turns[1].ids)
        assert tok.decode(run.turns[-1].ids, skip_special_tokens=True) == str(row["answer"])


TWO_SEAT_TASKSET = '''
import verifiers.v1 as vf

__all__ = ["DuelEnv", "DuelTaskset"]


class DuelConfig(vf.EnvConfig):
    first: vf.AgentConfig = vf.AgentConfig()
    second: vf.AgentConfig = vf.AgentConfig()


class DuelEnv(vf.Env[DuelConfig]):
    async def run(self, task, agents):
        await agents.first.run(task)
        await agents.second.run(task)


class DuelTaskset(vf.Taskset[vf.Task[vf.TaskData], vf.TasksetConfig]):
    def load(self):
        return [vf.Task(vf.TaskData(prompt=f"Say {i}."), self.config.task) for i in range(4)]
'''


def test_an_env_of_two_seats_is_refused_by_name(tmp_path):
    """Both seats' calls would reach the one policy's endpoint and train as its own."""
    from rlvr.base.errors import ConfigError
    from rlvr.tasks.verifiers_env import VerifiersTask

    (tmp_path / "vf_duel").mkdir()
    (tmp_path / "vf_duel" / "__init__.py").write_text(TWO_SEAT_TASKSET)
    with pytest.raises(ConfigError, match=r"vf_duel.*2 agent seats \(first, second\)"):
        VerifiersTask(str(tmp_path / "vf_duel"), eval_size=1)
