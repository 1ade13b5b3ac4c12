"""Time one GRPO step of CausalLMPolicy against a minimal hand-written PyTorch loop.

Workload: Llama-style model (hidden 128, intermediate 384, 4 layers, 4 heads, tied
embeddings, character vocabulary of 17), 8 prompts of 6 digits, G = 8 responses each
(N = 64), 16 new tokens, temperature 1, clipped GRPO loss, AdamW.

Each step is split into three phases:

    generate  ours: policy.sample (KV cache, prompt encoded once per group, finished
              rows leave the batch); baseline: model.generate(do_sample=True,
              num_return_sequences=G, max_new_tokens=16)
    score     old log-probs. Ours: the sampling log-probs (no forward pass);
              baseline: one no_grad forward + log_softmax + gather
    update    one forward + backward of the clipped loss (rlvr.core.policy_loss,
              aggregate_loss) and an AdamW step; ours scores with policy.log_probs

Both start from the same weights and run interleaved in one process; the script prints
the median of each phase and the ratio baseline / ours of the whole step (goal >= 1.3).
Times are this process's CPU time by default (``time.process_time``, one torch thread):
on a shared machine it leaves out the time other processes hold the core; ``--clock
wall`` measures wall time instead (use it with more threads).

    python benchmarks/grpo_step.py                        # 3 warm-up + 15 timed steps
    python benchmarks/grpo_step.py --repeats 30 --threads 2 --clock wall
    python benchmarks/grpo_step.py --no-share-prompts     # ours without prompt sharing
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from rlvr import core
from rlvr.modeling import build_char_tokenizer, build_model
from rlvr.policies.causal_lm import CausalLMPolicy

PHASES = ("generate", "score", "update")
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
BENCHMARK_CHARS = "0123456789 >+="  # with pad, bos, eos: a vocabulary of 17


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="timed steps per path")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per path first")
    parser.add_argument("--prompts", type=int, default=8, help="B: prompts per step")
    parser.add_argument("--group-size", type=int, default=8, help="G: responses per prompt")
    parser.add_argument("--new-tokens", type=int, default=16, help="longest response")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--clock", choices=CLOCKS, default="cpu", help="cpu: process CPU time; wall: elapsed time")
    parser.add_argument("--share-prompts", action=argparse.BooleanOptionalAction, default=True,
                        help="ours: score each prompt once for its group (CausalLMPolicy.share_prompts)")
    parser.add_argument("--seed", type=int, default=0, help="model, prompt and sampling seed")
    return parser.parse_args()


def digit_prompts(count: int, generator: torch.Generator) -> list[str]:
    digits = torch.randint(0, 10, (count, 6), generator=generator)
    return ["".join(str(d) for d in row) for row in digits.tolist()]


def rewards_of(prompts: list[str], responses: list[list[str]]) -> torch.Tensor:
    """A cheap stand-in reward [B, G]: how many of the prompt's digits the response holds."""
    return torch.tensor([[float(sum(c in r for c in p)) for r in group] for p, group in zip(prompts, responses)])


def grpo_loss(log_probs, old_log_probs, rewards, mask) -> torch.Tensor:
    """Clipped GRPO loss of [N, T] log-probs, from [B, G] rewards and the [N, T] mask."""
    deltas = core.compute_deltas(rewards, "normalized").reshape(-1)  # [N]
    per_token, _ = core.policy_loss(log_probs, deltas, "clipped", old_log_probs)
    return core.aggregate_loss(per_token, mask, "seq_mean_token_mean")


class Ours:
    """One GRPO step through CausalLMPolicy."""

    def __init__(self, model, tokenizer, args):
        self.clock = CLOCKS[args.clock]
        self.policy = CausalLMPolicy(model, tokenizer, max_new_tokens=args.new_tokens,
                                     share_prompts=args.share_prompts)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.group_size = args.group_size

    def step(self, prompts: list[str], generator: torch.Generator) -> dict[str, float]:
        times = [self.clock()]
        samples = self.policy.sample(prompts, self.group_size, 1.0, generator)
        times.append(self.clock())
        old_log_probs = samples.sample_log_probs  # [N, T]: log pi_old, recorded while sampling
        times.append(self.clock())
        rewards = rewards_of(prompts, samples.responses)  # [B, G]
        start = self.clock()
        log_probs, _ = self.policy.log_probs(samples, 1.0)
        grpo_loss(log_probs, old_log_probs, rewards, samples.response_mask).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        times.append(self.clock() - start + times[-1])
        return {phase: b - a for phase, a, b in zip(PHASES, times, times[1:])}


