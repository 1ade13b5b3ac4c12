"""Diagnostics of a run: gradient noise, reward hacking, per-prompt learning.

Pure functions of numbers the trainer already has (gradients of micro-batches, the epoch's rewards and gold verdicts,
per-epoch records); nothing here reads a config or writes a file. Record names: ``grad/*``
(``GradientNoiseMeter.metrics``), ``hack/*`` (``max_reward_stats``), and records of kind "prompts"
(``prompt_solve_shares``). Shapes: B prompts, G responses per prompt, P parameters, m parts of a batch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlvr.batch.record import Record, prompt_text

# ---------------------------------------------------------------- gradient noise


def noise_estimates(norm_sq_small: float, size_small: float, norm_sq_big: float, size_big: float
                    ) -> tuple[float, float]:
    """Unbiased |G|^2 and tr(Sigma) from the squared norms of two gradient estimates of batch sizes b < B (McCandlish et
    al. 2018, appendix A.1; derived in docs/explanation/loop.md)."""
    if not 0 < size_small < size_big:
        raise ValueError(f"need 0 < small batch < big batch, got {size_small} and {size_big}")
    true_norm_sq = (size_big * norm_sq_big - size_small * norm_sq_small) / (size_big - size_small)
    trace_cov = (norm_sq_small - norm_sq_big) / (1 / size_small - 1 / size_big)
    return true_norm_sq, trace_cov


def noise_scale(true_norm_sq: float, trace_cov: float) -> float:
    """B_simple = tr(Sigma) / |G|^2: the batch size at which the gradient's noise equals its signal. Both clamped at 0
    first: inf when no signal is measurable, NaN when neither is."""
    signal, noise = max(true_norm_sq, 0.0), max(trace_cov, 0.0)
    if signal == 0.0:
        return math.inf if noise > 0 else math.nan
    return noise / signal


class GradientNoiseMeter:
    """The gradient noise of one optimizer step, from the gradients of its parts (each part's share of the batch
    gradient; sizes b_k in prompts, whole groups per part).

    ``metrics`` (needs m >= 2 parts): ``grad/true_norm_sq`` (|G|^2), ``grad/trace_cov`` (tr Sigma), ``grad/noise_scale``
    (B_simple), ``grad/snr`` (B / B_simple) and ``grad/batch_size`` (B); the estimator is explained in
    docs/explanation/loop.md."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.total: torch.Tensor | None = None  # [P]: sum of the parts' gradients (their dtype and device)
        self.norms_sq: list[float] = []  # |g_k|^2
        self.sizes: list[float] = []  # b_k

    def add(self, grad: torch.Tensor, size: float) -> None:
        """One part's gradient (its share of the batch gradient) [P], and its size b_k > 0."""
        if size <= 0:
            raise ValueError(f"a part's size must be positive, got {size}")
        grad = grad.detach().reshape(-1)
        if self.total is not None and grad.shape != self.total.shape:
            raise ValueError(f"gradient of {grad.numel()} numbers, the earlier parts had {self.total.numel()}")
        self.total = grad.clone() if self.total is None else self.total + grad
        self.norms_sq.append(_norm_sq(grad))
        self.sizes.append(float(size))

    def add_parts(self, norms_sq: Sequence[float], sizes: Sequence[float], total: torch.Tensor) -> None:
        """Parts measured elsewhere (data-parallel learners: each its own share's parts), their |g_k|^2 and b_k;
        ``total`` [P] is the sum of every part's gradient, these and those added before (the all-reduced gradient)."""
        if len(norms_sq) != len(sizes) or any(size <= 0 for size in sizes):
            raise ValueError(f"need one positive size per part, got {len(norms_sq)} norms and sizes {list(sizes)}")
        self.norms_sq += [float(x) for x in norms_sq]
        self.sizes += [float(x) for x in sizes]
        self.total = total.detach().reshape(-1).clone()

    def add_running_sum(self, running: torch.Tensor, size: float) -> None:
        """The accumulated gradient [P] after one more part of ``size``: the part's gradient is the difference from the
        sum so far."""
        running = running.detach().reshape(-1)
        self.add(running if self.total is None else running - self.total, size)

    def metrics(self) -> dict[str, float]:
        if len(self.sizes) < 2:
            raise ValueError(f"gradient noise needs at least 2 parts of the batch, got {len(self.sizes)}")
        batch = sum(self.sizes)
        norm_sq_big = _norm_sq(self.total)
        pairs = [noise_estimates(norm_sq * (batch / size) ** 2, size, norm_sq_big, batch)  # |G_k|^2 = (B/b_k)^2 |g_k|^2
                 for norm_sq, size in zip(self.norms_sq, self.sizes)]
        true_norm_sq = sum(p[0] for p in pairs) / len(pairs)
        trace_cov = sum(p[1] for p in pairs) / len(pairs)
        scale = noise_scale(true_norm_sq, trace_cov)
        return {"grad/true_norm_sq": true_norm_sq, "grad/trace_cov": trace_cov, "grad/noise_scale": scale,
                "grad/snr": batch / scale if scale != 0 else math.inf, "grad/batch_size": batch}


