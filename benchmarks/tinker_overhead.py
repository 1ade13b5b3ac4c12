"""The Tinker server's overhead: one RL step of tinker-cookbook's arithmetic recipe through the ``tinker`` SDK and
rlvr's server, against the same step run directly on ``rlvr.tinker``'s parts, in one process.

The step is the cookbook's synchronous RL step: B groups of G rollouts of its arithmetic environment (few-shot ChatML
prompts from ``ArithmeticDataset`` and the ``qwen3_instruct`` renderer, graded by the environment), each rollout one
sample request of up to ``--max-tokens`` tokens at temperature 1, advantages = reward - the group's mean, datums as
``trajectory_to_data`` builds them, the ``importance_sampling`` loss, one Adam step (the cookbook's betas and eps),
and new sampler weights for the next step. Both sides train a LoRA (rank 32) of the same base model from the same
initial weights, on the same prompts with the same per-rollout sampling seeds, so they sample the same tokens and do
the same work; the script checks that they did.

    server  the SDK's ServiceClient against ``rlvr.tinker.server.Running`` on loopback: every rollout's
            ``sample`` at once (as the cookbook's rollouts run), ``forward_backward`` and ``optim_step`` submitted
            together, then ``save_weights_and_get_sampling_client``
    direct  no HTTP, no SDK: ``Samplers.sample`` for each rollout, ``TrainingModel.forward(backward=True)``,
            ``optim_step``, and a ``Snapshot`` of the trained weights

The server runs in a thread of this process, not a process of its own: one process has one torch thread pool, so
both sides run their model work with the same ``--threads``, and the SDK's client, the ASGI loop and the worker
share the process's cores (and GIL) the way a client and a server on one laptop share its cores. Wall time, rounds
alternating which side goes first, after a warm-up step each; the script prints the medians and server / direct - 1,
and exits 1 when that overhead passes ``--limit`` (15 %).

It needs the tinker SDK and tinker-cookbook, the ``tinker`` extra, in an environment of their own (their pins stay
out of rlvr's main one): ``python -m venv .venv-tinker && .venv-tinker/bin/pip install -e '.[tinker]'``.

    .venv-tinker/bin/python benchmarks/tinker_overhead.py                 # SmolLM2, 8 groups x 4, 2 threads
    .venv-tinker/bin/python benchmarks/tinker_overhead.py --rounds 5 --threads 1
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

try:
    import tinker
    from tinker_cookbook import renderers
    from tinker_cookbook.completers import TokensWithLogprobs
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDataset
    from tinker_cookbook.rl.data_processing import trajectory_to_data
    from tinker_cookbook.rl.types import Trajectory, Transition
except ImportError as err:
    sys.exit(f"benchmarks/tinker_overhead.py needs the tinker SDK and tinker-cookbook ({err.name} is missing): "
             "pip install 'rlvr[tinker]'")

from rlvr.tinker.models import AdamStep, Adapters, Datum, TrainingModel
from rlvr.tinker.names import served_model
from rlvr.tinker.sampling import Request, Samplers, Snapshot
from rlvr.tinker.server import Running

API_KEY = "tml-benchmark"
LOSS = "importance_sampling"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a served model (packaged name, folder)")
    parser.add_argument("--groups", type=int, default=8, help="groups per step (the recipe's groups_per_batch)")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=5)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--rounds", type=int, default=3, help="timed steps of each side")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps of each side first")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--limit", type=float, default=0.15, help="the largest overhead that passes")
    return parser.parse_args()


class Rollouts:
    """One step's rollouts: the cookbook's arithmetic environments of batch ``index``, and a seed for each."""

    def __init__(self, dataset: ArithmeticDataset, index: int):
        self.builders = dataset.get_batch(index)
        self.seed = 1000 * (index + 1)

    async def envs(self) -> list[list]:
        return [list(await b.make_envs()) for b in self.builders]


def advantages(rewards: list[float]) -> list[float]:
    """Reward minus the group's mean, as the cookbook's ``compute_advantages`` (float32)."""
    r = torch.tensor(rewards)
    return (r - r.mean()).tolist()


# ---- through the SDK and the server ----------------------------------------------------------


async def served_rollout(sampler, env, seed: int, max_tokens: int) -> tuple[Transition, list[int]]:
    ob, stop = await env.initial_observation()
    params = tinker.SamplingParams(stop=stop, max_tokens=max_tokens, temperature=1.0, seed=seed)
    seq = (await sampler.sample(ob, 1, params)).sequences[0]
    step = await env.step(seq.tokens)
    ac = TokensWithLogprobs(seq.tokens, seq.logprobs, seq.stop_reason)
    return Transition(ob, ac, step.reward, step.episode_done, step.metrics), seq.tokens


async def served_step(training, sampler, rollouts: Rollouts, args: argparse.Namespace):
    """(the next sampling client, every rollout's sampled tokens)."""
    groups = await rollouts.envs()
    jobs = [served_rollout(sampler, env, rollouts.seed + g * args.group_size + i, args.max_tokens)
            for g, envs in enumerate(groups) for i, env in enumerate(envs)]
    done = await asyncio.gather(*jobs)
    data, sampled = [], []
    for g in range(len(groups)):
        group = done[g * args.group_size:(g + 1) * args.group_size]
        for (transition, tokens), adv in zip(group, advantages([t.reward for t, _ in group])):
            for d in trajectory_to_data(Trajectory([transition], tinker.ModelInput.empty()), adv):
                inputs = {k: v for k, v in d.loss_fn_inputs.items() if k != "mask"}  # as the cookbook sends it
                data.append(tinker.Datum(model_input=d.model_input, loss_fn_inputs=inputs))
            sampled.append(tokens)
    backward = training.forward_backward(data, LOSS)
    step = training.optim_step(tinker.AdamParams(learning_rate=args.learning_rate, beta1=0.9, beta2=0.95, eps=1e-8))
    await backward
    await step
    return await training.save_weights_and_get_sampling_client(), sampled


# ---- directly on rlvr.tinker's parts ---------------------------------------------------------


class Direct:
    """The same step on a ``TrainingModel`` and ``Samplers`` of this process."""

    def __init__(self, base, rank: int):
        self.model = TrainingModel(base.name, base.folder, Adapters(rank=rank), 0)
        self.samplers = Samplers()
        self.base = base
        self.snapshot = self.snap()

    def snap(self) -> Snapshot:
        return Snapshot(self.base.name, self.base.folder, self.model.adapters, self.model.trainable_state(),
                        self.model.seed)

    async def rollout(self, env, seed: int, max_tokens: int) -> tuple[list[int], list[int], list[float], float]:
        ob, stop = await env.initial_observation()
        prompt = ob.to_ints()
        request = Request(torch.tensor(prompt, dtype=torch.long), 1, max_tokens, 1.0, seed=seed,
                          stop_strings=tuple(s for s in stop if isinstance(s, str)),
                          stop_tokens=tuple(s for s in stop if not isinstance(s, str)))
        seq = self.samplers.sample(self.snapshot, request).sequences[0]
        step = await env.step(seq.tokens)
        return prompt, seq.tokens, seq.logprobs, step.reward

    async def step(self, rollouts: Rollouts, args: argparse.Namespace) -> list[list[int]]:
        groups = await rollouts.envs()
        done = [await self.rollout(env, rollouts.seed + g * args.group_size + i, args.max_tokens)
                for g, envs in enumerate(groups) for i, env in enumerate(envs)]
        datums, sampled = [], []
        for g in range(len(groups)):
            group = done[g * args.group_size:(g + 1) * args.group_size]
            for (prompt, tokens, logprobs, _), adv in zip(group, advantages([r for *_, r in group])):
                datums.append(datum(prompt, tokens, logprobs, adv))
                sampled.append(tokens)
        self.model.forward(datums, LOSS, None, backward=True)
        self.model.optim_step(AdamStep(learning_rate=args.learning_rate, beta1=0.9, beta2=0.95, eps=1e-8))
        self.snapshot = self.snap()
        return sampled


def datum(prompt: list[int], tokens: list[int], logprobs: list[float], advantage: float) -> Datum:
    """``trajectory_to_data``'s datum of one single-turn rollout: the sequence shifted by one, sampled log-probs and
    the advantage on the response's positions, 0 on the prompt's."""
    full, tail = prompt + tokens, len(prompt) - 1
    return Datum(torch.tensor(full[:-1], dtype=torch.long),
                 {"target_tokens": torch.tensor(full[1:], dtype=torch.long),
                  "logprobs": torch.tensor([0.0] * tail + logprobs, dtype=torch.float32),
                  "advantages": torch.tensor([0.0] * tail + [advantage] * len(tokens), dtype=torch.float32)})


# ---- the comparison --------------------------------------------------------------------------


async def compare(args: argparse.Namespace, server: Running, base) -> tuple[list[float], list[float], bool]:
    from transformers import AutoTokenizer

    renderer = renderers.get_renderer("qwen3_instruct", tokenizer=AutoTokenizer.from_pretrained(base.folder))
    dataset = ArithmeticDataset(batch_size=args.groups, renderer=renderer, group_size=args.group_size)
    client = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    training = await client.create_lora_training_client(base.name, rank=args.rank, seed=0)
    sampler = await training.save_weights_and_get_sampling_client()
    direct = Direct(base, args.rank)
    served, ran, same = [], [], True
    for r in range(args.warmup + args.rounds):
        rollouts = Rollouts(dataset, r)
        times, tokens = {}, {}
        for side in ("server", "direct") if r % 2 == 0 else ("direct", "server"):
            start = time.perf_counter()
            if side == "server":
                sampler, tokens[side] = await served_step(training, sampler, rollouts, args)
            else:
                tokens[side] = await direct.step(rollouts, args)
            times[side] = time.perf_counter() - start
        same &= tokens["server"] == tokens["direct"]
        if r >= args.warmup:
            served.append(times["server"])
            ran.append(times["direct"])
        print(f"  step {r}{' (warm-up)' if r < args.warmup else ''}: server {times['server']:.2f} s, "
              f"direct {times['direct']:.2f} s", flush=True)
    return served, ran, same


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=FutureWarning, module="tinker")
    base = served_model(args.model)
    with tempfile.TemporaryDirectory() as state, \
            Running([base], Path(state), API_KEY, place_tokenizers=False) as server:
        served, ran, same = asyncio.run(compare(args, server, base))
    s, d = statistics.median(served), statistics.median(ran)
    overhead = s / d - 1
    print(f"{base.name}: one RL step of the arithmetic recipe, {args.groups} groups x {args.group_size} samples, "
          f"up to {args.max_tokens} tokens, LoRA rank {args.rank}, {LOSS}; {args.threads} threads, "
          f"{args.rounds} rounds (wall seconds, median)")
    print(f"  through the SDK and the server {s:.2f} s ({', '.join(f'{x:.2f}' for x in served)})")
    print(f"  direct on rlvr.tinker          {d:.2f} s ({', '.join(f'{x:.2f}' for x in ran)})")
    print(f"  overhead {overhead:+.1%} (limit: {args.limit:+.0%})")
    print(f"  sampled tokens identical on both sides: {same}")
    return 0 if overhead <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())
