"""One typed config: dataclasses per concern, YAML in and out, ``key=value`` overrides.

Each field declares its help and its own rules in one line (``setting``); one check
enforces them over every section, and ``validate`` holds only the rules between fields.
Validation names the bad field, its value and what is allowed, before any work is done.
Defaults reproduce the lecture's sorting experiment.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

import torch
import yaml

from rlvr.core import AGGREGATIONS, DELTA_MODES, KL_ESTIMATORS, KL_LOSS_ESTIMATORS, LOSS_MODES
from rlvr.errors import ConfigError, did_you_mean
from rlvr.policies.causal_lm import LOAD_OPTIONS, SETTING_OPTIONS
from rlvr.policies.prompts import check_chat_template
from rlvr.presets import ALGO_PRESETS, resolve_defaults
from rlvr.rules import BOUNDS, check_rules, coerce, finite, option, rules_text  # noqa: F401 (BOUNDS: re-exported)
from rlvr.tasks import TASKS, check_task_options
from rlvr.tasks.sorting import LECTURE_PROMPTS, REWARDS
from rlvr.trl_names import VERL_NAMES, foreign_hint

POLICIES = ("positional", "causal_lm")
POLICY_OPTIONS = {"causal_lm": LOAD_OPTIONS + SETTING_OPTIONS}  # the positional model takes none
OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("constant", "linear", "cosine")
TRACKERS = ("wandb", "trackio")
OLD_LOG_PROBS = ("auto", "sampler", "recompute")  # where the old policy's log-probs come from
# deltas that subtract a group statistic
GROUP_BASELINES = ("centered", "normalized", "leave_one_out", "batch_normalized", "reinforce_pp")
KL_PLACEMENTS = ("loss", "reward")  # where the KL penalty goes
OVERLONG = ("none", "mask", "penalty")  # what happens to responses cut at the length limit
REWARD_FUNCTION_KEYS = ("function", "weight", "timeout", "name", "required")

# Sizes past which a run would exhaust memory (or processes) before doing any work. A
# field's own limit is declared on it (``max=``); these bound products.
MAX_RESPONSES = 2**16  # responses sampled at once: prompts x group_size, eval batch x eval_samples
MAX_POSITIONAL_PARAMETERS = 2**24  # the positional toy model: 2 n D^2 + V D (64 MiB of float32)
# torch's own thread count (physical cores, or OMP_NUM_THREADS), read before any run sets its own
DEFAULT_TORCH_THREADS = torch.get_num_threads()


def setting(default: Any, help: str, *, choices: Any = None, min: float | None = None, max: float | None = None,
            above: float | None = None, below: float | None = None, only: str | None = None) -> Any:
    """A config field: its default, one line of help and its own rules, declared once.

    choices: the allowed values (a tuple, or a registry whose keys are the names); min,
    max: inclusive bounds; above, below: exclusive ones; only: the rules hold only when
    the section's ``name`` is this. An optional field's null passes every rule.
    """
    metadata = option(help, choices=choices, min=min, max=max, above=above, below=below)
    if only is not None:
        metadata["only"] = only
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class TaskConfig:
    name: str = setting("sorting", "task", choices=TASKS)
    reward: str = setting("inclusion_ordering", "sorting reward", choices=REWARDS, only="sorting")
    num_numbers: int = setting(3, "numbers per prompt (n)", min=2, max=1024, only="sorting")
    vocab_size: int = setting(5, "numbers are drawn from range(vocab_size)", above=0, max=4096, only="sorting")
    prompts: list | None = setting([list(p) for p in LECTURE_PROMPTS],
                                   "fixed prompts used every epoch and for evaluation; null to sample fresh ones",
                                   only="sorting")
    allow_repeats: bool = setting(False, "random prompts may repeat a number", only="sorting")
    prompts_per_epoch: int = setting(3, "B: prompts sampled per epoch (random or text-task prompts)", above=0)
    eval_size: int = setting(64, "held-out prompts (random prompts)", above=0, max=2**14, only="sorting")
    options: dict = setting({}, "task-specific options (text tasks: the task class's keyword arguments)")


@dataclass
class RewardsConfig:
    functions: list = setting([], (
        "user reward functions: [{function: 'module:name', weight: 1.0, timeout: 5.0, name: '', "
        "required: false}]; required: a completion it does not score (error, timeout, invalid, "
        "None) gets no reward (NaN) instead of the others' sum"))
    strict: bool = setting(False, "the first reward error is fatal (else: abstain and count)")
    timeout: float | None = setting(
        10.0, "seconds per call of a user function, run in a worker killed past it (null: in-process, no limit)",
        above=0)
    num_workers: int = setting(2, "reward worker processes (for functions with a timeout)", above=0, max=256)
    replace_task_rewards: bool = setting(False, (
        "the functions replace the task's built-in rewards instead of adding to them; the task's gold "
        "check still runs, for the solve rate only (weight 0, not required)"))


@dataclass
class PolicyConfig:
    name: str = setting("positional", "policy", choices=POLICIES)
    embedding_dim: int = setting(10, "positional model: embedding size D", above=0, only="positional")
    embedding_std: float = setting(1.0, "positional model: std of the initial embedding", above=0, only="positional")
    temperature: float = setting(1.0, "sampling and scoring temperature", above=0)
    options: dict = setting({}, "policy-specific options (causal_lm: " + ", ".join(POLICY_OPTIONS["causal_lm"]) + ")")


@dataclass
class AlgoConfig:
    preset: str | None = setting(None, (
        "set deltas, loss, aggregation, the clip ranges and kl_coef at once (the table: rlvr config --help, "
        "docs/trl.md); fields given beside it win; null: each field's own default"), choices=ALGO_PRESETS)
    epochs: int = setting(100, "outer loop: sample a batch of responses each epoch", above=0)
    inner_steps: int = setting(10, "optimizer steps on each epoch's responses", above=0)
    group_size: int = setting(10, "G: responses sampled per prompt", above=0)
    deltas: str = setting("centered", "delta mode", choices=DELTA_MODES)
    loss: str = setting("naive", "loss", choices=LOSS_MODES)
    clip_eps: float | None = setting(0.2, (
        "clipped loss: lower clip range (the ratio is clipped to [1 - eps, ...]); null: no lower clip (cispo only, "
        "and cispo's default when no preset sets it, as MiniMax-M1 and TRL)"), above=0, below=1)
    clip_eps_high: float | None = setting(None, "clipped loss: upper range (default clip_eps)", above=0)
    aggregation: str = setting("seq_mean_token_mean", "loss aggregation", choices=AGGREGATIONS)
    normalizer: float | None = setting(
        None, "seq_mean_token_sum divisor (default: the policy's longest possible response, e.g. max_new_tokens)",
        above=0)
    kl_coef: float = setting(0.0, "KL penalty weight toward the reference (0: no reference)", min=0)
    kl_estimator: str = setting("k3", (
        "KL estimator; as a loss its gradient minimises KL(pi||ref) for k2, k1+, k3+ (k2's gradient), "
        "KL(ref||pi) for k3; k1's is zero (refused)"), choices=KL_ESTIMATORS)
    ref_update_every: int = setting(10, "refresh the reference copy every K epochs", above=0)
    # > 0: with eps 0 a group of equal rewards would divide 0 by 0
    adv_eps: float = setting(1e-6, "normalized deltas: std + eps", above=0)
    old_log_probs: str = setting("auto", (
        "the old policy's log-probs (ratio/clipped losses, TIS): sampler (recorded while sampling), recompute "
        "(the trainer's scorer after sampling, one more forward pass; logs mismatch/*), auto (recompute when "
        "the engine's log-probs are not the trainer's, or with tis_cap)"), choices=OLD_LOG_PROBS)
    tis_cap: float | None = setting(None, (
        "truncated importance sampling: each token's policy-gradient term times min(pi_old / pi_sampler, C), "
        "this C (null: off; needs recompute)"), min=1)
    clip_ratio_c: float = setting(3.0, "dual_clip loss: for negative deltas the objective is bounded below by "
                                       "c * delta (c > 1)", above=1)
    kl_in: str = setting("loss", (
        "where the KL penalty toward the reference goes: loss (kl_estimator's term times kl_coef, per token) or "
        "reward (kl_coef times k1 = log pi_old - log ref summed over the response, subtracted from the reward "
        "before the deltas)"), choices=KL_PLACEMENTS)
    entropy_coef: float = setting(0.0, "entropy bonus: the loss minus this times each token's entropy", min=0)
    dynamic_sampling: bool = setting(False, (
        "DAPO's dynamic sampling: drop groups whose deltas are all zero and sample more prompts until the batch "
        "is full (at most max_sampling_tries batches; then zero-delta groups fill it)"))
    max_sampling_tries: int = setting(4, "dynamic sampling: batches sampled per epoch at most", above=0, max=64)
    overlong: str = setting("none", (
        "responses cut at the length limit (no end-of-sequence token): none; mask (no loss on them, DAPO's "
        "overlong filtering); penalty (DAPO's soft length penalty added to every reward)"), choices=OVERLONG)
    overlong_cache: int = setting(4, "penalty: tokens before the limit over which it ramps from 0 to "
                                     "-overlong_factor", above=0)
    overlong_factor: float = setting(1.0, "penalty: the reward lost by a response of the longest length", min=0)
    top_entropy_q: float | None = setting(None, (
        "train only on this fraction of the batch's response tokens with the highest entropy (0.2 in 'Beyond "
        "the 80/20 rule'; null: all tokens)"), above=0, max=1)


@dataclass
class OptimConfig:
    name: str = setting("adam", "optimizer", choices=OPTIMIZERS)
    lr: float = setting(1e-3, "learning rate", above=0)
    weight_decay: float = setting(0.0, "weight decay", min=0)
    betas: list = setting([0.9, 0.999], "Adam betas: two numbers in [0, 1)")
    max_grad_norm: float | None = setting(None, "clip the gradient norm (null: no clipping)", above=0)
    micro_batches: int = setting(1, "split each step's N responses into this many micro-batches", above=0)
    schedule: str = setting("constant", "learning rate after warm-up (linear, cosine: decay to 0)", choices=SCHEDULES)
    warmup_steps: int = setting(0, "optimizer steps of linear learning-rate warm-up", min=0)
    max_bad_steps: int = setting(5, "stop after this many consecutive non-finite steps", above=0)


@dataclass
class LogConfig:
    eval_every: int = setting(10, "evaluate the held-out prompts every k epochs", above=0)
    eval_samples: int = setting(8, "n: sampled responses per held-out prompt (pass@1 and pass@n)", above=0)
    eval_batch_size: int = setting(64, "held-out prompts decoded at once", above=0)
    eval_at_start: bool = setting(True, "evaluate before the first step (the starting point)")
    table_rows: int = setting(4, "held-out prompts shown in the samples table", min=0)
    progress: bool = setting(True, "show a progress bar")
    plot: bool = setting(True, "write plot.png into the run directory")
    entropy: bool = setting(True, "compute and log the policy's entropy every step (a second pass over the vocabulary "
                                  "of every response token: turn off for large vocabularies)")
    tensorboard: bool = setting(False, "also log scalars to RUN_DIR/tensorboard")
    tracker: str | None = setting(None, "also log to an experiment tracker (null: none)", choices=TRACKERS)
    tracker_project: str = setting("rlvr", "the tracker's project name")
    checkpoint_every: int = setting(10, "write a checkpoint every k epochs (0: only at the end)", min=0)
    keep_checkpoints: int = setting(2, "how many recent checkpoints to keep", above=0)
    grad_noise_every: int = setting(0, (
        "every k epochs, measure the policy gradient's noise at the epoch's first step from the gradients of "
        "its parts: grad/snr, grad/noise_scale (0: off)"), min=0)
    grad_noise_parts: int = setting(4, "gradient noise: parts (of whole groups) the measured step's batch is split "
                                       "into, at least the micro-batches", min=2, max=1024)
    prompt_records: bool = setting(True, "a 'prompts' record per epoch: each training prompt's share of "
                                         "responses that pass the gold check (per-prompt learning curves)")


@dataclass
class SftConfig:
    steps: int = setting(300, "SFT optimizer steps (rlvr sft)", above=0)
    batch_size: int = setting(32, "SFT pairs per step", above=0, max=MAX_RESPONSES)
    lr: float = setting(1e-3, "SFT learning rate", above=0)
    max_grad_norm: float = setting(1.0, "SFT gradient clipping", above=0)
    data: str | None = setting(None, "JSONL of {prompt, completion}; default: the task's examples")
    num_examples: int = setting(2000, "pairs drawn from the task when sft.data is unset", above=0, max=2**20)
    eval_every: int = setting(50, "held-out greedy accuracy every k steps", above=0)
    eval_size: int = setting(50, "held-out prompts used by SFT evaluation", above=0, max=2**14)


@dataclass
class ClusterConfig:
    rollout_workers: int = setting(0, (
        "Ray actors that sample and grade each epoch's batch (0: sample in this process; nothing changes)"),
        min=0, max=1024)
    learners: int = setting(1, (
        "data-parallel learners (Ray actors in a torch.distributed group, each taking its share of the batch; "
        "1: this process takes the optimizer steps)"), above=0, max=1024)
    learner_strategy: str = setting("ddp", (
        "learners > 1: ddp (a full replica each, gradients all-reduced) or fsdp (FSDP2: parameters, gradients and "
        "optimizer state sharded over the learners; causal_lm)"), choices=("ddp", "fsdp"))
    max_staleness: int = setting(0, (
        "k: rollout workers sample up to k epochs ahead, with weights up to k versions old, while the "
        "trainer trains (0: synchronous; >= 1 needs rollout workers and algo.tis_cap)"), min=0, max=64)
    address: str | None = setting(None, "Ray cluster address (null: start a local Ray with the CPUs needed)")
    split_batch: bool = setting(False, (
        "split each epoch's batch over the rollout workers (its prompts drawn here, each part sampled with its own "
        "generator) so they generate at once; false: the whole batch on one worker (epoch e on worker e mod W), "
        "which with one worker gives the single-process records"))
    weight_sync: str = setting("object_store", (
        "how the rollout workers get new weights: object_store (through Ray's object store; survives worker "
        "restarts) or collective (one torch.distributed broadcast per dtype from this process: gloo on CPU, "
        "NCCL on GPU; a restarted worker ends the run)"), choices=("object_store", "collective"))


@dataclass
class Config:
    name: str = setting("lecture", "run name (runs/<name> by default); unset: lecture for the sorting toy, else "
                        "the task's name and the model's (sort_text-tiny_lm)")
    out_dir: str | None = setting(None, "run directory (default runs/<name>)")
    seed: int = setting(0, "seed for prompts, sampling and initialisation", min=0, max=2**32 - 1)  # numpy's range
    threads: int | None = setting(None, (
        "torch CPU threads; null: 1 for the positional toy (its ops are too small to split), torch's default "
        "for causal_lm (the machine's cores; more threads may change an LM's numbers in their last bits); "
        "0: leave torch's setting"), min=0, max=1024)
    deterministic: bool = setting(False, "torch deterministic algorithms (bitwise-equal reruns on GPU too)")
    task: TaskConfig = field(default_factory=TaskConfig)
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    log: LogConfig = field(default_factory=LogConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    @property
    def torch_threads(self) -> int:
        """The torch CPU threads a run uses: ``threads`` when set, else 1 for the positional
        toy and torch's default for an LM (0: leave torch's setting as it is)."""
        if self.threads is not None:
            return self.threads
        return 1 if self.policy.name == "positional" else DEFAULT_TORCH_THREADS

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) if self.out_dir else Path("runs") / self.name

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        """The settings that apply as YAML (a field of another task or policy left out:
        loaded back, it takes its default, as the config built from it has)."""
        data = self.to_dict()
        for section, unused in _unused_fields(self).items():
            for name in unused:
                del data[section][name]
        return yaml.safe_dump(_named_callables(data), sort_keys=False)

    def to_commented_yaml(self) -> str:
        """YAML with each field's help and rules as a comment: every setting that applies, documented."""
        lines: list[str] = []
        _commented(self, "", lines)
        return "\n".join(lines) + "\n"


