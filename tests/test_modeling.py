"""Tiny models and tokenizers built offline, and loading them back through plain transformers."""

from __future__ import annotations

import argparse

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers import TINY
from rlvr.cli import main
from rlvr.modeling import (
    DEFAULT_CHARS,
    add_init_model_arguments,
    build_char_tokenizer,
    build_model,
    init_model,
    load_model_and_tokenizer,
    run_init_model,
)


def test_char_tokenizer_round_trips():
    tokenizer = build_char_tokenizer()
    assert len(tokenizer) == 3 + 18  # pad, bos, eos + digits, space and ">+-*=()"
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    text = "31 4>1 34+(2-7)*3=9"
    ids = tokenizer(text)["input_ids"]
    assert ids == [3 + DEFAULT_CHARS.index(c) for c in text]  # one id per character, no specials
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode([1, *ids, 2, 0], skip_special_tokens=True) == text


def test_char_tokenizer_rejects_bad_characters():
    with pytest.raises(ValueError, match="distinct"):
        build_char_tokenizer("aab")
    with pytest.raises(ValueError, match="distinct"):
        build_char_tokenizer(["ab", "c"])
    with pytest.raises(Exception, match="UNK"):  # outside the vocabulary: an error, not <unk>
        build_char_tokenizer("abc")("abd")


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_init_model_reloads_through_plain_transformers(tmp_path, arch):
    path = init_model(tmp_path, arch=arch, chars="0123>", seed=3, **TINY)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    assert tokenizer.decode(tokenizer("10>32")["input_ids"]) == "10>32"
    assert model.config.vocab_size == len(tokenizer) == 8
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    built = build_model(arch, vocab_size=8, seed=3, **TINY).eval()
    ids = torch.tensor([tokenizer("3210>0123")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, built(ids).logits)  # the very same weights
    other = build_model(arch, vocab_size=8, seed=4, **TINY).eval()
    with torch.no_grad():
        assert not torch.equal(other(ids).logits, built(ids).logits)


def test_build_model_leaves_the_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    build_model(**TINY)
    assert torch.equal(torch.rand(3), expected)


def test_cli_helpers_write_the_requested_model(tmp_path):
    parser = add_init_model_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--out", str(tmp_path / "m"), "--arch", "gpt2", "--hidden-size", "16",
                              "--intermediate-size", "24", "--num-layers", "1", "--num-heads", "2",
                              "--untie-embeddings"])
    path = run_init_model(args)
    model, tokenizer = load_model_and_tokenizer(path)
    assert model.config.model_type == "gpt2"
    assert (model.config.n_embd, model.config.n_inner, model.config.n_layer) == (16, 24, 1)
    assert model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr()
    assert len(tokenizer) == 21


def test_load_model_and_tokenizer_dtype_and_errors(tmp_path):
    path = init_model(tmp_path / "m", **TINY)
    model, tokenizer = load_model_and_tokenizer(path, dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert tokenizer.padding_side == "left" and model.training
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        load_model_and_tokenizer(missing)
    with pytest.raises(ValueError, match="float32"):
        load_model_and_tokenizer(path, dtype="float8")
    with pytest.raises(ValueError, match="arch"):
        init_model(tmp_path / "x", arch="mamba", **TINY)


def test_lora_trains_only_adapters_and_starts_at_the_base_model(tmp_path):
    pytest.importorskip("peft")
    path = init_model(tmp_path, **TINY)
    base, tokenizer = load_model_and_tokenizer(path)
    model, _ = load_model_and_tokenizer(path, lora={"r": 4, "lora_alpha": 8})
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    ids = torch.tensor([tokenizer("12>21")["input_ids"]])
    with torch.no_grad():  # LoRA's B starts at zero: the adapted model equals the base
        torch.testing.assert_close(model(ids).logits, base(ids).logits)
    with pytest.raises(ValueError, match="LoRA"):
        load_model_and_tokenizer(path, lora={"rank": 4})


def test_init_model_help_shows_defaults_and_chars_take_a_newline(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["init-model", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "model width (default: 128)" in text and "(default: '0123456789 >+-*=()')" in text
    assert main(["init-model", "--out", str(tmp_path / "m"), "--chars", "12\\n", "--hidden-size", "8",
                 "--intermediate-size", "8", "--num-layers", "1", "--num-heads", "2"]) == 0
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "m"))
    assert tokenizer.decode(tokenizer("1\n2", add_special_tokens=False)["input_ids"]) == "1\n2"
    assert len(tokenizer) == 3 + 3  # pad, bos, eos and '1', '2', newline
    assert main(["init-model", "--out", str(tmp_path / "m2"), "--chars", "11"]) == 2  # one line, no traceback
    assert "init-model: chars must be distinct single characters" in capsys.readouterr().err
