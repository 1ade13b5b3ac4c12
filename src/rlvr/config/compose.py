"""The composition root: the task, the policy (its engine inside) and the reward runner a config asks for. The one place
that reads the config's ``task``, ``rewards`` and ``policy`` sections; every part it builds takes plain arguments. Also
which optional installs a config needs (``check_extras``), checked before anything is built.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch

from rlvr.base.errors import ConfigError
from rlvr.base.extras import AGENT_MODULES, LM_MODULES, require
from rlvr.config.checks import check_engine
from rlvr.policies.positional import PositionalPolicy
from rlvr.tasks import task_class
from rlvr.tasks.grading import GradedTask, reward_runner

if TYPE_CHECKING:
    from rlvr.agents.server import Endpoint
    from rlvr.batch.interfaces import Policy, Task
    from rlvr.config import Config, PolicyConfig
    from rlvr.policies.causal_lm import CausalLMPolicy

__all__ = ["build_causal_lm_policy", "build_policy", "build_task", "check_extras", "driver_holds_weights",
           "needed_modules", "runs_on_ray"]


def runs_on_ray(config: Config) -> bool:
    """Whether ``config`` runs any part of the loop on Ray (rollout workers, or data-parallel learners)."""
    return config.cluster.rollout_workers > 0 or config.cluster.learners > 1


def driver_holds_weights(config: Config) -> bool:
    """Whether the driver holds the policy's weights: not when data-parallel learners hold them and rollout workers
    sample; then its policy is built on the meta device (the tokenizer and the limits only)."""
    return not (config.cluster.learners > 1 and config.cluster.rollout_workers > 0)


def build_task(config: Config, serve: bool = True) -> GradedTask:
    """The task of ``config`` with the runner of its and the user's reward functions; configuration errors name the
    field. A task that shuffles its data (``shuffle_seed``: dataset, reasoning_gym) gets the run's ``seed`` unless its
    options set one. Without ``serve``, a judge's reference model is checked, not loaded."""
    t, r = config.task, config.rewards
    cls = task_class(t.name)
    options = dict(vars(t.options))
    if options.get("shuffle_seed", 0) is None:
        options["shuffle_seed"] = config.seed
    try:
        task = cls(**options)
    except (TypeError, ValueError, OSError) as err:
        raise ConfigError(f"task.options for {t.name!r}: {err}") from err
    # the task has started no runner of its own
    try:
        functions, reference = serve_reference(r.functions, config.policy, start=serve)
        if reference is not None:
            task.services.append(reference)
        task.runner = reward_runner(task, functions, r.timeout, strict=r.strict, num_workers=r.num_workers,
                                    replace_task_rewards=r.replace_task_rewards)
    except BaseException:
        task.close()
        raise
    return task


def build_policy(config: Config, task: Task | None = None, weights: bool = True) -> Policy:
    """The policy of ``config.policy``, as ``task`` samples it (``Task.policy_for``: an environment's episodes).
    Without ``weights``: its parameters on the meta device, the tokenizer and limits real, no engine started."""
    p = config.policy
    if p.name == "positional":
        with torch.device("meta") if not weights else nullcontext():
            sizes = config.task.options
            policy: Policy = PositionalPolicy(sizes.vocab_size, p.options.embedding_dim, sizes.num_numbers,
                                              p.options.embedding_std)
    else:
        try:
            policy = build_causal_lm_policy(p, weights)
        except ConfigError:
            raise  # it names its setting (policy.options.model=...) already
        except (ValueError, TypeError, OSError) as err:  # bad options or a model that is not there
            raise ConfigError(f"policy.options: {err}") from err
    return policy if task is None else task.policy_for(policy)


def build_causal_lm_policy(config: PolicyConfig, weights: bool = True) -> CausalLMPolicy:
    """The policy of a ``PolicyConfig`` named "causal_lm", its checked ``options`` as plain arguments (``temperature``
    picks the vLLM engine's log-prob mode). Without ``weights``: on the meta device, with the hf engine."""
    from rlvr.policies.causal_lm import CausalLMPolicy  # transformers: an optional extra

    o = config.options
    if o.model is None:
        raise ValueError("policy.options.model is required: a model folder (rlvr init-model) or a hub name")
    if weights:
        check_engine(o)  # before loading anything
    settings = {**vars(o), "device": o.device if weights else "meta", "engine": o.engine if weights else "hf"}
    return CausalLMPolicy.from_pretrained(settings.pop("model"), temperature=config.temperature, **settings)


