"""TRL's and verl's config names and what rlvr calls each: the tables, declared once.

A key of TRL's ``GRPOConfig`` (or ``TrainingArguments``) or of verl's PPO trainer config is refused with the rlvr name
to use ("rlvr calls this algo.group_size"), the setting a value means ("use algo.preset=dr_grpo"), or why there is none.
TRL's names are matched by the key alone, wherever it stands; verl's by their dotted path, or by their last part when no
other verl name ends so. ``docs/how-to/from-trl.md`` shows both tables (``markdown_table``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, NamedTuple


class ForeignName(NamedTuple):
    rlvr: str | None  # a dotted rlvr setting, possibly with its value ("policy.options.engine=vllm"); None: none
    note: str = ""
    values: dict[Any, str] = {}  # a foreign value -> the rlvr setting and value it means (read only)
    translate: Callable[[Any], str | None] | None = None  # a foreign value -> the rlvr settings it means, or None


def verl_rs_bounds(value: Any) -> str | None:
    """The rlvr bounds of verl's rollout_rs_threshold ``value``, or None when it names none.

    verl's *_k1 rejection keeps log L <= k1 <= log U for k1 = -log r (a token's, or its response's sum or mean), given
    as "L_U" or U alone (L = 1 / U); so r, the product or the geometric mean lies in [1 / U, 1 / L]. U alone is [1 / U,
    U], as the older verl's upper bound U on r with its default lower bound. rlvr needs is_low < 1 < is_high.

    >>> verl_rs_bounds("0.5_4")
    'algo.is_low=0.25 algo.is_high=2'
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    lower, _, upper = str(value).strip().partition("_") if isinstance(value, str) else ("", "", str(value))
    if not upper:
        lower, upper = "", lower
    try:
        high_bound = float(upper)
        low_bound = float(lower) if lower else 1.0 / high_bound
    except (ValueError, ZeroDivisionError):
        return None
    if not 0 < low_bound < 1 < high_bound:
        return None
    if not lower:
        return f"algo.is_high={high_bound:g}"
    return f"algo.is_low={1.0 / high_bound:g} algo.is_high={1.0 / low_bound:g}"


