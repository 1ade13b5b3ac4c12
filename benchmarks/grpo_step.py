"""Time one GRPO step of CausalLMPolicy against a minimal hand-written PyTorch loop, and TRL.

Workload: Llama-style model (hidden 128, intermediate 384, 4 layers, 4 heads, tied
embeddings, character vocabulary of 17), 8 prompts of 6 digits, G = 8 responses each
(N = 64), 16 new tokens, temperature 1, clipped GRPO loss, AdamW.

Each step is split into three phases:

    generate  ours: policy.sample (HFEngine: preallocated KV cache, prompt encoded once
              per group, finished rows leave the batch); baseline:
              model.generate(do_sample=True, num_return_sequences=G, max_new_tokens=16)
    score     old log-probs. Ours: the sampling log-probs (no forward pass);
              baseline: one no_grad forward + log_softmax + gather
    update    one forward + backward of the clipped loss (rlvr.core.policy_loss,
              aggregate_loss) and an AdamW step; ours scores with policy.log_probs
              (with the entropy, as the trainer logs it) and steps the trainer's
              fused AdamW, the baseline a plain torch.optim.AdamW

Both start from the same weights, see the same prompts and run interleaved in one
process, once per thread setting: each count in ``--threads`` for both sides, then each
side's default (rlvr's ``threads: null`` for a causal LM, and torch's own default for
the baseline and TRL: both the machine's cores, so that row is the cores row). One
torch thread is timed in this process's CPU time (``time.process_time``: on a shared
machine it leaves out the time other processes hold the core), more threads in wall
time; ``--clock`` forces one. The script prints the median of each phase and the ratio
baseline / ours of the whole step.

``--model`` times a real model instead (``smollm2-135m-instruct``, the packaged GGUF, or any
model folder): chat prompts from the arithmetic recipe (``examples/data/chat_arithmetic_train.jsonl``,
rendered by the model's chat template into the same text for every side), by default B = 4,
G = 8 and 64 new tokens; the model's vocabulary (49,152 for SmolLM2) makes the LM head and
the log-softmax a large share of the step.

With ``--trl``, TRL's GRPOTrainer runs the same steps (same saved model, prompts, G, new
tokens and threads; float32, no checkpointing, no KL) in a subprocess of
``--trl-python`` (default: this interpreter), e.g. a virtual environment made with
``python -m venv /tmp/trl-venv && /tmp/trl-venv/bin/pip install torch==2.13.0 trl`` so
that TRL's transformers stays out of rlvr's. It is timed after ours, not interleaved;
the script prints TRL / ours, or "TRL not installed".

    python benchmarks/grpo_step.py                        # 1 thread and the cores; 3 warm-up + 15 timed steps
    python benchmarks/grpo_step.py --threads 1 --repeats 30
    python benchmarks/grpo_step.py --trl --trl-python /tmp/trl-venv/bin/python
    python benchmarks/grpo_step.py --no-share-prompts     # ours without prompt sharing
    python benchmarks/grpo_step.py --memory               # also each side's peak RSS, each in a process of its own
    python benchmarks/grpo_step.py --no-loop --limits     # rlvr alone, against this machine's limits
    python benchmarks/grpo_step.py --model smollm2-135m-instruct --repeats 3 --warmup 1 --memory \
        --trl --trl-python /tmp/trl-venv/bin/python

``--memory`` runs ours, then the baseline, alone (1 thread, the same steps) in a fresh
interpreter each and prints its peak resident memory (``ru_maxrss``) after building the
model and after the steps; TRL's run prints its own peak. With ``PYTHONPATH=<a checkout of
another revision>/src`` it measures that revision's step.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from rlvr import core
from rlvr.config import Config, OptimConfig, PolicyConfig
from rlvr.loop import optim
from rlvr.loop.optim import build_optimizer
from rlvr.modeling import build_char_tokenizer, build_model
from rlvr.policies.causal_lm import CausalLMPolicy
from rlvr.policies.scoring import length_buckets

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling machine_limits.py
from machine_limits import Shapes, StepTokens, copy_bandwidth, decode_limit, update_limit  # noqa: E402

# the trainer's update; revisions without optimizer_update (--memory of an older checkout) step()
optimizer_update = getattr(optim, "optimizer_update", lambda optimizer: optimizer.step())
clear_grads = getattr(optim, "clear_grads", lambda optimizer: optimizer.zero_grad(set_to_none=True))

PHASES = ("generate", "score", "update")
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
BENCHMARK_CHARS = "0123456789 >+="  # with pad, bos, eos: a vocabulary of 17
TORCH_DEFAULT_THREADS = torch.get_num_threads()  # read before anything sets it
RLVR_DEFAULT_THREADS = Config(policy=PolicyConfig(name="causal_lm")).torch_threads  # rlvr's threads: null


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="timed steps per path")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per path first")
    parser.add_argument("--model", default=None,
                        help="a real model (smollm2-135m-instruct, a GGUF or a model folder) with chat prompts; "
                             "default: the tiny Llama with digit prompts")
    parser.add_argument("--prompts", type=int, default=None, help="B: prompts per step (default 8; 4 with --model)")
    parser.add_argument("--group-size", type=int, default=8, help="G: responses per prompt")
    parser.add_argument("--new-tokens", type=int, default=None,
                        help="longest response (default 16; 64 with --model)")
    parser.add_argument("--threads", default=f"1,{TORCH_DEFAULT_THREADS}",
                        help="comma-separated torch thread counts, each for both sides (default: 1 and the cores)")
    parser.add_argument("--clock", choices=("auto", *CLOCKS), default="auto",
                        help="cpu: process CPU time; wall: elapsed time; auto: cpu at 1 thread, else wall")
    parser.add_argument("--trl", action="store_true", help="also time TRL's GRPOTrainer step (a subprocess)")
    parser.add_argument("--trl-python", default=sys.executable, help="an interpreter that can import trl")
    parser.add_argument("--share-prompts", action=argparse.BooleanOptionalAction, default=True,
                        help="ours: score each prompt once for its group (CausalLMPolicy.share_prompts)")
    parser.add_argument("--seed", type=int, default=0, help="model, prompt and sampling seed")
    parser.add_argument("--memory", action="store_true", help="also each side's peak RSS, each in a process of its own")
    parser.add_argument("--limits", action="store_true",
                        help="also ours's update and generation against this machine's limits (machine_limits.py)")
    parser.add_argument("--profile", action="store_true", help="also one step of ours under torch's profiler")
    parser.add_argument("--loop", action=argparse.BooleanOptionalAction, default=True,
                        help="also the hand-written loop (the baseline); --no-loop: rlvr (and TRL) only")
    parser.add_argument("--memory-child", choices=("ours", "baseline"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.prompts = args.prompts or (4 if args.model else 8)
    args.new_tokens = args.new_tokens or (64 if args.model else 16)
    return args


def digit_prompts(count: int, generator: torch.Generator) -> list[str]:
    digits = torch.randint(0, 10, (count, 6), generator=generator)
    return ["".join(str(d) for d in row) for row in digits.tolist()]


def chat_prompts(tokenizer, count: int, steps: int) -> list[list[str]]:
    """``steps`` lists of ``count`` recipe questions, rendered by the model's chat template."""
    path = Path(__file__).resolve().parents[1] / "examples" / "data" / "chat_arithmetic_train.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    texts = [tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
             for row in rows[:count * steps]]
    return [texts[i * count:(i + 1) * count] for i in range(steps)]


