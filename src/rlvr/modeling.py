"""Tiny causal LMs built offline, and loading any causal LM from a folder or hub name.

``init_model`` writes a character tokenizer and a random model that plain ``from_pretrained(dir)`` loads back: the
toy tasks train the same kind of object a real checkpoint is, and the tests need no download.
"""

from __future__ import annotations

import argparse
import os
import re
import string
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
# What the text toy tasks write: sorting ("3 1 4>1 3 4") and arithmetic ("12-(7*3)="). There is no unknown
# token: a character outside the vocabulary is an error when encoding, never <unk>.
DEFAULT_CHARS = "0123456789 >+-*=()"
PRINTABLE = string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", "")  # init-model --printable
ARCHS = ("llama", "gpt2")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_char_tokenizer(chars: str | list[str] = DEFAULT_CHARS, out_dir: str | Path | None = None):
    """A character-level ``PreTrainedTokenizerFast``: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, then ``chars`` in
    order. Encoding adds no special tokens, so ``decode(encode(s)) == s`` for any string over ``chars``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(chars)
    bad = [c for c in chars if len(c) != 1 or c in SPECIAL_TOKENS]
    if bad or len(set(chars)) != len(chars) or not chars:
        raise ValueError(f"chars must be distinct single characters, got {chars!r}")
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *chars])}
    # WordLevel needs an unk name; it is not in the vocabulary, so unknown characters raise.
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    if out_dir is not None:
        tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def _model_config(arch: str, vocab_size: int, hidden_size: int, intermediate_size: int,
                  num_layers: int, num_heads: int, tie_embeddings: bool, max_positions: int):
    """A transformers config for ``arch`` with special ids 0 (pad), 1 (bos), 2 (eos)."""
    from transformers import GPT2Config, LlamaConfig

    special = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    if arch == "llama":
        return LlamaConfig(
            vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
            num_hidden_layers=num_layers, num_attention_heads=num_heads,
            num_key_value_heads=num_heads, max_position_embeddings=max_positions,
            tie_word_embeddings=tie_embeddings, **special,
        )
    if arch == "gpt2":
        # no dropout: sampling and scoring must see the same policy
        return GPT2Config(
            vocab_size=vocab_size, n_embd=hidden_size, n_inner=intermediate_size,
            n_layer=num_layers, n_head=num_heads, n_positions=max_positions,
            tie_word_embeddings=tie_embeddings, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, **special,
        )
    raise ValueError(f"unknown arch {arch!r}; allowed: {', '.join(ARCHS)}")


def build_model(
    arch: str = "llama",
    vocab_size: int = len(SPECIAL_TOKENS) + len(DEFAULT_CHARS),
    hidden_size: int = 128,
    intermediate_size: int = 384,
    num_layers: int = 4,
    num_heads: int = 4,
    tie_embeddings: bool = True,
    max_positions: int = 256,
    seed: int = 0,
):
    """A randomly initialised causal LM with special ids pad 0, bos 1, eos 2: the same arguments and seed give
    the same weights; the global torch RNG is left as it was."""
    from transformers import AutoModelForCausalLM

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    config = _model_config(arch, vocab_size, hidden_size, intermediate_size, num_layers,
                           num_heads, tie_embeddings, max_positions)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = 0
    model.generation_config.bos_token_id = 1
    model.generation_config.eos_token_id = 2
    return model


def init_model(out_dir: str | Path, chars: str | list[str] = DEFAULT_CHARS, **options: Any) -> Path:
    """Write a character tokenizer over ``chars`` and ``build_model(**options)`` (its vocabulary the tokenizer's) to
    ``out_dir``; returns it."""
    out_dir = Path(out_dir)
    tokenizer = build_char_tokenizer(chars)
    model = build_model(vocab_size=len(tokenizer), **options)
    tokenizer.save_pretrained(str(out_dir))
    model.save_pretrained(str(out_dir))
    return out_dir


def add_init_model_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``init_model``'s options to ``parser`` (for ``rlvr init-model``)."""
    parser.add_argument("--out", required=True, help="folder to write the tokenizer and model to")
    parser.add_argument("--arch", default="llama", choices=ARCHS, help="model family (default: %(default)s)")
    parser.add_argument("--hidden-size", type=int, default=128, help="model width (default: %(default)s)")
    parser.add_argument("--intermediate-size", type=int, default=384, help="MLP width (default: %(default)s)")
    parser.add_argument("--num-layers", type=int, default=4, help="transformer blocks (default: %(default)s)")
    parser.add_argument("--num-heads", type=int, default=4, help="attention heads (default: %(default)s)")
    parser.add_argument("--untie-embeddings", action="store_true",
                        help="separate input embedding and output head (tied by default)")
    parser.add_argument("--chars", default=DEFAULT_CHARS, type=unescape_chars,
                        help="characters of the vocabulary (pad, bos, eos are added); \\n, \\t and \\\\ stand "
                             "for newline, tab and backslash (default: %(default)r)")
    parser.add_argument("--printable", action="store_true",
                        help="add every printable ASCII character, tab and newline to --chars (for prompts in "
                             "English, such as reasoning-gym's)")
    parser.add_argument("--max-positions", type=int, default=256,
                        help="longest sequence, prompt and response (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="initialisation seed (default: %(default)s)")
    return parser


def unescape_chars(text: str) -> str:
    """``--chars`` as characters: ``\\n``, ``\\t`` and ``\\\\`` are newline, tab and a backslash (a shell passes
    them on as written); any other backslash stays as it is."""
    return re.sub(r"\\([nt\\])", lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m[1]], text)


def run_init_model(args: argparse.Namespace) -> Path:
    chars = args.chars + "".join(c for c in PRINTABLE if c not in args.chars) if args.printable else args.chars
    return init_model(
        args.out, arch=args.arch, hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size, num_layers=args.num_layers,
        num_heads=args.num_heads, tie_embeddings=not args.untie_embeddings,
        chars=chars, max_positions=args.max_positions, seed=args.seed,
    )


@contextmanager
def quiet_libraries() -> Iterator[None]:
    """For one rlvr command: no progress bars from transformers and huggingface_hub (rlvr shows its own), and no
    deprecation warnings that transformers and peft raise about each other's calls. Both are as they were after the
    block, also when transformers is first imported within it; a user's ``HF_HUB_DISABLE_PROGRESS_BARS`` wins."""
    from rlvr.base.extras import missing_package

    hub = None
    if "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ and missing_package("huggingface_hub") is None:
        import huggingface_hub.utils as hub  # cheap; transformers takes its bars' state from it when imported
    hub_on = hub is not None and not hub.are_progress_bars_disabled()
    hf_logging = sys.modules.get("transformers.utils.logging")
    hf_on = None if hf_logging is None or hub is None else hf_logging.is_progress_bar_enabled()
    if hub is not None:
        hub.disable_progress_bars()
    if hf_on:
        hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            for category in (FutureWarning, DeprecationWarning):
                warnings.filterwarnings("ignore", category=category, module=r"(transformers|peft)(\.|$)")
            yield
    finally:
        if hub is not None:
            hf_logging = sys.modules.get("transformers.utils.logging")
            if hf_logging is not None and (hub_on if hf_on is None else hf_on):
                hf_logging.enable_progress_bar()
            (hub.enable_progress_bars if hub_on else hub.disable_progress_bars)()


def _torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; allowed: {', '.join(DTYPES)}")
    return DTYPES[dtype]


def add_lora(model: torch.nn.Module, lora: dict[str, Any]) -> torch.nn.Module:
    """Wrap ``model`` with LoRA adapters (``lora``: ``peft.LoraConfig`` fields; ``target_modules`` defaults to
    ``"all-linear"``); only the adapters stay trainable."""
    try:
        import peft
    except ImportError as err:
        raise ImportError("LoRA needs peft: pip install 'rlvr[lora]'") from err
    settings = {"target_modules": "all-linear", **lora}
    try:
        config = peft.LoraConfig(task_type="CAUSAL_LM", **settings)
    except TypeError as err:
        raise ValueError(f"bad LoRA settings {lora!r}: {err}") from err
    return peft.get_peft_model(model, config)


def load_model_and_tokenizer(
    name_or_path: str | Path,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    lora: dict[str, Any] | None = None,
):
    """Load ``(model, tokenizer)`` with ``from_pretrained`` from a folder or a hub name.

    The model is put in train mode on ``device`` ("meta": without weights, for a process that never runs it); the
    tokenizer pads on the left. FileNotFoundError when ``name_or_path`` is neither a local folder nor fetchable.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = _torch_dtype(dtype)
    source = str(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        if torch.device(device).type == "meta":  # the architecture alone: no weights read, no memory
            from transformers import AutoConfig

            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source), dtype=torch_dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
    except (OSError, ValueError) as err:
        if Path(source).exists():
            raise
        raise FileNotFoundError(
            f"no model at {source!r}: it is not a local folder and could not be fetched "
            f"from the hub ({type(err).__name__}: {err})"
        ) from err
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device)
    model.train()
    if lora is not None:
        with torch.device("meta") if torch.device(device).type == "meta" else nullcontext():
            model = add_lora(model, lora)
    return model, tokenizer