class Baseline:
    """The same step written directly against transformers and torch."""

    def __init__(self, model, tokenizer, args):
        self.clock = CLOCKS[args.clock]
        self.model, self.tokenizer, self.args = model, tokenizer, args
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.eos = tokenizer.eos_token_id

    def sequence_log_probs(self, sequences, attention, prompt_len):
        """log pi of the response tokens [N, T] of sequences [N, P + T]."""
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(input_ids=sequences, attention_mask=attention, position_ids=positions).logits
        log_probs = torch.log_softmax(logits[:, prompt_len - 1:-1].float(), dim=-1)
        return log_probs.gather(-1, sequences[:, prompt_len:, None]).squeeze(-1)

    def step(self, prompts: list[str], generator: torch.Generator) -> dict[str, float]:
        g, new_tokens = self.args.group_size, self.args.new_tokens
        times = [self.clock()]
        inputs = self.tokenizer(prompts, return_tensors="pt", padding=True)
        torch.manual_seed(int(torch.randint(2**31, (1,), generator=generator)))
        sequences = self.model.generate(**inputs, do_sample=True, num_return_sequences=g, max_new_tokens=new_tokens,
                                        temperature=1.0, top_k=0, top_p=1.0, pad_token_id=self.tokenizer.pad_token_id)
        prompt_len = inputs["input_ids"].shape[1]
        response = sequences[:, prompt_len:]  # [N, T]
        is_eos = (response == self.eos).long()
        mask = (is_eos.cumsum(-1) - is_eos) == 0  # up to and including the first EOS
        attention = torch.cat([inputs["attention_mask"].repeat_interleave(g, 0), mask.long()], dim=1)
        texts = self.tokenizer.batch_decode(torch.where(mask, response, self.eos), skip_special_tokens=True)
        times.append(self.clock())
        with torch.no_grad():
            old_log_probs = self.sequence_log_probs(sequences, attention, prompt_len)
        times.append(self.clock())
        rewards = rewards_of(prompts, [texts[b * g:(b + 1) * g] for b in range(len(prompts))])
        start = self.clock()
        log_probs = self.sequence_log_probs(sequences, attention, prompt_len)
        grpo_loss(log_probs, old_log_probs, rewards, mask).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        times.append(self.clock() - start + times[-1])
        return {phase: b - a for phase, a, b in zip(PHASES, times, times[1:])}


def report(results: dict[str, list[dict[str, float]]]) -> None:
    medians = {}
    print(f"{'path':<10}" + "".join(f"{p:>12}" for p in (*PHASES, "step")) + "   (median ms)")
    for name, steps in results.items():
        medians[name] = {p: statistics.median(s[p] for s in steps) for p in PHASES}
        medians[name]["step"] = statistics.median(sum(s.values()) for s in steps)
        print(f"{name:<10}" + "".join(f"{1000 * medians[name][p]:>12.1f}" for p in (*PHASES, "step")))
    ratio = medians["baseline"]["step"] / medians["ours"]["step"]
    print("baseline / ours: " + ", ".join(
        f"{p} {medians['baseline'][p] / medians['ours'][p]:.2f}x" for p in ("generate", "update", "step")))
    print(f"step speed-up: {ratio:.2f}x (goal >= 1.3x)")


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = build_char_tokenizer(BENCHMARK_CHARS)
    model = build_model("llama", vocab_size=len(tokenizer), hidden_size=128, intermediate_size=384,
                        num_layers=4, num_heads=4, tie_embeddings=True, seed=args.seed)
    paths = {"ours": Ours(copy.deepcopy(model), tokenizer, args), "baseline": Baseline(model, tokenizer, args)}
    generator = torch.Generator().manual_seed(args.seed)
    results = {name: [] for name in paths}
    for i in range(args.warmup + args.repeats):
        prompts = digit_prompts(args.prompts, generator)
        for name, path in paths.items():  # interleaved: both see the same machine load
            times = path.step(prompts, generator)
            if i >= args.warmup:
                results[name].append(times)
    print(f"{args.repeats} steps after {args.warmup} warm-up, {torch.get_num_threads()} torch thread(s), {args.clock} "
          f"time; V={len(tokenizer)} B={args.prompts} G={args.group_size} new tokens={args.new_tokens}")
    report(results)


if __name__ == "__main__":
    main()