def rewards_of(prompts: list[str], responses: list[list[str]]) -> torch.Tensor:
    """A cheap stand-in reward [B, G]: how many of the prompt's digits the response holds."""
    return torch.tensor([[float(sum(c in r for c in p if c.isdigit())) for r in group]
                         for p, group in zip(prompts, responses)])


def grpo_loss(log_probs, old_log_probs, rewards, mask) -> torch.Tensor:
    """Clipped GRPO loss of [N, T] log-probs, from [B, G] rewards and the [N, T] mask."""
    deltas = core.compute_deltas(rewards.to(log_probs.device), "normalized").reshape(-1)  # [N]
    per_token, _ = core.policy_loss(log_probs, deltas, "clipped", old_log_probs)
    return core.aggregate_loss(per_token, mask, "seq_mean_token_mean")


class Ours:
    """One GRPO step through CausalLMPolicy."""

    def __init__(self, model, tokenizer, args):
        self.clock = time.process_time
        self.policy = CausalLMPolicy(model, tokenizer, max_new_tokens=args.new_tokens,
                                     share_prompts=args.share_prompts)
        # the trainer's optimizer (fused AdamW) and its scoring call, entropy included
        self.optimizer = build_optimizer(OptimConfig(name="adamw", lr=1e-4), list(model.parameters()))
        self.group_size = args.group_size
        self.tokens: list[StepTokens] = []  # each step's real tokens, for --limits
        self.positions: list[tuple[int, int]] = []  # each update's (positions run, real tokens)

    def step(self, prompts: list[str], generator: torch.Generator) -> dict[str, float]:
        times = [self.clock()]
        samples = self.generate(prompts, generator)
        times.append(self.clock())
        old_log_probs = samples.sample_log_probs  # [N, T]: log pi_old, recorded while sampling
        times.append(self.clock())
        rewards = rewards_of(prompts, samples.responses)  # [B, G]
        start = self.clock()
        self.update(samples, old_log_probs, rewards)
        times.append(self.clock() - start + times[-1])
        self.last_tokens = int(samples.response_mask.sum())  # response tokens of this step
        self.tokens.append(step_tokens(samples, self.group_size))
        self.positions.append(positions_run(samples, self.tokens[-1], self.policy.share_prompts))
        return {phase: b - a for phase, a, b in zip(PHASES, times, times[1:])}


    def generate(self, prompts: list[str], generator: torch.Generator):
        return self.policy.sample(prompts, self.group_size, 1.0, generator)

    def update(self, samples, old_log_probs: torch.Tensor, rewards: torch.Tensor) -> None:
        log_probs, _ = self.policy.log_probs(samples, 1.0, with_entropy=True)
        grpo_loss(log_probs, old_log_probs, rewards, samples.response_mask).backward()
        optimizer_update(self.optimizer)  # as the trainer steps (rlvr.loop.step.optimizer_step)
        clear_grads(self.optimizer)


