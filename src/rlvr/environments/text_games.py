"""Single-player TextArena games (``pip install 'rlvr[textarena]'``) as rlvr Environments.

TextArena registers text games by id ("GuessTheNumber-v0", "Mastermind-v0", ...); ``TextArenaGame`` drives one
episode of such a game, so that a config names it::

    task:
      name: environment
      options:
        environment_factory: rlvr.environments.text_games:TextArenaGame
        environment_options: {env_id: GuessTheNumber-v0}

and Python code builds the same with ``text_game("GuessTheNumber-v0")``.

Some games fetch word lists at import or reset (Wordle, Hangman: NLTK downloads); without a network those fail,
and the episode with them. The number, code and board games (GuessTheNumber, Mastermind, TowerOfHanoi, ...) need
no data.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rlvr.base.errors import did_you_mean
from rlvr.base.extras import require
from rlvr.environments.base import EnvironmentFactory, Step

WIN_REWARD = 1.0  # a single-player game's reward for a win; a loss scores its progress, under 1


class TextArenaGame:
    """One episode of a single-player TextArena game; ``game_options`` go to its constructor, over the id's own.

    reset(start): an int seed or a row ``{"seed": n}``; the game's first messages (the rules, the board) are the
    prompt, one message a line.

    step(text): the player's action, through the id's action wrappers (``7`` -> ``[7]``). The observation is the
    game's new messages, one a line, the player's own move left out. TextArena's observation wrappers, which
    repeat the whole history every turn, are passed by: an episode appends each observation to what came before.
    Reward 0 until the game ends; then the game's reward: 1 for a win, else the fraction of the puzzle done
    (TextArena's single-player convention), and ``solved`` is whether it won without an invalid move.

    The games draw from Python's ``random``, seeded at reset. Each episode keeps a generator state of its own,
    swapped in around every call into the game, so that a seed gives the same game however episodes interleave
    and the process's ``random`` is left as it was (not across threads; numpy draws, as Sokoban's, are not kept).
    """

    def __init__(self, env_id: str, **game_options: Any) -> None:
        ta = _textarena(f"TextArenaGame(env_id={env_id!r})")
        registry = ta.envs.registration.ENV_REGISTRY
        if env_id not in registry:
            raise ValueError(f"env_id={env_id!r} is not a registered TextArena game; "
                             f"{did_you_mean(env_id, sorted(registry))}")
        self.env_id = env_id
        self.env = ta.make(env_id, **game_options)
        self.game = self.env  # the game under its wrappers: its observations are raw messages
        while isinstance(self.game, ta.Wrapper):
            self.game = self.game.env
        self.done = False
        self.started = False
        self._random_state = random.Random().getstate()

    def tools(self) -> dict[str, Callable[..., Any]]:
        return {}

    def reset(self, start: Any) -> str:
        seed = _seed_of(start)
        self._random_state = random.Random(seed).getstate()
        with self._own_random():
            try:
                self.env.reset(num_players=1, seed=seed)
            except AssertionError as err:  # TextArena's states assert their number of players
                raise ValueError(f"{self.env_id} is not a single-player game: {err}") from err
            text = self._new_messages()
        self.started, self.done = True, False
        if text is None:
            raise ValueError(f"{self.env_id} gave no first observation after reset")
        return text

    def step(self, text: str) -> Step:
        if not self.started or self.done:
            raise RuntimeError("step() needs an episode in progress: call reset() first")
        with self._own_random():
            done, _ = self.env.step(text)
            observation = self._new_messages()
            if not done:
                return Step(observation, 0.0, done=False, solved=None)
            rewards, game_info = self.env.close()
        self.done = True
        if not rewards or 0 not in rewards:  # every single-player game sets its reward as it ends
            raise RuntimeError(f"{self.env_id} ended without a reward for its player: {rewards!r}")
        reward = float(rewards[0])
        won = reward >= WIN_REWARD and not game_info[0].get("invalid_move", False)
        return Step(observation, reward, done=True, solved=won)

    def _new_messages(self) -> str | None:
        """The game's messages for the player since the last call, one a line, its own moves left out; or None."""
        from textarena import ObservationType

        _, messages = self.game.get_observation()
        texts = [message for _, message, kind in messages if kind != ObservationType.PLAYER_ACTION]
        return "\n".join(texts) if texts else None

    @contextmanager
    def _own_random(self) -> Iterator[None]:
        """Python's ``random`` in this episode's state for the code within; the process's put back after."""
        outer = random.getstate()
        random.setstate(self._random_state)
        try:
            yield
        finally:
            self._random_state = random.getstate()
            random.setstate(outer)


def text_game(env_id: str, **game_options: Any) -> EnvironmentFactory:
    """A factory of ``TextArenaGame`` episodes of ``env_id`` for ``rlvr.train(..., environment_factory=...)``;
    one game is built now, so a missing install or an unknown id fails here, not in the first episode."""
    TextArenaGame(env_id, **game_options)
    return functools.partial(TextArenaGame, env_id, **game_options)


def _seed_of(start: Any) -> int:
    """The seed an episode starts from: an int, or a row's int "seed"."""
    seed = start.get("seed") if isinstance(start, dict) else start
    if isinstance(seed, int) and not isinstance(seed, bool):
        return seed
    raise ValueError(f"a TextArena episode starts from an int seed or a row {{'seed': n}}, got {start!r:.80}")


def _textarena(what: str) -> Any:
    """The ``textarena`` module; ConfigError naming the extra that installs it when missing."""
    require(what, ("textarena",))
    import textarena

    return textarena
