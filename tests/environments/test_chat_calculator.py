"""ChatCalculator: the chat messages it starts from, and its gold check on the answer turn."""

import pytest

from rlvr.environments.chat_calculator import PLAIN_SYSTEM, TOOL_SYSTEM, ChatCalculator
from rlvr.environments.games import ENVIRONMENTS


def test_a_seed_gives_the_same_question_and_the_operands_have_their_digits():
    first, again = ChatCalculator().reset(7), ChatCalculator().reset(7)
    assert first == again
    question = first[-1]
    assert question["role"] == "user"
    a, _, b = question["content"].removeprefix("What is ").removesuffix("?").split()
    assert (len(a), len(b)) == (3, 2)
    assert ChatCalculator().reset(8)[-1] != question


def test_with_the_tool_the_example_calls_it_and_answers_with_its_result():
    messages = ChatCalculator().reset({"a": 12, "b": 3})
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert messages[0]["content"] == TOOL_SYSTEM
    assert messages[2]["content"] == "calculator(318*47)"
    assert messages[3]["content"] == str(318 * 47)
    assert messages[4]["content"] == f"318 * 47 = {318 * 47}"
    assert messages[-1]["content"] == "What is 12 * 3?"


def test_the_baseline_has_no_tool_and_no_example_when_asked():
    plain = ChatCalculator(use_tools=False).reset({"a": 12, "b": 3})
    assert [m["role"] for m in plain] == ["system", "user", "assistant", "user"]
    assert plain[0]["content"] == PLAIN_SYSTEM and "calculator" not in str(plain)
    bare = ChatCalculator(use_tools=False, example=False, operator="+").reset({"a": 12, "b": 3})
    assert bare == [{"role": "system", "content": PLAIN_SYSTEM}, {"role": "user", "content": "What is 12 + 3?"}]


@pytest.mark.parametrize(("text", "solved"), [
    ("12 * 3 = 36", True), ("36", True), ("The answer is 36.", True), ("36 or 37", False), ("35", False),
    ("36.5", False), ("no number", False), ("", False),
    # compared as numbers, as the dataset's last_number check does
    ("12 * 3 = 36.0", True), ("36.00", True), ("036", True), ("-36", False),
    ("9" * 5000, False),  # bounded: int() of this many digits would raise
])
def test_the_answer_is_the_last_number_of_the_turn(text, solved):
    env = ChatCalculator()
    env.reset({"a": 12, "b": 3})
    step = env.step(text)
    assert (step.solved, step.reward, step.done, step.observation) == (solved, float(solved), True, None)


def test_commas_and_signs_are_read():
    env = ChatCalculator(digits=(4, 4), operator="-")
    env.reset({"a": 1000, "b": 3000})
    assert env.step("1,000 - 3,000 = -2,000").solved
    env = ChatCalculator(digits=(4, 4), operator="+")
    env.reset({"a": 1234, "b": 1000})
    assert env.step("2,234").solved


def test_bad_settings_and_starts_are_named():
    with pytest.raises(ValueError, match="operator"):
        ChatCalculator(operator="/")
    with pytest.raises(ValueError, match="digits"):
        ChatCalculator(digits=(3, 0))
    with pytest.raises(ValueError, match="integer 'a' and 'b'"):
        ChatCalculator().reset({"a": "1", "b": 2})
    with pytest.raises(ValueError, match="int seed or a row"):
        ChatCalculator().reset("7")
    with pytest.raises(RuntimeError, match="reset"):
        ChatCalculator().step("1")


def test_it_is_a_ready_environment():
    assert ENVIRONMENTS["chat_calculator"] is ChatCalculator
