"""The dataset task: file formats, chat prompts, columns to reward functions, eval split,
resumable per-pass shuffle, bad files, and a tiny end-to-end run with a Python reward."""

from __future__ import annotations

import json

import pytest
import torch

from rlvr.base.data import DataError
from rlvr.base.errors import ConfigError
from rlvr.config import load_config
from rlvr.config.compose import build_task
from rlvr.tasks.dataset import DatasetTask, PassOrder

QUIET = ["log.progress=false", "log.plot=false"]
ROWS = [{"prompt": [{"role": "user", "content": f"q{i}"}], "answer": str(i), "level": i % 3} for i in range(10)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def jsonl(tmp_path):
    return write_jsonl(tmp_path / "d.jsonl", ROWS)


def dataset_config(options, *overrides):
    """A config of the dataset task with ``options`` (a YAML flow mapping) and an LM policy."""
    return load_config(None, ["task.name=dataset", f"task.options={options}", "policy.name=causal_lm", *overrides])


def test_every_format_gives_the_same_prompts(tmp_path, jsonl):
    flat = [{"prompt": f"q{i}", "answer": str(i)} for i in range(10)]  # CSV holds text only
    (tmp_path / "d.json").write_text(json.dumps(flat))
    with (tmp_path / "d.csv").open("w") as f:
        f.write("prompt,answer\n" + "".join(f"q{i},{i}\n" for i in range(10)))
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(flat), tmp_path / "d.parquet")
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(flat).save_to_disk(str(tmp_path / "saved"))
    expected = None
    for name in ("d.json", "d.csv", "d.parquet", "saved"):
        task = DatasetTask(tmp_path / name, answer_column="answer", gold="exact", eval_fraction=0.2)
        got = (task.fixed_prompts()["training prompt"], task.eval_prompts())
        expected = expected or got
        assert got == expected, name
    train, held_out = expected
    assert len(train) == 8 and len(held_out) == 2  # floor(0.2 * 10) held out
    assert {p["prompt"] for p in train} | {p["prompt"] for p in held_out} == {f"q{i}" for i in range(10)}


def test_chat_prompts_render_with_the_template_and_system_prompt(jsonl, tiny_model):
    from rlvr.base.errors import PromptError
    from rlvr.modeling import load_model_and_tokenizer
    from rlvr.policies.prompts import prompt_token_ids

    task = DatasetTask(jsonl, system_prompt="s", answer_column="answer", gold="exact")
    prompt = task.eval_prompts()[0]
    assert prompt["prompt"][0] == {"role": "system", "content": "s"} and prompt["prompt"][1]["role"] == "user"
    _, tokenizer = load_model_and_tokenizer(tiny_model)
    with pytest.raises(PromptError, match="eval prompt 0 is a chat .* no chat template"):
        prompt_token_ids(tokenizer, [prompt], True, 4, None, "eval prompt")
    tokenizer.chat_template = ("{% for m in messages %}{{ m.content }}={% endfor %}"
                               "{% if add_generation_prompt %}>{% endif %}")
    digits = DatasetTask(write_jsonl(jsonl.parent / "digits.jsonl", [{"prompt": "12", "answer": "3"}] * 3),
                         system_prompt="9", answer_column="answer", gold="exact", eval_fraction=0.4)
    ids = prompt_token_ids(tokenizer, digits.eval_prompts(), True, 4, None)
    # rendered "9=12=>" as characters, without the tokenizer's BOS (the template owns specials)
    assert tokenizer.decode(ids[0]) == "9=12=>" and ids[0][0] != tokenizer.bos_token_id


def test_text_prompts_reach_a_chat_model_as_one_user_message_unless_raw_text(tmp_path, chat_model, tiny_model):
    """A text prompt column and a model with a chat template: each prompt is one user message,
    rendered by the template with its generation prompt (an instruct model reads its questions
    as it was trained to), and graded as a chat; raw_text keeps the text, as does a model
    without a template."""
    from rlvr.config.compose import build_policy
    from rlvr.policies.prompts import prompt_texts

    path = write_jsonl(tmp_path / "text.jsonl", [{"prompt": f"q{i}", "answer": str(i)} for i in range(10)])

    def prompts(model, *more):
        config = dataset_config(f"{{path: {path}, answer_column: answer, gold: exact, extract: whole}}",
                                f"policy.options.model={model}", *more)
        with build_task(config) as task:
            policy = build_policy(config, task)
            rows = task.fixed_prompts()["training prompt"] + task.eval_prompts()
            solved = task.grade(rows[:1], [[rows[0]["answer"], "no"]]).correct.tolist()
            return rows, prompt_texts(policy.tokenizer, rows), solved

    rows, texts, solved = prompts(chat_model)
    assert [row["prompt"] for row in rows] == [[{"role": "user", "content": f"q{row['answer']}"}] for row in rows]
    assert texts[0] == f"<|user|>\nq{rows[0]['answer']}<eos>\n<|assistant|>\n"
    assert solved == [[True, False]]  # the gold check reads a chat's completions (one assistant message each)
    for model, more in ((chat_model, ["task.options.raw_text=true"]), (tiny_model, [])):
        rows, texts, solved = prompts(model, *more)
        assert texts == [row["prompt"] for row in rows] == [f"q{row['answer']}" for row in rows]
        assert solved == [[True, False]]


