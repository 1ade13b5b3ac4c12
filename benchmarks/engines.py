"""Generation engines side by side: tokens/s of each, and a full rlvr GRPO step with each.

For each model size (random-init Llama-style models with the character vocabulary of
``rlvr init-model``), every available engine in ``--engines`` samples the same prompts
(``task.name=sort_text``, B prompts x G responses, up to T new tokens) in this one
process, interleaved repeat by repeat; the script prints the median generation tokens/s
(response tokens / wall seconds of ``policy.sample``) and the median wall seconds of
one GRPO step through the trainer (``collect_rollout`` + ``optimizer_step``: sampling,
rewards, old log-probs as the trainer takes them for that engine, one clipped update),
then each engine's ratio to the first one.

    tiny  hidden 64, intermediate 128, 2 layers, 2 heads
    mid   hidden 512, intermediate 1536, 8 layers, 8 heads

An engine is one entry of ENGINES: the ``policy.options`` that select it and a check
that says why it cannot run here (e.g. its package is missing); an unavailable engine
is skipped with that message. Adding one is adding an entry.

``--model`` runs a real model instead (``smollm2-135m-instruct``, the packaged GGUF, or any
model folder) on the chat prompts of the arithmetic recipe (``task.name=dataset`` on
``examples/data/chat_arithmetic_train.jsonl``, rendered by the model's chat template),
B = 4, G = 8 and 64 new tokens unless given.

    python benchmarks/engines.py                          # hf on tiny and mid
    python benchmarks/engines.py --engines hf,vllm --models tiny --repeats 5
    python benchmarks/engines.py --engines hf,vllm --model smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlvr.config import config_from_dict, merge, parse_overrides
from rlvr.loop.step import optimizer_step
from rlvr.loop.trainer import collect_rollout, setup
from rlvr.modeling import init_model

MODELS = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2),
    "mid": dict(hidden_size=512, intermediate_size=1536, num_layers=8, num_heads=8),
}


@dataclass(frozen=True)
class BenchEngine:
    """One engine as this benchmark runs it.

    options:     ``policy.options`` entries that select it (none: the default hf engine)
    unavailable: why it cannot run in this environment, or None when it can
    """

    options: dict = field(default_factory=dict)
    unavailable: Callable[[], str | None] = lambda: None


def missing_package(name: str) -> Callable[[], str | None]:
    return lambda: None if importlib.util.find_spec(name) is not None else f"the {name} package is not installed"


ENGINES: dict[str, BenchEngine] = {
    "hf": BenchEngine(),
    "vllm": BenchEngine({"engine": "vllm"}, missing_package("vllm")),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", default="hf", help=f"comma-separated, from: {', '.join(ENGINES)}")
    parser.add_argument("--models", default="tiny,mid", help=f"comma-separated, from: {', '.join(MODELS)}")
    parser.add_argument("--model", default=None, help="a real model (name, GGUF or folder) in place of --models")
    parser.add_argument("--prompts", type=int, default=None, help="B: prompts per step (default 8; 4 with --model)")
    parser.add_argument("--group-size", type=int, default=8, help="G: responses per prompt")
    parser.add_argument("--new-tokens", type=int, default=None, help="T: longest response (default 32; 64 with "
                                                                     "--model)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per engine, after one warm-up")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: rlvr's, the cores)")
    parser.add_argument("--device", default="cpu", help="where the trainer's model lives")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.prompts = args.prompts or (4 if args.model else 8)
    args.new_tokens = args.new_tokens or (64 if args.model else 32)
    return args


def task_overrides(args: argparse.Namespace) -> list[str]:
    """The prompts: the recipe's chat arithmetic for a real model, sort_text for the tiny ones."""
    if args.model:
        data = Path(__file__).resolve().parents[1] / "examples" / "data"
        return ["task.name=dataset", f"task.options={{path: '{data / 'chat_arithmetic_train.jsonl'}', "
                "answer_column: answer, gold: exact, extract: last_number, num_eval: 8}", "rewards.timeout=null"]
    return ["task.name=sort_text", "task.options={num_digits: 4, num_eval: 8}"]