def _norm_sq(x: torch.Tensor) -> float:
    """|x|^2 summed in float64: the estimators subtract squared norms of similar size."""
    return torch.linalg.vector_norm(x, dtype=torch.float64).item() ** 2


def flat_grad(module: torch.nn.Module) -> torch.Tensor:
    """The module's accumulated gradients as one vector [P] (zeros where a parameter has none)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in module.parameters() if p.requires_grad])


# ---------------------------------------------------------------- reward hacking


def max_reward_stats(rewards: torch.Tensor, correct: torch.Tensor, max_reward: float | None = None,
                     atol: float = 1e-6, reward_is_gold: bool = False) -> dict[str, float]:
    """How many top-reward responses fail the gold check; rewards [B, G] (NaN: abstained), correct [B, G] bool.
    ``hack/max_reward_frac``: share of scored responses at the top; ``hack/max_reward_not_gold``: share of those that
    fail the gold check (0, never NaN, when none counts). The top is ``max_reward`` or else the batch's highest reward,
    within ``atol``; when a batch's top counts is in docs/explanation/loop.md."""
    if rewards.shape != correct.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)} and correct {tuple(correct.shape)} differ in shape")
    flat, right = rewards.reshape(-1), correct.reshape(-1).bool()  # [B*G]
    scored = torch.isfinite(flat)
    count = int(scored.sum())
    if max_reward is None:
        top_value = torch.where(scored, flat, -torch.inf).amax().item()
        bottom = torch.where(scored, flat, torch.inf).amin().item()
        # nothing to tell a top by: no response scored above the others, or no right answer to compare with
        usable = top_value - bottom > atol and bool((scored & right).any())
    else:
        top_value, usable = max_reward, True
    # the threshold in the rewards' dtype, as comparing with a Python number rounds it
    top = scored & (flat >= torch.tensor(top_value - atol, dtype=flat.dtype))
    num_top, not_gold = int(top.sum()), int((top & ~right).sum())
    if not count or not usable or reward_is_gold:
        return {"hack/max_reward_frac": 0.0, "hack/max_reward_not_gold": 0.0}
    return {"hack/max_reward_frac": num_top / count, "hack/max_reward_not_gold": not_gold / num_top if num_top else 0.0}


def epoch_series(records: Iterable[Record], key: str) -> tuple[list[int], list[float]]:
    """(epochs, values) of ``key`` from the first train record of each epoch (every record of an epoch carries the same
    rollout numbers)."""
    epochs, values, seen = [], [], set()
    for r in records:
        if r.get("kind") == "train" and r["epoch"] not in seen and r.get(key) is not None:
            seen.add(r["epoch"])
            epochs.append(r["epoch"])
            values.append(float(r[key]))
    return epochs, values


def fitted_change(values: Sequence[float]) -> float:
    """The change over ``values`` along their least-squares line: slope * (len - 1)."""
    n = len(values)
    if n < 2:
        return 0.0
    x_mean, y_mean = (n - 1) / 2, sum(values) / n
    cov = sum((i - x_mean) * (y - y_mean) for i, y in enumerate(values))
    var = sum((i - x_mean) ** 2 for i in range(n))
    return cov / var * (n - 1)


