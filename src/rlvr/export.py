"""``rlvr export RUN_DIR --out DIR``: a run's trained model as a folder of its own.

For a causal LM the folder is what ``AutoModelForCausalLM.from_pretrained(DIR)`` and
``AutoTokenizer.from_pretrained(DIR)`` load: the weights, the model's config and the
tokenizer. A LoRA run's adapters are merged into the base model's weights first, so the
folder needs neither peft nor the base model. For the positional toy (not a transformers
model) the folder holds ``policy.pt`` (its ``state_dict``, loadable with
``torch.load(..., weights_only=True)``) and the run's ``config.yaml``, from which
``rlvr.policies.build_policy`` builds the module to load it into.

The weights are those of the newest checkpoint whose files match their checksums (the
final one, for a run that finished), or of ``checkpoint=`` when named. The folder is
written under a temporary name and renamed, so a failed export leaves nothing at ``out``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from rlvr.checkpoint import CheckpointError, list_checkpoints, load_payload, verify
from rlvr.config import Config, load_config
from rlvr.errors import ConfigError, RunError


def export_model(run_dir: str | Path, out: str | Path, checkpoint: str | None = None) -> Path:
    """Write the trained model of ``run_dir`` to the new folder ``out``; returns ``out``.

    checkpoint: the name of one of the run's checkpoints ("step-000000100"); None: the
    newest that verifies. Raises ConfigError for a folder that is not a run directory or
    an ``out`` that exists and is not empty, CheckpointError when no checkpoint is usable.
    """
    run_dir, out = Path(run_dir), Path(out)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir}: no config.yaml there (not a run directory)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out}: already exists and is not an empty folder; give a new one")
    config = load_config(run_dir / "config.yaml")
    source = _checkpoint(run_dir, checkpoint)
    tmp = out.with_name(f".tmp-{out.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if config.policy.name == "causal_lm":
            _export_causal_lm(config, source / "model", tmp)
        else:
            payload = load_payload(source / "trainer.pt")
            torch.save(payload["policy"], tmp / "policy.pt")
            shutil.copyfile(run_dir / "config.yaml", tmp / "config.yaml")
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


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
            return checkpoint
        problems.append(f"{checkpoint.name}: {problem}")
    raise CheckpointError(f"no usable checkpoint in {run_dir / 'checkpoints'}: {'; '.join(problems)}")


def _export_causal_lm(config: Config, model_dir: Path, out: Path) -> None:
    """The checkpoint's ``model/`` folder as a plain transformers model folder; LoRA
    adapters (an ``adapter_config.json`` there) merged into the base model first."""
    if not (model_dir / "adapter_config.json").is_file():
        if not (model_dir / "config.json").is_file():
            raise RunError(f"{model_dir}: no model saved in this checkpoint")
        shutil.copytree(model_dir, out, dirs_exist_ok=True)
        return
    try:
        import peft
    except ImportError as err:
        raise RunError("merging a LoRA run's adapters needs peft: pip install 'rlvr[lora]'") from err
    from transformers import AutoTokenizer

    from rlvr.modeling import load_model_and_tokenizer

    options = config.policy.options
    base, _ = load_model_and_tokenizer(options["model"], dtype=options.get("dtype", "float32"))
    merged = peft.PeftModel.from_pretrained(base, str(model_dir)).merge_and_unload()
    merged.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(out))
