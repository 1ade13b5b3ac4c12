"""What one learner holds: parameter and Adam-state bytes per learner, FSDP over 2 learners
against one process, in the same run.

rlvr's own learner (``rlvr.cluster.learner_rank.LearnerRank``, as a Ray learner runs it, here in
plain processes joined in a gloo group) builds a random tiny Llama (``rlvr init-model``
shapes), shards it with ``cluster.learner_strategy=fsdp`` (FSDP2 ``fully_shard``) or keeps a
full replica (one process), then takes an Adam step on zero gradients so that the optimizer
holds its state (exp_avg, exp_avg_sq). Each learner reports the bytes of what it holds
itself: its local shards of the parameters and of the Adam state.

    python benchmarks/learner_memory.py                   # hidden 256, 4 layers
    python benchmarks/learner_memory.py --hidden-size 512 --num-layers 8
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

from rlvr.cluster.learner_rank import LearnerRank
from rlvr.cluster.weight_sync import free_port
from rlvr.config import load_config
from rlvr.modeling import init_model, quiet_libraries


def local_bytes(tensor: torch.Tensor) -> int:
    """The bytes this process holds of ``tensor`` (its shard, for a sharded DTensor)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def held_bytes(learner: LearnerRank) -> tuple[int, int]:
    """The bytes ``learner`` holds itself: its parameters' and its Adam state's (local shards)."""
    states = [v for s in learner.st.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return sum(local_bytes(p) for p in learner.params), sum(local_bytes(v) for v in states)


def held(rank: int, world_size: int, port: int, overrides: list[str], out: dict) -> None:
    with quiet_libraries():
        learner = LearnerRank(load_config(None, overrides), rank, world_size, f"tcp://127.0.0.1:{port}")
    for p in learner.params:
        p.grad = torch.zeros_like(p)
    learner.st.optimizer.step()  # Adam's moments now exist, sharded as their parameters
    out[rank] = held_bytes(learner)
    learner.close()


def measure(world_size: int, strategy: str, model: Path) -> list[tuple[int, int]]:
    port = free_port()
    overrides = ["policy.name=causal_lm", f"policy.options.model={model}", "task.name=sort_text",
                 f"cluster.learner_strategy={strategy}", "optim.name=adam", "threads=1"]
    out = mp.Manager().dict()
    mp.spawn(held, args=(world_size, port, overrides, out), nprocs=world_size, join=True)
    return [out[rank] for rank in range(world_size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--num-layers", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, quiet_libraries():
        model = Path(tmp) / "model"
        init_model(model, hidden_size=args.hidden_size, intermediate_size=4 * args.hidden_size,
                   num_layers=args.num_layers, num_heads=4, seed=0)
        one = measure(1, "ddp", model)[0]
        sharded = measure(2, "fsdp", model)
    mib = 2.0**20
    print(f"tiny Llama, hidden {args.hidden_size}, {args.num_layers} layers, float32, Adam")
    print(f"  one process      parameters {one[0] / mib:7.2f} MiB   Adam state {one[1] / mib:7.2f} MiB")
    for rank, (p, s) in enumerate(sharded):
        print(f"  fsdp learner {rank}   parameters {p / mib:7.2f} MiB   Adam state {s / mib:7.2f} MiB"
              f"   ({(p + s) / sum(one):.2f} of one process)")


if __name__ == "__main__":
    main()