TRL_NAMES: dict[str, ForeignName] = {
    # the algorithm
    "num_generations": ForeignName("algo.group_size", "G, responses sampled per prompt"),
    "beta": ForeignName("algo.kl_coef", "the KL penalty's weight; the estimator is algo.kl_estimator (k3 by default)"),
    "epsilon": ForeignName("algo.clip_eps", (
        "the lower clip range of the clipped, dual_clip and gspo losses; TRL's cispo has none (algo.clip_eps=null, "
        "the cispo default)")),
    "epsilon_high": ForeignName("algo.clip_eps_high", (
        "the upper clip range (DAPO: 0.28); for cispo TRL's value is the ratio's cap itself, rlvr's is the range "
        "above 1: algo.clip_eps_high = epsilon_high - 1 (TRL 5.0 -> 4.0)")),
    "loss_type": ForeignName("algo.preset", (
        "grpo, dr_grpo and dapo are presets of algo.deltas, algo.loss, algo.aggregation, the clip ranges and "
        "algo.kl_coef (see `rlvr config`); the aggregation alone is algo.aggregation"),
        {"grpo": "algo.preset=grpo", "dr_grpo": "algo.preset=dr_grpo", "dapo": "algo.preset=dapo",
         "bnpo": "algo.preset=dapo"}),
    "scale_rewards": ForeignName("algo.deltas", (
        "group (true): normalized; batch: batch_normalized; none (false): centered"),
        {"group": "algo.deltas=normalized", True: "algo.deltas=normalized", "batch": "algo.deltas=batch_normalized",
         "none": "algo.deltas=centered", False: "algo.deltas=centered"}),
    "num_iterations": ForeignName("algo.inner_steps", "optimizer steps on each epoch's batch (mu)"),
    "steps_per_generation": ForeignName("algo.inner_steps", (
        "each of rlvr's inner steps uses the whole batch; optim.micro_batches splits one step")),
    "max_steps": ForeignName("algo.epochs", "one epoch samples a batch, then takes algo.inner_steps optimizer steps"),
    "num_train_epochs": ForeignName("algo.epochs", (
        "an rlvr epoch is one batch of task.prompts_per_epoch prompts, not a pass over the data set")),
    "ref_model_sync_steps": ForeignName("algo.ref_update_every", (
        "the reference is replaced by a copy of the policy every K epochs (no mixing)")),
    "sync_ref_model": ForeignName("algo.ref_update_every",
                                  "the reference is refreshed every K epochs when kl_coef > 0"),
    "vllm_importance_sampling_correction": ForeignName("algo.is_correction", (
        "TRL's default is on, as vllm_importance_sampling_mode=sequence_mask with cap 3: algo.is_correction="
        "seq_mask_is with algo.tis_cap=3; rlvr's default corrects nothing"), {
        True: "algo.is_correction=seq_mask_is with algo.tis_cap=3 (TRL's default mode and cap)",
        False: "none: rlvr's default corrects nothing (algo.is_correction and algo.tis_cap unset)"}),
    "vllm_importance_sampling_mode": ForeignName("algo.is_correction", (
        "r = pi_old / pi_sampler, per token or per response (prod r); the cap C is algo.tis_cap (TRL's default "
        "3); token_mask drops ratios below algo.is_low too (default 1 / algo.is_high), where TRL keeps them"), {
        "sequence_mask": "algo.is_correction=seq_mask_is with algo.tis_cap=C (TRL's default, C = 3)",
        "sequence_truncate": "algo.is_correction=seq_tis with algo.tis_cap=C",
        "token_truncate": "algo.is_correction=token_tis with algo.tis_cap=C",
        "token_mask": "algo.is_correction=icepop with algo.is_high=C (it also drops ratios below algo.is_low, "
                      "default 1 / is_high)"}),
    "vllm_importance_sampling_cap": ForeignName("algo.tis_cap", (
        "C: min(r, C) for the truncating modes, 0 above C for sequence_mask; algo.is_high for token_mask")),
    "vllm_importance_sampling_clip_max": ForeignName("algo.tis_cap", (
        "TRL's newer name for the cap C (default 3): min(r, C) for the truncating modes, 0 above C for "
        "sequence_mask; algo.is_high for token_mask")),
    "vllm_importance_sampling_clip_min": ForeignName("algo.is_low", (
        "with token_mask (algo.is_correction=icepop) the lowest ratio kept; rlvr's truncating corrections and "
        "seq_mask_is take no lower bound")),
    # batch and optimizer
    "learning_rate": ForeignName("optim.lr"),
    "lr_scheduler_type": ForeignName("optim.schedule", "constant, linear or cosine",
                                     {"constant": "optim.schedule=constant", "linear": "optim.schedule=linear",
                                      "cosine": "optim.schedule=cosine"}),
    "warmup_steps": ForeignName("optim.warmup_steps"),
    "warmup_ratio": ForeignName("optim.warmup_steps", "give the warm-up in optimizer steps"),
    "max_grad_norm": ForeignName("optim.max_grad_norm", "null: no clipping (TRL's default is 1.0)"),
    "weight_decay": ForeignName("optim.weight_decay"),
    "adam_beta1": ForeignName("optim.betas", "[beta1, beta2]"),
    "adam_beta2": ForeignName("optim.betas", "[beta1, beta2]"),
    "gradient_accumulation_steps": ForeignName("optim.micro_batches", (
        "splits each step's responses into micro-batches; the step's batch stays the same")),
    "per_device_train_batch_size": ForeignName("task.prompts_per_epoch", (
        "rlvr counts prompts (B), each sampled algo.group_size times; TRL counts completions")),
    "generation_batch_size": ForeignName("task.prompts_per_epoch", "B prompts x algo.group_size responses per epoch"),
    "seed": ForeignName("seed"),
    # generation and the model
    "temperature": ForeignName("policy.temperature"),
    "max_completion_length": ForeignName("policy.options.max_new_tokens"),
    "top_p": ForeignName("policy.options.top_p"),
    "top_k": ForeignName("policy.options.top_k"),
    "use_vllm": ForeignName("policy.options.engine=vllm", "vLLM in the trainer's process, as TRL's colocate mode"),
    "vllm_gpu_memory_utilization": ForeignName("policy.options.engine_options.gpu_memory_utilization"),
    "vllm_max_model_length": ForeignName("policy.options.engine_options.max_model_len"),
    "gradient_checkpointing": ForeignName("policy.options.gradient_checkpointing"),
    "disable_dropout": ForeignName("policy.options.disable_dropout", "true by default in rlvr"),
    "bf16": ForeignName("policy.options.autocast=bfloat16", "or policy.options.dtype=bfloat16 for bfloat16 weights"),
    "fp16": ForeignName("policy.options.autocast=float16"),
    "model_init_kwargs": ForeignName("policy.options", "dtype, device, lora"),
    "reward_weights": ForeignName("rewards.functions", "each function's weight: {function: ..., weight: 0.5}"),
    # logging, evaluation, saving
    "output_dir": ForeignName("out_dir"),
    "run_name": ForeignName("name"),
    "report_to": ForeignName("log.tracker", "wandb or trackio; log.tensorboard=true for TensorBoard",
                             {"wandb": "log.tracker=wandb", "trackio": "log.tracker=trackio",
                              "tensorboard": "log.tensorboard=true"}),
    "eval_steps": ForeignName("log.eval_every", "in epochs"),
    "eval_strategy": ForeignName("log.eval_every", "held-out evaluation every k epochs"),
    "num_generations_eval": ForeignName("log.eval_samples"),
    "per_device_eval_batch_size": ForeignName("log.eval_batch_size"),
    "save_steps": ForeignName("log.checkpoint_every", "in epochs"),
    "save_strategy": ForeignName("log.checkpoint_every", "a checkpoint every k epochs (0: only at the end)"),
    "save_total_limit": ForeignName("log.keep_checkpoints"),
    "log_completions": ForeignName("log.table_rows", "held-out samples go to RUN_DIR/samples.md at each evaluation"),
    "resume_from_checkpoint": ForeignName("resume=RUN_DIR", "on the command line: rlvr train resume=RUN_DIR"),
    "importance_sampling_level": ForeignName("algo.loss=gspo", "sequence: GSPO's one clipped ratio per response",
                                             {"sequence": "algo.loss=gspo", "token": "algo.loss=clipped"}),
    "mask_truncated_completions": ForeignName("algo.overlong=mask", "responses cut at max_new_tokens leave the loss"),
    "top_entropy_quantile": ForeignName("algo.top_entropy_q", "train on this fraction of highest-entropy tokens"),
    "reward_funcs": ForeignName("rewards.functions", (
        "GRPOTrainer's argument: a list of 'module:function' names or {function: ..., weight: ...} mappings; "
        "from Python, rlvr.train(config, reward_funcs=[fn])")),
    # no equivalent
    "max_prompt_length": ForeignName(None, (
        "prompts are never truncated; one longer than the model's positions minus max_new_tokens is an error")),
    "logging_steps": ForeignName(None, "every optimizer step is recorded in metrics.jsonl"),
    "delta": ForeignName(None, "no two-sided clipping; algo.clip_eps_high sets the upper range"),
    "min_p": ForeignName(None, "sampling takes policy.options.top_k and top_p"),
    "repetition_penalty": ForeignName(None, "sampling takes policy.options.top_k and top_p"),
    "vllm_mode": ForeignName("cluster.rollout_workers", (
        "colocate: policy.options.engine=vllm in the trainer's process; server: Ray rollout workers with that engine")),
    "ref_model_mixup_alpha": ForeignName(None, "the reference is a plain copy (algo.ref_update_every)"),
    "shuffle_dataset": ForeignName("task.options", (
        "the dataset task shuffles each pass over the data with the run's seed (its shuffle_seed option to "
        "choose another), resumable mid-pass")),
    "remove_unused_columns": ForeignName(None, "every column of a prompt reaches the reward functions"),
    "push_to_hub": ForeignName(None, "`rlvr export RUN_DIR --out DIR` writes a folder from_pretrained loads"),
    "use_liger_kernel": ForeignName(None, "the loss is plain PyTorch"),
}