def _named_callables(value: Any) -> Any:
    """``value`` with each callable (a reward function given from Python, ``rlvr.train``)
    written as its "module:name", so that YAML holds no Python object."""
    if callable(value):
        return f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', type(value).__name__)}"
    if isinstance(value, dict):
        return {key: _named_callables(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_named_callables(item) for item in value]
    return value


def _applies(section: Any, f: dataclasses.Field) -> bool:
    """Does ``f`` apply to ``section``'s task or policy (its ``only`` rule, if any, names it)?"""
    return f.metadata.get("only", getattr(section, "name", None)) == getattr(section, "name", None)


def _unused_fields(config: Config) -> dict[str, list[str]]:
    """Section -> the fields that are for another task or policy (``only``), unused by this config."""
    return {f.name: [g.name for g in fields(section) if not _applies(section, g)]
            for f in fields(config) if dataclasses.is_dataclass(section := getattr(config, f.name))}


def _commented(obj: Any, indent: str, lines: list[str]) -> None:
    for f in fields(obj):
        if not _applies(obj, f):
            continue
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            lines.append(f"{indent}{f.name}:")
            _commented(value, indent + "  ", lines)
            continue
        text = yaml.safe_dump({f.name: _named_callables(value)}, default_flow_style=True, width=10**6).strip()[1:-1]
        help_text = f.metadata.get("help", "") + rules_text(f.metadata)
        lines.append(f"{indent}{text}" + (f"  # {help_text}" if help_text else ""))


# ---------------------------------------------------------------- building


def _build(cls: type, data: dict, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = get_type_hints(cls)  # every key is a field: config_from_dict named the unknown ones first
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value or {}, path + ".")
        else:
            kwargs[key] = coerce(path, value, hint)
    return cls(**kwargs)


def config_from_dict(data: dict) -> Config:
    """A validated Config from a nested mapping (missing keys take the defaults, after
    ``algo.preset`` and the causal-LM defaults: ``rlvr.presets.resolve_defaults``)."""
    data = resolve_defaults(data or {})
    if isinstance(data, dict):
        unknown = _unknown_keys(data)
        if any(not _is_option(path) for path, _ in unknown):  # unknown options alone: check_options
            raise ConfigError(_unknown_message(unknown))
    config = _build(Config, data, "")
    validate(config)
    for section, unused in _unused_fields(config).items():
        # ignored (validate warned when given): the default, as a config written and read back has
        defaults = type(getattr(config, section))()
        for name in unused:
            setattr(getattr(config, section), name, getattr(defaults, name))
    return config


# ---------------------------------------------------------------- unknown keys


def _section(path: str) -> str:
    """"algo." of "algo.epochs", "policy.options." of "policy.options.model", "" of "seed"."""
    return path[:path.rfind(".") + 1]


def _is_option(path: str) -> bool:
    return _section(path) in ("policy.options.", "task.options.")


def _chosen(data: dict, section: str, cls: type) -> Any:
    """The ``name`` that ``data`` gives its ``section`` (its default when it gives none)."""
    node = data.get(section)
    given = node.get("name") if isinstance(node, dict) else None
    return given if given is not None else next(f.default for f in fields(cls) if f.name == "name")


def setting_paths(data: dict) -> dict[str, str]:
    """Every setting's dotted path -> "" when it applies to the config mapping ``data``,
    else the choice it needs ("policy.name=causal_lm"): each section's fields, and the
    options of every policy and every task (``task.options.path``)."""
    paths: dict[str, str] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = get_type_hints(cls)
        for f in fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], f"{prefix}{f.name}.")
            else:
                paths[prefix + f.name] = ""

    walk(Config, "")
    for section, owners in (("policy", {name: POLICY_OPTIONS.get(name, ()) for name in POLICIES}),
                            ("task", {name: tuple(cls.options) for name, cls in TASKS.items()})):
        chosen = _chosen(data, section, PolicyConfig if section == "policy" else TaskConfig)
        owners_of: dict[str, list[str]] = {}
        for name, options in owners.items():
            for key in options:
                owners_of.setdefault(key, []).append(name)
        for key, names in owners_of.items():
            either = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
            paths[f"{section}.options.{key}"] = "" if chosen in names else f"{section}.name={either}"
    return paths


