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
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="folder with the model and its tokenizer")
    parser.add_argument("--prompts-file", required=True, help="JSON list of prompts, B per step, in step order")
    parser.add_argument("--prompts", type=int, required=True, help="B: prompts per step")
    parser.add_argument("--group-size", type=int, required=True, help="G: completions per prompt")
    parser.add_argument("--new-tokens", type=int, required=True, help="longest completion")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps (warm-up included)")
    parser.add_argument("--threads", type=int, required=True, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def digit_reward(prompts: list[str], completions: list[str], **kwargs) -> list[float]:
    """grpo_step.py's stand-in reward: how many of the prompt's digits the completion holds."""
    return [float(sum(c in completion for c in prompt if c.isdigit()))
            for prompt, completion in zip(prompts, completions)]


def main() -> None:
    args = parse_args()
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    with open(args.prompts_file) as f:
        prompts = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    times: list[dict[str, float]] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.start = (time.perf_counter(), time.process_time())

        def on_step_end(self, *_, **__):
            times.append({"wall": time.perf_counter() - self.start[0], "cpu": time.process_time() - self.start[1]})

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, per_device_train_batch_size=args.prompts * args.group_size,
            num_generations=args.group_size, max_completion_length=args.new_tokens, temperature=1.0, top_p=1.0,
            top_k=0, learning_rate=1e-4, lr_scheduler_type="constant", beta=0.0, num_iterations=1,
            loss_type="grpo", max_grad_norm=0.0, max_steps=args.steps, shuffle_dataset=False,
            gradient_accumulation_steps=1, logging_strategy="no", save_strategy="no", report_to=[], use_cpu=True,
            seed=args.seed, disable_dropout=True, dataloader_num_workers=0, steps_per_generation=1,
            bf16=False, gradient_checkpointing=False,  # TRL's defaults; rlvr's step is float32 without checkpointing
        )
        trainer = GRPOTrainer(model=model, reward_funcs=digit_reward, args=config, processing_class=tokenizer,
                              train_dataset=Dataset.from_dict({"prompt": prompts}), callbacks=[StepTimer()])
        trainer.train()
    print(json.dumps({"trl": __import__("trl").__version__, "transformers": __import__("transformers").__version__,
                      "threads": torch.get_num_threads(), "steps": times,
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
