"""TRL environment_factory classes as rlvr Environments, driven by hand; loading one named
"module:Class" from the working directory, and the errors for specs that do not load."""

import pickle
import sys

import pytest

from rlvr.base.errors import ConfigError
from rlvr.environments.adapters import TRLEnvironment, environment_from_factory, load_environment_factory
from rlvr.environments.base import Step

WHERE = "task.options.environment_factory"


class GuessingGame:
    """TRL-style: reset(**row) reads the row's target; guess is the tool; reward and solved
    are attributes, as TRL's examples keep them for a reward function."""

    def reset(self, target, **row):
        self.target, self.guesses, self.reward, self.solved = target, 0, 0.0, False
        return " Use the guess tool."

    def guess(self, n: int) -> str:
        """Guess the number.

        Args:
            n: the guess
        """
        self.guesses += 1
        if n == self.target:
            self.reward, self.solved = 1.0 / self.guesses, True
            return "correct"
        return "higher" if n < self.target else "lower"

    def _check(self):  # private: not a tool
        return self.target


class Counter:
    """TRL's documented form: get_reward owns the reward (it wins over a reward attribute);
    async methods; reset seeded from an int."""

    reward = 5.0

    def reset(self, seed=0, quiet=False, **row):
        self.count, self.goal = 0, seed
        return None if quiet else f"Count to {seed}."

    async def increment(self, step: int) -> int:
        """Add step."""
        self.count += step
        return self.count

    async def get_reward(self) -> float:
        return float(self.count == self.goal)


class OwnEnvironment:
    """rlvr's own Environment: used as it is."""

    def reset(self, start):
        return "go"

    def step(self, text):
        return Step(reward=1.0, done=True, solved=True)

    def tools(self):
        return {}


def test_a_trl_environment_driven_by_hand():
    env = TRLEnvironment(GuessingGame())
    row = {"prompt": [{"role": "system", "content": "Play."}, {"role": "user", "content": "Find it."}], "target": 7}
    prompt = env.reset(row)
    # reset's text appended to the last message as TRL appends it; the row itself untouched.
    assert prompt == [{"role": "system", "content": "Play."},
                      {"role": "user", "content": "Find it. Use the guess tool."}]
    assert row["prompt"][-1]["content"] == "Find it."
    tools = env.tools()
    assert set(tools) == {"guess"}
    assert [tools["guess"](n) for n in (3, 9, 7)] == ["higher", "lower", "correct"]
    # The turn without a tool call ends the episode; solved in 3 guesses: reward 1/3.
    assert env.step("It is 7.") == Step(observation=None, reward=pytest.approx(1 / 3), done=True, solved=True)


def test_an_unsolved_episode_and_text_prompts():
    env = TRLEnvironment(GuessingGame())
    assert env.reset({"prompt": "Find it.", "target": 2}) == "Find it. Use the guess tool."
    env.tools()["guess"](1)
    assert env.step("no idea") == Step(reward=0.0, done=True, solved=False)


def test_get_reward_wins_and_async_methods_run():
    env = TRLEnvironment(Counter())
    # An int seed reaches reset(seed=...); with no row prompt, reset's text is the user message.
    assert env.reset(3) == [{"role": "user", "content": "Count to 3."}]
    assert env.tools()["increment"](2) == 2
    assert env.tools()["increment"].__doc__ == "Add step."
    assert env.step("done").reward == 0.0  # get_reward: 2 != 3 (the reward attribute 5.0 is not read)
    env.tools()["increment"](1)
    assert env.step("done") == Step(reward=1.0, done=True, solved=None)


def test_a_row_without_a_prompt_needs_reset_text():
    with pytest.raises(ValueError, match="no 'prompt' and reset returned nothing"):
        TRLEnvironment(Counter()).reset({"seed": 2, "quiet": True})
    assert TRLEnvironment(Counter()).reset({"prompt": [{"role": "user", "content": "hi"}], "quiet": True}) == [
        {"role": "user", "content": "hi"}
    ]


def test_reset_without_seed_is_called_bare():
    class Fixed:
        def reset(self):
            self.reward = 0.5
            return "Go."

    env = TRLEnvironment(Fixed())
    assert env.reset(11) == [{"role": "user", "content": "Go."}]
    assert env.tools() == {}
    assert env.step("x").reward == 0.5


def test_a_non_numeric_reward_is_an_error():
    class Bad(GuessingGame):
        def get_reward(self):
            return "high"

    env = TRLEnvironment(Bad())
    env.reset({"prompt": "p", "target": 1})
    with pytest.raises(TypeError, match=r"Bad.get_reward\(\) is 'high', not a number"):
        env.step("x")