def _unknown_keys(data: dict) -> list[tuple[str, str]]:
    """(path, hint) of every key of the config mapping ``data`` that names no setting, in
    every section and in the options of its policy and task (the positional policy's and
    sorting's options are not read)."""
    paths = setting_paths(data)
    found: list[tuple[str, str]] = []

    def walk(cls: type, node: dict, prefix: str) -> None:
        hints, names = get_type_hints(cls), [f.name for f in fields(cls)]
        for key, value in node.items():
            if key not in names:
                found.extend(_unknown_key(f"{prefix}{key}", value, names, paths))
            elif dataclasses.is_dataclass(hints[key]) and isinstance(value, dict):
                walk(hints[key], value, f"{prefix}{key}.")

    walk(Config, data, "")
    for section in ("policy", "task"):
        node = data.get(section)
        options = node.get("options") if isinstance(node, dict) else None
        allowed = [p.rsplit(".", 1)[1] for p, when in paths.items()
                   if _section(p) == f"{section}.options." and not when]
        if isinstance(options, dict) and allowed:
            for key, value in options.items():
                if key not in allowed:
                    found.extend(_unknown_key(f"{section}.options.{key}", value, allowed, paths))
    return found


def _unknown_key(path: str, value: Any, allowed: list[str], paths: dict[str, str]) -> list[tuple[str, str]]:
    """(path, hint) for an unknown key; a mapping under it that holds verl's names (its
    ``actor_rollout_ref:`` section) gives one per setting in it."""
    if isinstance(value, dict) and value:
        leaves = _leaves(path, value)
        if any(leaf in VERL_NAMES for leaf, _ in leaves):
            return [(leaf, foreign_hint(leaf, v) if leaf in VERL_NAMES else "a verl setting rlvr has no equivalent "
                     "of (docs/trl.md lists those it has)") for leaf, v in leaves]
    key = path.rsplit(".", 1)[-1]
    if path in VERL_NAMES:
        return [(path, foreign_hint(path, value))]
    elsewhere = {p: when for p, when in paths.items() if _section(p) != _section(path)}
    return [(path, did_you_mean(key, allowed, elsewhere, known=foreign_hint(path, value)))]


