"""The ready verifiers, and reward functions loaded from the working directory or given as callables."""

from __future__ import annotations

import functools

import pytest

from rlvr.base.errors import ConfigError
from rlvr.rewards import RewardRunner, RewardSpec, load_reward_function, load_reward_specs
from rlvr.rewards.verifiers import (
    answer_format,
    exact_match,
    extract_answer,
    math_answer,
    numeric_match,
    parse_number,
    regex_reward,
)


def test_extract_answer_rules():
    text = "x \\boxed{\\frac{1}{2}} <answer> 3 </answer> then <answer>4</answer> \\boxed{{5}}"
    assert extract_answer(text) == "4"  # auto: the last answer tag before any box
    assert extract_answer(text, "boxed") == "{5}"  # the last box, nested braces kept whole
    assert extract_answer("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_answer("\\boxed{1") is None  # the brace never closes
    assert extract_answer("no answer here") is None and extract_answer(" 7 ", "whole") == "7"
    with pytest.raises(ValueError, match="extract='box' is not allowed"):
        extract_answer("", "box")


def test_last_number_reads_the_final_number_of_running_text():
    # an instruct model's usual answer: the working, then the result, then a full stop
    assert extract_answer("17 + 21 = 38.", "last_number") == "38"
    assert extract_answer("It costs $1,234.50 in total; that is -3.5 less than -1,000", "last_number") == "-1,000"
    assert extract_answer([{"role": "assistant", "content": "The answer is 42.\n"}], "last_number") == "42"
    assert extract_answer("no digits here", "last_number") is None
    assert exact_match(["12 + 30 = 42", "42 is it? No, 41", "forty-two"], ["42"] * 3, extract="last_number") \
        == [1.0, 0.0, 0.0]
    assert numeric_match(["The total is 1,000."], ["1000"], extract="last_number") == [1.0]


@pytest.mark.parametrize("completion, gold", [
    ("The total is 1,234.", "1234"),  # thousands commas dropped
    ("1234", "1,234"),  # on the gold's side too
    ("79.0", "79"),  # numbers compared as numbers
    ("It costs $5.", "$5.00"),  # "$" and a final "." dropped
    ("-0", "0"),
    ("between 12-15", "15"),  # a hyphen between two numbers is a range: its end, not -15
    ("x-3", "3"),  # after a letter, a hyphen joins, it is no sign
])
def test_last_number_reads_numbers_as_lm_eval_flexible_extract(completion, gold):
    assert exact_match([completion], [gold], extract="last_number") == [1.0]


@pytest.mark.parametrize("completion, gold", [
    ("12-15", "-15"),
    ("1,234", "123"),
    ("79.01", "79"),
    ("12345678901234567891", "12345678901234567890"),  # exact, not as floats (equal past 2**53)
    ("100", "1e2"),  # a gold with an exponent is read as text
])
def test_last_number_tells_different_numbers_apart(completion, gold):
    assert exact_match([completion], [gold], extract="last_number") == [0.0]


def test_last_number_rewards_the_last_number_whatever_comes_before_it():
    # the chosen rule, as lm-eval's flexible extract: only the last number is read, so a reply that
    # states a wrong answer first is rewarded; a format reward or another extract asks for a form
    reply = "8The answer is 8\nThe number 77 is ahemm"
    assert exact_match([reply, reply], ["77", "8"], extract="last_number") == [1.0, 0.0]
    assert exact_match([reply], ["8"], extract="whole") == [0.0]


def test_math_answer_plain_and_latex_golds():
    pytest.importorskip("math_verify")
    completions = ["<answer>\\frac{1}{2}</answer>", "\\boxed{0.5}", "<answer>x^2+1</answer>",
                   "<answer>18 dollars</answer>", "<answer>3</answer>", "no tags: 7", "<answer>1</answer>"]
    golds = ["1/2", "\\frac{1}{2}", "1+x^2", "18", "\\sqrt{2}", "7", ""]
    # right, right (LaTeX gold), right (^ read as a power, not xor), right (units dropped),
    # wrong, no answer found (0, not the bare text), gold does not parse (abstain)
    assert math_answer(completions, golds) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, None]


def test_exact_and_numeric_match():
    assert exact_match(["<answer> Paris </answer>", "<answer>paris</answer>", "Paris"], ["Paris"] * 3) == [1, 0, 0]
    assert exact_match(["12"], [12], extract="whole") == [1.0]  # a non-string gold compared as text
    assert parse_number("$1,234.5") == 1234.5 and parse_number("50%") == 50.0 and parse_number("1 2") is None
    completions = [f"<answer>{a}</answer>" for a in ("1,000", "0.3333333", "3.01", "x")]
    assert numeric_match(completions, ["1000", 1 / 3, "3", "1"], rel_tol=1e-6) == [1.0, 1.0, 0.0, 0.0]
    assert numeric_match(["<answer>1</answer>"], ["one"]) == [None]  # the gold is no number


def test_format_rewards():
    assert answer_format(["<think>a</think> <answer>1</answer>", "<answer>1</answer>"]) == [1.0, 0.0]
    digits = regex_reward(r"\d+")
    assert digits(prompts=["p", "p"], completions=["123", "12a"]) == [1.0, 0.0]
    with pytest.raises(Exception, match="unterminated|missing"):
        regex_reward("(")


def test_verifiers_load_from_yaml_names():
    for name in ("math_answer", "exact_match", "numeric_match", "answer_format"):
        assert load_reward_function(f"rlvr.rewards.verifiers:{name}").__name__ == name


def test_options_are_keyword_arguments_bound_to_the_function():
    spec, = load_reward_specs([{"function": "rlvr.rewards.verifiers:exact_match", "weight": 0.5,
                                "options": {"extract": "last_number"}}], timeout=None)
    assert spec.name == "exact_match" and spec.weight == 0.5
    assert spec.fn(completions=["3 + 4 = 7", "7 is not it: 8"], answer=["7", "7"]) == [1.0, 0.0]


def test_module_in_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_for_test.py").write_text(
        "def shorter(completions, **kwargs):\n    return [1.0 / (1 + len(c)) for c in completions]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    fn = load_reward_function("my_rewards_for_test:shorter")
    assert fn(completions=["abc"]) == [0.25]
    with pytest.raises(Exception, match=r"no module named 'not_here_either' \(looked on sys.path and in "):
        load_reward_function("not_here_either:f")


def test_callables_bare_or_in_a_dict_and_bad_items():
    def bonus(completions, **kwargs):
        return [1.0] * len(completions)

    specs = load_reward_specs([bonus, {"function": lambda completions, **k: [0.0] * len(completions),
                                       "name": "zero", "weight": 0.5}], timeout=None)
    assert [(s.name, s.weight) for s in specs] == [("bonus", 1.0), ("zero", 0.5)]
    with pytest.raises(Exception, match=r"functions\[0\]: expected 'module:function' or a callable, got int"):
        load_reward_specs([3], timeout=None)


def test_a_closure_runs_in_reward_workers_and_spawn_refuses_it_clearly():
    offset = 0.5

    def closure(completions, **kwargs):  # not picklable: a local function
        return [len(c) + offset for c in completions]

    with RewardRunner([RewardSpec(closure, timeout=5.0)], num_workers=1) as runner:  # fork: inherited
        assert runner(["p", "p"], ["ab", "c"]).rewards.tolist() == [2.5, 1.5]
    with pytest.raises(Exception, match="reward function 'closure' cannot be sent to a 'spawn' worker"):
        RewardRunner([RewardSpec(closure, timeout=5.0)], start_method="spawn")
    partial = functools.partial(exact_match, extract="whole")  # what spawn can receive
    RewardRunner([RewardSpec(partial, timeout=5.0)], start_method="spawn").close()


def test_replace_task_rewards_needs_functions(tmp_path):
    from rlvr.config import load_config
    from rlvr.config.compose import build_task

    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": "2"}\n')
    config = load_config(None, ["task.name=dataset", f"task.options={{path: {path}, answer_column: answer}}",
                                "policy.name=causal_lm", "rewards.replace_task_rewards=true"])
    with pytest.raises(ConfigError, match="replace_task_rewards=true needs rewards.functions"):
        build_task(config)
