"""Time TRL's GRPOTrainer steps on a saved model: the TRL half of ``grpo_step.py --trl``.

Runs in an interpreter that has ``trl`` (usually its own virtual environment, so that
its transformers does not replace rlvr's); imports neither rlvr nor anything of this
repository. ``grpo_step.py`` saves the model and the prompts, runs this script, and
reads the one JSON line it prints: the wall and CPU seconds of each optimizer step.

The step is TRL's whole GRPO step: B prompts x G completions generated with
``model.generate``, rewards, the clipped loss ("grpo": sequence mean of token means),
backward and AdamW. float32, no activation checkpointing (TRL defaults to bfloat16 and
checkpointing), no KL term (beta 0), one inner step, no gradient clipping, no logging:
the same work as rlvr's step in ``grpo_step.py``.

    python benchmarks/trl_step.py --model DIR --prompts-file prompts.json --group-size 8 ...

``time_to_accuracy.py`` runs it on a recipe's rows instead (``--rows-file``: chat prompts
and answers, the reward the recipe's gold check) and has the held-out prompts of
``--eval-file`` answered greedily before training and every ``--eval-every`` steps, outside
the timed steps; the completions come back in the JSON line for the caller to score, each
evaluation with the training seconds before it (``training_clock.py``: the wall clock from
just before the data and the model are loaded, less the evaluations'), as rlvr's side is timed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import tempfile
import time
from pathlib import Path

from training_clock import TrainingClock


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="folder with the model and its tokenizer")
    parser.add_argument("--prompts-file", help="JSON list of prompts, B per step, in step order (the digit reward)")
    parser.add_argument("--rows-file", help="JSON list of {prompt, answer} rows, B per step, in step order (the "
                                            "reward: the reply's last number is the answer, rlvr's gold check)")
    parser.add_argument("--eval-file", help="JSON list of held-out prompts, answered greedily")
    parser.add_argument("--eval-every", type=int, default=0, help="evaluate before training and every k steps")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-grad-norm", type=float, default=0.0, help="gradient clipping (0: none)")
    parser.add_argument("--prompts", type=int, required=True, help="B: prompts per step")
    parser.add_argument("--group-size", type=int, required=True, help="G: completions per prompt")
    parser.add_argument("--new-tokens", type=int, required=True, help="longest completion")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps (warm-up included)")
    parser.add_argument("--threads", type=int, required=True, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if (args.prompts_file is None) == (args.rows_file is None):
        parser.error("give one of --prompts-file and --rows-file")
    return args


def digit_reward(prompts: list[str], completions: list[str], **kwargs) -> list[float]:
    """grpo_step.py's stand-in reward: how many of the prompt's digits the completion holds."""
    return [float(sum(c in completion for c in prompt if c.isdigit()))
            for prompt, completion in zip(prompts, completions)]


def last_number_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """The arithmetic recipe's gold check: 1.0 when the reply's last number is the answer.
    rlvr's own ``exact_match`` (extract="last_number"), its file loaded by path: it imports
    only the standard library, and this interpreter has no rlvr."""
    return _verifiers().exact_match(completions, answer, extract="last_number")


def _verifiers():
    path = Path(__file__).resolve().parents[1] / "src" / "rlvr" / "rewards" / "verifiers.py"
    spec = importlib.util.spec_from_file_location("rlvr_verifiers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def greedy_completions(model, tokenizer, prompts: list, new_tokens: int, batch: int = 64) -> list[str]:
    """Each chat prompt's greedy reply, rendered by the model's chat template."""
    import torch

    replies = []
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for i in range(0, len(prompts), batch):
            texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
                     for p in prompts[i:i + batch]]
            encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            out = model.generate(**encoded, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
            replies += tokenizer.batch_decode(out[:, encoded["input_ids"].shape[1]:], skip_special_tokens=True)
    tokenizer.padding_side = padding_side
    model.train(was_training)
    return replies


def main() -> None:
    args = parse_args()
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    clock = TrainingClock()
    if args.rows_file:
        with open(args.rows_file) as f:
            rows = json.load(f)
        dataset, reward = Dataset.from_list(rows), last_number_reward
    else:
        with open(args.prompts_file) as f:
            dataset, reward = Dataset.from_dict({"prompt": json.load(f)}), digit_reward
    eval_prompts = []
    if args.eval_file:
        with open(args.eval_file) as f:
            eval_prompts = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    times: list[dict[str, float]] = []
    evals: list[dict] = []

    def evaluate(step: int) -> None:
        with clock.evaluation():
            completions = greedy_completions(model, tokenizer, eval_prompts, args.new_tokens)
        evals.append({"step": step, "seconds": clock.at_evaluations[-1], "completions": completions})

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.start = (time.perf_counter(), time.process_time())

        def on_step_end(self, *_, **__):
            times.append({"wall": time.perf_counter() - self.start[0], "cpu": time.process_time() - self.start[1]})
            clock.step_ended()

    class Evaluator(TrainerCallback):  # after StepTimer in the callbacks: outside the timed steps
        def on_train_begin(self, *_, **__):
            if eval_prompts:
                evaluate(0)

        def on_step_end(self, _args, state, *__, **___):
            if eval_prompts and args.eval_every and state.global_step % args.eval_every == 0:
                evaluate(state.global_step)

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, per_device_train_batch_size=args.prompts * args.group_size,
            num_generations=args.group_size, max_completion_length=args.new_tokens, temperature=args.temperature,
            top_p=1.0, top_k=0, learning_rate=args.lr, lr_scheduler_type="constant", beta=0.0, num_iterations=1,
            loss_type="grpo", max_grad_norm=args.max_grad_norm, max_steps=args.steps, shuffle_dataset=False,
            gradient_accumulation_steps=1, logging_strategy="no", save_strategy="no", report_to=[], use_cpu=True,
            seed=args.seed, disable_dropout=True, dataloader_num_workers=0, steps_per_generation=1,
            bf16=False, gradient_checkpointing=False,  # TRL's defaults; rlvr's step is float32 without checkpointing
        )
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, processing_class=tokenizer,
                              train_dataset=dataset, callbacks=[StepTimer(), Evaluator()])
        trainer.train()
    print(json.dumps({"trl": __import__("trl").__version__, "transformers": __import__("transformers").__version__,
                      "threads": torch.get_num_threads(), "steps": times, "evals": evals,
                      "at_steps": clock.at_steps,
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