def _leaves(path: str, value: Any) -> list[tuple[str, Any]]:
    if not isinstance(value, dict) or not value:
        return [(path, value)]
    return [leaf for key, item in value.items() for leaf in _leaves(f"{path}.{key}", item)]


def _unknown_message(unknown: list[tuple[str, str]]) -> str:
    """One line naming every unknown key, each with its hint."""
    def said(path: str, hint: str) -> str:
        if _is_option(path):
            section, key = path.rsplit(".", 1)
            return f"{section}: unknown option {key!r}; {hint}"
        return f"unknown key {path!r}; {hint}"

    if len(unknown) == 1:
        return said(*unknown[0])
    return f"{len(unknown)} unknown keys: " + " ".join(f"({i}) {said(*item)}" for i, item in enumerate(unknown, 1))


def _load_yaml(text: str, where: str) -> Any:
    """``text`` parsed as YAML; if it is not YAML, a one-line ConfigError naming ``where``."""
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{where}: not valid YAML ({err.problem or err.context}{at})") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not valid YAML ({' '.join(str(err).split())})") from err
    except RecursionError as err:  # the parser recurses once per level of nesting
        raise ConfigError(f"{where}: not valid YAML (nested too deeply)") from err


def parse_overrides(overrides: list[str]) -> dict:
    """``["algo.lr=1e-2", "task.prompts=null"]`` -> nested dict, values parsed as YAML."""
    data: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. algo.group_size=16)")
        key, raw = item.split("=", 1)
        value = _load_yaml(raw, f"override {item!r}") if raw.strip() else ""
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node[parts[-1]] = value
    return data