def test_environment_from_factory_picks_the_kind():
    assert environment_from_factory(OwnEnvironment) is OwnEnvironment
    make = environment_from_factory(GuessingGame)
    first, second = make(), make()
    assert isinstance(first, TRLEnvironment) and isinstance(first.instance, GuessingGame)
    assert first.instance is not second.instance  # one instance per episode
    assert isinstance(pickle.loads(pickle.dumps(make))(), TRLEnvironment)  # travels to rollout workers
    # A factory function: its result decides.
    assert isinstance(environment_from_factory(lambda: OwnEnvironment())(), OwnEnvironment)
    assert isinstance(environment_from_factory(lambda: GuessingGame())(), TRLEnvironment)


def test_environment_from_factory_refuses_other_things():
    class Neither:
        def guess(self, n):
            return n

    with pytest.raises(ConfigError, match="environment_factory: class Neither has neither step"):
        environment_from_factory(Neither)
    with pytest.raises(ConfigError, match="expected an environment class or a factory, got int 3"):
        environment_from_factory(3)
    with pytest.raises(TypeError, match="Neither has no reset method"):
        TRLEnvironment(Neither())


@pytest.fixture
def envs_dir(tmp_path, monkeypatch):
    """A working directory holding env modules; sys.path and sys.modules restored after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("rlvr_test_envs"):
            del sys.modules[name]


def test_load_environment_factory_from_the_working_directory(envs_dir):
    (envs_dir / "rlvr_test_envs_a.py").write_text(
        "class Game:\n"
        "    def reset(self, **row):\n"
        "        return 'hello'\n"
        "    def poke(self) -> str:\n"
        "        return 'ouch'\n"
    )
    factory = load_environment_factory("rlvr_test_envs_a:Game", WHERE)
    assert factory.__name__ == "Game"
    env = environment_from_factory(factory, WHERE)()
    assert env.reset({"prompt": "Say "}) == "Say hello"
    assert env.tools()["poke"]() == "ouch"


def test_load_environment_factory_errors_name_where(envs_dir):
    (envs_dir / "rlvr_test_envs_b.py").write_text(
        "class Game:\n    def reset(self, **row):\n        pass\n"
        "class Plain:\n    pass\n"
        "LIMIT = 3\n"
    )
    (envs_dir / "rlvr_test_envs_broken.py").write_text("1 / 0\n")
    cases = {
        "rlvr_test_envs_b": "expected 'module:Class'",
        "rlvr_test_envs_b:": "expected 'module:Class'",
        "rlvr_test_envs_nope:Game": "no module named 'rlvr_test_envs_nope'",
        "rlvr_test_envs_b:Gmae": "module 'rlvr_test_envs_b' has no 'Gmae'; it defines: Game, Plain",
        "rlvr_test_envs_b:Plain": "class Plain has neither step",
        "rlvr_test_envs_b:LIMIT": "expected an environment class or a factory, got int 3",
        "rlvr_test_envs_broken:Game": "importing 'rlvr_test_envs_broken' raised ZeroDivisionError",
    }
    for spec, expected in cases.items():
        with pytest.raises(ConfigError) as raised:
            load_environment_factory(spec, WHERE)
        message = str(raised.value)
        assert message.startswith(f"{WHERE}: {spec!r}: "), message
        assert expected in message, message
        assert "reward function" not in message, message


class Incrementer:
    """A TRL-style class whose tool takes an int, as TRL's examples annotate it."""

    def reset(self, **row):
        self.total = 0
        return "count"

    def increment(self, step: int, twice: bool = False) -> int:
        """Add to the total."""
        self.total += step * (2 if twice else 1)
        return self.total


def test_plain_tool_arguments_arrive_as_their_annotated_types():
    from rlvr.environments.calls import _OPERATIONS
    from rlvr.environments.tool_parsing import call_arguments, parse_tool_calls, typed_arguments

    envs = {0: TRLEnvironment(Incrementer())}
    envs[0].reset({"prompt": "go"})
    (call,), errors = parse_tool_calls("increment(3)", "plain", ["increment"])
    assert not errors and call.arguments == {"_": "3"}  # a plain call's argument is text
    assert _OPERATIONS["tool"](envs, 0, "increment", *call_arguments(call.arguments)) == "3"
    assert _OPERATIONS["tool"](envs, 0, "increment", (" 4 ",), {"twice": "true"}) == "11"
    with pytest.raises(ValueError, match="argument 'step' must be int, got 'three'"):
        typed_arguments(Incrementer().increment, ("three",), {})
    assert typed_arguments(Incrementer().increment, (2.5,), {}) == ((2.5,), {})  # not text: passed as it is
