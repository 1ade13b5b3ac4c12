"""The ready environments (guessing game, calculator arithmetic, retry wrapper) driven by
hand, their seeds, and their SFT demonstrations replayed through them."""

from __future__ import annotations

import pickle
import random

import pytest

from rlvr.base.data import read_jsonl
from rlvr.environments.base import ToolResult
from rlvr.environments.games import (
    ENVIRONMENTS,
    CalculatorArithmetic,
    ChatCalculator,
    GuessingGame,
    parse_integer,
    write_sft_jsonl,
)
from rlvr.environments.retry import RETRY_MESSAGE, GoldCheck, RetryEnvironment, gold_check
from rlvr.environments.tool_parsing import PLAIN_ARGUMENT, format_tool_results, parse_tool_calls
from rlvr.environments.tools import TOOLS
from rlvr.modeling import DEFAULT_CHARS, PRINTABLE
from rlvr.rewards import RewardSpec


def replay(env, start, pairs, tool_result=None, turn_end=""):
    """Drive ``env`` from ``start`` with the completions of ``pairs``, checking that each
    pair's prompt is the transcript so far (prompt, turns, each with ``turn_end`` after it,
    and observations concatenated). A completion that ``tool_result`` answers (a tool call)
    gets that text, as the runner would, instead of reaching step(). Returns the steps."""
    transcript = env.reset(start)
    steps = []
    for number, (prompt, completion) in enumerate(pairs):
        assert prompt == transcript, f"pair {number}"
        result = tool_result(completion) if tool_result else None
        if result is not None:
            transcript += completion + turn_end + result
            continue
        step = env.step(completion)
        steps.append(step)
        if step.done:
            assert number == len(pairs) - 1, "the episode ended before its last pair"
            break
        transcript += completion + turn_end + step.observation
    return steps


# ---- parsing


@pytest.mark.parametrize("text, value", [
    ("16", 16), (" 7\n", 7), ("-5", -5), ("007", 7), ("9" * 100, int("9" * 100)),
    ("", None), ("abc", None), ("12x", None), ("1 2", None), ("+5", None), ("9" * 101, None), ("٣", None),
])
def test_parse_integer_reads_only_a_plain_integer(text, value):
    assert parse_integer(text) == value


# ---- guessing game


def test_guessing_game_by_hand_direction_feedback_and_reward_on_the_solving_step():
    game = GuessingGame()
    assert game.reset({"target": 22}) == "1-32>"
    first = game.step("16")
    assert (first.observation, first.reward, first.done, first.solved) == (" +>", 0.0, False, False)
    second = game.step("24")
    assert (second.observation, second.reward, second.done) == (" ->", 0.0, False)
    third = game.step("22")
    # the third turn: 1 - 0.1 * (3 - 1) = 0.8, all of the return on this step
    assert (third.observation, third.done, third.solved) == (None, True, True)
    assert third.reward == pytest.approx(0.8)
    with pytest.raises(RuntimeError):
        game.step("22")


def test_guessing_reward_decays_by_a_tenth_per_turn_and_stops_at_a_tenth():
    def reward_after(wrong_turns):
        game = GuessingGame()
        game.reset({"target": 5})
        for _ in range(wrong_turns):
            assert game.step("6").reward == 0.0
        return game.step("5").reward

    assert reward_after(0) == 1.0
    assert reward_after(4) == pytest.approx(0.6)  # fifth turn
    assert reward_after(8) == pytest.approx(0.2)  # ninth turn
    assert reward_after(9) == pytest.approx(0.1)  # tenth: 1 - 0.9
    assert reward_after(15) == pytest.approx(0.1)  # 1 - 1.5 would be negative: the floor of a solve


@pytest.mark.parametrize("text, observation", [
    ("", " 1-32>"), ("abc", " 1-32>"), ("12x", " 1-32>"), ("9" * 101, " 1-32>"),  # not numbers: the range again
    ("9" * 50, " ->"), ("-5", " +>"), ("0", " +>"), ("33", " ->"), (" 20 ", " +>"),  # numbers, in range or not
])
def test_guessing_odd_text_and_out_of_range_numbers(text, observation):
    game = GuessingGame()
    game.reset({"target": 22})
    step = game.step(text)
    assert (step.observation, step.reward, step.done, step.solved) == (observation, 0.0, False, False)
    assert game.step("22").reward == pytest.approx(0.9)  # the odd turn counted as a turn


