"""One typed config: dataclasses per concern, YAML in and out, ``key=value`` overrides.

Validation names the bad field, its value and what is allowed, before any work is
done. Defaults reproduce the lecture's sorting experiment.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import yaml

from rlvr.core import AGGREGATIONS, DELTA_MODES, KL_ESTIMATORS, KL_LOSS_ESTIMATORS, LOSS_MODES
from rlvr.errors import ConfigError, did_you_mean
from rlvr.tasks.sorting import LECTURE_PROMPTS, REWARDS

# Sizes past which a run would exhaust memory (or processes) before doing any work. A
# field's own limit is declared on it ("min"/"max" in its metadata); these bound products.
MAX_RESPONSES = 2**16  # responses sampled at once: prompts x group_size, eval batch x eval_samples
MAX_POSITIONAL_PARAMETERS = 2**24  # the positional toy model: 2 n D^2 + V D (64 MiB of float32)


@dataclass
class TaskConfig:
    name: str = field(default="sorting", metadata={"help": "task: sorting | sort_text | arithmetic | gsm8k"})
    reward: str = field(default="inclusion_ordering", metadata={"help": "sorting reward: " + " | ".join(REWARDS)})
    num_numbers: int = field(default=3, metadata={"help": "numbers per prompt (n)", "max": 1024})
    vocab_size: int = field(default=5, metadata={"help": "numbers are drawn from range(vocab_size)", "max": 4096})
    prompts: list | None = field(
        default_factory=lambda: [list(p) for p in LECTURE_PROMPTS],
        metadata={"help": "fixed prompts used every epoch and for evaluation; null to sample fresh ones"},
    )
    allow_repeats: bool = field(default=False, metadata={"help": "random prompts may repeat a number"})
    prompts_per_epoch: int = field(default=3, metadata={"help": "B: prompts sampled per epoch (random prompts)"})
    eval_size: int = field(default=64, metadata={"help": "held-out prompts (random prompts)", "max": 2**14})
    options: dict = field(default_factory=dict, metadata={"help": "task-specific options (text tasks)"})


@dataclass
class RewardsConfig:
    functions: list = field(
        default_factory=list,
        metadata={"help": (
            "user reward functions: [{function: 'module:name', weight: 1.0, timeout: 5.0, name: '', "
            "required: false}]; required: a completion it does not score (error, timeout, invalid, "
            "None) gets no reward (NaN) instead of the others' sum (text tasks only)"
        )},
    )
    strict: bool = field(default=False, metadata={"help": "the first reward error is fatal (else: abstain and count)"})
    timeout: float | None = field(
        default=10.0,
        metadata={"help": "seconds per call of a user function, run in a worker killed past it (null: in-process, no limit)"},
    )
    num_workers: int = field(default=2, metadata={"help": "reward worker processes (for functions with a timeout)",
                                                  "max": 256})


@dataclass
class PolicyConfig:
    name: str = field(default="positional", metadata={"help": "policy: positional | causal_lm"})
    embedding_dim: int = field(default=10, metadata={"help": "positional model: embedding size D"})
    embedding_std: float = field(default=1.0, metadata={"help": "positional model: std of the initial embedding"})
    temperature: float = field(default=1.0, metadata={"help": "sampling and scoring temperature"})
    options: dict = field(default_factory=dict, metadata={"help": "policy-specific options (causal_lm)"})


@dataclass
class AlgoConfig:
    epochs: int = field(default=100, metadata={"help": "outer loop: sample a batch of responses each epoch"})
    inner_steps: int = field(default=10, metadata={"help": "optimizer steps on each epoch's responses"})
    group_size: int = field(default=10, metadata={"help": "G: responses sampled per prompt"})
    deltas: str = field(default="centered", metadata={"help": "delta mode: " + " | ".join(DELTA_MODES)})
    loss: str = field(default="naive", metadata={"help": "loss: " + " | ".join(LOSS_MODES)})
    clip_eps: float = field(default=0.2, metadata={"help": "clipped loss: lower clip range"})
    clip_eps_high: float | None = field(default=None, metadata={"help": "clipped loss: upper range (default clip_eps)"})
    aggregation: str = field(default="seq_mean_token_mean", metadata={"help": "loss aggregation: " + " | ".join(AGGREGATIONS)})
    normalizer: float | None = field(default=None, metadata={
        "help": "seq_mean_token_sum divisor (default: the policy's longest possible response, e.g. max_new_tokens)"})
    kl_coef: float = field(default=0.0, metadata={"help": "KL penalty weight toward the reference (0: no reference)"})
    kl_estimator: str = field(default="k3", metadata={
        "help": "KL estimator: " + " | ".join(KL_ESTIMATORS) + "; as a loss its gradient minimises KL(pi||ref) for "
        "k2, k1+, k3+ (k2's gradient), KL(ref||pi) for k3; k1's is zero (refused)"})
    ref_update_every: int = field(default=10, metadata={"help": "refresh the reference copy every K epochs"})
    adv_eps: float = field(default=1e-6, metadata={"help": "normalized deltas: std + eps"})


@dataclass
class OptimConfig:
    name: str = field(default="adam", metadata={"help": "optimizer: adam | adamw"})
    lr: float = field(default=1e-3, metadata={"help": "learning rate"})
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay"})
    betas: list = field(default_factory=lambda: [0.9, 0.999], metadata={"help": "Adam betas"})
    max_grad_norm: float | None = field(default=None, metadata={"help": "clip the gradient norm (null: no clipping)"})
    micro_batches: int = field(default=1, metadata={"help": "split each step's N responses into this many micro-batches"})
    schedule: str = field(default="constant", metadata={"help": "learning rate after warm-up: constant | linear | cosine (to 0)"})
    warmup_steps: int = field(default=0, metadata={"help": "optimizer steps of linear learning-rate warm-up"})
    max_bad_steps: int = field(default=5, metadata={"help": "stop after this many consecutive non-finite steps"})


@dataclass
class LogConfig:
    eval_every: int = field(default=10, metadata={"help": "evaluate the held-out prompts every k epochs"})
    eval_samples: int = field(default=8, metadata={"help": "n: sampled responses per held-out prompt (pass@1 and pass@n)"})
    eval_batch_size: int = field(default=64, metadata={"help": "held-out prompts decoded at once"})
    eval_at_start: bool = field(default=True, metadata={"help": "evaluate before the first step (the starting point)"})
    table_rows: int = field(default=4, metadata={"help": "held-out prompts shown in the samples table"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})
    plot: bool = field(default=True, metadata={"help": "write plot.png into the run directory"})
    tensorboard: bool = field(default=False, metadata={"help": "also log scalars to RUN_DIR/tensorboard"})
    tracker: str | None = field(default=None, metadata={"help": "also log to an experiment tracker: wandb | trackio"})
    tracker_project: str = field(default="rlvr", metadata={"help": "the tracker's project name"})
    checkpoint_every: int = field(default=10, metadata={"help": "write a checkpoint every k epochs (0: only at the end)"})
    keep_checkpoints: int = field(default=2, metadata={"help": "how many recent checkpoints to keep"})


@dataclass
class SftConfig:
    steps: int = field(default=300, metadata={"help": "SFT optimizer steps (rlvr sft)"})
    batch_size: int = field(default=32, metadata={"help": "SFT pairs per step", "max": MAX_RESPONSES})
    lr: float = field(default=1e-3, metadata={"help": "SFT learning rate"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "SFT gradient clipping"})
    data: str | None = field(default=None, metadata={"help": "JSONL of {prompt, completion}; default: the task's examples"})
    num_examples: int = field(default=2000, metadata={"help": "pairs drawn from the task when sft.data is unset",
                                                      "max": 2**20})
    eval_every: int = field(default=50, metadata={"help": "held-out greedy accuracy every k steps"})
    eval_size: int = field(default=50, metadata={"help": "held-out prompts used by SFT evaluation", "max": 2**14})


@dataclass
class Config:
    name: str = field(default="lecture", metadata={"help": "run name (runs/<name> by default)"})
    out_dir: str | None = field(default=None, metadata={"help": "run directory (default runs/<name>)"})
    seed: int = field(default=0, metadata={"help": "seed for prompts, sampling and initialisation",
                                           "min": 0, "max": 2**32 - 1})  # numpy's seed range
    threads: int = field(default=1, metadata={"help": "torch CPU threads (0: torch's default)", "min": 0, "max": 1024})
    deterministic: bool = field(default=False, metadata={"help": "torch deterministic algorithms (bitwise-equal reruns on GPU too)"})
    task: TaskConfig = field(default_factory=TaskConfig)
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    log: LogConfig = field(default_factory=LogConfig)
    sft: SftConfig = field(default_factory=SftConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) if self.out_dir else Path("runs") / self.name

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def to_commented_yaml(self) -> str:
        """YAML with each field's help as a comment: every setting, documented."""
        lines: list[str] = []
        _commented(self, "", lines)
        return "\n".join(lines) + "\n"