def merge(base: dict, update: dict) -> dict:
    """Recursive dict merge: ``update`` wins; sections merge key by key."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            # options are free-form keyword dicts: merged one level deep, not recursively
            out[key] = {**out[key], **value} if key == "options" else merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML file <- ``key=value`` overrides, then validation."""
    data = {} if path is None else read_mapping(path)
    if overrides:
        data = merge(data, parse_overrides(overrides))
    return config_from_dict(data)


def read_mapping(path: str | Path) -> dict:
    """The mapping a YAML config file holds, not yet built or validated."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not valid UTF-8 ({err.reason} at byte {err.start})") from err
    data = _load_yaml(text, str(path)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


# ---------------------------------------------------------------- validation


def _check_fields(section: Any, prefix: str = "") -> None:
    """The rules each field declares (``setting``), over every section."""
    name = getattr(section, "name", None)  # the task's or policy's name, for messages
    for f in fields(section):
        value, path, rules = getattr(section, f.name), prefix + f.name, f.metadata
        if dataclasses.is_dataclass(value):
            _check_fields(value, path + ".")
            continue
        if value is None:
            continue  # an optional field left null
        if not _applies(section, f):  # a field of another task or policy: unused here
            if value != getattr(type(section)(), f.name):
                warnings.warn(f"{path}={value!r} is ignored: it is for {prefix}name={rules['only']!r} only, "
                              f"not {name!r}", stacklevel=3)
            continue
        check_rules(path, value, rules)


def _check_reward_functions(functions: list) -> None:
    """Each of ``rewards.functions``: 'module:function' or a Python callable (``rlvr.train(...,
    reward_funcs=[fn])``), or a mapping of REWARD_FUNCTION_KEYS whose function is one."""
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


def _check_sorting_prompts(t: TaskConfig) -> None:
    """Fixed sorting prompts: at least one, each ``num_numbers`` integers in [0, vocab_size)."""
    if t.prompts is None:
        return
    if not t.prompts:
        raise ConfigError("task.prompts=[] holds no prompt; give some, or null to sample fresh ones")
    for i, prompt in enumerate(t.prompts):
        numbers = prompt if isinstance(prompt, list) else []
        if len(numbers) != t.num_numbers or not all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x < t.vocab_size for x in numbers
        ):
            raise ConfigError(f"task.prompts[{i}]={prompt!r} must be a list of task.num_numbers={t.num_numbers} "
                              f"integers in [0, task.vocab_size={t.vocab_size})")


def _check_positional_size(t: TaskConfig, p: PolicyConfig) -> None:
    """The positional model's parameter count, 2 n D^2 (encode, decode) + V D (embedding)."""
    size = 2 * t.num_numbers * p.embedding_dim**2 + t.vocab_size * p.embedding_dim
    if size > MAX_POSITIONAL_PARAMETERS:
        raise ConfigError(
            f"policy.embedding_dim={p.embedding_dim} with task.num_numbers={t.num_numbers} and "
            f"task.vocab_size={t.vocab_size}: the positional model would have {size:,} parameters; "
            f"the limit is {MAX_POSITIONAL_PARAMETERS:,}"
        )


