"""TextArenaGame: single-player TextArena games driven turn by turn as rlvr Environments.
Runs only where the textarena extra is installed; the games used need no data or network."""

from __future__ import annotations

import pickle
import random
import sys

import pytest

pytest.importorskip("textarena")

from rlvr.base.errors import ConfigError  # noqa: E402
from rlvr.environments.base import Step  # noqa: E402
from rlvr.environments.text_games import TextArenaGame, text_game  # noqa: E402

GUESS = "GuessTheNumber-v0"  # a number in 1..20; the game answers "higher" or "lower"
LOW, HIGH = 1, 20


def binary_search(game: TextArenaGame) -> tuple[list[Step], list[int]]:
    """Play a reset GuessTheNumber episode by bisection until it ends: its steps and guesses."""
    low, high, steps, guesses = LOW, HIGH, [], []
    while not (steps and steps[-1].done):
        guess = (low + high) // 2
        guesses.append(guess)
        steps.append(game.step(f"My guess: [{guess}]"))
        if steps[-1].observation == "The target number is higher.":
            low = guess + 1
        elif steps[-1].observation == "The target number is lower.":
            high = guess - 1
        assert len(steps) <= 5, "bisection over 20 numbers needs at most 5 guesses"
    return steps, guesses


def test_a_seed_gives_the_same_first_observation():
    # LightsOut's first observation shows its random starting grid
    first = [TextArenaGame("LightsOut-v0").reset(seed) for seed in (0, 0, 1, 2, 3)]
    assert first[0] == first[1]
    assert len(set(first[1:])) > 1, "different seeds should give different grids"
    assert TextArenaGame("LightsOut-v0").reset({"seed": 0}) == first[0]


def test_bisection_wins_with_reward_one_and_solved():
    game = TextArenaGame(GUESS)
    prompt = game.reset(5)
    assert "Guess The Number" in prompt and "between 1 and 20" in prompt
    steps, guesses = binary_search(game)
    *middle, last = steps
    for step in middle:  # no reward before the end; the game's hint only (the player's own move is not echoed)
        assert (step.reward, step.done, step.solved) == (0.0, False, None)
        assert step.observation in ("The target number is higher.", "The target number is lower.")
    assert (last.reward, last.done, last.solved) == (1.0, True, True)
    with pytest.raises(RuntimeError, match="call reset"):
        game.step("[1]")
    # the same seed hides the same number: the same guesses win again
    again = TextArenaGame(GUESS)
    again.reset(5)
    assert binary_search(again)[1] == guesses


def test_episodes_keep_their_own_random_state():
    random.seed(123)
    expected = random.random()
    random.seed(123)
    TextArenaGame(GUESS).reset(7)
    assert random.random() == expected, "reset changed the process's random state"
    # 2048 places a random tile after every move: a seed's episode must see the same tiles
    # whether it runs alone or interleaved with another episode and other draws
    game_id, moves = "2048-v0-ultra-easy", ["[up]", "[left]", "[down]", "[right]"] * 2
    alone = TextArenaGame(game_id)
    alone.reset(4)
    boards = [alone.step(move).observation for move in moves]
    mine, other = TextArenaGame(game_id), TextArenaGame(game_id)
    mine.reset(4)
    other.reset(9)
    interleaved = []
    for move in moves:
        interleaved.append(mine.step(move).observation)
        other.step(move)
        random.random()
    assert interleaved == boards
    assert len(set(boards)) > 1


def test_a_loss_scores_its_progress_unsolved():
    scout = TextArenaGame(GUESS)
    scout.reset(11)
    target = binary_search(scout)[1][-1]
    game = TextArenaGame(GUESS, max_turns=2)
    game.reset(11)
    step, guesses = None, []
    for guess in [n for n in range(LOW, HIGH + 1) if n != target][:5]:  # wrong guesses only
        guesses.append(guess)
        step = game.step(f"[{guess}]")
        if step.done:
            break
    assert step is not None and step.done, "max_turns=2 should end the game within a few guesses"
    assert step.solved is False
    # GuessTheNumber's progress: 1 - |last guess - target| / (max - min)
    assert step.reward == pytest.approx(1 - abs(guesses[-1] - target) / (HIGH - LOW))
    assert 0.0 <= step.reward < 1.0


def test_a_second_invalid_move_ends_the_game_unsolved():
    game = TextArenaGame(GUESS)
    game.reset(0)
    warned = game.step("no number here")
    assert not warned.done and warned.reward == 0.0
    assert "invalid move" in warned.observation
    ended = game.step("still none")
    # no guess yet: progress 0
    assert (ended.done, ended.solved, ended.reward) == (True, False, 0.0)


def test_a_two_player_game_is_refused():
    with pytest.raises(ValueError, match="not a single-player game"):
        TextArenaGame("TicTacToe-v0").reset(0)


def test_unknown_id_and_bad_starts():
    with pytest.raises(ValueError, match="did you mean 'GuessTheNumber-v0'"):
        TextArenaGame("GuessTheNumbr-v0")
    game = TextArenaGame(GUESS)
    for start in ("3", True, {"target": 4}, {"seed": 1.5}):
        with pytest.raises(ValueError, match="int seed"):
            game.reset(start)
    with pytest.raises(RuntimeError, match="call reset"):
        game.step("[3]")


def test_missing_library_names_the_extra(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.delitem(sys.modules, "textarena")  # found the way a fresh process finds it: not there
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "textarena"
                        else find_spec(name, *args))
    with pytest.raises(ConfigError, match=r"pip install 'rlvr\[textarena\]'"):
        TextArenaGame(GUESS)


def test_built_from_config_options_and_text_game():
    from rlvr.environments.adapters import environment_from_factory
    from rlvr.tasks.environment import environment_factory_of

    make = environment_factory_of("", "rlvr.environments.text_games:TextArenaGame",
                                  {"env_id": GUESS, "max_number": 8})
    game = make()
    assert isinstance(game, TextArenaGame)
    assert "between 1 and 8" in game.reset(0)
    factory = pickle.loads(pickle.dumps(text_game(GUESS, max_number=8)))  # rollout workers get it pickled
    made = environment_from_factory(factory)()
    assert isinstance(made, TextArenaGame) and made.reset(0) == game.reset(0)
    with pytest.raises(ValueError, match="not a registered TextArena game"):
        text_game("NoSuchGame-v0")