def test_columns_reach_reward_functions_by_name(jsonl):
    seen = {}

    def by_level(prompts, completions, level, answer, **kwargs):
        seen.update(prompts=prompts, level=level, answer=answer)
        return [float(lv) for lv in level]

    config = dataset_config(f"{{path: {jsonl}, eval_fraction: 0.5}}")
    config.rewards.functions = [by_level]
    config.rewards.timeout = None
    task = build_task(config)
    prompts = task.eval_prompts()[:2]
    result = task.score(prompts, [["a", "b"], ["c", "d"]])
    assert seen["level"] == [prompts[0]["level"]] * 2 + [prompts[1]["level"]] * 2
    assert seen["answer"][0] == prompts[0]["answer"] and seen["prompts"][0] == prompts[0]["prompt"]
    assert result.rewards.tolist() == [[float(prompts[0]["level"])] * 2, [float(prompts[1]["level"])] * 2]
    assert not task.grade(prompts, [["a"], ["b"]]).correct.any()  # no gold check: nothing counts as solved


def test_gold_check_and_replace_task_rewards(jsonl):
    options = f"{{path: {jsonl}, answer_column: answer, gold: numeric, extract: whole, eval_fraction: 0.5}}"
    task = build_task(dataset_config(options))
    p = task.eval_prompts()[0]
    grades = task.grade([p], [[p["answer"], "x"]])
    assert grades.rewards.tolist() == [[1.0, 0.0]] and grades.correct.tolist() == [[True, False]]

    def constant(completions, **kwargs):
        return [0.25] * len(completions)

    config = dataset_config(options, "rewards.replace_task_rewards=true", "rewards.timeout=null")
    config.rewards.functions = [constant]
    grades = build_task(config).grade([p], [[p["answer"], "x"]])
    # the gold check is a metric now: the reward is the user's alone, the solve rate still the gold's
    assert grades.rewards.tolist() == [[0.25, 0.25]] and grades.correct.tolist() == [[True, False]]


def test_last_number_gold_check_scores_an_answer_with_its_working(jsonl):
    options = f"{{path: {jsonl}, answer_column: answer, gold: exact, extract: last_number, eval_fraction: 0.5}}"
    task = build_task(dataset_config(options))
    p = task.eval_prompts()[0]
    worked = f"1 + 1 = 2, so the answer is {p['answer']}."
    assert task.grade([p], [[worked, f"{p['answer']} is wrong, it is 9999"]]).rewards.tolist() == [[1.0, 0.0]]


def test_no_reward_at_all_is_a_config_error(jsonl):
    config = dataset_config(f"{{path: {jsonl}}}")
    with pytest.raises(ConfigError, match="no reward of its own.*answer_column is not set.*rewards.functions"):
        build_task(config)


def test_pass_order_covers_every_row_once_per_pass_and_resumes():
    order = PassOrder(10, seed=3)
    gen = torch.Generator().manual_seed(0)
    batches = [order.take(4, gen) for _ in range(5)]  # 20 draws: exactly two passes
    stream = sum(batches, [])
    assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:]) == list(range(10))
    assert stream[:10] != stream[10:]  # a fresh order each pass (seeded by (3, pass))
    # resumed after two batches (mid-pass) from the generator's state alone, in a new task
    gen = torch.Generator().manual_seed(0)
    order.take(4, gen), order.take(4, gen)
    torch.rand(7, generator=gen)  # the policy samples with the same generator between batches
    saved = gen.get_state()
    straight = [order.take(4, gen) for _ in range(3)]
    restored = torch.Generator()
    restored.set_state(saved)
    assert [PassOrder(10, seed=3).take(4, restored) for _ in range(3)] == straight


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "a", "answer": "1"}\n{"answer": "2"}\n', r"d.jsonl:2: missing column 'prompt'"),
    ('{"prompt": "a", "answer": "1"}\n{"prompt": "b",\n', r"d.jsonl:2: invalid JSON"),
    # a null value is there, and null: not "missing column 'prompt' (found prompt, answer)"
    ('{"prompt": "a", "answer": "1"}\n{"prompt": null, "answer": "2"}\n', r"d.jsonl:2: column 'prompt' is null$"),
    ('', r"d.jsonl: empty"),
    ('{"prompt": [{"role": "user"}], "answer": "1"}\n', r"d.jsonl:1: column 'prompt', message 0: expected"),
    ('{"prompt": "a", "completions": 1}\n', r"column 'completions' clashes"),
])
def test_bad_jsonl_names_file_and_line(tmp_path, content, message):
    (tmp_path / "d.jsonl").write_text(content)
    with pytest.raises(DataError, match=message):
        DatasetTask(tmp_path / "d.jsonl", eval_fraction=0.5)