def _check_batch_sizes(config: Config) -> None:
    """Responses sampled at once stay under MAX_RESPONSES; micro-batches split N evenly."""
    t, a, o, lg = config.task, config.algo, config.optim, config.log
    batch = len(t.prompts) if (t.name == "sorting" and t.prompts is not None) else t.prompts_per_epoch
    n = batch * a.group_size
    if n > MAX_RESPONSES:
        raise ConfigError(f"algo.group_size={a.group_size} x {batch} prompts = {n} responses per epoch; "
                          f"the limit is {MAX_RESPONSES}")
    eval_n = lg.eval_samples * lg.eval_batch_size
    if eval_n > MAX_RESPONSES:
        raise ConfigError(f"log.eval_samples={lg.eval_samples} x log.eval_batch_size={lg.eval_batch_size} = "
                          f"{eval_n} responses sampled at once; the limit is {MAX_RESPONSES}")
    if n % o.micro_batches:
        raise ConfigError(f"optim.micro_batches={o.micro_batches} does not divide the {n} responses per epoch "
                          f"({batch} prompts x group_size {a.group_size})")


def validate(config: Config) -> None:
    """Reject configurations that cannot run; warn about ones that run but make no sense.
    Each field's own rules are declared on it; the rules here are those between fields."""
    t, p, a, o = config.task, config.policy, config.algo, config.optim
    _check_fields(config)
    if t.name == "sorting":
        if p.name != "positional":
            raise ConfigError("task.name='sorting' needs policy.name='positional' (use sort_text for LMs)")
        _check_sorting_prompts(t)
        _check_positional_size(t, p)
    elif p.name == "positional":
        raise ConfigError(f"policy.name='positional' only fits task.name='sorting', not {t.name!r}")
    if a.group_size < 2 and a.deltas in GROUP_BASELINES:
        raise ConfigError(f"algo.group_size={a.group_size} with algo.deltas={a.deltas!r}: a group baseline needs "
                          "G >= 2 (every delta would be 0); use deltas=raw or a larger group")
    if a.kl_coef > 0 and a.kl_in == "loss" and a.kl_estimator not in KL_LOSS_ESTIMATORS:
        raise ConfigError(
            f"algo.kl_estimator={a.kl_estimator!r} with algo.kl_coef={a.kl_coef}: as a loss term k1's gradient is "
            f"zero in expectation, so the penalty does nothing; use one of {', '.join(KL_LOSS_ESTIMATORS)} "
            "(k1+ / k3+: k1's / k3's value with k2's gradient, grad KL(pi||ref)), or put k1 in the reward: "
            "algo.kl_in=reward"
        )
    if a.dynamic_sampling and config.cluster.rollout_workers > 0:
        raise ConfigError("algo.dynamic_sampling samples more batches in this process; it does not work with "
                          f"cluster.rollout_workers={config.cluster.rollout_workers} yet")
    if a.tis_cap is not None and a.old_log_probs == "sampler":
        raise ConfigError(f"algo.tis_cap={a.tis_cap} with algo.old_log_probs='sampler': the TIS weights "
                          "pi_old / pi_sampler need the trainer's own old log-probs; use recompute or auto")
    if len(o.betas) != 2 or not all(finite(b) and 0 <= b < 1 for b in o.betas):
        raise ConfigError(f"optim.betas={o.betas!r} must be two numbers in [0, 1)")
    _check_reward_functions(config.rewards.functions)
    _check_batch_sizes(config)
    _check_cluster(config)
    _check_algo_combinations(config)
    if a.old_log_probs == "recompute" and a.loss == "naive" and a.tis_cap is None:
        warnings.warn("algo.old_log_probs='recompute' with algo.loss='naive' and no algo.tis_cap: the naive loss "
                      "uses no old log-probs, so none are recomputed (and no mismatch/* is logged)", stacklevel=2)
    if a.loss != "naive" and a.inner_steps == 1:
        warnings.warn(f"algo.loss={a.loss!r} with algo.inner_steps=1: the ratio pi/pi_old is always 1 at the only "
                      "step, so the loss equals the naive one", stacklevel=2)