def _commented(obj: Any, indent: str, lines: list[str]) -> None:
    for f in fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            lines.append(f"{indent}{f.name}:")
            _commented(value, indent + "  ", lines)
            continue
        text = yaml.safe_dump({f.name: value}, default_flow_style=True, width=10**6).strip()[1:-1]
        help_text = f.metadata.get("help", "")
        lines.append(f"{indent}{text}" + (f"  # {help_text}" if help_text else ""))


# ---------------------------------------------------------------- building


def _field_types(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _suggest(key: str, options: list[str]) -> str:
    return f"; {did_you_mean(key, options)}"


def _finite(value: Any) -> bool:
    """Is ``value`` a finite real number? NaN passes every range check (all comparisons
    are False) and no float setting means anything at infinity, so both are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past the float range
        return False


def _coerce(path: str, value: Any, hint: Any) -> Any:
    """Check ``value`` against the annotation ``hint``; ints are accepted for floats."""
    origin, args = get_origin(hint), get_args(hint)
    if args and type(None) in args:  # Optional[X]
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
        origin, args = get_origin(hint), get_args(hint)
    base = origin or hint
    if base is float and isinstance(value, (int, float, str)) and not isinstance(value, bool):
        # YAML 1.1 reads "1e-3" (no dot) as a string; accept what float() accepts.
        try:
            number = float(value)
        except ValueError:
            number = None
        except OverflowError:  # an int past the float range
            raise ConfigError(f"{path}={value!r} must be a finite number") from None
        if number is not None:
            if not _finite(number):
                raise ConfigError(f"{path}={number!r} must be a finite number")
            return number
    if base is bool and isinstance(value, bool):
        return value
    if base is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if base in (str, list, dict) and isinstance(value, base):
        return value
    name = getattr(base, "__name__", str(base))
    raise ConfigError(f"{path}: expected {name}, got {value!r} ({type(value).__name__})")


def _build(cls: type, data: dict, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = _field_types(cls)
    names = [f.name for f in fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"unknown key {path!r}{_suggest(key, names)}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value or {}, path + ".")
        else:
            kwargs[key] = _coerce(path, value, hint)
    return cls(**kwargs)


def config_from_dict(data: dict) -> Config:
    """A validated Config from a nested mapping (missing keys take the defaults)."""
    config = _build(Config, data or {}, "")
    validate(config)
    return config


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
    data: dict = {}
    if path is not None:
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
    if overrides:
        data = merge(data, parse_overrides(overrides))
    return config_from_dict(data)


# ---------------------------------------------------------------- validation


def _choice(path: str, value: str, allowed: tuple[str, ...] | list[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{path}={value!r} is not allowed; choose one of: {', '.join(allowed)}")


def _positive(path: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{path}={value!r} must be {bound}")


REWARD_FUNCTION_KEYS = ("function", "weight", "timeout", "name", "required")


def _validate_rewards(r: RewardsConfig) -> None:
    _positive("rewards.num_workers", r.num_workers)
    if r.timeout is not None:
        _positive("rewards.timeout", r.timeout)
    for i, item in enumerate(r.functions):
        path = f"rewards.functions[{i}]"
        if isinstance(item, str):
            item = {"function": item}
        if not isinstance(item, dict) or "function" not in item:
            raise ConfigError(f"{path}: expected 'module:function' or a mapping with a 'function' key, got {item!r}")
        unknown = sorted(set(item) - set(REWARD_FUNCTION_KEYS))
        if unknown:
            raise ConfigError(f"{path}: unknown keys {unknown}; allowed: {', '.join(REWARD_FUNCTION_KEYS)}")
        if not isinstance(item["function"], str) or item["function"].count(":") != 1:
            raise ConfigError(f"{path}.function={item['function']!r} must be 'module:function'")
        weight = item.get("weight", 1.0)
        if not _finite(weight):
            raise ConfigError(f"{path}.weight={weight!r} must be a finite number")
        timeout = item.get("timeout")
        if timeout is not None and not (_finite(timeout) and timeout > 0):
            raise ConfigError(f"{path}.timeout={timeout!r} must be positive seconds or null")
        if not isinstance(item.get("required", False), bool):
            raise ConfigError(f"{path}.required={item['required']!r} must be true or false")


def _check_limits(obj: Any, prefix: str = "") -> None:
    """The "min" and "max" declared in each field's metadata, in every section."""
    for f in fields(obj):
        value, path = getattr(obj, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            _check_limits(value, path + ".")
            continue
        low, high = f.metadata.get("min"), f.metadata.get("max")
        if low is not None and value < low:
            raise ConfigError(f"{path}={value!r} must be >= {low}")
        if high is not None and value > high:
            raise ConfigError(f"{path}={value!r} must be <= {high}")


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
    _positive("policy.embedding_dim", p.embedding_dim)
    size = 2 * t.num_numbers * p.embedding_dim**2 + t.vocab_size * p.embedding_dim
    if size > MAX_POSITIONAL_PARAMETERS:
        raise ConfigError(
            f"policy.embedding_dim={p.embedding_dim} with task.num_numbers={t.num_numbers} and "
            f"task.vocab_size={t.vocab_size}: the positional model would have {size:,} parameters; "
            f"the limit is {MAX_POSITIONAL_PARAMETERS:,}"
        )


TASKS = ("sorting", "sort_text", "arithmetic", "gsm8k")
POLICIES = ("positional", "causal_lm")
OPTIMIZERS = ("adam", "adamw")


def validate(config: Config) -> None:
    """Reject configurations that cannot run; warn about ones that run but make no sense."""
    t, p, a, o, lg = config.task, config.policy, config.algo, config.optim, config.log
    _check_limits(config)
    _choice("task.name", t.name, TASKS)
    _choice("policy.name", p.name, POLICIES)
    _choice("algo.deltas", a.deltas, DELTA_MODES)
    _choice("algo.loss", a.loss, LOSS_MODES)
    _choice("algo.aggregation", a.aggregation, AGGREGATIONS)
    _choice("algo.kl_estimator", a.kl_estimator, KL_ESTIMATORS)
    _choice("optim.name", o.name, OPTIMIZERS)
    if t.name == "sorting":
        _choice("task.reward", t.reward, REWARDS)
        if p.name != "positional":
            raise ConfigError("task.name='sorting' needs policy.name='positional' (use sort_text for LMs)")
        for key in ("num_numbers", "vocab_size", "prompts_per_epoch", "eval_size"):
            _positive(f"task.{key}", getattr(t, key))
        if t.num_numbers < 2:
            raise ConfigError(f"task.num_numbers={t.num_numbers} must be >= 2 to sort")
        _check_sorting_prompts(t)
        _check_positional_size(t, p)
    elif p.name == "positional":
        raise ConfigError(f"policy.name='positional' only fits task.name='sorting', not {t.name!r}")
    for key in ("epochs", "inner_steps", "group_size", "ref_update_every"):
        _positive(f"algo.{key}", getattr(a, key))
    if a.group_size < 2 and a.deltas in ("centered", "normalized", "leave_one_out"):
        raise ConfigError(
            f"algo.group_size={a.group_size} with algo.deltas={a.deltas!r}: a group baseline needs G >= 2 "
            "(every delta would be 0); use deltas=raw or a larger group"
        )
    _positive("algo.adv_eps", a.adv_eps)  # std + eps: 0 would divide 0 by 0 in a group of equal rewards
    _positive("policy.temperature", p.temperature)
    _positive("policy.embedding_std", p.embedding_std)
    _positive("optim.lr", o.lr)
    _positive("optim.weight_decay", o.weight_decay, allow_zero=True)
    _positive("algo.kl_coef", a.kl_coef, allow_zero=True)
    if a.kl_coef > 0 and a.kl_estimator not in KL_LOSS_ESTIMATORS:
        raise ConfigError(
            f"algo.kl_estimator={a.kl_estimator!r} with algo.kl_coef={a.kl_coef}: as a loss term k1's gradient is "
            f"zero in expectation, so the penalty does nothing; use one of {', '.join(KL_LOSS_ESTIMATORS)} "
            "(k1+ / k3+: k1's / k3's value with k2's gradient, grad KL(pi||ref)). "
            "k1 belongs in the reward, which is not supported yet"
        )
    _positive("algo.clip_eps", a.clip_eps)
    if a.clip_eps >= 1:
        raise ConfigError(f"algo.clip_eps={a.clip_eps} must be < 1 (the ratio is clipped to [1 - eps, ...])")
    if a.clip_eps_high is not None:
        _positive("algo.clip_eps_high", a.clip_eps_high)
    if a.normalizer is not None:
        _positive("algo.normalizer", a.normalizer)
    if o.max_grad_norm is not None:
        _positive("optim.max_grad_norm", o.max_grad_norm)
    if len(o.betas) != 2 or not all(_finite(b) and 0 <= b < 1 for b in o.betas):
        raise ConfigError(f"optim.betas={o.betas!r} must be two numbers in [0, 1)")
    _positive("optim.micro_batches", o.micro_batches)
    _positive("optim.max_bad_steps", o.max_bad_steps)
    _choice("optim.schedule", o.schedule, ("constant", "linear", "cosine"))
    _positive("optim.warmup_steps", o.warmup_steps, allow_zero=True)
    _positive("log.eval_batch_size", lg.eval_batch_size)
    _positive("log.checkpoint_every", lg.checkpoint_every, allow_zero=True)
    _positive("log.keep_checkpoints", lg.keep_checkpoints)
    _positive("log.eval_every", lg.eval_every)
    _positive("log.eval_samples", lg.eval_samples)
    if lg.tracker is not None:
        _choice("log.tracker", lg.tracker, ("wandb", "trackio"))
    _positive("log.table_rows", lg.table_rows, allow_zero=True)
    _validate_rewards(config.rewards)
    for key in ("steps", "batch_size", "lr", "max_grad_norm", "num_examples", "eval_every", "eval_size"):
        _positive(f"sft.{key}", getattr(config.sft, key))
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
        raise ConfigError(
            f"optim.micro_batches={o.micro_batches} does not divide the {n} responses per epoch "
            f"({batch} prompts x group_size {a.group_size})"
        )
    if a.loss in ("ratio", "clipped") and a.inner_steps == 1:
        warnings.warn(
            f"algo.loss={a.loss!r} with algo.inner_steps=1: the ratio pi/pi_old is always 1 at the only step, "
            "so the loss equals the naive one",
            stacklevel=2,
        )