VERL_NAMES: dict[str, ForeignName] = {
    # data
    "data.train_batch_size": ForeignName("task.prompts_per_epoch", "prompts per step (B), each sampled "
                                         "algo.group_size times"),
    "data.max_response_length": ForeignName("policy.options.max_new_tokens"),
    "data.max_prompt_length": ForeignName(None, (
        "prompts are never truncated; one longer than the model's positions minus max_new_tokens is an error")),
    "data.train_files": ForeignName("task.options.path", "with task.name=dataset (JSONL, JSON, CSV, Parquet)"),
    "data.val_files": ForeignName("task.options.eval_path", "with task.name=dataset"),
    "data.prompt_key": ForeignName("task.options.prompt_column", "with task.name=dataset"),
    "data.shuffle": ForeignName("task.options", (
        "the dataset task shuffles each pass over the data (its shuffle_seed option, default the run's seed)")),
    "data.seed": ForeignName("seed"),
    # the actor, its optimizer and the rollout
    "actor_rollout_ref.model.path": ForeignName("policy.options.model"),
    "actor_rollout_ref.model.enable_gradient_checkpointing": ForeignName("policy.options.gradient_checkpointing"),
    "actor_rollout_ref.model.lora_rank": ForeignName("policy.options.lora", "{r: 16, alpha: 32, ...}"),
    "actor_rollout_ref.actor.optim.lr": ForeignName("optim.lr"),
    "actor_rollout_ref.actor.optim.weight_decay": ForeignName("optim.weight_decay"),
    "actor_rollout_ref.actor.optim.lr_warmup_steps": ForeignName("optim.warmup_steps"),
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": ForeignName("optim.warmup_steps",
                                                                       "give the warm-up in optimizer steps"),
    "actor_rollout_ref.actor.optim.warmup_style": ForeignName("optim.schedule", "constant, linear or cosine", {
        "constant": "optim.schedule=constant", "cosine": "optim.schedule=cosine"}),
    "actor_rollout_ref.actor.grad_clip": ForeignName("optim.max_grad_norm"),
    "actor_rollout_ref.actor.clip_ratio": ForeignName("algo.clip_eps", "the lower clip range; the upper one is "
                                                      "algo.clip_eps_high (default: the same)"),
    "actor_rollout_ref.actor.clip_ratio_low": ForeignName("algo.clip_eps"),
    "actor_rollout_ref.actor.clip_ratio_high": ForeignName("algo.clip_eps_high", "DAPO's clip-higher: 0.28"),
    "actor_rollout_ref.actor.clip_ratio_c": ForeignName("algo.clip_ratio_c", "with algo.loss=dual_clip"),
    "actor_rollout_ref.actor.loss_agg_mode": ForeignName("algo.aggregation", (
        "token-mean: token_mean; seq-mean-token-mean: seq_mean_token_mean; seq-mean-token-sum-norm: "
        "seq_mean_token_sum (token sums over algo.normalizer)"), {
        "token-mean": "algo.aggregation=token_mean", "seq-mean-token-mean": "algo.aggregation=seq_mean_token_mean",
        "seq-mean-token-sum-norm": "algo.aggregation=seq_mean_token_sum",
        "seq-mean-token-sum": "algo.aggregation=seq_mean_token_sum"}),
    "actor_rollout_ref.actor.policy_loss.loss_mode": ForeignName("algo.loss", "vanilla: clipped", {
        "vanilla": "algo.loss=clipped", "gspo": "algo.loss=gspo"}),
    "actor_rollout_ref.actor.ppo_epochs": ForeignName("algo.inner_steps", (
        "optimizer steps on each epoch's batch; each of rlvr's steps uses the whole batch")),
    "actor_rollout_ref.actor.ppo_mini_batch_size": ForeignName("algo.inner_steps", (
        "each of rlvr's inner steps uses the whole batch: batch / mini-batch steps per pass are algo.inner_steps")),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": ForeignName("optim.micro_batches", (
        "rlvr gives the number of micro-batches each step's responses are split into")),
    "actor_rollout_ref.actor.use_kl_loss": ForeignName("algo.kl_in=loss", "and algo.kl_coef > 0 (0: no KL)"),
    "actor_rollout_ref.actor.kl_loss_coef": ForeignName("algo.kl_coef"),
    "actor_rollout_ref.actor.kl_loss_type": ForeignName("algo.kl_estimator", "low_var_kl: k3; mse: k2", {
        "low_var_kl": "algo.kl_estimator=k3", "k3": "algo.kl_estimator=k3", "mse": "algo.kl_estimator=k2",
        "k2": "algo.kl_estimator=k2", "k3+": "algo.kl_estimator=k3+", "k1+": "algo.kl_estimator=k1+",
        "kl": "algo.kl_in=reward (k1 there; k1 as a loss has zero expected gradient, in the reward it acts)",
        "k1": "algo.kl_in=reward (k1 there; k1 as a loss has zero expected gradient, in the reward it acts)"}),
    "actor_rollout_ref.actor.entropy_coeff": ForeignName("algo.entropy_coef"),
    "actor_rollout_ref.actor.strategy": ForeignName("cluster.learner_strategy", "fsdp2 and fsdp: fsdp (FSDP2)", {
        "fsdp": "cluster.learner_strategy=fsdp", "fsdp2": "cluster.learner_strategy=fsdp"}),
    "actor_rollout_ref.actor.tis_imp_ratio_cap": ForeignName("algo.tis_cap", "C in min(pi_old / pi_sampler, C)"),
    "algorithm.rollout_correction.rollout_is": ForeignName("algo.is_correction", (
        "importance weights against the sampler: token or sequence TIS, capped at algo.tis_cap"),
        {"token": "algo.is_correction=token_tis", "sequence": "algo.is_correction=seq_tis"}),
    "algorithm.rollout_correction.rollout_is_threshold": ForeignName("algo.tis_cap", "C in min(ratio, C)"),
    "algorithm.rollout_correction.rollout_rs": ForeignName("algo.is_correction", (
        "rejection (masking) of tokens or sequences whose ratio is outside [algo.is_low, algo.is_high]: token_k1 "
        "a token's, seq_sum_k1 its response's product, seq_mean_k1 their geometric mean (bounds: "
        "rollout_rs_threshold); token, sequence and geometric are older verl's; rlvr takes one option and has "
        "none of the k2, k3 or seq_max ones"),
        {"token_k1": "algo.is_correction=token_mis", "seq_sum_k1": "algo.is_correction=seq_mis",
         "seq_mean_k1": "algo.is_correction=geo_mask", "token": "algo.is_correction=token_mis",
         "sequence": "algo.is_correction=seq_mis", "geometric": "algo.is_correction=geo_mask"}),
    "algorithm.rollout_correction.rollout_rs_threshold": ForeignName("algo.is_high", (
        "U alone: algo.is_high=U; the k1 options' 'L_U' bounds -log r to [log L, log U], so the ratio to "
        "[1/U, 1/L]: algo.is_low=1/U, algo.is_high=1/L"), translate=verl_rs_bounds),
    "algorithm.rollout_correction.rollout_rs_threshold_lower": ForeignName("algo.is_low", (
        "older verl's lower bound of the ratio (default 1 / algo.is_high); newer verl gives it in "
        "rollout_rs_threshold as 'L_U', which is algo.is_high=1/L")),
    "actor_rollout_ref.rollout.n": ForeignName("algo.group_size", "G, responses sampled per prompt"),
    "actor_rollout_ref.rollout.temperature": ForeignName("policy.temperature"),
    "actor_rollout_ref.rollout.top_p": ForeignName("policy.options.top_p"),
    "actor_rollout_ref.rollout.top_k": ForeignName("policy.options.top_k"),
    "actor_rollout_ref.rollout.response_length": ForeignName("policy.options.max_new_tokens"),
    "actor_rollout_ref.rollout.name": ForeignName("policy.options.engine", "hf (in-process) or vllm", {
        "vllm": "policy.options.engine=vllm", "hf": "policy.options.engine=hf"}),
    "actor_rollout_ref.rollout.gpu_memory_utilization": ForeignName(
        "policy.options.engine_options.gpu_memory_utilization"),
    "actor_rollout_ref.rollout.val_kwargs.n": ForeignName("log.eval_samples"),
    # the algorithm
    "algorithm.adv_estimator": ForeignName("algo.deltas", (
        "grpo: normalized (algo.preset=grpo also sets the loss and KL of DeepSeekMath's GRPO); rloo: "
        "leave_one_out; reinforce_plus_plus_baseline: reinforce_pp; no critic, so no gae"), {
        "grpo": "algo.deltas=normalized (or algo.preset=grpo: normalized deltas, the clipped loss, kl_coef 0.04)",
        "rloo": "algo.deltas=leave_one_out (or algo.preset=rloo)",
        "reinforce_plus_plus_baseline": "algo.deltas=reinforce_pp",
        "gae": "none: rlvr has no critic; algo.deltas=normalized is GRPO's critic-free baseline"}),
    "algorithm.norm_adv_by_std_in_grpo": ForeignName("algo.deltas", "true: normalized; false: centered (Dr. GRPO)", {
        True: "algo.deltas=normalized", False: "algo.deltas=centered (or algo.preset=dr_grpo)"}),
    "algorithm.use_kl_in_reward": ForeignName("algo.kl_in=reward", "k1 times algo.kl_coef, subtracted from the reward"),
    "algorithm.kl_ctrl.kl_coef": ForeignName("algo.kl_coef"),
    "algorithm.kl_ctrl.type": ForeignName(None, "the KL weight is fixed (algo.kl_coef)"),
    "algorithm.gamma": ForeignName(None, "one reward per response: no discounting"),
    "algorithm.lam": ForeignName(None, "no critic, so no GAE"),
    "algorithm.filter_groups.enable": ForeignName("algo.dynamic_sampling", "DAPO's dynamic sampling"),
    "algorithm.filter_groups.max_num_gen_batches": ForeignName("algo.max_sampling_tries"),
    "reward_model.overlong_buffer.enable": ForeignName("algo.overlong=penalty", "DAPO's soft length penalty"),
    "reward_model.overlong_buffer.len": ForeignName("algo.overlong_cache"),
    "reward_model.overlong_buffer.penalty_factor": ForeignName("algo.overlong_factor"),
    "custom_reward_function.path": ForeignName("rewards.functions", "'module:name' entries ('my_rewards:fn' finds "
                                               "my_rewards.py in the working directory)"),
    # the trainer
    "trainer.total_epochs": ForeignName("algo.epochs", (
        "an rlvr epoch is one batch of task.prompts_per_epoch prompts, not a pass over the data set")),
    "trainer.total_training_steps": ForeignName("algo.epochs", "one epoch samples a batch, then takes "
                                                "algo.inner_steps optimizer steps"),
    "trainer.save_freq": ForeignName("log.checkpoint_every", "in epochs"),
    "trainer.test_freq": ForeignName("log.eval_every", "in epochs"),
    "trainer.val_before_train": ForeignName("log.eval_at_start"),
    "trainer.logger": ForeignName("log.tracker", "wandb or trackio; metrics.jsonl is always written"),
    "trainer.project_name": ForeignName("log.tracker_project"),
    "trainer.experiment_name": ForeignName("name"),
    "trainer.default_local_dir": ForeignName("out_dir"),
    "trainer.max_actor_ckpt_to_keep": ForeignName("log.keep_checkpoints"),
    "trainer.n_gpus_per_node": ForeignName("cluster.learners", "data-parallel learners (Ray actors)"),
    "trainer.resume_mode": ForeignName("resume=RUN_DIR", "on the command line: rlvr train resume=RUN_DIR"),
}