def _check_algo_combinations(config: Config) -> None:
    """Settings of the loss, the KL, dynamic sampling and the noise meter that contradict each other."""
    t, a, c, lg = config.task, config.algo, config.cluster, config.log
    fixed = t.name == "sorting" and t.prompts is not None
    batch = len(t.prompts) if fixed else t.prompts_per_epoch  # B: a fixed list is the whole batch
    if a.clip_eps is None and a.loss != "cispo":
        raise ConfigError(f"algo.clip_eps=null (no lower clip) is for algo.loss='cispo' only, not {a.loss!r}; "
                          "give a lower clip range, e.g. algo.clip_eps=0.2")
    if a.clip_eps is None and a.clip_eps_high is None:
        raise ConfigError("algo.clip_eps=null (no lower clip) needs the upper range: set algo.clip_eps_high "
                          "(the weight is clipped to [0, 1 + clip_eps_high])")
    if a.kl_coef > 0 and a.kl_in == "reward" and a.kl_estimator not in ("k1", "k1+"):
        raise ConfigError(
            f"algo.kl_in=reward with algo.kl_estimator={a.kl_estimator!r}: the reward's penalty is k1 summed over "
            "the response (log pi_old - log ref), whose policy gradient is that of -kl_coef * KL(pi||ref); set "
            "algo.kl_estimator=k1 (the logged kl is then k1 too), or put the KL in the loss: algo.kl_in=loss")
    if a.dynamic_sampling and fixed and t.prompts_per_epoch not in (len(t.prompts), TaskConfig.prompts_per_epoch):
        raise ConfigError(
            f"task.prompts_per_epoch={t.prompts_per_epoch} with {len(t.prompts)} fixed task.prompts and "
            f"algo.dynamic_sampling: each batch is the whole list of {len(t.prompts)} prompts (each try samples it "
            "again); drop task.prompts_per_epoch, or set task.prompts=null to sample that many fresh prompts")
    if lg.grad_noise_every:
        if batch < 2:
            raise ConfigError(f"log.grad_noise_every={lg.grad_noise_every} with {batch} prompt per batch: the noise "
                              "meter compares the gradients of at least 2 parts of whole groups; use 2 or more "
                              "prompts per epoch, or log.grad_noise_every=0")
        if c.learners > 1 and c.learner_strategy == "fsdp":
            raise ConfigError(f"log.grad_noise_every={lg.grad_noise_every} with cluster.learner_strategy='fsdp': "
                              "sharded gradients mix the learners' parts; use ddp or log.grad_noise_every=0")
        if c.learners > 1 and batch % c.learners:
            raise ConfigError(f"log.grad_noise_every={lg.grad_noise_every} with cluster.learners={c.learners}: the "
                              f"{batch} prompts per batch must split evenly, so each learner's share is whole "
                              "groups for the noise meter's parts")
    if a.loss == "gspo" and a.aggregation != "seq_mean_token_mean":
        warnings.warn(f"algo.loss='gspo' with algo.aggregation={a.aggregation!r}: GSPO's objective is a mean over "
                      "responses of one sequence ratio each (seq_mean_token_mean); a token-weighted aggregation "
                      "weighs each response's term by its length", stacklevel=3)


