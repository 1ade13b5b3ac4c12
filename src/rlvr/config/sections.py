"""One typed config: a dataclass per concern, YAML in and out, ``key=value`` overrides.

The sections of rlvr's config, each field declared in one line (``setting``: its default, help and own rules), with the
facts derived from them (``AlgoConfig.kl_in_reward``, ...); ``rlvr.config.settings`` builds, checks and writes them,
``rlvr.config.checks`` holds the rules between fields. Defaults reproduce the lecture's sorting experiment.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlvr.base.rules import setting
from rlvr.config.presets import ALGO_PRESETS
from rlvr.config.settings import commented_yaml, to_yaml
from rlvr.core import AGGREGATIONS, DELTA_MODES, IS_CORRECTIONS, KL_ESTIMATORS, LOSS_MODES
from rlvr.core.logprobs import DEFAULT_CHUNK_ELEMENTS
from rlvr.engines import ENGINES
from rlvr.engines.vllm import VLLMOptions
from rlvr.modeling import DTYPES
from rlvr.tasks import TASK_OPTIONS, TASKS

POLICIES = ("positional", "causal_lm")
OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("constant", "linear", "cosine")
TRACKERS = ("wandb", "trackio")
OLD_LOG_PROBS = ("auto", "sampler", "recompute")  # where the old policy's log-probs come from
KL_PLACEMENTS = ("loss", "reward")  # where the KL penalty goes
OVERLONG = ("none", "mask", "penalty")  # what happens to responses cut at the length limit
AUTOCAST = ("bfloat16", "float16")
# responses sampled at once (prompts x group_size, eval batch x eval_samples) past which a run would exhaust memory
# before doing any work
MAX_RESPONSES = 2**16
# torch's own thread count (physical cores, or OMP_NUM_THREADS), read before any run sets its own
DEFAULT_TORCH_THREADS = torch.get_num_threads()


@dataclass
class PositionalOptions:
    """``policy.options`` of ``policy.name: positional`` (``rlvr.policies.positional``), the sorting toy's model; its
    sizes n and V are the task's (``task.options``)."""

    embedding_dim: int = setting(10, "embedding size D", above=0)
    embedding_std: float = setting(1.0, "std of the initial embedding", above=0)


@dataclass
class CausalLMOptions:
    """``policy.options`` of ``policy.name: causal_lm`` (``rlvr.policies.causal_lm``)."""

    model: str | None = setting(None, "a model folder (rlvr init-model, rlvr sft's RUN_DIR/model) or a hub name; "
                                      "required to train")
    dtype: str = setting("float32", "the weights' dtype", choices=DTYPES)
    device: str = setting("cpu", "torch device of the model (cpu, cuda, cuda:1, mps)")
    lora: dict | None = setting(None, "train LoRA adapters only: peft LoraConfig arguments ({r: 8, lora_alpha: 16}); "
                                      "null: every weight")
    chat_template: str | None = setting(None, "a Jinja chat template that renders chat prompts, in place of the "
                                              "tokenizer's own; checkpoints save it")
    max_new_tokens: int = setting(64, "longest response, in tokens", min=1)
    min_new_tokens: int = setting(0, "the end tokens cannot be drawn before this many tokens", min=0)
    top_k: int = setting(0, "sample from the k most likely tokens (0: all); log-probs stay those of pi_tau", min=0)
    top_p: float = setting(1.0, "sample from the nucleus of this mass (1: all); log-probs stay those of pi_tau",
                           above=0, max=1)
    stop_strings: list = setting([], "a response ends with the token that completes one of these (kept in it)")
    autocast: str | None = setting(None, "run forward passes under torch.autocast to this dtype, the weights staying "
                                         "in theirs (null: no autocast)", choices=AUTOCAST)
    gradient_checkpointing: bool = setting(False, "recompute activations in backward (less memory, more time)")
    disable_dropout: bool = setting(True, "dropout probability 0: sampling runs in eval mode, so with dropout the "
                                          "recorded log-probs would not be those scored")
    add_special_tokens: bool = setting(True, "prompts are encoded with the tokenizer's special tokens (BOS)")
    chunk_elements: int = setting(DEFAULT_CHUNK_ELEMENTS, "float32 logits per chunk when turning logits into "
                                                          "log-probs", above=0)
    share_prompts: bool = setting(True, "scoring encodes each prompt once for its G responses")
    pack_linears: bool = setting(True, "the hf engine runs float32 CPU linear layers by oneDNN on weights reordered "
                                       "once per generation (faster decoding; float32 rounding apart)")
    compile: bool = setting(False, "score with a torch.compile'd forward of the trained module (inductor; "
                                   "the first scoring of each new shape compiles, seconds to minutes; "
                                   "python benchmarks/lm_update_levers.py measures it)")
    engine: str = setting("hf", "what generates: hf (in this process, sharing the trainer's module) or vllm (its "
                                "own copy of the weights)", choices=ENGINES)
    engine_options: VLLMOptions = setting(VLLMOptions(), "the engine's settings (vllm)")


