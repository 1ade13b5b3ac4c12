"""Does the driver's memory grow with the model? Peak RSS of the driver process of a run with
2 data-parallel learners and a rollout worker (``cluster.learners=2``,
``cluster.rollout_workers=1``), for two random tiny Llamas whose parameter counts differ
about 10x, in the same run.

Each run is ``rlvr train`` in a child process (2 epochs of ``sort_text`` from the random
model with a KL term, FSDP learners unless ``--strategy ddp``, evaluated at the start and the
end, a checkpoint at the end); its peak RSS is the child's ``ru_maxrss`` (the learners and the
worker are Ray actors, not its children, so they are not counted; the reward worker processes
it forks are smaller than it). A driver that holds no weights, optimizer state or reference
stays the same size; one that takes the learners' state back every epoch grows by the
model's parameters and Adam state.

    python benchmarks/driver_memory.py
    python benchmarks/driver_memory.py --small 256 2 --large 512 5 --strategy ddp
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from rlvr.modeling import init_model, quiet_libraries


def parameters(hidden: int, layers: int) -> int:
    """Parameters of ``init_model``'s Llama without the (tiny) embeddings: 4 h^2 attention + 3 h (4h) MLP a layer."""
    return layers * 16 * hidden * hidden


def driver_peak_rss(model: Path, out: Path, strategy: str) -> float:
    """MiB: the peak resident memory of the driver process of a 2-learner run."""
    args = [sys.executable, "-m", "rlvr.cli", "train", "task.name=sort_text", "task.options={num_digits: 3}",
            "task.prompts_per_epoch=4", "policy.name=causal_lm",
            f"policy.options={{model: '{model}', max_new_tokens: 6}}", "algo.epochs=2", "algo.group_size=2",
            "algo.kl_coef=0.01", "cluster.learners=2", "cluster.rollout_workers=1",
            f"cluster.learner_strategy={strategy}", "log.progress=false", "log.plot=false", "log.eval_every=100",
            "log.eval_at_start=true", "log.checkpoint_every=0", f"out_dir={out}", "threads=1"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    done = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    if done.returncode != 0:
        raise SystemExit(f"the run failed:\n{done.stderr[-2000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux: the largest child so far
    if peak <= before:
        print("  (this run's peak did not exceed an earlier child's: the number below is that earlier peak)")
    return peak / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", type=int, nargs=2, default=[256, 2], metavar=("HIDDEN", "LAYERS"))
    parser.add_argument("--large", type=int, nargs=2, default=[512, 5], metavar=("HIDDEN", "LAYERS"))
    parser.add_argument("--strategy", choices=("fsdp", "ddp"), default="fsdp")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (hidden, layers) in (("small", args.small), ("large", args.large)):
            model = Path(tmp) / name
            with quiet_libraries():
                init_model(model, hidden_size=hidden, intermediate_size=4 * hidden, num_layers=layers,
                           num_heads=4, seed=0)
            results[name] = (parameters(hidden, layers), driver_peak_rss(model, Path(tmp) / f"run-{name}",
                                                                         args.strategy))
    (small_params, small_rss), (large_params, large_rss) = results["small"], results["large"]
    print(f"2 learners ({args.strategy}), 1 rollout worker; driver peak RSS")
    print(f"  small model {small_params / 1e6:6.2f} M parameters   {small_rss:8.1f} MiB")
    print(f"  large model {large_params / 1e6:6.2f} M parameters   {large_rss:8.1f} MiB")
    print(f"parameters x{large_params / small_params:.1f}, driver peak RSS x{large_rss / small_rss:.2f} "
          f"({(large_rss - small_rss) / small_rss:+.0%})")


if __name__ == "__main__":
    main()
