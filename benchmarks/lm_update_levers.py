"""Two levers on the LM step's update (scoring forward + backward + AdamW), measured in one
process: plain float32, bfloat16 autocast over float32 weights (``policy.options.autocast``),
and the scoring forward through ``torch.compile`` (``policy.options.compile``). The workload
is ``grpo_step.py``'s (hidden 128, 4 layers, vocab 17, 8 prompts x 8 responses, 16 new
tokens), one batch sampled once and updated on repeatedly; one torch thread, process CPU
time, the median of ``--repeats`` updates after the first (the first, which holds the
compile, is printed apart: inductor's cold compile only the first time on a machine, whose
cache keeps it). Each lever starts from a copy of the same weights.

    python benchmarks/lm_update_levers.py
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from rlvr.config import OptimConfig
from rlvr.loop.optim import build_optimizer
from rlvr.modeling import init_model, load_model_and_tokenizer, quiet_libraries
from rlvr.policies.causal_lm import CausalLMPolicy

sys.path.insert(0, str(Path(__file__).parent))
from grpo_step import digit_prompts, grpo_loss, rewards_of  # noqa: E402


def time_update(model, tokenizer, samples, rewards, lever: str, repeats: int) -> tuple[float, float, float]:
    """(first update s, median of the next ``repeats`` s, first loss) with ``lever``."""
    policy = CausalLMPolicy(model, tokenizer, max_new_tokens=16, autocast="bfloat16" if lever == "bf16" else None,
                            compile=lever == "compile")  # policy.options.autocast / policy.options.compile
    optimizer = build_optimizer(OptimConfig(name="adamw", lr=1e-4), list(model.parameters()))

    def update() -> float:
        log_probs, _ = policy.log_probs(samples, 1.0, with_entropy=True)
        loss = grpo_loss(log_probs, samples.sample_log_probs, rewards, samples.response_mask)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    clock = time.process_time()
    loss = update()
    first = time.process_time() - clock
    times = []
    for _ in range(repeats):
        clock = time.process_time()
        update()
        times.append(time.process_time() - clock)
    return first, statistics.median(times), loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp, quiet_libraries():
        init_model(Path(tmp), hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4, seed=0)
        model, tokenizer = load_model_and_tokenizer(tmp)
    generator = torch.Generator().manual_seed(1)
    prompts = digit_prompts(8, generator)
    samples = CausalLMPolicy(model, tokenizer, max_new_tokens=16).sample(prompts, 8, 1.0, generator)
    rewards = rewards_of(prompts, samples.responses)
    print(f"torch {torch.__version__}, 1 thread, CPU time; update = scoring forward + backward + AdamW")
    plain = None
    for lever in ("float32", "bf16", "compile"):
        first, median, loss = time_update(copy.deepcopy(model), tokenizer, samples, rewards, lever, args.repeats)
        plain = plain or median
        print(f"  {lever:<8} first {first * 1000:9.1f} ms   median {median * 1000:7.1f} ms   "
              f"float32 / this {plain / median:.2f}x   first loss {loss:+.6f}")


if __name__ == "__main__":
    main()
