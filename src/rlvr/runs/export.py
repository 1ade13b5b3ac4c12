"""``rlvr export RUN_DIR --out DIR``: a run's trained model as a folder of its own.

A causal LM's folder loads with ``from_pretrained`` (LoRA adapters merged, DCP shards
gathered; the base model checked by digest, or ``--base``); the positional toy's holds
``policy.pt`` and ``config.yaml``. The weights are the newest verified checkpoint's, or
``checkpoint=``'s; written beside ``out`` and renamed (docs/explanation/runs.md)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from rlvr.base.errors import ConfigError, RunError
from rlvr.base.extras import LM_MODULES, require
from rlvr.cluster.sharded import load_sharded_weights
from rlvr.config import Config, load_config
from rlvr.runs.checkpoint import (
    CheckpointError,
    list_checkpoints,
    load_payload,
    manifest_files,
    save_pretrained,
    sharded_folder,
    verify,
)


def export_model(run_dir: str | Path, out: str | Path, checkpoint: str | None = None,
                 base: str | Path | None = None) -> Path:
    """Write the trained model of ``run_dir`` to the new folder ``out``; returns ``out``.

    checkpoint: a checkpoint's name ("step-000000100"); None: the newest that verifies. base: where a LoRA run's
    base model is now (None: where the run recorded it); its digest must be the one recorded at train time.
    Raises ConfigError for a ``run_dir`` that is not a run or an ``out`` that is not new and outside it,
    CheckpointError when no checkpoint is usable, RunError for a base model that is not the run's.
    """
    run_dir, out = Path(run_dir), Path(out)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir}: no config.yaml there (not a run directory)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out}: already exists and is not an empty folder; give a new one")
    if out.resolve().is_relative_to(run_dir.resolve()):
        # a folder in checkpoints/ would pass for a checkpoint (counted by keep_checkpoints, resumed from)
        raise ConfigError(f"--out {out}: inside the run directory {run_dir}; give a folder outside it")
    config = load_config(run_dir / "config.yaml")
    source = _checkpoint(run_dir, checkpoint)
    out.parent.mkdir(parents=True, exist_ok=True)
    # a fresh folder of our own beside ``out`` (the same file system: the rename is atomic), never one we did
    # not make; the model is written in a folder made inside it, with the user's umask (mkdtemp's is 0700)
    holder = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    tmp = holder / out.name
    tmp.mkdir()
    sharded = sharded_folder(source)
    try:
        if config.policy.name == "causal_lm":
            model_dir, files = source / "model", manifest_files(source, "model")
            if sharded is not None:  # the shards merged into the run's model, saved as a checkpoint's model/ is
                model_dir = holder / "merged"
                save_pretrained(_merged_policy(config, sharded), model_dir)
                files = sorted(str(p.relative_to(model_dir)) for p in model_dir.rglob("*") if p.is_file())
            _export_causal_lm(config, model_dir, files, tmp, base)
        else:
            weights = (load_payload(source / "trainer.pt")["policy"] if sharded is None
                       else _merged_policy(config, sharded).module.state_dict())
            torch.save(weights, tmp / "policy.pt")
            shutil.copyfile(run_dir / "config.yaml", tmp / "config.yaml")
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(tmp, out)
    finally:
        shutil.rmtree(holder, ignore_errors=True)
    return out


def _merged_policy(config: Config, folder: Path) -> Any:
    """The run's policy, built from its config, holding the weights of the sharded ``folder`` whole."""
    from rlvr.config.compose import build_policy

    policy = build_policy(config)
    load_sharded_weights(policy.module, folder)
    return policy


def _checkpoint(run_dir: Path, name: str | None) -> Path:
    """The checkpoint named ``name``, or the newest one whose files match their manifest."""
    candidates = list_checkpoints(run_dir)
    if not candidates:
        raise CheckpointError(f"no checkpoint in {run_dir / 'checkpoints'} (the run wrote none yet)")
    if name is not None:
        chosen = [c for c in candidates if c.name == name]
        if not chosen:
            raise ConfigError(f"--checkpoint {name}: not in {run_dir / 'checkpoints'}; there are: "
                              f"{', '.join(c.name for c in candidates)}")
        candidates = chosen
    problems = []
    for checkpoint in reversed(candidates):
        problem = verify(checkpoint)
        if problem is None:
            if problems:
                warnings.warn(f"exporting {checkpoint.name}, the newest checkpoint that verifies", stacklevel=3)
            return checkpoint
        warnings.warn(f"skipping checkpoint {checkpoint}: {problem}", stacklevel=3)
        problems.append(f"{checkpoint.name}: {problem}")
    raise CheckpointError(f"no usable checkpoint in {run_dir / 'checkpoints'}: {'; '.join(problems)}")


def _export_causal_lm(config: Config, model_dir: Path, files: list[str], out: Path,
                      base: str | Path | None = None) -> None:
    """The checkpoint's ``model/`` folder (the manifest's ``files``) as a plain transformers folder, LoRA adapters
    merged into the base model."""
    if "adapter_config.json" not in files:
        if "config.json" not in files:
            raise RunError(f"{model_dir}: no model saved in this checkpoint")
        for rel in files:  # the manifest's files alone, each a regular file (verify refuses links)
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(model_dir / rel, out / rel, follow_symlinks=False)
        return
    require("merging a LoRA run's adapters", (*LM_MODULES, "peft"))
    import peft
    from transformers import AutoTokenizer

    from rlvr.modeling import load_model_and_tokenizer

    options = config.policy.options
    model, _ = load_model_and_tokenizer(_base_model(config, model_dir, base), dtype=options.dtype)
    merged = peft.PeftModel.from_pretrained(model, str(model_dir)).merge_and_unload()
    merged.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(out))


def _base_model(config: Config, model_dir: Path, base: str | Path | None) -> str:
    """Where to load a LoRA checkpoint's base model from (``base``, else the one the run recorded), its digest
    checked against the recorded one."""
    from rlvr.policies.hf_model import BASE_MODEL_FILE, locate_model, model_identity

    record = model_dir / BASE_MODEL_FILE
    if not record.is_file():  # a checkpoint written before runs recorded their base model
        named = str(base or config.policy.options.model)
        warnings.warn(f"{model_dir} does not record its base model: merging into {named!r} unchecked", stacklevel=3)
        return named
    try:
        trained = json.loads(record.read_text(encoding="utf-8"))
        model, digest = str(trained["model"]), str(trained["sha256"])
    except (ValueError, TypeError, KeyError) as err:
        raise RunError(f"{record}: not a base-model record ({err})") from err
    located = locate_model(base or model)
    found = model_identity(base or model, located)
    if found["sha256"] != digest:
        raise RunError(f"base model {found['model']} (sha256 {found['sha256'][:16]}) is not the one the run trained "
                       f"its adapters on, {model} (sha256 {digest[:16]}); give that model with --base")
    return located