def engine_config(args: argparse.Namespace, model: str, engine: BenchEngine, out_dir: str):
    options = {"model": model, "max_new_tokens": args.new_tokens, "device": args.device, **engine.options}
    if args.model and engine.options.get("engine") == "vllm":  # a real model's 8192 positions: a KV cache too
        options["engine_options"] = {"max_model_len": 1024}    # large for vLLM's CPU default; chats fit in 1024
    overrides = [
        *task_overrides(args), f"task.prompts_per_epoch={args.prompts}",
        "policy.name=causal_lm", f"algo.group_size={args.group_size}", "algo.loss=clipped", "algo.inner_steps=2",
        f"algo.epochs={args.repeats + 1}", "log.progress=false", "log.plot=false", f"seed={args.seed}",
        f"out_dir={out_dir}",
    ]
    # the options (a path among them) as a mapping rather than through YAML quoting
    config = config_from_dict(merge(parse_overrides(overrides), {"policy": {"options": options}}))
    if args.threads is not None:
        config.threads = args.threads
    return config


def time_engines(args: argparse.Namespace, model: str, names: list[str]) -> dict[str, dict[str, float]]:
    """Per engine: median generation tokens/s and median GRPO step seconds."""
    runs = {}
    with tempfile.TemporaryDirectory() as out:
        for name in names:
            config = engine_config(args, model, ENGINES[name], f"{out}/{name}")
            task, state = setup(config)
            runs[name] = (config, task, state, {"tokens_per_s": [], "step_s": []})
        try:
            for repeat in range(args.repeats + 1):
                for config, task, state, times in runs.values():  # interleaved: same machine load
                    prompts = task.sample_prompts(args.prompts, torch.Generator().manual_seed(repeat))
                    start = time.perf_counter()
                    samples = state.policy.sample(prompts, args.group_size, 1.0, state.generator)
                    generate = time.perf_counter() - start
                    start = time.perf_counter()
                    rollout = collect_rollout(config, task, state)
                    optimizer_step(config, state, rollout)
                    step = time.perf_counter() - start
                    if repeat > 0:  # the first is warm-up
                        times["tokens_per_s"].append(int(samples.response_mask.sum()) / generate)
                        times["step_s"].append(step)
        finally:
            for _, task, _, _ in runs.values():
                close = getattr(task, "close", None)
                if close is not None:
                    close()
    return {name: {key: statistics.median(values) for key, values in run[3].items()} for name, run in runs.items()}


def report(size: str, results: dict[str, dict[str, float]]) -> None:
    first = next(iter(results))
    print(f"{size}:")
    for name, r in results.items():
        gen_ratio = r["tokens_per_s"] / results[first]["tokens_per_s"]
        step_ratio = results[first]["step_s"] / r["step_s"]
        print(f"  {name:<6} generate {r['tokens_per_s']:>10.0f} tokens/s ({gen_ratio:.2f}x {first})   "
              f"GRPO step {r['step_s'] * 1000:>9.1f} ms ({step_ratio:.2f}x {first}'s speed)")


def main() -> None:
    args = parse_args()
    names = []
    for name in args.engines.split(","):
        if name not in ENGINES:
            raise SystemExit(f"unknown engine {name!r}; choose from: {', '.join(ENGINES)}")
        reason = ENGINES[name].unavailable()
        if reason is not None:
            print(f"skipping engine {name}: {reason}")
        else:
            names.append(name)
    if not names:
        raise SystemExit("no engine to run")
    print(f"B={args.prompts} G={args.group_size} T<={args.new_tokens}, {args.repeats} repeats after 1 warm-up, "
          f"device {args.device}, torch {torch.__version__}")
    if args.model:
        report(args.model, time_engines(args, args.model, names))
        print(f"torch threads: {torch.get_num_threads()}")
        return
    with tempfile.TemporaryDirectory() as folder:
        for size in args.models.split(","):
            model_dir = init_model(Path(folder) / size, arch="llama", max_positions=512, seed=args.seed,
                                   **MODELS[size])
            report(size, time_engines(args, str(model_dir), names))
    print(f"torch threads: {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