POLICY_OPTIONS = {"positional": PositionalOptions, "causal_lm": CausalLMOptions}  # policy.name -> its options


def named_default(options: Any, sections: dict[str, type], name: str) -> Any:
    """``options`` for the section ``name`` picks: the defaults of another name's section become that section's defaults
    (a section built in Python with only its ``name`` set)."""
    picked = sections.get(name)
    if picked is not None and not isinstance(options, picked) and options == type(options)():
        return picked()
    return options


@dataclass
class TaskConfig:
    name: str = setting("sorting", "task", choices=TASKS)
    prompts_per_epoch: int = setting(3, "B: prompts sampled per epoch (random or text-task prompts)", above=0)
    options: Any = setting(TASK_OPTIONS["sorting"](), "the task's options: its class's keyword arguments",
                           sections=TASK_OPTIONS)  # one of TASK_OPTIONS' sections

    def __post_init__(self) -> None:
        self.options = named_default(self.options, TASK_OPTIONS, self.name)


@dataclass
class RewardsConfig:
    functions: list = setting([], (
        "user reward functions: [{function: 'module:name', weight: 1.0, timeout: 5.0, name: '', "
        "required: false, options: {}}]; required: a completion it does not score (error, timeout, invalid, "
        "None) gets no reward (NaN) instead of the others' sum; options: keyword arguments the function is "
        "called with (extract: last_number)"))
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
    temperature: float = setting(1.0, "sampling and scoring temperature", above=0)
    options: PositionalOptions | CausalLMOptions = setting(
        PositionalOptions(), "the causal LM's model, loading, sampling and generation engine; the positional "
        "model's sizes", sections=POLICY_OPTIONS)

    def __post_init__(self) -> None:
        self.options = named_default(self.options, POLICY_OPTIONS, self.name)