def test_guessing_interval_feedback_states_the_range_left_open():
    game = GuessingGame(feedback="interval")
    game.reset({"target": 22})
    assert game.step("16").observation == " 17-32>"
    assert game.step("abc").observation == " 17-32>"
    assert game.step("24").observation == " 17-23>"
    assert game.step("99").observation == " 17-23>"  # too high, outside the range: nothing narrows
    assert game.step("5").observation == " 17-23>"  # too low, outside it: nor here
    assert game.step("21").observation == " 22-23>"
    step = game.step("22")
    assert step.solved and step.reward == pytest.approx(0.4)  # the seventh turn: 1 - 0.1 * 6


def test_binary_search_on_the_feedback_alone_solves_every_target_within_six_turns():
    for target in range(1, 33):
        game = GuessingGame()
        low, high = 1, 32
        game.reset({"target": target})
        for _ in range(6):
            guess = (low + high) // 2
            step = game.step(str(guess))
            if step.done:
                break
            assert step.observation in (" +>", " ->")
            low, high = (guess + 1, high) if step.observation == " +>" else (low, guess - 1)
        assert step.solved, target
        assert step.reward >= 0.5


def test_guessing_max_turns_ends_unsolved_and_a_solve_on_the_last_turn_still_counts():
    game = GuessingGame(max_turns=2)
    game.reset({"target": 3})
    assert not game.step("4").done
    last = game.step("5")
    assert (last.observation, last.reward, last.done, last.solved) == (None, 0.0, True, False)
    game.reset({"target": 3})
    game.step("4")
    assert game.step("3").reward == pytest.approx(0.9)


def test_guessing_seed_fixes_the_target():
    targets = []
    for seed in range(60):
        a, b = GuessingGame(), GuessingGame()
        assert a.reset(seed) == b.reset(seed) == "1-32>"
        assert a.target == b.target == random.Random(seed).randint(1, 32)
        targets.append(a.target)
    assert len(set(targets)) > 15 and min(targets) >= 1 and max(targets) <= 32
    wide = GuessingGame(low=0, high=1000)
    assert wide.reset(3) == "0-1000>" and wide.target == random.Random(3).randint(0, 1000)


@pytest.mark.parametrize("start", [
    {"target": 0}, {"target": 33}, {"target": "5"}, {"target": True}, {}, "5", True, 2.0,
])
def test_guessing_refuses_bad_starts(start):
    with pytest.raises(ValueError):
        GuessingGame().reset(start)


def test_guessing_refuses_bad_settings_and_a_step_before_reset():
    for kwargs in ({"low": 5, "high": 5}, {"low": -1}, {"feedback": "warmer"}, {"max_turns": 0}):
        with pytest.raises(ValueError):
            GuessingGame(**kwargs)
    with pytest.raises(RuntimeError):
        GuessingGame().step("3")


@pytest.mark.parametrize("feedback", GuessingGame.FEEDBACK)
def test_guessing_demonstrations_replay_to_a_solve_inside_the_open_range(feedback):
    game = GuessingGame(feedback=feedback)
    rng = random.Random(0)
    for seed in range(40):
        pairs = game.demonstration(seed, rng)
        env = GuessingGame(feedback=feedback)
        steps = replay(env, seed, pairs)
        assert steps[-1].solved and steps[-1].done and len(steps) == len(pairs)
        assert all(int(guess) <= 32 and int(guess) >= 1 for _, guess in pairs)
        texts = "".join(p + c for p, c in pairs)
        assert set(texts) <= set(game.chars) <= set(DEFAULT_CHARS)


def test_guessing_demonstrations_guess_inside_the_range_left_open_and_leave_turns_to_save():
    game = GuessingGame()
    rng = random.Random(1)
    demo_turns, binary_turns = [], []
    for seed in range(300):
        env = GuessingGame()
        env.reset(seed)
        for _, guess in game.demonstration(seed, rng):
            assert env.open_low <= int(guess) <= env.open_high  # never a guess the feedback already ruled out
            env.step(guess)
        demo_turns.append(env.turns)
        low, high, turns = 1, 32, 0
        while True:
            turns, guess = turns + 1, (low + high) // 2
            if guess == env.target:
                break
            low, high = (guess + 1, high) if guess < env.target else (low, guess - 1)
        binary_turns.append(turns)
    demo_mean, binary_mean = sum(demo_turns) / 300, sum(binary_turns) / 300
    # binary search averages 135/32 = 4.2 turns over 32 numbers, random pivots about 5.4
    assert demo_mean > binary_mean + 0.7, (demo_mean, binary_mean)
    assert max(demo_turns) > 6


