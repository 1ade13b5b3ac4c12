"""Language-model runs end to end on a tiny local model: SFT, GRPO, checkpoints, resume."""

import json

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from rlvr.cli import main  # noqa: E402
from rlvr.modeling import init_model  # noqa: E402
from rlvr.runs.checkpoint import list_checkpoints, load_latest  # noqa: E402
from rlvr.runs.metrics import read_records, without_timings  # noqa: E402


def lm_args(model, out, epochs=4):
    return [
        f"out_dir={out}", "task.name=sort_text", "task.prompts_per_epoch=4",
        "task.options={num_digits: 3, num_eval: 8}", "policy.name=causal_lm",
        f"policy.options={{model: '{model}', max_new_tokens: 7}}", f"algo.epochs={epochs}",
        "algo.inner_steps=2", "algo.group_size=4", "algo.loss=clipped", "algo.deltas=normalized",
        "optim.lr=1e-3", "optim.micro_batches=2", "log.eval_every=2", "log.eval_samples=2",
        "log.checkpoint_every=2", "log.progress=false", "log.plot=false", "seed=7",
    ]


def test_sft_writes_a_loadable_model_and_lowers_the_loss(tiny_model, tmp_path):
    out = tmp_path / "sft"
    assert main(["sft", f"out_dir={out}", "task.name=sort_text", "task.options={num_digits: 3, num_eval: 8}",
                 "policy.name=causal_lm", f"policy.options={{model: '{tiny_model}', max_new_tokens: 7}}",
                 "sft.steps=30", "sft.batch_size=16", "sft.lr=3e-3", "sft.eval_every=30", "sft.eval_size=8"]) == 0
    records = read_records(out / "sft_metrics.jsonl")
    assert records[-1]["loss"] < 0.6 * records[0]["loss"]
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    assert model.config.vocab_size == len(tokenizer)


def test_grpo_run_checkpoints_load_in_plain_transformers(tiny_model, tmp_path):
    out = tmp_path / "rl"
    assert main(["train", *lm_args(tiny_model, out)]) == 0
    records = read_records(out)
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 8
    for key in ("time/generate", "time/reward", "time/score", "time/step", "tokens_per_sec_generate",
                "reward/position/mean", "reward/exact_match/mean"):
        assert key in train[0]
    evals = [r for r in records if r["kind"] == "eval"]
    assert {"pass@1", "pass@2", "greedy_solve_rate"} <= set(evals[-1])
    checkpoint = list_checkpoints(out)[-1]
    model = AutoModelForCausalLM.from_pretrained(checkpoint / "model")
    AutoTokenizer.from_pretrained(checkpoint / "model")
    _, payload = load_latest(out)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, payload["policy"][name]), name
    assert "| prompt | response | reward | correct |" in (out / "samples.md").read_text()


def test_lm_resume_after_k_epochs_equals_straight_run(tiny_model, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["train", *lm_args(tiny_model, straight, epochs=4)]) == 0
    assert main(["train", *lm_args(tiny_model, split, epochs=2)]) == 0
    assert main(["train", f"resume={split}", "algo.epochs=4"]) == 0
    assert without_timings(read_records(straight)) == without_timings(read_records(split))
    a, b = load_latest(straight)[1]["policy"], load_latest(split)[1]["policy"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_deterministic_mode_gives_bitwise_identical_records(tiny_model, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        assert main(["train", *lm_args(tiny_model, out, epochs=2), "deterministic=true"]) == 0
    torch.use_deterministic_algorithms(False)
    assert without_timings(read_records(a)) == without_timings(read_records(b))


@pytest.mark.parametrize("options, message", [
    ("{modl: x}", "policy.options: unknown option 'modl'"),
    ("{model: /nonexistent/model/dir}", "/nonexistent/model/dir"),
])
def test_bad_policy_options_exit_cleanly_and_leave_nothing(tmp_path, capsys, options, message):
    out = tmp_path / "never"
    code = main(["train", f"out_dir={out}", "task.name=sort_text", "policy.name=causal_lm",
                 f"policy.options={options}", "log.progress=false"])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_malformed_sft_data_names_file_and_line(tiny_model, tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"prompt": "3 1>", "completion": "1 3"}\n{"prompt": "2 1>"}\n')
    code = main(["sft", f"out_dir={tmp_path / 'sft'}", "task.name=sort_text", "policy.name=causal_lm",
                 f"policy.options={{model: '{tiny_model}'}}", f"sft.data={data}", "sft.steps=1"])
    assert code == 2
    assert f"{data}:2" in capsys.readouterr().err
    assert not (tmp_path / "sft").exists()


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum"])
def test_lm_micro_batching_gives_the_same_gradient(tiny_model, tmp_path, aggregation):
    from rlvr.config import load_config
    from rlvr.loop.step import optimizer_step
    from rlvr.loop.trainer import collect_rollout, setup

    def gradient(micro_batches):
        args = lm_args(tiny_model, tmp_path / "unused") + [
            f"algo.aggregation={aggregation}", f"optim.micro_batches={micro_batches}", "algo.kl_coef=0.1",
            "optim.lr=1e-30", "algo.inner_steps=1"]
        config = load_config(None, args)
        task, st = setup(config)
        rollout = collect_rollout(config, task, st)
        # Fixed nonzero deltas: whether a random tiny model earns any reward depends on the
        # machine's float rounding, and all-zero deltas would make every gradient 0.
        rollout.deltas = torch.linspace(-1.0, 1.0, rollout.samples.num_responses)
        lengths = rollout.samples.response_mask.sum(dim=1)
        optimizer_step(config, st, rollout)
        return [p.grad.clone() for p in st.policy.module.parameters()], lengths

    (one, lengths), (four, _) = gradient(1), gradient(4)
    assert lengths.unique().numel() > 1  # responses of different lengths: the weights matter
    for a, b in zip(one, four):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in one)


def test_lora_trains_only_the_adapters(tiny_model, tmp_path):
    pytest.importorskip("peft")
    from rlvr.config import load_config
    from rlvr.runs.launch import run_sft

    config = load_config(None, [
        "task.name=sort_text", "task.options={num_digits: 3, num_eval: 8}", "policy.name=causal_lm",
        f"policy.options={{model: '{tiny_model}', max_new_tokens: 7, lora: {{r: 4, lora_alpha: 8}}}}",
        "sft.steps=3", "sft.batch_size=8", "sft.lr=1e-2", "sft.eval_every=3", "sft.eval_size=4"])
    base = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    out = run_sft(config, tmp_path)
    from peft import PeftModel

    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), out)
    changed = [n for n, p in tuned.named_parameters() if "lora_" in n and p.abs().sum() > 0 and "lora_B" in n]
    assert changed  # lora_B starts at 0: nonzero means the adapters trained
    frozen = {n: p for n, p in tuned.base_model.model.named_parameters() if "lora_" not in n}
    for name, p in frozen.items():
        key = name.replace("base_layer.", "")
        assert torch.equal(p, base[key]), name  # the base weights did not move
    merged = tuned.merge_and_unload().state_dict()
    assert any(not torch.equal(merged[k], base[k]) for k in base)


