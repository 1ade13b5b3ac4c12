"""GPU check: rlvr's GRPO step (HFEngine + scoring + update) against a hand-written one.

Model: random-init Qwen2.5-0.5B shape (hidden 896, 24 layers, 14 heads, 2 KV heads,
intermediate 4864, vocabulary 151936, tied embeddings) in bfloat16, built from these
dimensions here (no download); a character tokenizer covers the vocabulary. Workload: 8
prompts of 32 characters x 8 responses x 256 new tokens, temperature 1.

Both paths are ``benchmarks/grpo_step.py``'s ``Ours`` (CausalLMPolicy: sampling with the
preallocated KV cache, the sampling log-probs as old log-probs, scoring with entropy,
fused/foreach AdamW) and ``Baseline`` (``model.generate``, a no_grad scoring forward,
forward + backward + AdamW), on copies of one model, interleaved step by step, each
phase timed in wall seconds after a device synchronize. Printed and written (JSON and
markdown): generation tokens/s, peak GPU memory per path, the generate / score /
update split, the step ratio, and how far rlvr's sampling log-probs are from its scoring
of the same tokens (the KV-cache path against a full forward, on this device).

``--smoke`` runs the same code with tiny shapes on the CPU (the test suite runs it).

    python benchmarks/gpu_check.py --out gpu_check     # writes gpu_check.json, gpu_check.md
    python benchmarks/gpu_check.py --smoke --out /tmp/smoke
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from grpo_step import PHASES, Baseline, Ours  # noqa: E402
from rlvr.modeling import build_char_tokenizer  # noqa: E402

QWEN_0_5B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
                 rms_norm_eps=1e-6, tie_word_embeddings=True)
SMOKE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=512, max_position_embeddings=256, rope_theta=1e6,
             rms_norm_eps=1e-6, tie_word_embeddings=True)
FIRST_CHAR = 0x100  # characters of the vocabulary start past ASCII; surrogates are skipped


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (a test of this script)")
    parser.add_argument("--out", default="gpu_check", help="result files: OUT.json and OUT.md")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per path, after --warmup")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    shape = dict(prompts=2, group_size=2, new_tokens=8, prompt_chars=8) if args.smoke else \
        dict(prompts=8, group_size=8, new_tokens=256, prompt_chars=32)
    for key, value in shape.items():
        setattr(args, key, value)
    args.share_prompts = True
    return args


def vocabulary_chars(vocab_size: int) -> list[str]:
    """vocab_size - 3 distinct characters (pad, bos and eos take ids 0-2)."""
    chars, code = [], FIRST_CHAR
    while len(chars) < vocab_size - 3:
        if not 0xD800 <= code <= 0xDFFF:
            chars.append(chr(code))
        code += 1
    return chars


def build(args: argparse.Namespace, device: torch.device) -> tuple[torch.nn.Module, object]:
    from transformers import AutoModelForCausalLM, Qwen2Config

    dims = SMOKE if args.smoke else QWEN_0_5B
    config = Qwen2Config(pad_token_id=0, bos_token_id=1, eos_token_id=2, **dims)
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, 2
    return model, build_char_tokenizer(vocabulary_chars(dims["vocab_size"]))


def prompts_for(step: int, args: argparse.Namespace, chars: list[str]) -> list[str]:
    generator = torch.Generator().manual_seed(args.seed * 1000 + step)
    # the first 64 characters only: prompts stay short strings of common ids
    picks = torch.randint(0, min(64, len(chars)), (args.prompts, args.prompt_chars), generator=generator)
    return ["".join(chars[i] for i in row) for row in picks.tolist()]


def log_prob_gap(policy, prompts: list[str], args: argparse.Namespace, generator: torch.Generator) -> dict:
    """How far the engine's recorded log-probs (KV cache, one token at a time) are from the
    policy's scoring of the same tokens (one forward over each response): max and mean
    absolute difference over response tokens. Float rounding only; bfloat16 makes it larger."""
    samples = policy.sample(prompts, args.group_size, 1.0, generator)
    with torch.no_grad():
        scored, _ = policy.log_probs(samples, 1.0)
    gap = (scored - samples.sample_log_probs).abs()[samples.response_mask]
    return {"max_abs": float(gap.max()), "mean_abs": float(gap.mean()), "tokens": int(gap.numel())}


def run(args: argparse.Namespace) -> dict:
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu" and args.smoke:
        torch.set_num_threads(1)  # tiny shapes: more threads only add overhead
    model, tokenizer = build(args, device)
    chars = vocabulary_chars(model.config.vocab_size)

    def clock() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    paths = {"rlvr": Ours(copy.deepcopy(model), tokenizer, args), "hand-written": Baseline(model, tokenizer, args)}
    generator = torch.Generator().manual_seed(args.seed + 1)
    steps: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
    peaks = dict.fromkeys(paths, 0)
    tokens: dict[str, list[int]] = {name: [] for name in paths}
    for step in range(args.warmup + args.repeats):
        prompts = prompts_for(step, args, chars)
        for name, path in paths.items():
            path.clock = clock
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            times = path.step(prompts, generator)
            if device.type == "cuda":
                peaks[name] = max(peaks[name], torch.cuda.max_memory_allocated())
            if step >= args.warmup:
                steps[name].append(times)
                tokens[name].append(path.last_tokens)
    result = summary(args, device, steps, peaks, tokens)
    result["rlvr_sample_vs_scored_log_probs"] = log_prob_gap(paths["rlvr"].policy, prompts_for(-1, args, chars), args,
                                                            generator)
    return result


def summary(args, device, steps, peaks, tokens) -> dict:
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else f"cpu ({platform.machine()})",
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        "shape": "smoke" if args.smoke else "Qwen2.5-0.5B (random init), bfloat16",
        "prompts": args.prompts, "group_size": args.group_size, "new_tokens": args.new_tokens,
        "repeats": args.repeats, "paths": {},
    }
    for name, timed in steps.items():
        phases = {p: statistics.median(s[p] for s in timed) for p in PHASES}
        step = statistics.median(sum(s.values()) for s in timed)
        generate_rate = statistics.median(t / s["generate"] for t, s in zip(tokens[name], timed))
        result["paths"][name] = {**{f"{p}_s": v for p, v in phases.items()}, "step_s": step,
                                 "generate_tokens_per_s": generate_rate,
                                 "peak_memory_gib": peaks[name] / 2**30 if device.type == "cuda" else None}
    result["step_ratio_hand_written_over_rlvr"] = (result["paths"]["hand-written"]["step_s"]
                                                   / result["paths"]["rlvr"]["step_s"])
    return result


def markdown(result: dict) -> str:
    lines = [f"GPU check: {result['device']}, torch {result['torch']}, transformers {result['transformers']}",
             f"{result['shape']}; {result['prompts']} prompts x {result['group_size']} responses x "
             f"{result['new_tokens']} new tokens; median of {result['repeats']} steps", "",
             "| path | generate s | score s | update s | step s | generate tokens/s | peak GiB |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in result["paths"].items():
        peak = "n/a" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.1f}"
        lines.append(f"| {name} | {r['generate_s']:.3f} | {r['score_s']:.3f} | {r['update_s']:.3f} | "
                     f"{r['step_s']:.3f} | {r['generate_tokens_per_s']:.0f} | {peak} |")
    gap = result["rlvr_sample_vs_scored_log_probs"]
    lines += ["", f"hand-written / rlvr step time: {result['step_ratio_hand_written_over_rlvr']:.2f}x",
              f"rlvr: sampling log-probs vs scored, |difference| max {gap['max_abs']:.2e}, mean {gap['mean_abs']:.2e} "
              f"over {gap['tokens']} tokens"]
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args()
    result = run(args)
    text = markdown(result)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