def test_guessing_demonstrations_solve_within_max_turns():
    game = GuessingGame(max_turns=6)
    rng = random.Random(2)
    for seed in range(100):
        pairs = game.demonstration(seed, rng)
        assert len(pairs) <= 6
        assert replay(GuessingGame(max_turns=6), seed, pairs)[-1].solved


def test_guessing_sft_examples_are_whole_demonstrations_in_order():
    pairs = GuessingGame().sft_examples(50, random.Random(7))
    assert len(pairs) == 50
    assert pairs == GuessingGame().sft_examples(50, random.Random(7))
    assert pairs != GuessingGame().sft_examples(50, random.Random(8))
    rng = random.Random(7)
    first = GuessingGame().demonstration(rng.getrandbits(62), rng)
    assert pairs[: len(first)] == first
    assert pairs[len(first)][0] == "1-32>"  # the next episode starts at its prompt
    assert GuessingGame().sft_examples(0, random.Random(7)) == []


# ---- calculator arithmetic


def test_calculator_by_hand():
    task = CalculatorArithmetic()
    assert task.reset({"a": 12345, "b": 67890}) == "12345+67890="
    step = task.step("80235")
    assert (step.observation, step.reward, step.done, step.solved) == (None, 1.0, True, True)
    with pytest.raises(RuntimeError):
        task.step("80235")


@pytest.mark.parametrize("text, solved", [
    (" 80235\n", True), ("80236", False), ("", False), ("abc", False), ("80235x", False),
    ("calculator(12345+67890)", False), ("9" * 300, False), ("-80235", False),
])
def test_calculator_answer_parsing(text, solved):
    task = CalculatorArithmetic()
    task.reset({"a": 12345, "b": 67890})
    step = task.step(text)
    assert step.done and step.solved is solved and step.reward == float(solved)


def test_calculator_seed_fixes_numbers_of_the_given_length():
    seen = set()
    for seed in range(30):
        a, b = CalculatorArithmetic(digits=8), CalculatorArithmetic(digits=8)
        assert a.reset(seed) == b.reset(seed) == f"{a.a}+{a.b}="
        assert 10**7 <= a.a < 10**8 and 10**7 <= a.b < 10**8
        seen.add(a.a)
    assert len(seen) == 30
    for start in ({"a": 1}, {"a": 1, "b": "2"}, {"a": -1, "b": 2}, [1, 2]):
        with pytest.raises(ValueError):
            CalculatorArithmetic().reset(start)
    with pytest.raises(ValueError):
        CalculatorArithmetic(digits=0)


def test_calculator_tool_variants():
    with_tools, without = CalculatorArithmetic(), CalculatorArithmetic(use_tools=False)
    assert with_tools.tool_names == ("calculator",) and without.tool_names == ()
    assert with_tools.tools() == {} and without.tools() == {}
    assert set(without.chars) <= set(DEFAULT_CHARS)
    assert set(with_tools.chars) <= set(PRINTABLE) and "\n" in with_tools.chars


def calculator_result(completion):
    """What the runner feeds back for a turn that calls the calculator in the plain style:
    the call parsed, run by the calculator tool, its result formatted (None: a turn without
    calls, which goes to step())."""
    calls, errors = parse_tool_calls(completion, "plain", {"calculator"})
    assert not errors
    if not calls:
        return None
    (call,) = calls
    content = TOOLS["calculator"](call.arguments[PLAIN_ARGUMENT])
    return format_tool_results([ToolResult("calculator", content)], "plain")


def test_calculator_demonstrations_call_the_tool_then_answer_its_result():
    task = CalculatorArithmetic(digits=6)
    pairs = task.demonstration({"a": 123456, "b": 654321})
    assert pairs == [
        ("123456+654321=", "calculator(123456+654321)"),
        ("123456+654321=calculator(123456+654321)= 777777\n", "777777"),
    ]
    for seed in range(20):
        pairs = task.demonstration(seed)
        steps = replay(CalculatorArithmetic(digits=6), seed, pairs, calculator_result)
        assert len(steps) == 1 and steps[0].solved
        assert set("".join(p + c for p, c in pairs)) <= set(task.chars)


