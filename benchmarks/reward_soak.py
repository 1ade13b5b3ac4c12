"""Soak the reward pipeline: many batches through reward functions that raise, hang,
crash their worker, spin in C, or return garbage, and check that it survives with exact
counts.

No model: each completion is random words plus, sometimes, a fate token that tells the
reward functions how to misbehave on it, so the script knows how many errors, timeouts,
invalid values and abstentions each function must report, and fails (exit 1) if any
count differs. It prints those counts, the worker kills it survived and the wall time.

    python benchmarks/reward_soak.py                    # ~10-20 s on 2 cores
    python benchmarks/reward_soak.py --rounds 200 --timeout 0.2
"""

from __future__ import annotations

import argparse
import collections
import itertools
import logging
import math
import os
import random
import sys
import time

from rlvr.rewards import RewardRunner, RewardSpec

# fate -> how often it happens, per completion
FATES = {"RAISE": 0.02, "NONE": 0.01, "NAN": 0.005, "TEXT": 0.005, "HANG": 0.003, "SPIN": 0.001, "CRASH": 0.001}
WORDS = ["the", "answer", "is", "7", "because", "3", "plus", "4", "so", "therefore"]


def length_reward(prompts, completions, **kwargs):
    """Well behaved, in-process."""
    return [min(len(c) / 100.0, 1.0) for c in completions]


def fated_reward(prompts, completions, answer, **kwargs):
    """Misbehaves as each completion's fate says; otherwise 1.0 if it mentions the answer."""
    out = []
    for completion in completions:
        fate = completion.rsplit(" ", 1)[-1]
        if fate == "RAISE":
            raise ValueError(f"cannot grade {completion[:20]!r}")
        if fate == "HANG":
            time.sleep(3600)
        if fate == "SPIN":
            sum(itertools.repeat(0, 10**13))  # C loop: only a kill stops it
        if fate == "CRASH":
            os._exit(7)
        out.append({"NONE": None, "NAN": math.nan, "TEXT": "1"}.get(fate, float(answer[0] in completion)))
    return out


def make_batch(rng: random.Random, num_prompts: int, group_size: int):
    """B prompt dicts and B x G completions, some carrying a fate token."""
    prompts = [{"prompt": f"question {rng.randrange(10**6)}?", "answer": str(rng.randrange(10))}
               for _ in range(num_prompts)]
    responses = []
    for _ in prompts:
        group = []
        for _ in range(group_size):
            words = rng.choices(WORDS, k=rng.randint(1, 30))
            draw, fate = rng.random(), None
            for name, probability in FATES.items():
                if draw < probability:
                    fate = name
                    break
                draw -= probability
            group.append(" ".join(words + ([fate] if fate else [])))
        responses.append(group)
    return prompts, responses


def expected_counts(responses) -> collections.Counter:
    """What fated_reward must report: the fate of each completion mapped to its count."""
    kinds = {"RAISE": "errors", "CRASH": "errors", "NONE": "abstained", "NAN": "invalid", "TEXT": "invalid",
             "HANG": "timeouts", "SPIN": "timeouts"}
    counts = collections.Counter()
    for completion in itertools.chain.from_iterable(responses):
        counts[kinds.get(completion.rsplit(" ", 1)[-1], "scored")] += 1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="batches to score")
    parser.add_argument("--prompts", type=int, default=32, help="B: prompts per batch")
    parser.add_argument("--group-size", type=int, default=8, help="G: completions per prompt")
    parser.add_argument("--timeout", type=float, default=0.3, help="seconds per reward call")
    parser.add_argument("--workers", type=int, default=2, help="reward worker processes")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the runner's first-of-a-kind warnings are expected here

    rng = random.Random(args.seed)
    specs = [RewardSpec(length_reward, 0.1), RewardSpec(fated_reward, 1.0, timeout=args.timeout)]
    totals = {name: collections.Counter() for name in ("length_reward", "fated_reward")}
    expected = collections.Counter()
    abstained_groups, slowest_round, mismatches = 0, 0.0, 0
    start = time.perf_counter()
    with RewardRunner(specs, num_workers=args.workers) as runner:
        for round_index in range(args.rounds):
            prompts, responses = make_batch(rng, args.prompts, args.group_size)
            round_start = time.perf_counter()
            result = runner.score_groups(prompts, responses)
            slowest_round = max(slowest_round, time.perf_counter() - round_start)
            want = expected_counts(responses)
            got = {k: v for k, v in vars(result.stats["fated_reward"]).items() if k != "mean"}
            if any(got[k] != want[k] for k in got):
                mismatches += 1
                print(f"round {round_index}: counts {got} but expected {dict(want)}", file=sys.stderr)
            expected.update(want)
            abstained_groups += int(result.metrics()["reward/abstained_groups"])
            for name, stats in result.stats.items():
                totals[name].update({k: v for k, v in vars(stats).items() if k != "mean"})
    wall = time.perf_counter() - start

    n = args.rounds * args.prompts * args.group_size
    print(f"scored {args.rounds} batches of {args.prompts} x {args.group_size} = {n} completions "
          f"in {wall:.1f} s ({n / wall:.0f} completions/s), {args.workers} workers, timeout {args.timeout} s")
    for name, counts in totals.items():
        kinds = ("scored", "abstained", "errors", "timeouts", "invalid")
        print(f"  {name:14s} " + "  ".join(f"{k} {counts[k]}" for k in kinds))
    fated = totals["fated_reward"]
    print(f"  survived: {fated['errors']} exceptions / worker crashes, {fated['timeouts']} hung calls killed, "
          f"{fated['invalid']} invalid values; {abstained_groups} groups fully abstained")
    print(f"  slowest batch {slowest_round:.2f} s")
    if mismatches:
        print(f"FAIL: {mismatches} batches with counts different from the fates", file=sys.stderr)
        return 1
    print("OK: every count matches the fates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