TABLES = {"TRL": TRL_NAMES, "verl": VERL_NAMES}


def foreign_hint(path: str, value: Any = None) -> str | None:
    """What a config error says about the unknown key ``path`` (dotted) set to ``value`` when it is TRL's or verl's
    name, else None.

    >>> foreign_hint("loss_type", "dr_grpo")
    "'loss_type' is TRL's name; use algo.preset=dr_grpo"
    """
    key = path.rsplit(".", 1)[-1]
    if path in VERL_NAMES:
        return _hint("verl", path, VERL_NAMES[path], value)
    if key in TRL_NAMES:
        return _hint("TRL", key, TRL_NAMES[key], value)
    verl = [name for name in VERL_NAMES if name.rsplit(".", 1)[-1] == key]
    if len(verl) == 1:
        return _hint("verl", verl[0], VERL_NAMES[verl[0]], value)
    return None


def _hint(framework: str, name: str, entry: ForeignName, value: Any) -> str:
    said = f"{name!r} is {framework}'s name; "
    if isinstance(value, Hashable) and not isinstance(value, float) and value in entry.values:
        return f"{said}use {entry.values[value]}"
    if entry.translate is not None and (settings := entry.translate(value)) is not None:
        return f"{said}use {settings}"
    if entry.rlvr is None:
        return f"{said}rlvr has no equivalent: {entry.note}"
    note = f" ({entry.note})" if entry.note else ""
    return f"{said}rlvr calls this {entry.rlvr}{note}"


def markdown_table(framework: str = "TRL") -> str:
    """A table of ``docs/how-to/from-trl.md``: one row per name of ``framework`` (TRL, verl), in the order declared."""
    header = {"TRL": "TRL (GRPOConfig)", "verl": "verl (ppo_trainer)"}[framework]
    rows = [f"| {header} | rlvr | note |", "| --- | --- | --- |"]
    for name, entry in TABLES[framework].items():
        rlvr = f"`{entry.rlvr}`" if entry.rlvr else "(none)"
        values = "; ".join(f"{_yaml(v)}: `{target.split(' ')[0]}`" for v, target in entry.values.items())
        note = "; ".join(part for part in (entry.note, f"values: {values}" if values else "") if part)
        rows.append(f"| `{name}` | {rlvr} | {note} |")
    return "\n".join(rows) + "\n"


def _yaml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
