"""Setting up a transformers causal LM for RL: where it comes from, its limits, its device,
dropout, checkpointing."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from rlvr.base.data import hash_file

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def locate_model(name_or_path: str | Path, timeout: float = 3.0) -> str:
    """Where ``from_pretrained`` should load ``name_or_path`` from, found in seconds.

    A GGUF source is its converted folder; a local folder is itself; a hub name is itself when the hub answers
    within ``timeout`` (behind a proxy it is not probed), else its snapshot in the Hugging Face cache. Neither is a
    FileNotFoundError saying what to do, where transformers would retry the hub for about 50 s before failing.
    """
    from rlvr.policies.gguf_models import converted_folder, gguf_file

    source = str(name_or_path)
    file = gguf_file(source)  # a GGUF file, or a packaged model's name: its converted folder
    if file is not None:
        return converted_folder(file)
    if Path(source).expanduser().exists():
        return source
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(source)
    except HFValidationError:
        raise FileNotFoundError(f"policy.options.model={source!r}: no folder there (and it is not a hub name)") \
            from None
    offline = bool(constants.HF_HUB_OFFLINE)
    if not offline and (any(os.environ.get(v) for v in PROXY_VARIABLES) or _reachable(constants.ENDPOINT, timeout)):
        return source
    try:
        return snapshot_download(source, local_files_only=True)
    except (LocalEntryNotFoundError, OSError):
        pass
    why = "HF_HUB_OFFLINE is set" if offline else f"{constants.ENDPOINT} cannot be reached (no network?)"
    raise FileNotFoundError(
        f"model {source!r} is not a local folder nor in the Hugging Face cache ({constants.HF_HUB_CACHE}), and {why}: "
        f"download it where there is network (hf download {source}, or save_pretrained to a folder) and set "
        "policy.options.model to that folder, or copy the cache here")


BASE_MODEL_FILE = "base_model.json"  # in a LoRA checkpoint's model/ folder: ``model_identity`` of the base
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def model_identity(name_or_path: str | Path, folder: str | Path | None = None) -> dict[str, str]:
    """Which model ``name_or_path`` is: ``model`` (a local folder's absolute path, or the hub name) and ``sha256``
    of the config.json and weight files in ``folder`` (default: the local folder, or the hub snapshot)."""
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        model, folder = str(local.resolve()), folder or local
    else:
        model = str(name_or_path)
        if folder is None or not Path(folder).is_dir():
            from huggingface_hub import snapshot_download

            folder = snapshot_download(model, local_files_only=True)  # from_pretrained has just fetched it
    digest = hashlib.sha256()
    files = sorted(f for f in Path(folder).iterdir()
                   if f.is_file() and (f.name == "config.json" or f.name.endswith(WEIGHT_SUFFIXES)))
    for file in files:
        digest.update(f"{file.name}\0{file.stat().st_size}\0".encode())
        hash_file(file, digest)
    return {"model": model, "sha256": digest.hexdigest()}


def _reachable(url: str, timeout: float) -> bool:
    """Does a TCP connection to ``url``'s host open within ``timeout`` seconds? The name lookup takes no timeout,
    so the attempt runs in a thread waited for at most that long."""
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    opened: list[bool] = []

    def connect() -> None:
        try:
            with socket.create_connection((parsed.hostname, port), timeout=timeout):
                opened.append(True)
        except OSError:
            opened.append(False)

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(opened and opened[0])


def max_positions(model: torch.nn.Module) -> int | None:
    """The longest sequence ``model`` takes, prompt and response together, or None if its config states none."""
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions"):
        if isinstance(getattr(config, name, None), int):
            return getattr(config, name)
    return None


def eos_token_ids(model: torch.nn.Module, tokenizer: Any) -> tuple[int, ...]:
    """The token ids that end a response, sorted: the tokenizer's EOS and the generation config's."""
    ids = {tokenizer.eos_token_id}
    config_ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(config_ids if isinstance(config_ids, list) else [config_ids])
    ids.discard(None)
    if not ids:
        raise ValueError("the tokenizer and the model's generation config define no EOS token")
    return tuple(sorted(ids))


def check_device(device: str | torch.device) -> None:
    """A ValueError unless ``device`` is a torch device this machine has."""
    try:
        where = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={device!r} is not a torch device (e.g. cpu, cuda, cuda:1, mps)") from None
    if where.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} but CUDA is not available (torch.cuda.is_available() is False); "
                             "use device=cpu")
        if where.index is not None and where.index >= torch.cuda.device_count():
            raise ValueError(f"device={device!r} but this machine has {torch.cuda.device_count()} CUDA device(s)")
    if where.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={device!r} but MPS is not available; use device=cpu")


def disable_dropout(model: torch.nn.Module) -> None:
    """Dropout probability 0 in ``nn.Dropout`` modules and the ``attention_dropout`` given to kernels."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Non-reentrant activation checkpointing (transformers 5 name, else the older one)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def checkpointing_active(model: torch.nn.Module) -> bool:
    """Is activation checkpointing active (it drops KV caches in train mode)? The layers' flag: set whatever wraps
    the model (peft)."""
    return model.training and any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())