def test_calculator_baseline_demonstrations_answer_directly():
    task = CalculatorArithmetic(use_tools=False)
    assert task.demonstration({"a": 12345, "b": 67890}) == [("12345+67890=", "80235")]
    pairs = task.sft_examples(25, random.Random(0))
    assert len(pairs) == 25 and len({p for p, _ in pairs}) == 25
    for prompt, answer in pairs:
        a, b = prompt[:-1].split("+")
        assert int(answer) == int(a) + int(b)
        assert set(prompt + answer) <= set(DEFAULT_CHARS)


def test_calculator_sft_examples_keep_each_episode_whole_but_the_last():
    pairs = CalculatorArithmetic().sft_examples(5, random.Random(3))
    assert len(pairs) == 5
    assert [c.startswith("calculator(") for _, c in pairs] == [True, False, True, False, True]
    assert pairs[1][0].startswith(pairs[0][0] + pairs[0][1])


def test_texts_encode_with_a_character_tokenizer_over_the_environment_chars():
    pytest.importorskip("transformers")
    from rlvr.modeling import build_char_tokenizer

    for env in (GuessingGame(), CalculatorArithmetic(), CalculatorArithmetic(use_tools=False)):
        tokenizer = build_char_tokenizer(env.chars)
        for prompt, completion in env.sft_examples(6, random.Random(0)):
            ids = tokenizer(prompt + completion, add_special_tokens=False)["input_ids"]
            assert len(ids) == len(prompt + completion) and tokenizer.decode(ids) == prompt + completion