def step_tokens(samples, group_size: int) -> StepTokens:
    """The real tokens of a step's samples (rows b * G + g: prompt b's g-th response)."""
    prompt_lengths = samples.prompt_mask.sum(dim=1).tolist()[::group_size]
    response_lengths = samples.response_mask.sum(dim=1).tolist()
    return StepTokens(prompt_lengths, response_lengths, [row // group_size for row in range(len(response_lengths))])


def positions_run(samples, tokens: StepTokens, share: bool) -> tuple[int, int]:
    """(positions the update's forward runs, real tokens among them): the prompts, each padded to the widest (with
    ``share``, once each: ``encode_prompts``), then rlvr's buckets of like response width (``length_buckets``, as
    ``CausalLMPolicy.log_probs`` splits), each bucket's rows narrowed to its widest."""
    width = samples.prompt_ids.shape[1]
    ends = torch.tensor(tokens.response_lengths)
    run = len(tokens.prompt_lengths) * width if share else 0
    for rows in length_buckets(ends, 0):
        run += len(rows) * (int(ends[rows].max()) + (0 if share else width))
    real_prompts = sum(tokens.prompt_lengths) if share else sum(tokens.prompt_lengths[b] for b in tokens.prompt_of_row)
    return run, real_prompts + sum(tokens.response_lengths)


class Baseline:
    """The same step written directly against transformers and torch."""

    def __init__(self, model, tokenizer, args):
        self.clock = time.process_time
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
        inputs = self.tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left",
                                add_special_tokens=True).to(self.model.device)
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
        optimizer_update(self.optimizer)  # as the trainer steps (rlvr.loop.step.optimizer_step)
        clear_grads(self.optimizer)
        times.append(self.clock() - start + times[-1])
        self.last_tokens = int(mask.sum())
        return {phase: b - a for phase, a, b in zip(PHASES, times, times[1:])}


def clock_name(threads: int, clock: str) -> str:
    return clock if clock != "auto" else ("cpu" if threads == 1 else "wall")


def time_pair(model, tokenizer, args, threads: tuple[int, int], prompts: list[list[str]]) -> tuple[dict, Ours]:
    """Ours and the baseline (threads[0], threads[1]) from copies of ``model``, interleaved
    step by step on the same prompts: {path: [{phase: seconds}]} of the timed steps, and ours."""
    clock = CLOCKS[clock_name(max(threads), args.clock)]
    paths = {"ours": Ours(copy.deepcopy(model), tokenizer, args)}
    if args.loop:
        paths["baseline"] = Baseline(copy.deepcopy(model), tokenizer, args)
    generator = torch.Generator().manual_seed(args.seed + 1)
    results = {name: [] for name in paths}
    for i, step_prompts in enumerate(prompts):
        for (name, path), count in zip(paths.items(), threads):  # interleaved: both see the same machine load
            path.clock = clock
            torch.set_num_threads(count)
            times = path.step(step_prompts, generator)
            if i >= args.warmup:
                results[name].append(times)
    return results, paths["ours"]


def medians(steps: list[dict[str, float]]) -> dict[str, float]:
    out = {p: statistics.median(s[p] for s in steps) for p in PHASES}
    out["step"] = statistics.median(sum(s.values()) for s in steps)
    return out


def report(title: str, results: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    print(f"\n{title}")
    table = {name: medians(steps) for name, steps in results.items()}
    print(f"  {'path':<10}" + "".join(f"{p:>12}" for p in (*PHASES, "step")) + "   (median ms)")
    for name, m in table.items():
        print(f"  {name:<10}" + "".join(f"{1000 * m[p]:>12.1f}" for p in (*PHASES, "step")))
    if "baseline" in table:
        print("  baseline / ours: " + ", ".join(
            f"{p} {table['baseline'][p] / table['ours'][p]:.2f}x" for p in ("generate", "update", "step")))
    return table


def trl_step_times(args, model, tokenizer, prompts: list[list[str]], threads: int) -> list[dict] | None:
    """TRL's step seconds ({"wall", "cpu"} per step) in a subprocess of ``--trl-python``, or None without trl."""
    found = subprocess.run([args.trl_python, "-c", "import trl"], capture_output=True)
    if found.returncode != 0:
        return None
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        prompts_file = Path(folder) / "prompts.json"
        prompts_file.write_text(json.dumps([p for step in prompts for p in step]))
        command = [args.trl_python, str(Path(__file__).with_name("trl_step.py")), "--model", folder,
                   "--prompts-file", str(prompts_file), "--prompts", str(args.prompts), "--group-size",
                   str(args.group_size), "--new-tokens", str(args.new_tokens), "--steps", str(len(prompts)),
                   "--threads", str(threads), "--seed", str(args.seed)]
        done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"TRL run failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"  (TRL {result['trl']}, transformers {result['transformers']}; peak RSS {result['peak_rss_mib']:.0f} MiB "
          f"at {threads} thread(s))")
    return result["steps"][args.warmup:]


def report_limits(model, ours: Ours, steps: list[dict[str, float]]) -> None:
    """Ours's timed steps against this machine's limits (``machine_limits.py``), medians over the steps."""
    shapes, bandwidth = Shapes.of(model), copy_bandwidth()
    update, generate, padding = [], [], []
    for times, tokens, (run, real) in zip(steps, ours.tokens[-len(steps):], ours.positions[-len(steps):]):
        limit, bound = update_limit(shapes, tokens), decode_limit(shapes, tokens, bandwidth)
        update.append((limit["flops"] / times["update"], limit["flops_per_s"], limit["seconds"] / times["update"]))
        decoded = sum(tokens.response_lengths) / times["generate"]
        generate.append((decoded, sum(tokens.response_lengths) / bound["bandwidth_seconds"],
                         sum(tokens.response_lengths) / bound["compute_seconds"], bound["tokens_per_s"],
                         decoded / bound["tokens_per_s"]))
        padding.append(run / real)
    u = [statistics.median(column) for column in zip(*update)]
    g = [statistics.median(column) for column in zip(*generate)]
    print(f"  limits (medians of {len(steps)} steps; copy bandwidth {bandwidth / 1e9:.1f} GB/s):")
    print(f"    update:   {u[0] / 1e9:.1f} GFLOP/s useful (forward + backward of the real tokens); the same matmuls "
          f"here {u[1] / 1e9:.1f} GFLOP/s: {u[2]:.0%} of the limit")
    print(f"    generate: {g[0]:.0f} tokens/s (prefill included); bounds: memory bandwidth {g[1]:.0f}, matmuls "
          f"{g[2]:.0f}, the larger at each position {g[3]:.0f} tokens/s: {g[4]:.0%} of the limit "
          f"({g[0] / g[1]:.0%} of the bandwidth bound)")
    print(f"    padding:  the update runs {statistics.median(padding):.2f}x the real tokens' positions "
          "(what packing could save at most)")


def report_profile(ours: Ours, prompts: list[str], generator: torch.Generator, rows: int = 12) -> None:
    """One more step of ours under torch's profiler: each phase's ops by self CPU time."""
    from torch.profiler import profile

    with profile() as sampling:
        samples = ours.generate(prompts, generator)
    with profile() as updating:
        ours.update(samples, samples.sample_log_probs, rewards_of(prompts, samples.responses))
    for name, prof in (("generate", sampling), ("update", updating)):
        print(f"\n  profile of ours's {name}:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def release_memory() -> None:
    """Free what this process no longer holds and hand the heap back to the system (glibc's malloc_trim)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def memory_child(args, model, tokenizer, prompts: list[list[str]]) -> None:
    """One side's steps alone at 1 thread; prints {"built": MiB, "peak": MiB} as the last line."""
    torch.set_num_threads(1)
    side = (Ours if args.memory_child == "ours" else Baseline)(model, tokenizer, args)
    built = peak_rss_mib()
    generator = torch.Generator().manual_seed(args.seed + 1)
    for step_prompts in prompts:
        side.step(step_prompts, generator)
    print(json.dumps({"built": built, "peak": peak_rss_mib()}))


def report_memory(args) -> None:
    """Each side's peak RSS from ``memory_child`` in a fresh interpreter."""
    for side in ("ours", "baseline") if args.loop else ("ours",):
        command = [sys.executable, __file__, "--memory-child", side, "--prompts", str(args.prompts), "--group-size",
                   str(args.group_size), "--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats),
                   "--warmup", str(args.warmup), "--seed", str(args.seed),
                   *(["--model", args.model] if args.model else []),
                   *([] if args.share_prompts else ["--no-share-prompts"])]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"memory run failed:\n{done.stderr[-3000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        steps = result["peak"] - result["built"]
        print(f"{side} alone (1 thread, {args.warmup + args.repeats} steps): peak RSS {result['peak']:.0f} MiB, "
              f"{result['built']:.0f} MiB after building the model ({steps:.0f} MiB for the steps)")


def load_model(args):
    """(model, tokenizer, prompts of each step): ``--model`` with chat prompts, else the tiny Llama."""
    steps = args.warmup + args.repeats
    if args.model:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from rlvr.policies.hf_model import locate_model

        folder = locate_model(args.model)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        return model, tokenizer, chat_prompts(tokenizer, args.prompts, steps)
    tokenizer = build_char_tokenizer(BENCHMARK_CHARS)
    model = build_model("llama", vocab_size=len(tokenizer), hidden_size=128, intermediate_size=384,
                        num_layers=4, num_heads=4, tie_embeddings=True, seed=args.seed)
    prompt_generator = torch.Generator().manual_seed(args.seed)
    return model, tokenizer, [digit_prompts(args.prompts, prompt_generator) for _ in range(steps)]


def main() -> None:
    args = parse_args()
    counts = sorted({int(t) for t in args.threads.split(",")})
    model, tokenizer, prompts = load_model(args)
    if args.memory_child:
        memory_child(args, model, tokenizer, prompts)
        return
    if args.memory:
        report_memory(args)
    print(f"{args.model or 'tiny Llama'}: {args.repeats} steps after {args.warmup} warm-up per setting; "
          f"V={len(tokenizer)} B={args.prompts} "
          f"G={args.group_size} new tokens={args.new_tokens}; defaults: rlvr {RLVR_DEFAULT_THREADS} thread(s), "
          f"baseline and TRL {TORCH_DEFAULT_THREADS} (torch's)")
    settings = {f"{n} thread(s) each": (n, n) for n in counts}
    defaults = (RLVR_DEFAULT_THREADS, TORCH_DEFAULT_THREADS)
    if defaults not in settings.values():
        settings[f"defaults (rlvr {defaults[0]}, baseline {defaults[1]} threads)"] = defaults
    for title, threads in settings.items():
        name = clock_name(max(threads), args.clock)
        results, ours = time_pair(model, tokenizer, args, threads, prompts)
        table = report(f"{title}, {name} time", results)
        if args.limits and threads[0] == threads[1]:
            report_limits(model, ours, results["ours"])
        if args.profile and threads[0] == threads[1]:
            report_profile(ours, prompts[-1], torch.Generator().manual_seed(args.seed + 2))
        del results, ours
        release_memory()  # TRL's process (about 12 GiB on SmolLM2) starts beside this one
        if threads == defaults and not title.startswith("defaults"):
            print("  (this row is each side's default)")
        if args.trl and threads[0] == threads[1]:
            steps = trl_step_times(args, model, tokenizer, prompts, threads[1])
            if steps is None:
                print(f"  TRL not installed (for {args.trl_python}); see --trl-python")
                args.trl = False
                continue
            trl = statistics.median(s[name] for s in steps)
            print(f"  TRL GRPOTrainer step {1000 * trl:.1f} ms: TRL / ours {trl / table['ours']['step']:.2f}x "
                  f"(ours {1 / table['ours']['step']:.2f} steps/s, TRL {1 / trl:.2f} steps/s)")


if __name__ == "__main__":
    main()
