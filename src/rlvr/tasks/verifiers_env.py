"""verifiers environments as a task: ``task.name: verifiers``.

The design: ``docs/explanation/tasks.md`` (``rlvr.tasks.verifiers_env``).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import threading
from typing import Any

from rlvr.agents.runner import AgentLimits
from rlvr.agents.server import MAX_CALLS
from rlvr.base.errors import ConfigError
from rlvr.base.rules import option
from rlvr.tasks.agent import AgentTask

RUNTIMES = ("subprocess", "docker", "podman", "apptainer")  # verifiers' local runtimes
KEY_VARIABLE = "RLVR_ENDPOINT_API_KEY"  # where verifiers' client reads an episode's key: this, then _N
MAX_TASKS = 2**20


class VerifiersTask(AgentTask):
    """A verifiers taskset's episodes against the run's endpoint; see the module docstring."""

    name = "verifiers"
    no_gold_hint = "no taskset reward named as task.options.solved_reward (or 'solved') was 1"
    options = {
        "taskset": option("a verifiers taskset id: an installed package exporting its Taskset (e.g. textarena), "
                          "or the path of such a package's folder (examples/vf_arithmetic)"),
        "taskset_options": option("fields of the taskset's config (its TasksetConfig), e.g. {num_tasks: 64}"),
        "harness": option("the verifiers harness the policy plays through (null: its chat program)"),
        "runtime": option("where the harness runs: subprocess (here; refused for a harness that executes "
                          "code), docker, podman or apptainer", choices=RUNTIMES),
        "solved_reward": option("the taskset's reward whose score of 1 means solved (the gold check; none: "
                                "its reward named 'solved', if any)"),
        "eval_size": option("held-out tasks: the last of the taskset's", min=1, max=2**16),
        "max_tasks": option("tasks read from the taskset at most (an infinite one needs it)", min=2, max=MAX_TASKS),
        "concurrency": AgentTask.options["concurrency"],
        "episode_timeout": AgentTask.options["episode_timeout"],
        "max_tokens": AgentTask.options["max_tokens"],
        "max_calls": AgentTask.options["max_calls"],
        "max_sampled_tokens": AgentTask.options["max_sampled_tokens"],
    }

    def __init__(self, taskset: str, taskset_options: dict[str, Any] | None = None, harness: str = "null",
                 runtime: str = "subprocess", solved_reward: str | None = None, eval_size: int = 16,
                 max_tasks: int = 4096, concurrency: int = 32, episode_timeout: float = 300.0,
                 max_tokens: int = 1024, max_calls: int = MAX_CALLS, max_sampled_tokens: int | None = None) -> None:
        from rlvr.base.extras import AGENT_MODULES, require

        require("task.name='verifiers'", (*AGENT_MODULES, "verifiers"))
        self.max_calls, self.max_sampled_tokens = max_calls, max_sampled_tokens
        self.verifiers = _Verifiers(taskset, dict(taskset_options or {}), harness, runtime,
                                    solved_reward or "solved")
        rows = self.verifiers.rows(max_tasks)
        if len(rows) <= eval_size:
            raise ConfigError(f"task.options.taskset={taskset!r} has {len(rows)} tasks, none left for training "
                              f"beside eval_size={eval_size} held out")
        self._serve(self.verifiers.run, AgentLimits(concurrency, episode_timeout, max_tokens), rows[:-eval_size],
                    rows[-eval_size:])

    def close(self) -> None:
        super().close()
        if "verifiers" in self.__dict__:
            self.verifiers.close()


class _Verifiers:
    """A verifiers environment (its taskset, harness and interception server) and the event
    loop it runs in; ``run`` is the agent: one episode of a row's task at the client's URL."""

    def __init__(self, taskset: str, taskset_options: dict[str, Any], harness: str, runtime: str,
                 solved_reward: str) -> None:
        import importlib.util

        import verifiers.v1 as vf

        from rlvr.rewards.loading import look_in_working_directory

        if os.path.isdir(taskset):  # a taskset package's folder: found where it lies
            folder = os.path.dirname(os.path.abspath(taskset))
            if folder not in sys.path:
                sys.path.append(folder)  # last: it never hides an installed package
            taskset = os.path.basename(os.path.normpath(taskset))
        module = taskset.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()  # as verifiers names it
        if module.isidentifier() and importlib.util.find_spec(module) is None:
            look_in_working_directory(module)
        try:
            # the taskset's own Env where its package exports one (its run() plays the user: a
            # game's moves, a second question), else SingleAgentEnv
            seats = [name for name, field in vf.env_config_type(taskset).model_fields.items()
                     if isinstance(field.default, vf.AgentConfig)]
            if len(seats) == 1:
                config = vf.resolve_env_config({"taskset": {**taskset_options, "id": taskset},
                                                seats[0]: {"harness": {"id": harness}, "runtime": {"type": runtime}}})
                self.env = vf.load_environment(config)
        except Exception as err:  # noqa: BLE001 - verifiers' own message names what is wrong
            raise ConfigError(f"task.options: verifiers could not load taskset {taskset!r} with harness "
                              f"{harness!r}: {type(err).__name__}: {err}") from None
        if len(seats) != 1:  # every seat's calls would reach the one policy's endpoint and train as its own
            raise ConfigError(f"task.options.taskset={taskset!r}: its verifiers Env has {len(seats)} agent seats "
                              f"({', '.join(seats) or 'none'}); rlvr trains an Env of one seat, the policy's")
        executes = [h.config.id for h in self.env._harnesses.values() if h.EXECUTES_CODE]
        if executes and runtime == "subprocess":
            raise ConfigError(f"task.options.harness={harness!r} runs the code the model writes: give it a "
                              "sandbox, task.options.runtime: docker, podman or apptainer (subprocess runs it "
                              "beside the trainer)")
        self.solved_reward = solved_reward
        self.tasks: list[Any] = []  # row["task"] is its place here
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._serving: Any = None
        self._episodes = itertools.count()  # names each episode's key variable

    def rows(self, max_tasks: int) -> list[dict[str, Any]]:
        """The taskset's first ``max_tasks`` tasks as rows (their data), each kept by its index."""
        for task in self.env.taskset:
            if len(self.tasks) >= max_tasks:
                break
            self.tasks.append(task)
        return [{"task": i, **task.data.model_dump(mode="json", exclude_none=True)}
                for i, task in enumerate(self.tasks)]

    async def run(self, client: Any, row: dict[str, Any]) -> dict[str, float]:
        """One verifiers episode of ``row``'s task, its model calls sent to ``client``'s URL."""
        future = asyncio.run_coroutine_threadsafe(self._episode(str(client.base_url), client.api_key, row),
                                                  self._started())
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()  # the episode's timeout or the run's stop: verifiers' episode ends too
            raise

    async def _episode(self, base_url: str, api_key: str, row: dict[str, Any]) -> dict[str, float]:
        import verifiers.v1 as vf

        # each episode's key in a variable of its own (episodes run at once, each with its key),
        # read by verifiers when it makes the episode's client, gone with the episode
        variable = f"{KEY_VARIABLE}_{next(self._episodes)}"
        os.environ[variable] = api_key
        try:
            context = vf.ModelContext(model="rlvr-policy",
                                      client=vf.EvalClientConfig(base_url=base_url, api_key_var=variable))
            (slot,) = self.env.slots(self.tasks[row["task"]])
            episode = await self.env.run_slot(slot, context)
        finally:
            os.environ.pop(variable, None)
        if not episode.ok:
            found = [*episode.errors, *(error for trace in episode.traces for error in trace.errors)]
            errors = [f"{e.type}: {e.message}" for e in found]
            raise RuntimeError(f"verifiers' episode failed: {errors[0] if errors else 'no reason given'}"[:600])
        outcome: dict[str, Any] = {"reward": sum(trace.reward for trace in episode.traces)}
        for trace in episode.traces:
            for name, reward in trace.rewards.items():
                if reward is not None:
                    outcome[name] = reward.score
        if self.solved_reward in outcome:
            outcome["solved"] = outcome[self.solved_reward] >= 1.0
        return outcome

    def _started(self) -> asyncio.AbstractEventLoop:
        """verifiers' loop, started (with the environment's serving) on first use."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=loop.run_forever, name="rlvr-verifiers", daemon=True)
            self._thread.start()
            self._serving = self.env.serving()
            asyncio.run_coroutine_threadsafe(self._serving.__aenter__(), loop).result()
            self._loop = loop
        return self._loop

    def close(self) -> None:
        if self._loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._serving.__aexit__(None, None, None), self._loop).result(timeout=60)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
            self._loop = None
