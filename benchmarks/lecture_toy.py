"""Time the lecture's sorting experiment: rlvr's trainer against a lecture-style loop.

The baseline is written the way the lecture presents its code: einsum model, rewards
computed per (prompt, response) with Python lists, ``compute_deltas`` on the [B, G]
rewards, log-softmax + gather for log-probs, mean loss, Adam; one 100 x 10 run, no
printing. Both are timed in the same process, interleaved, and the script prints the
median times and their ratio (rlvr / baseline; the goal is <= 0.2 on the lecture
configuration).

    python benchmarks/lecture_toy.py                 # lecture config, every delta mode
    python benchmarks/lecture_toy.py --large         # also 256 prompts of 8 numbers, G=16
    python benchmarks/lecture_toy.py --floor         # also the least 1000 steps cost
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
from torch import nn

import rlvr
from rlvr.loop.optim import optimizer_update
from rlvr.loop.trainer import setup, train

LECTURE_PROMPTS = [[1, 0, 2], [3, 2, 4], [1, 2, 3]]


class LectureModel(nn.Module):
    def __init__(self, vocab_size: int, dim: int, length: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dim)
        self.encode = nn.Parameter(torch.randn(length, dim, dim) / math.sqrt(dim))
        self.decode = nn.Parameter(torch.randn(length, dim, dim) / math.sqrt(dim))

    def forward(self, prompts: torch.Tensor) -> torch.Tensor:
        x = self.embedding(prompts)
        state = torch.einsum("bpd,pde->be", x, self.encode)
        out = torch.einsum("be,pef->bpf", state, self.decode)
        return torch.einsum("bpd,vd->bpv", out, self.embedding.weight)


def inclusion_ordering(prompt: list[int], response: list[int]) -> float:
    inclusion = sum(1 for x in prompt if x in response)
    ordering = sum(1 for x, y in zip(response, response[1:]) if x <= y)
    return float(inclusion + ordering)


def baseline_deltas(rewards: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "raw":
        return rewards
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    if mode == "centered":
        return centered
    return centered / (rewards.std(dim=1, keepdim=True) + 1e-6)


def baseline_run(mode: str, prompts_list: list[list[int]], group: int, vocab: int, epochs: int, steps: int) -> None:
    """The lecture-style loop (naive loss)."""
    torch.manual_seed(0)
    prompts = torch.tensor(prompts_list)
    n = prompts.shape[1]
    model = LectureModel(vocab, 10, n)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(epochs):
        with torch.no_grad():
            probs = torch.softmax(model(prompts), dim=-1)  # [B, n, V]
            flat = probs.reshape(-1, vocab)
            responses = torch.multinomial(flat, group, replacement=True).reshape(len(prompts_list), n, group)
            responses = responses.transpose(1, 2)  # [B, G, n]
        rewards = torch.tensor(
            [[inclusion_ordering(p, r) for r in resp.tolist()] for p, resp in zip(prompts_list, responses)]
        )
        deltas = baseline_deltas(rewards, mode)
        for _ in range(steps):
            logits = model(prompts)  # [B, n, V]
            log_probs = torch.log_softmax(logits, dim=-1)
            log_probs = log_probs.unsqueeze(1).expand(-1, group, -1, -1)  # [B, G, n, V]
            chosen = log_probs.gather(-1, responses.unsqueeze(-1)).squeeze(-1)  # [B, G, n]
            loss = -(deltas.unsqueeze(-1) * chosen).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


def floor_run(with_optimizer: bool, steps: int = 1000) -> None:
    """The least a 100 x 10 run can cost: rlvr's positional log-probs and a naive loss,
    backward with autograd, and a fused Adam step when ``with_optimizer``
    (``optimizer_update``, as the trainer steps), 1000 times on one fixed batch; no
    sampling, no statistics, no records."""
    torch.manual_seed(0)
    config = rlvr.load_config(None, ["log.progress=false"])
    _, st = setup(config)
    samples = st.policy.sample(torch.tensor(LECTURE_PROMPTS), 10, 1.0, st.generator)
    deltas = torch.randn(30, 1)
    params = list(st.policy.module.parameters())
    for _ in range(steps):
        for p in params:
            p.grad = None
        log_probs, _ = st.policy.log_probs(samples, 1.0)
        (-(deltas * log_probs)).mean().backward()
        if with_optimizer:
            optimizer_update(st.optimizer)


def rlvr_run(config: rlvr.Config) -> None:
    state = setup(config)
    train(config, state=state)


def time_it(fn, repeats: int) -> float:
    """Median CPU time of this process (``time.process_time``): on a shared machine it
    leaves out the time other processes hold the core, unlike wall time."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def compare(label: str, config: rlvr.Config, base_fn, repeats: int) -> None:
    rlvr_run(config)  # warm-up of both
    base_fn()
    ours, base = [], []
    for _ in range(repeats):  # interleaved, so machine noise hits both alike
        ours.append(time_it(lambda: rlvr_run(config), 1))
        base.append(time_it(base_fn, 1))
    o, b = statistics.median(ours), statistics.median(base)
    print(f"{label:<40} rlvr {o:7.3f} s   lecture-style {b:7.3f} s   ratio {o / b:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--large", action="store_true", help="also time 256 prompts of 8 numbers, G=16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--floor", action="store_true", help="also time bare forward/backward (+ Adam) steps")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), median CPU seconds of {args.repeats} runs")
    for mode in ("raw", "centered", "normalized"):
        config = rlvr.load_config(
            None, [f"algo.deltas={mode}", "log.progress=false", "log.eval_every=1000", f"threads={args.threads}"]
        )
        compare(f"lecture 3 prompts x G=10, 100x10, {mode}", config,
                lambda m=mode: baseline_run(m, LECTURE_PROMPTS, 10, 5, 100, 10), args.repeats)
    if args.floor:
        for label, with_optimizer in (("floor: forward + backward only", False), ("floor: + fused Adam step", True)):
            floor_run(with_optimizer)
            seconds = time_it(lambda w=with_optimizer: floor_run(w), args.repeats)
            print(f"{label:<40} {seconds:7.3f} s per 1000 steps")
    if args.large:
        gen = torch.Generator().manual_seed(0)
        prompts = torch.rand(256, 16, generator=gen).argsort(dim=-1)[:, :8].tolist()
        overrides = [f"task.options.prompts={prompts}", "task.options.num_numbers=8", "task.options.vocab_size=16",
                     "algo.group_size=16", "algo.epochs=10", "log.progress=false", "log.eval_every=1000",
                     f"threads={args.threads}"]
        config = rlvr.load_config(None, overrides)
        compare("256 prompts of 8 x G=16, 10x10, centered", config,
                lambda: baseline_run("centered", prompts, 16, 16, 10, 10), max(1, args.repeats // 2))


if __name__ == "__main__":
    main()