@dataclass
class AlgoConfig:
    preset: str | None = setting(None, (
        "set deltas, loss, aggregation, the clip ranges and kl_coef at once (the table: rlvr config --help, "
        "docs/how-to/from-trl.md); fields given beside it win; null: each field's own default"), choices=ALGO_PRESETS)
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
        "the engine's log-probs are not the trainer's, or with an off-policy correction)"), choices=OLD_LOG_PROBS)
    tis_cap: float | None = setting(None, (
        "truncated importance sampling: each token's policy-gradient term times min(pi_old / pi_sampler, C), "
        "this C (null: off; needs recompute); also seq_tis's and seq_mask_is's cap, and beside token_mis, "
        "seq_mis or geo_mask the kept tokens' weight min(r, C)"), min=1)
    is_correction: str | None = setting(None, (
        "off-policy correction of each token's policy-gradient term, r = pi_old / pi_sampler "
        "(docs/explanation/algorithms.md): token_tis, "
        "seq_tis (truncated at tis_cap); token_mis, seq_mis, geo_mask (tokens, responses by prod r, responses by "
        "the geometric mean of r outside [is_low, is_high] dropped); icepop (r outside dropped, the rest weighted "
        "by r); seq_mask_is (prod r per response, 0 above tis_cap: TRL's sequence_mask); null: token_tis when "
        "tis_cap is set, else none"), choices=IS_CORRECTIONS)
    is_low: float | None = setting(None, "masking corrections: the lowest ratio kept (null: 1 / is_high)",
                                   above=0, below=1)
    is_high: float | None = setting(None, (
        "masking corrections (token_mis, seq_mis, geo_mask, icepop): the highest ratio kept, e.g. 2 per token, "
        "1.001 for geo_mask, 5 for icepop (IcePop's beta)"), above=1)
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

    @property
    def uses_reference(self) -> bool:
        """A frozen reference copy is kept and scored: the KL penalty is on."""
        return self.kl_coef > 0

    @property
    def kl_in_reward(self) -> bool:
        """KL in the reward: kl_coef times k1 summed over each response, subtracted before the deltas."""
        return self.uses_reference and self.kl_in == "reward"

    @property
    def off_policy_method(self) -> str | None:
        """The off-policy correction of the policy-gradient term: is_correction, else token_tis when only tis_cap is
        set; None: none."""
        return self.is_correction or ("token_tis" if self.tis_cap is not None else None)

    @property
    def needs_old_log_probs(self) -> bool:
        """The old policy's log-probs are used: by a ratio loss, by an off-policy correction or by the reward's KL (the
        naive loss alone needs none)."""
        return self.loss != "naive" or self.off_policy_method is not None or self.kl_in_reward


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
        "trainer trains (0: synchronous; >= 1 needs rollout workers and an off-policy correction: algo.tis_cap "
        "or algo.is_correction)"), min=0, max=64)
    max_staleness_steps: int | None = setting(None, (
        "the oldest, in optimizer steps, the weights that sampled a batch may be when its training starts (null: "
        "max_staleness x algo.inner_steps, the age of a batch sampled k epochs ahead); cluster.stale_policy says "
        "how the bound is kept"), min=0, max=2**31)
    stale_policy: str = setting("admit", (
        "how the staleness bound is kept: admit (a batch is submitted only as far ahead as it can be trained "
        "within the bound: nothing sampled is thrown away) or drop (submitted max_staleness epochs ahead; one "
        "older than the bound when its training starts is dropped, counted in cluster/dropped_stale, and "
        "sampled again, which can bias the trained data: async/length_shift and async/solve_shift show whether it "
        "did)"), choices=("admit", "drop"))
    partial_rollouts: bool = setting(False, (
        "with cluster.weights_in_flight: new weights published while a worker generates reach it between tokens; "
        "the running responses take them and go on from their token prefix (the KV cache recomputed with the "
        "new weights), each token recording the weights version that sampled it (single-turn tasks)"))
    weights_in_flight: bool = setting(False, (
        "max_staleness >= 1: the rollout workers start each batch with the newest weights, published after every "
        "optimizer step, not those held when the batch was submitted (fresher samples; which weights a batch gets "
        "then depends on timing, so such a run is not reproduced exactly from its seed)"))
    address: str | None = setting(None, "Ray cluster address: auto, HOST:PORT or ray://HOST:PORT (null: start a "
                                        "local Ray with the CPUs needed)")
    split_batch: bool = setting(False, (
        "split each epoch's batch over the rollout workers (its prompts drawn here, each part sampled with its own "
        "generator) so they generate at once; false: the whole batch on one worker (epoch e on worker e mod W), "
        "which with one worker gives the single-process records; needs rollout workers"))
    weight_sync: str = setting("object_store", (
        "how the rollout workers get new weights: object_store (through Ray's object store; survives worker "
        "restarts) or collective (one torch.distributed broadcast per dtype from this process: gloo on CPU, "
        "NCCL on GPU; a restarted worker ends the run)"), choices=("object_store", "collective"))
    call_timeout: float = setting(1800.0, (
        "seconds one call to a rollout worker or learner (a batch, an optimizer step, a weights broadcast, a "
        "collective) may take before the run stops with one line naming the actor and what it was doing"),
        above=0)



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
        """The torch CPU threads a run uses: ``threads`` when set, else 1 for the positional toy and torch's default for
        an LM (0: leave torch's setting as it is)."""
        if self.threads is not None:
            return self.threads
        return 1 if self.policy.name == "positional" else DEFAULT_TORCH_THREADS

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) if self.out_dir else Path("runs") / self.name

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        """The settings as YAML."""
        return to_yaml(self)

    def to_commented_yaml(self) -> str:
        """YAML with each field's help and rules as a comment: every setting that applies, documented."""
        return "\n".join(commented_yaml(self)) + "\n"