# the tasks that need an optional install -> its modules
TASK_MODULES = {"reasoning_gym": ("reasoning_gym",), "gsm8k": ("math_verify",), "agent": AGENT_MODULES,
                "verifiers": (*AGENT_MODULES, "verifiers")}


def needed_modules(config: Config) -> list[tuple[str, tuple[str, ...]]]:
    """(the setting, the modules it needs) for each optional back end ``config`` uses. The vLLM engine is left to the
    run: a config may be written for a GPU machine."""
    p, t, c, lg = config.policy, config.task, config.cluster, config.log
    needs = []
    if p.name == "causal_lm":
        needs.append(("policy.name='causal_lm'", LM_MODULES))
        if p.options.lora is not None:
            needs.append(("policy.options.lora", ("peft",)))
    if t.name in TASK_MODULES:
        needs.append((f"task.name={t.name!r}", TASK_MODULES[t.name]))
    for i, item in enumerate(config.rewards.functions):
        function = item.get("function") if isinstance(item, dict) else item
        if isinstance(function, str) and function.startswith("rlvr.rewards.judge:"):
            needs.append((f"rewards.functions[{i}]={function!r}", ("openai",)))
    if c.rollout_workers > 0:
        needs.append((f"cluster.rollout_workers={c.rollout_workers}", ("ray",)))
    if c.learners > 1:
        needs.append((f"cluster.learners={c.learners}", ("ray",)))
    if lg.tracker:
        needs.append((f"log.tracker={lg.tracker!r}", (lg.tracker,)))
    if lg.tensorboard:
        needs.append(("log.tensorboard=True", ("tensorboard",)))
    return needs


def check_extras(config: Config) -> None:
    """ConfigError naming the setting and the extra to install for the first optional back end of ``config`` whose
    package is missing; nothing is imported."""
    for what, modules in needed_modules(config):
        require(what, modules)


REFERENCE = "reference"
MODEL_NAME = "rlvr-reference"


def asks_reference(item: Any) -> bool:
    """Is this ``rewards.functions`` item a function whose options say ``base_url: reference``?"""
    return isinstance(item, dict) and isinstance(item.get("options"), dict) and \
        item["options"].get("base_url") == REFERENCE


def serve_reference(functions: Sequence[Any], policy: PolicyConfig, start: bool = True
                    ) -> tuple[list[Any], Endpoint | None]:
    """A judge reward whose options say ``base_url: reference`` asks the model the run starts from, frozen:
    ``policy.options.model`` loaded once more (no LoRA, hf engine) and served on loopback by an open-routes endpoint.
    Returns ``functions`` with each such judge pointed at it (a copy with its URL, model name and a fresh key, never
    written to the run directory) and the started endpoint (None when no function asks, or without ``start``)."""
    if not any(asks_reference(item) for item in functions):
        return list(functions), None
    from rlvr.agents.server import Endpoint

    require("rewards.functions: a judge with base_url 'reference'", AGENT_MODULES)
    if policy.name != "causal_lm":
        raise ConfigError("rewards.functions: a judge with base_url 'reference' needs a language model "
                          f"(policy.name: causal_lm), not policy.name={policy.name!r}")
    if not start:
        return list(functions), None
    options = dataclasses.replace(policy.options, lora=None, engine="hf", engine_options={}, compile=False,
                                  gradient_checkpointing=False)
    model = build_causal_lm_policy(dataclasses.replace(policy, options=options))
    model.module.requires_grad_(False)
    endpoint = Endpoint(model, model_name=MODEL_NAME, open_routes=True)
    endpoint.start()
    served = []
    for item in functions:
        if asks_reference(item):
            item = copy.deepcopy(item)
            item["options"].update(base_url=f"http://{endpoint.host}:{endpoint.port}/v1", model=MODEL_NAME,
                                   api_key=endpoint.api_key)
        served.append(item)
    return served, endpoint