def test_turn_end_puts_the_eos_id_after_each_earlier_turn_as_an_episode_context_has_it():
    pytest.importorskip("transformers")
    from rlvr.modeling import build_char_tokenizer

    tokenizer = build_char_tokenizer(GuessingGame().chars)

    def encode(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    pairs = GuessingGame().demonstration({"target": 22}, random.Random(4), turn_end=tokenizer.eos_token)
    assert len(pairs) >= 2
    assert replay(GuessingGame(), {"target": 22}, pairs, turn_end="<eos>")[-1].solved
    # the episode's context: prompt ids, then each policy turn's ids ending with EOS, then the observation's
    game = GuessingGame()
    context = encode(game.reset({"target": 22}))
    for prompt, guess in pairs:
        assert encode(prompt) == context
        observation = game.step(guess).observation
        context += encode(guess) + [tokenizer.eos_token_id] + encode(observation or "")
    calculator = CalculatorArithmetic().demonstration(0, turn_end="<eos>")
    assert replay(CalculatorArithmetic(), 0, calculator, calculator_result, turn_end="<eos>")[-1].solved


# ---- JSONL and the registry


def test_sft_jsonl_reads_back_as_rlvr_sft_reads_it(tmp_path):
    pairs = CalculatorArithmetic().sft_examples(6, random.Random(0)) + GuessingGame().sft_examples(6, random.Random(0))
    path = write_sft_jsonl(pairs, tmp_path / "demos.jsonl")
    rows = read_jsonl(path, {"prompt": str, "completion": str})
    assert [(r["prompt"], r["completion"]) for r in rows] == pairs


def test_registry_builds_each_environment_with_its_options():
    assert ENVIRONMENTS == {"guessing": GuessingGame, "calculator_arithmetic": CalculatorArithmetic,
                            "chat_calculator": ChatCalculator}
    assert ENVIRONMENTS["guessing"](high=64).reset({"target": 40}) == "1-64>"
    assert ENVIRONMENTS["calculator_arithmetic"](digits=3, use_tools=False).tool_names == ()
    for cls in (GuessingGame, CalculatorArithmetic):  # text episodes for character models
        env = cls()
        assert isinstance(env.reset(0), str) and env.tools() == {}
    chat = ChatCalculator(operator="+")  # chat episodes
    assert chat.reset(0)[-1]["role"] == "user" and chat.tools() == {}


# ---- retry wrapper


def answer_check(row, text):
    return text.strip() == row["answer"]


def test_retry_by_hand_wrong_then_right():
    env = RetryEnvironment(answer_check, max_attempts=3)
    row = {"prompt": "12+7*3=", "answer": "33"}
    assert env.reset(row) == "12+7*3="
    wrong = env.step("35")
    assert (wrong.observation, wrong.reward, wrong.done, wrong.solved) == (" 12+7*3=", 0.0, False, False)
    right = env.step("33")
    assert (right.observation, right.reward, right.done, right.solved) == (None, 1.0, True, True)
    with pytest.raises(RuntimeError):
        env.step("33")


def test_retry_gives_up_after_max_attempts_and_penalty_decays_the_reward():
    env = RetryEnvironment(answer_check, max_attempts=2)
    env.reset({"prompt": "1+1=", "answer": "2"})
    assert not env.step("").done
    last = env.step("abc")
    assert (last.observation, last.reward, last.done, last.solved) == (None, 0.0, True, False)
    env = RetryEnvironment(answer_check, max_attempts=5, penalty=0.25)
    env.reset({"prompt": "1+1=", "answer": "2"})
    env.step("3")
    env.step("4")
    assert env.step("2").reward == pytest.approx(0.5)  # third attempt: 1 - 0.25 * 2
    for kwargs in ({"max_attempts": 0}, {"penalty": -0.1}, {"penalty": 1.5}):
        with pytest.raises(ValueError):
            RetryEnvironment(answer_check, **kwargs)
    with pytest.raises(ValueError):
        env.reset({"answer": "2"})


def test_retry_wraps_the_arithmetic_task_gold_check():
    from rlvr.tasks.arithmetic import ArithmeticTask

    check = gold_check(ArithmeticTask())
    assert check.spec.name == "exact_answer"
    row = {"prompt": "12+7*3=", "answer": "33"}
    assert check(row, "33") and check(row, " 33\n")
    assert not any(check(row, text) for text in ("34", "", "abc", "33x", "9" * 200))
    assert pickle.loads(pickle.dumps(check))(row, "33")  # it travels to rollout workers
    env = RetryEnvironment(check, max_attempts=2)
    env.reset(row)
    assert env.step("34").observation == " 12+7*3="
    assert env.step("33").solved


def test_gold_check_counts_only_a_scored_one_as_right():
    def abstains(prompts, completions, **kw):
        return [None]

    def half(prompts, completions, **kw):
        return [0.5]

    def wrong_count(prompts, completions, **kw):
        return [1.0, 1.0]

    def raises(prompts, completions, **kw):
        raise KeyError("answer")

    row = {"prompt": "p", "answer": "a"}
    for fn in (abstains, half, wrong_count):
        assert not GoldCheck(RewardSpec(fn))(row, "a")
    with pytest.raises(KeyError):
        GoldCheck(RewardSpec(raises))(row, "a")

    class NoGold:
        name, gold_reward = "free", None

        def reward_specs(self):
            return [RewardSpec(half)]

    with pytest.raises(ValueError, match="no gold check"):
        gold_check(NoGold())


def test_retry_on_a_chat_row_sends_messages():
    seen = []

    def check_messages(prompts, completions, answer, **kw):
        seen.append(completions[0])
        return [float(completions[0][0]["content"] == answer[0])]

    env = RetryEnvironment(GoldCheck(RewardSpec(check_messages)), max_attempts=3)
    row = {"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"}
    assert env.reset(row) == row["prompt"]
    assert env.step("3").observation == [{"role": "user", "content": RETRY_MESSAGE}]
    assert env.step("2").solved
    assert seen[0] == [{"role": "assistant", "content": "3"}]
    custom = RetryEnvironment(answer_check, retry_text=" no>")
    custom.reset({"prompt": "1+1=", "answer": "2"})
    assert custom.step("3").observation == " no>"


def test_retry_demonstration_replays_through_the_environment():
    env = RetryEnvironment(answer_check, max_attempts=3)
    row = {"prompt": "12+7*3=", "answer": "33"}
    pairs = env.demonstration(row, ["35", "33"])
    assert pairs == [("12+7*3=", "35"), ("12+7*3=35 12+7*3=", "33")]
    assert env.demonstration(row, ["35", "33"], turn_end="<eos>")[1] == ("12+7*3=35<eos> 12+7*3=", "33")
    assert replay(RetryEnvironment(answer_check, max_attempts=3), row, pairs)[-1].solved
    assert set("".join(p + c for p, c in pairs)) <= set(DEFAULT_CHARS)
    with pytest.raises(ValueError, match="running"):
        env.demonstration(row, ["35"])
    with pytest.raises(ValueError, match="ended"):
        env.demonstration(row, ["33", "33"])
