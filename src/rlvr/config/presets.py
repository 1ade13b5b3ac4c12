"""Defaults that depend on other settings: ``algo.preset``, the causal-LM defaults and the run's name
(``default_run_name``). They fill what the config mapping does not give, before it is built (a field given always wins;
``rlvr config`` prints the result); a ``Config`` built field by field in Python takes its fields as they are.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# algo.preset -> the algo fields it sets. Every preset sets the same fields, so switching presets changes exactly these
# and nothing else.
ALGO_PRESETS: dict[str, dict[str, Any]] = {
    # the lecture's policy gradient: group-centred rewards, the plain (naive) loss
    "lecture": {"deltas": "centered", "loss": "naive", "aggregation": "seq_mean_token_mean",
                "clip_eps": 0.2, "clip_eps_high": None, "kl_coef": 0.0},
    # GRPO (DeepSeekMath): (r - mean) / std, the clipped ratio, each response's token mean, a k3 KL penalty of 0.04
    # toward the reference
    "grpo": {"deltas": "normalized", "loss": "clipped", "aggregation": "seq_mean_token_mean",
             "clip_eps": 0.2, "clip_eps_high": None, "kl_coef": 0.04},
    # Dr. GRPO: no std division and a constant token-sum normalizer (no length or difficulty bias), no KL
    "dr_grpo": {"deltas": "centered", "loss": "clipped", "aggregation": "seq_mean_token_sum",
                "clip_eps": 0.2, "clip_eps_high": None, "kl_coef": 0.0},
    # DAPO: the mean over every token of the batch, a wider upper clip range (clip-higher), no KL; its dynamic sampling
    # and overlong shaping are algo.dynamic_sampling and algo.overlong, set on their own
    "dapo": {"deltas": "normalized", "loss": "clipped", "aggregation": "token_mean",
             "clip_eps": 0.2, "clip_eps_high": 0.28, "kl_coef": 0.0},
    # RLOO: REINFORCE with the mean of the other G - 1 rewards as each response's baseline
    "rloo": {"deltas": "leave_one_out", "loss": "naive", "aggregation": "seq_mean_token_mean",
             "clip_eps": 0.2, "clip_eps_high": None, "kl_coef": 0.0},
}

# Settings a causal_lm run takes unless given. The lecture's defaults (Adam lr 1e-3, 10 inner steps on each batch, no
# clipping) suit the positional toy; they collapsed an SFT'd tiny LM within 10 epochs (held-out greedy 0.11 -> 0.00),
# where these took it to 0.43 in 100 (docs/how-to/from-trl.md). Two inner steps: the second is off-policy, where a
# clipped loss (algo.preset grpo, dr_grpo, dapo) acts. lr 1e-5 is for pretrained models; a tiny model from scratch
# learns faster at 1e-4 (0.44 after 30 epochs).
LM_DEFAULTS: dict[str, dict[str, Any]] = {
    "optim": {"lr": 1e-5, "max_grad_norm": 1.0},
    "algo": {"inner_steps": 2},
}


def resolve_defaults(data: dict) -> dict:
    """``data`` (a config mapping) with the preset's and the LM defaults' fields, and the run's name, filled in where
    ``data`` does not give them. A malformed mapping is returned as it is, for the config builder to name what is wrong;
    an unknown preset is left to validation."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    if out.get("name") is None:
        out["name"] = default_run_name(out)
    algo = out.get("algo")
    if isinstance(algo, dict) and algo.get("preset") in ALGO_PRESETS:
        out["algo"] = algo = {**ALGO_PRESETS[algo["preset"]], **algo}
    if isinstance(algo, dict) and algo.get("loss") == "cispo" and "clip_eps" not in algo:
        # CISPO bounds the weight above only (MiniMax-M1, TRL); the top stays at 1 + 0.2 unless given
        out["algo"] = {"clip_eps_high": 0.2, **algo, "clip_eps": None}
    if isinstance(algo, dict) and algo.get("kl_in") == "reward" and "kl_estimator" not in algo:
        # the reward's penalty is k1 (verl's use_kl_in_reward); the logged kl follows it
        out["algo"] = {**algo, "kl_estimator": "k1"}
    policy = out.get("policy")
    if isinstance(policy, dict) and policy.get("name") == "causal_lm":
        for section, defaults in LM_DEFAULTS.items():
            given = out.get(section) or {}
            if isinstance(given, dict):
                out[section] = {**defaults, **given}
    return out


def markdown_table() -> str:
    """The presets table of ``docs/how-to/from-trl.md``: one row per preset, one column per field it sets."""
    names = list(next(iter(ALGO_PRESETS.values())))
    rows = ["| algo.preset | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for preset, fields in ALGO_PRESETS.items():
        rows.append(f"| `{preset}` | " + " | ".join("null" if fields[n] is None else str(fields[n]) for n in names)
                    + " |")
    return "\n".join(rows) + "\n"


LECTURE_NAME = "lecture"  # the sorting toy's runs, the lecture's run among them: runs/lecture
NOT_IN_NAMES = r"[^\w.-]+"  # a model name's characters a folder name is better without


def default_run_name(data: dict) -> str:
    """The name of a run whose config gives none, from its config mapping: "lecture" for the sorting toy, else the
    task's name and the model's (its folder or hub name, the run's folder for ``RUN_DIR/model`` that ``rlvr sft``
    writes): ``sort_text-tiny_lm``."""
    task, policy = data.get("task"), data.get("policy")
    task_name = task.get("name", "sorting") if isinstance(task, dict) else "sorting"
    if task_name == "sorting" or not isinstance(task_name, str):
        return LECTURE_NAME
    options = policy.get("options") if isinstance(policy, dict) else None
    model = options.get("model") if isinstance(options, dict) else None
    if not isinstance(model, (str, Path)) or not str(model).strip("/"):
        return task_name
    path = Path(str(model).rstrip("/"))
    label = path.parent.name if path.name == "model" and path.parent.name else path.name
    return f"{task_name}-{re.sub(NOT_IN_NAMES, '_', label)}"
