"""Batched episode generation against a one-episode-at-a-time loop, in the same run.

The guessing game (``rlvr.environments.games.GuessingGame``) with a tiny character LM
(``rlvr init-model`` sizes, random weights: the episodes run to the turn limit or solve by
chance), 32 episodes (8 starts x 4): every active episode's next turn in one engine call
(``rlvr.environments.episodes.run_episodes``) against the same episodes run one after
another with the same seeds (identical episodes, checked). Both sides use the same threads,
wall time, best of ``--repeats``.

    python benchmarks/episodes.py                    # 32 episodes, 1 thread
    python benchmarks/episodes.py --episodes 64 --threads 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from rlvr.environments.episodes import EpisodeLimits, run_episodes
from rlvr.environments.games import GuessingGame
from rlvr.environments.workers import EnvironmentHosts
from rlvr.modeling import init_model, quiet_libraries
from rlvr.policies.causal_lm import CausalLMPolicy

GROUP = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden-size", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp, quiet_libraries():
        model = Path(tmp) / "model"
        init_model(model, hidden_size=args.hidden_size, intermediate_size=3 * args.hidden_size, num_layers=2,
                   num_heads=4, seed=0)
        policy = CausalLMPolicy.from_pretrained(str(model), max_new_tokens=4, stop_strings=[" "])
    starts = list(range(args.episodes // GROUP))
    seeds = torch.randint(2**62, (len(starts) * GROUP,), generator=torch.Generator().manual_seed(0))
    limits = EpisodeLimits(max_turns=6, max_tokens=64)

    def batched() -> list:
        return run_episodes(policy, EnvironmentHosts(GuessingGame), starts, GROUP, 1.0, None, limits, seeds=seeds)

    def one_at_a_time() -> list:
        return [run_episodes(policy, EnvironmentHosts(GuessingGame), [start], 1, 1.0, None, limits,
                             seeds=seeds[i:i + 1])[0]
                for i, start in enumerate(s for s in starts for _ in range(GROUP))]

    times = {}
    for name, run in (("batched", batched), ("one at a time", one_at_a_time)):
        best = float("inf")
        for _ in range(args.repeats):
            clock = time.perf_counter()
            episodes = run()
            best = min(best, time.perf_counter() - clock)
        times[name] = (best, episodes)
    same = [e.response_ids for e in times["batched"][1]] == [e.response_ids for e in times["one at a time"][1]]
    tokens = sum(e.length for e in times["batched"][1])
    turns = sum(e.policy_turns for e in times["batched"][1]) / len(times["batched"][1])
    print(f"{len(seeds)} episodes, {turns:.1f} policy turns and {tokens / len(seeds):.1f} tokens each, "
          f"threads={args.threads}; identical episodes: {same}")
    for name, (seconds, _) in times.items():
        print(f"  {name:<14} {seconds:7.3f} s")
    print(f"batched / one at a time speed: {times['one at a time'][0] / times['batched'][0]:.2f}x")


if __name__ == "__main__":
    main()
