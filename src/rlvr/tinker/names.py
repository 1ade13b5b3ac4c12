"""The base models a Tinker server serves, by the names clients use, and their tokenizers where clients look.

Recipes name a model by its hub name and load its tokenizer with ``AutoTokenizer.from_pretrained(name)``. A packaged
model (``rlvr.policies.gguf_models.PACKAGED``) answers to its hub name too, and its tokenizer files are written into
the Hugging Face cache as that name's snapshot, so the client loads it offline (``HF_HUB_OFFLINE=1``). Only the
tokenizer and config go there: the weights are the packaged GGUF's, not the hub's.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from rlvr.policies.hf_model import locate_model

# a packaged model's hub name -> its packaged name
HUB_NAMES = {"HuggingFaceTB/SmolLM2-135M-Instruct": "smollm2-135m-instruct"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "config.json", "generation_config.json", "vocab.json", "merges.txt")


@dataclass(frozen=True)
class ServedModel:
    """A base model: ``name`` as served (and listed), the names that reach it, its folder, and ``tokenizer_id``,
    what ``get_info`` tells clients to load the tokenizer by."""

    name: str
    aliases: tuple[str, ...]
    folder: str
    tokenizer_id: str


def served_model(source: str) -> ServedModel:
    """The model ``source`` names (a packaged name or its hub name, a folder, a GGUF file, a cached hub name)."""
    packaged = HUB_NAMES.get(source, source)
    hub = next((h for h, p in HUB_NAMES.items() if p == packaged), None)
    folder = locate_model(packaged)
    if hub is not None:
        return ServedModel(hub, (hub, packaged), folder, hub)
    name = source if not Path(source).expanduser().exists() else str(Path(source).expanduser().resolve())
    return ServedModel(name, (source, name), folder, name)


def place_tokenizer(model: ServedModel, hub_cache: str | None = None) -> Path | None:
    """Write ``model``'s tokenizer files into the Hugging Face cache as the snapshot of its hub name, unless a
    snapshot of that name is there already; returns the snapshot folder written, else None."""
    if model.tokenizer_id not in HUB_NAMES:
        return None
    from huggingface_hub import constants

    root = Path(hub_cache or constants.HF_HUB_CACHE) / ("models--" + model.tokenizer_id.replace("/", "--"))
    ref = root / "refs" / "main"
    if ref.is_file() and (root / "snapshots" / ref.read_text().strip() / "tokenizer_config.json").is_file():
        return None
    files = [Path(model.folder) / f for f in TOKENIZER_FILES if (Path(model.folder) / f).is_file()]
    digest = hashlib.sha1()
    for f in files:
        digest.update(f.name.encode() + f.read_bytes())
    revision = digest.hexdigest()
    snapshot = root / "snapshots" / revision
    partial = root / "snapshots" / f".{revision}.{os.getpid()}.partial"
    partial.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(f, partial / f.name)
    os.replace(partial, snapshot) if not snapshot.exists() else shutil.rmtree(partial)
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(revision)
    return snapshot