def test_autocast_keeps_float32_master_weights(tiny_model, tmp_path):
    # bf16 weights lose small Adam updates; autocast computes in bf16 and updates fp32.
    from rlvr.config import load_config
    from rlvr.runs.launch import run_sft

    config = load_config(None, [
        "task.name=sort_text", "task.options={num_digits: 3, num_eval: 8}", "policy.name=causal_lm",
        f"policy.options={{model: '{tiny_model}', max_new_tokens: 7, autocast: bfloat16}}",
        "sft.steps=2", "sft.batch_size=4", "sft.lr=1e-6", "sft.eval_every=2", "sft.eval_size=2"])
    out = run_sft(config, tmp_path)
    tuned = AutoModelForCausalLM.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert next(tuned.parameters()).dtype == torch.float32
    changed = [n for n, p in tuned.state_dict().items() if not torch.equal(p, base.state_dict()[n])]
    assert len(changed) > len(base.state_dict()) // 2  # a 1e-6 step still moves the fp32 weights


def test_autocast_runs_the_forward_in_bfloat16(tiny_model):
    from rlvr.policies.causal_lm import CausalLMPolicy

    policy = CausalLMPolicy.from_pretrained(str(tiny_model), autocast="bfloat16", max_new_tokens=4)
    ids = torch.tensor([[4, 5, 6]])
    assert policy.forward(input_ids=ids).logits.dtype == torch.bfloat16
    assert next(policy.module.parameters()).dtype == torch.float32
    with pytest.raises(ValueError, match="autocast must be one of"):
        CausalLMPolicy.from_pretrained(str(tiny_model), autocast="int8")


def test_unknown_task_option_suggests_the_nearest(tmp_path, capsys):
    code = main(["train", f"out_dir={tmp_path / 'x'}", "task.name=sort_text", "policy.name=causal_lm",
                 "policy.options={model: m}", "task.options={num_digit: 4}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "unknown option 'num_digit'; did you mean 'num_digits'?" in err


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_dropout_is_disabled_so_sampling_log_probs_are_the_trained_policy(arch):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from rlvr.modeling import build_char_tokenizer
    from rlvr.policies.causal_lm import CausalLMPolicy

    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    if arch == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2,
                                           resid_pdrop=0.5, embd_pdrop=0.5, attn_pdrop=0.5))
    else:
        model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=2, attention_dropout=0.5))
    model.train()
    policy = CausalLMPolicy(model, tokenizer, max_new_tokens=5)
    samples = policy.sample(["3 1 2>", "9 8>"], 3, 1.0, torch.Generator().manual_seed(0))
    scored, _ = policy.log_probs(samples, 1.0)  # train mode: dropout would make this random
    torch.testing.assert_close(scored.detach(), samples.sample_log_probs, atol=1e-5, rtol=0)


