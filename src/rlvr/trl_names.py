"""TRL's GRPOConfig names and what rlvr calls each: the one table, declared once.

A config key rlvr does not know but TRL's ``GRPOConfig`` (or the ``TrainingArguments``
it extends) does is refused with the rlvr name to use instead ("rlvr calls this
algo.group_size") or why there is none ("rlvr has no equivalent: ..."). ``docs/trl.md``
shows this table; a test keeps the two equal (``markdown_table`` writes it).

Each entry: TRL's name -> (the rlvr setting, or None when rlvr has none; a note on how
the two differ, or why there is no equivalent).
"""

from __future__ import annotations

from typing import NamedTuple


class TrlName(NamedTuple):
    rlvr: str | None  # a dotted rlvr setting, possibly with its value ("policy.options.engine=vllm"); None: none
    note: str = ""


TRL_NAMES: dict[str, TrlName] = {
    # the algorithm
    "num_generations": TrlName("algo.group_size", "G, responses sampled per prompt"),
    "beta": TrlName("algo.kl_coef", "the KL penalty's weight; the estimator is algo.kl_estimator (k3 by default)"),
    "epsilon": TrlName("algo.clip_eps", "the lower clip range; used by the clipped, dual_clip, gspo and cispo losses"),
    "epsilon_high": TrlName("algo.clip_eps_high", "the upper clip range (DAPO: 0.28)"),
    "loss_type": TrlName("algo.preset", (
        "grpo, dr_grpo and dapo are presets of algo.deltas, algo.loss, algo.aggregation, the clip ranges and "
        "algo.kl_coef (see `rlvr config`); the aggregation alone is algo.aggregation")),
    "scale_rewards": TrlName("algo.deltas", (
        "group (true): normalized; batch: batch_normalized; none (false): centered")),
    "num_iterations": TrlName("algo.inner_steps", "optimizer steps on each epoch's batch (mu)"),
    "steps_per_generation": TrlName("algo.inner_steps", (
        "each of rlvr's inner steps uses the whole batch; optim.micro_batches splits one step")),
    "max_steps": TrlName("algo.epochs", "one epoch samples a batch, then takes algo.inner_steps optimizer steps"),
    "num_train_epochs": TrlName("algo.epochs", (
        "an rlvr epoch is one batch of task.prompts_per_epoch prompts, not a pass over the data set")),
    "ref_model_sync_steps": TrlName("algo.ref_update_every", (
        "the reference is replaced by a copy of the policy every K epochs (no mixing)")),
    "sync_ref_model": TrlName("algo.ref_update_every", "the reference is refreshed every K epochs when kl_coef > 0"),
    "vllm_importance_sampling_correction": TrlName("algo.tis_cap", (
        "truncated importance sampling: on when algo.tis_cap is set")),
    "vllm_importance_sampling_cap": TrlName("algo.tis_cap", "C in min(pi_old / pi_sampler, C)"),
    # batch and optimizer
    "learning_rate": TrlName("optim.lr"),
    "lr_scheduler_type": TrlName("optim.schedule", "constant, linear or cosine"),
    "warmup_steps": TrlName("optim.warmup_steps"),
    "warmup_ratio": TrlName("optim.warmup_steps", "give the warm-up in optimizer steps"),
    "max_grad_norm": TrlName("optim.max_grad_norm", "null: no clipping (TRL's default is 1.0)"),
    "weight_decay": TrlName("optim.weight_decay"),
    "adam_beta1": TrlName("optim.betas", "[beta1, beta2]"),
    "adam_beta2": TrlName("optim.betas", "[beta1, beta2]"),
    "gradient_accumulation_steps": TrlName("optim.micro_batches", (
        "splits each step's responses into micro-batches; the step's batch stays the same")),
    "per_device_train_batch_size": TrlName("task.prompts_per_epoch", (
        "rlvr counts prompts (B), each sampled algo.group_size times; TRL counts completions")),
    "generation_batch_size": TrlName("task.prompts_per_epoch", "B prompts x algo.group_size responses per epoch"),
    "seed": TrlName("seed"),
    # generation and the model
    "temperature": TrlName("policy.temperature"),
    "max_completion_length": TrlName("policy.options.max_new_tokens"),
    "top_p": TrlName("policy.options.top_p"),
    "top_k": TrlName("policy.options.top_k"),
    "use_vllm": TrlName("policy.options.engine=vllm", "vLLM in the trainer's process, as TRL's colocate mode"),
    "vllm_gpu_memory_utilization": TrlName("policy.options.engine_options.gpu_memory_utilization"),
    "vllm_max_model_length": TrlName("policy.options.engine_options.max_model_len"),
    "gradient_checkpointing": TrlName("policy.options.gradient_checkpointing"),
    "disable_dropout": TrlName("policy.options.disable_dropout", "true by default in rlvr"),
    "bf16": TrlName("policy.options.autocast=bfloat16", "or policy.options.dtype=bfloat16 for bfloat16 weights"),
    "fp16": TrlName("policy.options.autocast=float16"),
    "model_init_kwargs": TrlName("policy.options", "dtype, device, lora"),
    "reward_weights": TrlName("rewards.functions", "each function's weight: {function: ..., weight: 0.5}"),
    # logging, evaluation, saving
    "output_dir": TrlName("out_dir"),
    "run_name": TrlName("name"),
    "report_to": TrlName("log.tracker", "wandb or trackio; log.tensorboard=true for TensorBoard"),
    "eval_steps": TrlName("log.eval_every", "in epochs"),
    "eval_strategy": TrlName("log.eval_every", "held-out evaluation every k epochs"),
    "num_generations_eval": TrlName("log.eval_samples"),
    "per_device_eval_batch_size": TrlName("log.eval_batch_size"),
    "save_steps": TrlName("log.checkpoint_every", "in epochs"),
    "save_strategy": TrlName("log.checkpoint_every", "a checkpoint every k epochs (0: only at the end)"),
    "save_total_limit": TrlName("log.keep_checkpoints"),
    "log_completions": TrlName("log.table_rows", "held-out samples go to RUN_DIR/samples.md at each evaluation"),
    "resume_from_checkpoint": TrlName("resume=RUN_DIR", "on the command line: rlvr train resume=RUN_DIR"),
    "importance_sampling_level": TrlName("algo.loss=gspo", "sequence: GSPO's one clipped ratio per response"),
    "mask_truncated_completions": TrlName("algo.overlong=mask", "responses cut at max_new_tokens leave the loss"),
    "top_entropy_quantile": TrlName("algo.top_entropy_q", "train on this fraction of highest-entropy tokens"),
    # no equivalent
    "max_prompt_length": TrlName(None, (
        "prompts are never truncated; one longer than the model's positions minus max_new_tokens is an error")),
    "logging_steps": TrlName(None, "every optimizer step is recorded in metrics.jsonl"),
    "delta": TrlName(None, "no two-sided clipping; algo.clip_eps_high sets the upper range"),
    "min_p": TrlName(None, "sampling takes policy.options.top_k and top_p"),
    "repetition_penalty": TrlName(None, "sampling takes policy.options.top_k and top_p"),
    "vllm_mode": TrlName("cluster.rollout_workers", (
        "colocate: policy.options.engine=vllm in the trainer's process; server: Ray rollout workers with that engine")),
    "ref_model_mixup_alpha": TrlName(None, "the reference is a plain copy (algo.ref_update_every)"),
    "shuffle_dataset": TrlName("task.options", (
        "the dataset task shuffles each pass over the data with the run's seed (its shuffle_seed option to "
        "choose another), resumable mid-pass")),
    "remove_unused_columns": TrlName(None, "every column of a prompt reaches the reward functions"),
    "push_to_hub": TrlName(None, "`rlvr export RUN_DIR --out DIR` writes a folder from_pretrained loads"),
    "use_liger_kernel": TrlName(None, "the loss is plain PyTorch"),
}


def trl_hint(key: str) -> str | None:
    """What a config error says about ``key`` when it is a TRL name, else None.

    >>> trl_hint("num_generations")
    "'num_generations' is TRL's name; rlvr calls this algo.group_size (G, responses sampled per prompt)"
    >>> trl_hint("group_size") is None
    True
    """
    entry = TRL_NAMES.get(key)
    if entry is None:
        return None
    if entry.rlvr is None:
        return f"{key!r} is TRL's name; rlvr has no equivalent: {entry.note}"
    note = f" ({entry.note})" if entry.note else ""
    return f"{key!r} is TRL's name; rlvr calls this {entry.rlvr}{note}"


def markdown_table() -> str:
    """The table of ``docs/trl.md``: one row per TRL name, in the order declared."""
    rows = ["| TRL (GRPOConfig) | rlvr | note |", "| --- | --- | --- |"]
    for trl, entry in TRL_NAMES.items():
        rlvr = f"`{entry.rlvr}`" if entry.rlvr else "(none)"
        rows.append(f"| `{trl}` | {rlvr} | {entry.note} |")
    return "\n".join(rows) + "\n"