@dataclass
class Divergence:
    """A window of epochs in which the reward rose and the gold accuracy did not keep up."""

    first_epoch: int
    last_epoch: int
    reward_rise: float  # fitted change of the reward over the window, as a share of its span so far
    gold_rise: float  # fitted change of the gold accuracy (absolute, accuracy in [0, 1])

    def message(self) -> str:
        return (f"epochs {self.first_epoch}-{self.last_epoch}: the reward rose by {self.reward_rise:.0%} of its "
                f"range while gold accuracy changed by {self.gold_rise:+.2f}; the reward may be hackable")


def reward_gold_divergence(records: Sequence[Record], window: int = 10, min_rise: float = 0.2,
                           gold_ratio: float = 0.5) -> list[Divergence]:
    """Windows of ``window`` epochs where the reward rose while the gold accuracy did not: the reward's fitted change as
    a share of its span so far, rho, is at least ``min_rise`` and the gold accuracy's fitted change is under
    ``gold_ratio`` * rho. Windows start every window // 2 epochs; the defaults' origin is in
    docs/explanation/loop.md."""
    if window < 2:
        raise ValueError(f"window must be at least 2 epochs, got {window}")
    gold_by_epoch = dict(zip(*epoch_series(records, "solve_rate")))
    pairs = [(e, r) for e, r in zip(*epoch_series(records, "reward_mean")) if e in gold_by_epoch]  # epochs with both
    epochs, rewards = [e for e, _ in pairs], [r for _, r in pairs]
    gold = [gold_by_epoch[e] for e in epochs]
    found = []
    highest, lowest = list(itertools.accumulate(rewards, max)), list(itertools.accumulate(rewards, min))
    for end in range(window, len(epochs) + 1, max(1, window // 2)):
        span = highest[end - 1] - lowest[end - 1]  # over epochs up to the window's end, kept as it goes
        if span <= 0:
            continue
        rho = fitted_change(rewards[end - window:end]) / span
        ds = fitted_change(gold[end - window:end])
        if rho >= min_rise and ds < gold_ratio * rho:
            found.append(Divergence(epochs[end - window], epochs[end - 1], rho, ds))
    return found


def gold_notes(records: Sequence[Record]) -> list[str]:
    """Why a run's hacking monitor says nothing: no gold signal (an environment that never said whether an episode was
    solved), or a reward that is the gold check itself."""
    _, reported = epoch_series(records, "episode/solved_reported")
    if reported and not any(reported):
        return ["no gold signal: the environment never said whether an episode was solved (Step(solved=...), or "
                "a TRL-style class's bool `solved` attribute), so solve rates read 0 and the hacking monitor is off"]
    gold_by_epoch = dict(zip(*epoch_series(records, "solve_rate")))
    pairs = [(r, gold_by_epoch[e]) for e, r in zip(*epoch_series(records, "reward_mean")) if e in gold_by_epoch]
    if len(pairs) >= 2 and all(abs(r - s) <= 1e-9 for r, s in pairs):
        return ["the reward is the gold check itself (reward_mean equals solve_rate every epoch): "
                "the hacking monitor has nothing to compare"]
    return []


def hacking_warnings(records: Sequence[Record], window: int = 10, not_gold_alarm: float = 0.5) -> list[str]:
    """Warnings for a run's summary: the first window where the reward outran the gold accuracy
    (``reward_gold_divergence``) when the whole run, as one window, did too (a partial-credit reward that climbs before
    the answers do, and the gold accuracy then following, is not reported), and, when the records carry ``hack/*``, the
    last ``window`` epochs' mean share of top-reward responses that fail the gold check when it reaches
    ``not_gold_alarm``. None where there is nothing to compare (``gold_notes``)."""
    if gold_notes(records):
        return []
    warnings = []
    divergences = reward_gold_divergence(records, window)
    epochs = len(epoch_series(records, "reward_mean")[0])
    if divergences and epochs >= 2 and reward_gold_divergence(records, epochs):
        more = len(divergences) - 1
        more = f" ({more} more window{'s' * (more > 1)})" if more else ""
        warnings.append(divergences[0].message() + more)
    _, not_gold = epoch_series(records, "hack/max_reward_not_gold")
    recent = [v for v in not_gold[-window:] if math.isfinite(v)]
    if recent and sum(recent) / len(recent) >= not_gold_alarm:
        span = f"the last {len(recent)} epochs" if len(recent) > 1 else "the last epoch"
        warnings.append(f"over {span}, {sum(recent) / len(recent):.0%} of the responses "
                        f"with the top reward failed the gold check")
    return warnings


# ---------------------------------------------------------------- per-prompt learning

CATEGORIES = ("learned", "always_solved", "never_solved", "forgotten", "mixed")


def prompt_key(prompt: Any) -> str:
    """A prompt as a record key: its text ("prompt" of a dict prompt), a chat as ``role: content`` lines
    (``prompt_text``), or its numbers joined by spaces."""
    if isinstance(prompt, dict):
        prompt = prompt["prompt"]
    if isinstance(prompt, torch.Tensor):
        prompt = prompt.tolist()
    if isinstance(prompt, (list, tuple)) and not any(isinstance(m, dict) for m in prompt):
        return " ".join(map(str, prompt))
    return prompt_text(prompt)


def prompt_solve_shares(prompts: Sequence[Any], correct: torch.Tensor) -> dict[str, float]:
    """Prompt key -> share of its G responses that pass the gold check; correct [B, G]. A prompt drawn twice in one
    batch gets the mean of its groups."""
    shares: dict[str, list[float]] = {}
    for prompt, share in zip(prompts, correct.float().mean(dim=1).tolist()):
        shares.setdefault(prompt_key(prompt), []).append(share)
    return {key: sum(v) / len(v) for key, v in shares.items()}


def prompt_curves(records: Iterable[Record]) -> dict[str, list[tuple[int, float]]]:
    """prompt key -> [(epoch, solved share), ...] from records of kind "prompts" ({"kind": "prompts", "epoch": e,
    "step": s, "solved": {key: share}})."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        if r.get("kind") == "prompts":
            for key, share in r["solved"].items():
                curves.setdefault(key, []).append((r["epoch"], float(share)))
    return curves


def classify_prompts(curves: dict[str, list[tuple[int, float]]], solved_at: float = 0.5) -> dict[str, list[str]]:
    """Each prompt into one of ``CATEGORIES`` by its solved shares (solved: share >= ``solved_at``) over the epochs it
    was seen; never_solved: every share 0; mixed: the rest (seen once unsolved, or solved at both ends with dips
    between)."""
    out: dict[str, list[str]] = {name: [] for name in CATEGORIES}
    for key, points in curves.items():
        shares = [share for _, share in sorted(points)]
        solved = [share >= solved_at for share in shares]
        if all(share == 0 for share in shares):
            name = "never_solved"
        elif all(solved):
            name = "always_solved"
        elif not solved[0] and solved[-1]:
            name = "learned"
        elif solved[0] and not solved[-1]:
            name = "forgotten"
        else:
            name = "mixed"
        out[name].append(key)
    return out


def prompt_summary(records: Sequence[Record], solved_at: float = 0.5) -> str:
    """One line: "12 prompts learned, 3 never solved, ...; 40% of groups had zero delta". The zero-delta share is the
    mean over epochs of frac_zero_delta_groups."""
    parts = []
    curves = prompt_curves(records)
    if curves:
        groups = classify_prompts(curves, solved_at)
        counts = ", ".join(f"{len(keys)} {name.replace('_', ' ')}" for name, keys in groups.items() if keys)
        parts.append(f"{len(curves)} prompts: {counts}")
    _, zero = epoch_series(records, "frac_zero_delta_groups")
    if zero:
        parts.append(f"{sum(zero) / len(zero):.0%} of groups had zero delta")
    return "; ".join(parts) if parts else "no per-prompt records and no zero-delta counts"