def test_gsm8k_grpo_epoch_with_a_tiny_model(tmp_path):
    # The GSM8K task through the trainer: prompts from the real data, math-verify grading
    # in worker processes, rewards and the gold check in the records.
    import json
    from pathlib import Path

    from rlvr.tasks.gsm8k import TEMPLATES

    data = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k"
    if not (data / "test.jsonl").is_file():
        pytest.skip(f"GSM8K not found in {data}")
    chars = set("".join(TEMPLATES.values()))
    for name in ("train.jsonl", "test.jsonl"):
        for line in (data / name).read_text().splitlines():
            row = json.loads(line)
            chars.update(row["question"] + row["answer"])
    model = tmp_path / "model"
    init_model(model, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
               chars="".join(sorted(chars - {"<", ">"} | {"<", ">"})), max_positions=2048)
    out = tmp_path / "run"
    assert main(["train", f"out_dir={out}", "task.name=gsm8k", "task.prompts_per_epoch=2",
                 f"task.options={{train_path: '{data / 'train.jsonl'}', eval_path: '{data / 'test.jsonl'}', "
                 "num_eval: 2, grader_timeout: 5.0}",
                 "policy.name=causal_lm", f"policy.options={{model: '{model}', max_new_tokens: 8}}",
                 "algo.epochs=1", "algo.inner_steps=2", "algo.group_size=2", "algo.loss=clipped",
                 "log.eval_samples=2", "log.progress=false", "log.plot=false"]) == 0
    train = [r for r in read_records(out) if r["kind"] == "train"]
    assert train[0]["reward/answer/scored"] + train[0]["reward/answer/abstained"] == 4
    assert train[0]["reward/answer/errors"] == 0 and train[0]["reward/answer/timeouts"] == 0
    assert TEMPLATES["r1_zero"][:30] in (out / "samples.md").read_text()  # the prompts as the model saw them


def test_compiled_scoring_gives_the_eager_log_probs_and_gradient_within_1e_5(tiny_model):
    """policy.options.compile: the scoring forward through torch.compile (inductor) gives the
    eager log-probs and gradient within rtol 1e-5 / atol 1e-6 (fusion reorders float
    arithmetic; nothing more may change), with shared prompts and without."""
    import copy

    from torch._dynamo.utils import counters

    from rlvr.policies.causal_lm import CausalLMPolicy

    counters.clear()
    eager = CausalLMPolicy.from_pretrained(str(tiny_model), max_new_tokens=5)
    compiled = CausalLMPolicy(copy.deepcopy(eager.module), eager.tokenizer, max_new_tokens=5, compile=True)
    samples = eager.sample(["123", "321"], 3, 1.0, torch.Generator().manual_seed(0))
    for share in (True, False):
        eager.share_prompts = compiled.share_prompts = share
        grads = []
        for policy in (eager, compiled):
            policy.module.zero_grad(set_to_none=True)
            log_probs, entropy = policy.log_probs(samples, 1.0, with_entropy=True)
            (log_probs * samples.response_mask).sum().backward()
            grads.append((log_probs.detach(), entropy, {n: p.grad for n, p in policy.module.named_parameters()}))
        (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = grads
        torch.testing.assert_close(lp_b, lp_a, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ent_b, ent_a, rtol=1e-5, atol=1e-6)
        for name, grad in g_a.items():
            torch.testing.assert_close(g_b[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    assert compiled.compiled is not None and eager.compiled is None  # off by default
    assert counters["stats"]["unique_graphs"] > 0  # dynamo did compile graphs (no silent eager fallback)


def test_sft_reads_whole_episodes_as_messages(tiny_model, tmp_path, capsys):
    from rlvr.loop.sft import episode_pairs

    episode = [{"role": "user", "content": "1-8>"}, {"role": "assistant", "content": "4"},
               {"role": "user", "content": "+"}, {"role": "assistant", "content": "6"}]
    assert episode_pairs(episode, False, "<e>", "x:1") == [("1-8>", "4"), ("1-8>4<e>+", "6")]
    assert episode_pairs(episode, True, "", "x:1") == [(episode[:1], "4"), (episode[:3], "6")]
    data = tmp_path / "episodes.jsonl"
    data.write_text(json.dumps({"messages": episode}) + "\n" + json.dumps({"prompt": "2-9>", "completion": "5"}) + "\n")
    args = ["sft", f"out_dir={tmp_path / 'sft'}", "task.name=environment", "task.options.environment=guessing",
            "task.options.max_tokens=32",
            "policy.name=causal_lm", f"policy.options={{model: '{tiny_model}', max_new_tokens: 3}}", f"sft.data={data}",
            "sft.steps=2", "sft.batch_size=3", "sft.eval_every=2", "sft.eval_size=2"]
    assert main(args) == 0
    assert (tmp_path / "sft" / "model" / "config.json").is_file()
    data.write_text(json.dumps({"messages": [{"role": "assistant", "content": "4"}]}) + "\n")
    assert main([*args[:1], f"out_dir={tmp_path / 'sft2'}", *args[2:]]) == 2
    assert f"{data}:1: an episode starts with its prompt" in capsys.readouterr().err