def test_bad_files_of_other_kinds(tmp_path):
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(DataError, match=r"d.txt: unknown file type '.txt'; expected .jsonl, .json, .csv, .parquet"):
        DatasetTask(tmp_path / "d.txt")
    (tmp_path / "d.json").write_text('[{"prompt": "a"},\n {"prompt": }]')
    with pytest.raises(DataError, match=r"d.json:2: invalid JSON"):
        DatasetTask(tmp_path / "d.json")
    (tmp_path / "d.csv").write_text("question,answer\nq,1\n")
    with pytest.raises(DataError, match=r"d.csv:2: missing column 'prompt' \(found question, answer\)"):
        DatasetTask(tmp_path / "d.csv")
    config = dataset_config(f"{{path: {tmp_path / 'nope.jsonl'}}}")
    with pytest.raises(ConfigError, match="task.options for 'dataset': .*nope.jsonl: no such file"):
        build_task(config)


def test_end_to_end_with_a_python_reward_learns_and_resumes(tmp_path, tiny_model):
    """A tiny LM on chat prompts; the reward (a closure, run in reward worker processes)
    is the fraction of a 3-token completion that is the digit 7: GRPO must raise it."""
    from rlvr.loop.trainer import setup, train

    rows = [{"prompt": [{"role": "user", "content": str(i)}], "hint": "7"} for i in range(12)]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    def sevens(completions, hint, **kwargs):  # hint: a data column, "7" in every row
        return [c[0]["content"].count(h) / 3 for c, h in zip(completions, hint)]  # chat: TRL's message lists

    overrides = [*QUIET, "task.name=dataset", f"task.options={{path: {path}, eval_fraction: 0.25}}",
                 "task.prompts_per_epoch=4", "policy.name=causal_lm", "algo.group_size=8", "algo.inner_steps=2",
                 "algo.deltas=normalized", "algo.epochs=12", "optim.lr=1e-2", "log.eval_every=100", "seed=1",
                 "rewards.timeout=5", "threads=1",
                 f"policy.options={{model: {tiny_model}, max_new_tokens: 3, chat_template: "
                 "'{% for m in messages %}{{ m.content }}={% endfor %}>'}"]
    config = load_config(None, overrides)
    config.rewards.functions = [sevens]
    records = [r for r in train(config) if r["kind"] == "train"]
    rewards = [r["reward_mean"] for r in records]
    assert all(r["reward/sevens/scored"] == 32 for r in records)  # 4 prompts x 8, each scored in a worker
    # measured (seed 1): 0.05 at the first epoch, 0.35 at the fifth, 1.0 at the last two
    assert max(rewards[:2]) < 0.2 and min(rewards[-4:]) > 0.8, rewards
    # 6 epochs + a fresh task and policy resumed from the state after them == 12 straight
    config.algo.epochs = 12
    task, st = setup(config)
    half = load_config(None, [*overrides, "algo.epochs=6"])
    half.rewards.functions = [sevens]
    first = train(half, state=(task, st))
    task2, st2 = setup(config)
    st2.policy.module.load_state_dict(st.policy.module.state_dict())
    st2.optimizer.load_state_dict(st.optimizer.state_dict())
    st2.generator.set_state(st.generator.get_state())
    st2.epoch, st2.step = st.epoch, st.step
    st2.scheduler.load_state_dict(st.scheduler.state_dict())
    rest = train(config, state=(task2, st2))
    task.close(), task2.close()
    resumed = [r["reward_mean"] for r in first + rest if r["kind"] == "train"]
    assert resumed == pytest.approx(rewards, abs=1e-6)


def test_the_dataset_task_knows_when_its_reward_is_the_gold_check():
    options = ["task.name=dataset", "policy.name=causal_lm", "task.prompts=null",
               "task.options={path: examples/data/tiny_math.jsonl, answer_column: answer, gold: numeric}"]
    with build_task(load_config(None, QUIET + options)) as task:
        assert task.reward_is_gold
    extra = ["rewards.functions=['rlvr.rewards.verifiers:math_answer']"]
    with build_task(load_config(None, QUIET + options + extra)) as task:
        assert not task.reward_is_gold