def _check_cluster(config: Config) -> None:
    c, a = config.cluster, config.algo
    responses = config.task.prompts_per_epoch * a.group_size
    if c.learners > responses:
        raise ConfigError(f"cluster.learners={c.learners}: more learners than the {responses} responses of a batch "
                          "(task.prompts_per_epoch x algo.group_size) to share among them")
    if c.learner_strategy == "fsdp" and config.policy.name != "causal_lm":
        raise ConfigError(f"cluster.learner_strategy='fsdp' with policy.name={config.policy.name!r}: the positional "
                          "toy's fused scorer reads its parameters directly, past FSDP's gathering; use ddp")
    if c.max_staleness > 0:
        if c.rollout_workers == 0:
            raise ConfigError(f"cluster.max_staleness={c.max_staleness} needs rollout workers to sample ahead "
                              "(cluster.rollout_workers >= 1)")
        if a.tis_cap is None:
            raise ConfigError(
                f"cluster.max_staleness={c.max_staleness}: stale batches need the off-policy correction; set "
                "algo.tis_cap (e.g. 2.0: each token's term times min(pi_old / pi_behaviour, 2))")


def check_options(config: Config) -> None:
    """policy.options and task.options without loading a model or data (``rlvr train``
    refuses the same as it builds): every unknown key in one error, each with the setting
    meant, then the task options' types and declared rules (``check_task_options``) and a
    chat template's limits (``rlvr.policies.prompts.check_chat_template``)."""
    unknown = [(path, hint) for path, hint in _unknown_keys(config.to_dict()) if _is_option(path)]
    if unknown:
        raise ConfigError(_unknown_message(unknown))
    check_task_options(config)
    if config.policy.name == "causal_lm" and "chat_template" in config.policy.options:
        check_chat_template(config.policy.options["chat_template"])
