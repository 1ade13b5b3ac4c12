"""A real pretrained instruct model end to end: SmolLM2-135M-Instruct (the packaged GGUF,
converted once per session) on the chat-arithmetic recipe, shortened: a GRPO step with a KL
penalty toward the reference copy and an evaluation, export then reload in plain
transformers (the same log-probs, bit for bit), LoRA on it, and its chat template checked
turn by turn."""

from __future__ import annotations

import math

import pytest
import torch

import rlvr
from helpers import QUIET, ROOT
from rlvr.cli import main
from rlvr.runs.metrics import read_records

RECIPE = ROOT / "examples" / "smollm2_arithmetic.yaml"
PROMPT = [{"role": "user", "content": "What is 83 + 69? Reply with only the number."}]


def length(completions, **kwargs):
    """A reward that differs within a group from the first step: the responses' lengths (a
    short run's groups need not hold a right answer). Chat prompts' completions are messages,
    as in TRL."""
    return [len(c[-1]["content"]) / 40 for c in completions]


def short_recipe(out, cache, *overrides):
    """The recipe, one epoch of 2 prompts x 4 responses of at most 8 tokens, 4 held-out
    prompts evaluated before and after; the model by its packaged name, from ``cache``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RLVR_CACHE", str(cache))
        return rlvr.train(RECIPE, [
            "algo.epochs=1", "task.prompts_per_epoch=2", "algo.group_size=4", "policy.options.max_new_tokens=8",
            "task.options.num_eval=4", "log.eval_every=1", "log.eval_samples=2", "log.checkpoint_every=1",
            "rewards.functions=[{function: 'rlvr.rewards.verifiers:exact_match', name: right_number, weight: 0.5, "
            "options: {extract: last_number}}, 'test_smollm2:length']", *QUIET, *overrides], out_dir=out)


def log_probs(model, ids):
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)


def chat_ids(tokenizer):
    """The recipe's prompt and an answer, as the policy sees them: the chat template's ids."""
    text = tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True) + "152<|im_end|>"
    return torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])


@pytest.fixture(scope="module")
def grpo_run(smollm2, tmp_path_factory):
    cache, _, _ = smollm2
    return short_recipe(tmp_path_factory.mktemp("smollm2") / "run", cache, "algo.kl_coef=0.05")


def test_a_grpo_step_with_a_reference_copy_and_an_evaluation(grpo_run, smollm2):
    from transformers import AutoModelForCausalLM

    records = read_records(grpo_run.run_dir)
    [train] = [r for r in records if r["kind"] == "train"]
    assert math.isfinite(train["loss"]) and train["grad_norm"] > 0
    assert train["frac_zero_delta_groups"] == 0.0  # the length reward differs within each group
    assert train["kl"] >= 0 and "reward/length/mean" in train and "reward/right_number/mean" in train
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["epoch"] for r in evals] == [0, 1]
    for record in evals:
        assert 0 <= record["greedy_solve_rate"] <= 1 and {"pass@1", "pass@2"} <= set(record)
    samples = next(r for r in records if r["kind"] == "samples" and r["epoch"] == 1)
    assert samples["rows"][0]["prompt"][0]["content"].startswith("What is")
    base = AutoModelForCausalLM.from_pretrained(smollm2[1])
    trained = grpo_run.policy.module
    moved = [name for name, p in trained.named_parameters() if not torch.equal(p, base.get_parameter(name))]
    assert len(moved) > 200  # full fine-tuning: the step moved (nearly) every one of the 272 tensors


def test_export_reloads_in_plain_transformers_with_the_same_log_probs(grpo_run, smollm2, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert main(["export", str(grpo_run.run_dir), "--out", str(tmp_path / "model")]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(smollm2[1]).chat_template
    ids = chat_ids(tokenizer)
    exported = log_probs(model, ids)
    assert torch.equal(exported, log_probs(grpo_run.policy.module.eval(), ids))  # bit for bit
    base = AutoModelForCausalLM.from_pretrained(smollm2[1])
    assert not torch.equal(exported, log_probs(base, ids))  # and not the base model's


def test_lora_on_the_real_model_trains_its_adapters_and_exports_merged(smollm2, tmp_path):
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    cache, folder, _ = smollm2
    result = short_recipe(tmp_path / "run", cache, "policy.options.lora={r: 4, lora_alpha: 8}", "optim.lr=1e-3",
                          "log.eval_at_start=false")
    trainable = [name for name, p in result.policy.module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "model")]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert not any("lora" in name for name in model.state_dict())
    from transformers import AutoTokenizer

    ids = chat_ids(AutoTokenizer.from_pretrained(folder))
    merged, adapted = log_probs(model, ids), log_probs(result.policy.module.eval(), ids)
    torch.testing.assert_close(merged, adapted, rtol=1e-4, atol=1e-4)  # W + BA merged: rounding only
    base = log_probs(AutoModelForCausalLM.from_pretrained(folder), ids)
    assert (merged - base).abs().max() > 1e-3  # the adapters trained


def test_its_chat_template_renders_episodes_turn_by_turn_as_whole(smollm2):
    from transformers import AutoTokenizer

    from rlvr.policies.chat_check import check_chat_template, render_delta

    tokenizer = AutoTokenizer.from_pretrained(smollm2[1])
    tool_episode = [
        {"role": "system", "content": "You can call calculator(expression)."},
        *PROMPT,
        {"role": "assistant", "content": '<tool_call>{"name": "calculator", "arguments": {"expression": "83+69"}}'
                                         "</tool_call>"},
        {"role": "tool", "content": "152"},
        {"role": "assistant", "content": "152"},
    ]
    game = [*PROMPT, {"role": "assistant", "content": "151"}, {"role": "user", "content": "Too low. Again."},
            {"role": "assistant", "content": "152"}]
    assert check_chat_template(tokenizer, [tool_episode, game]) == []
    assert render_delta(tokenizer, tool_episode[:3], [tool_episode[3]]) == (
        "\n<|im_start|>tool\n152<|im_end|>\n<|im_start|>assistant\n")


def test_the_calculator_recipe_runs_chat_episodes_with_its_tool(smollm2, tmp_path):
    """examples/smollm2_calculator.yaml, shortened: chat episodes whose prompt shows the tool
    exchange through the model's template, and whose turns the trainer trains on."""
    cache, _, _ = smollm2
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RLVR_CACHE", str(cache))
        run = rlvr.train(ROOT / "examples" / "smollm2_calculator.yaml", [
            "algo.epochs=1", "task.prompts_per_epoch=2", "algo.group_size=4", "policy.options.max_new_tokens=12",
            "task.options.eval_size=2", "task.options.max_tokens=40", "log.eval_every=1", "log.checkpoint_every=0",
            *QUIET], out_dir=tmp_path / "run")
    records = read_records(run.run_dir)
    [train] = [r for r in records if r["kind"] == "train"]
    assert math.isfinite(train["loss"]) and train["episode/turns"] >= 1
    samples = next(r for r in records if r["kind"] == "samples")
    roles = [m["role"] for m in samples["rows"][0]["prompt"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    tokenizer = run.policy.tokenizer
    text = tokenizer.apply_chat_template(samples["rows"][0]["prompt"], tokenize=False)
    assert "<|im_start|>tool\n14946<|im_end|>" in text
