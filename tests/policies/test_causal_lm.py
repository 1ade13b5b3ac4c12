"""CausalLMPolicy against slow, obviously-correct references on tiny random models.

Shapes: B prompts, G responses per prompt, N = B*G, P prompt tokens, T response tokens.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
import torch
from tiny_lm import make_policy

from rlvr.config import CausalLMOptions, ConfigError, PolicyConfig, config_from_dict
from rlvr.config.compose import build_causal_lm_policy
from rlvr.engines.base import cut_at_stop_string
from rlvr.engines.hf import draw_tokens
from rlvr.modeling import load_model_and_tokenizer
from rlvr.policies import engine_sync
from rlvr.policies.causal_lm import CausalLMPolicy

PROMPTS = ["123456>", "98>", {"prompt": "5"}]  # different lengths: left padding


def sample(policy, seed=0, group_size=4, temperature=1.0, prompts=PROMPTS):
    return policy.sample(prompts, group_size, temperature, torch.Generator().manual_seed(seed))


def real_tokens(samples, row):
    """Row ``row``'s unpadded prompt and response token lists."""
    prompt = samples.prompt_ids[row][samples.prompt_mask[row]].tolist()
    response = samples.response_ids[row][samples.response_mask[row]].tolist()
    return prompt, response


def reference_log_softmax(policy, samples, row, temperature):
    """One unpadded forward of row's prompt + response: log pi_tau [t, V] at its response tokens."""
    prompt, response = real_tokens(samples, row)
    with torch.no_grad():
        logits = policy.module(torch.tensor([prompt + response])).logits[0] / temperature
    return torch.log_softmax(logits[len(prompt) - 1: -1], dim=-1), torch.tensor(response)


def reference_log_probs(policy, samples, temperature):
    """Per row: log_softmax of a full forward, gathered at the response. [N, T] each."""
    expected = torch.zeros(samples.response_ids.shape)
    entropy = torch.zeros(samples.response_ids.shape)
    for row in range(samples.num_responses):
        log_softmax, response = reference_log_softmax(policy, samples, row, temperature)
        expected[row, : len(response)] = log_softmax.gather(-1, response[:, None])[:, 0]
        entropy[row, : len(response)] = -(log_softmax.exp() * log_softmax).sum(-1)
    return expected, entropy


def reference_greedy(policy, prompt: str) -> str:
    """Argmax decoding with a full forward per token, no cache, no padding."""
    ids = policy.tokenizer(prompt)["input_ids"]
    response = []
    with torch.no_grad():
        for _ in range(policy.max_response_length):
            token = int(policy.module(torch.tensor([ids + response])).logits[0, -1].argmax())
            response.append(token)
            if token == policy.tokenizer.eos_token_id:
                break
    return policy.tokenizer.decode(response, skip_special_tokens=True)


@pytest.mark.parametrize("share_prompts", [True, False])
def test_masks_and_log_probs_match_unpadded_reference(model_dir, share_prompts):
    policy = make_policy(model_dir, share_prompts=share_prompts)
    samples = sample(policy)
    lengths = samples.response_mask.sum(-1)
    num_tokens = samples.response_ids.shape[1]
    # the batch must mix rows that ended on EOS with rows that ran to the end
    assert (lengths < num_tokens).any() and (lengths == num_tokens).any()
    assert samples.prompt_mask[:, 0].logical_not().any()  # some prompts are left-padded
    eos = policy.tokenizer.eos_token_id
    for row in range(samples.num_responses):
        tokens = samples.response_ids[row].tolist()
        first_eos = tokens.index(eos) + 1 if eos in tokens else num_tokens
        assert int(lengths[row]) == first_eos  # mask: up to and including the first EOS
        assert samples.response_mask[row].tolist() == [t < first_eos for t in range(num_tokens)]
    expected, expected_entropy = reference_log_probs(policy, samples, temperature=0.7)
    log_probs, entropy = policy.log_probs(samples, temperature=0.7, with_entropy=True)
    torch.testing.assert_close(log_probs, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, expected_entropy, atol=1e-5, rtol=0)
    assert (log_probs[~samples.response_mask] == 0).all()


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_sampling_log_probs_equal_scored_log_probs(model_dir, temperature):
    # top_k / top_p / min_new_tokens change the draw, never the recorded log pi_tau
    for settings in ({}, {"top_k": 5, "top_p": 0.9, "min_new_tokens": 2}):
        policy = make_policy(model_dir, **settings)
        samples = sample(policy, seed=1, temperature=temperature)
        with torch.no_grad():
            scored, _ = policy.log_probs(samples, temperature)
        torch.testing.assert_close(samples.sample_log_probs, scored, atol=1e-5, rtol=0)
        assert (samples.sample_log_probs[samples.response_mask] < 0).all()


def test_fixed_seed_gives_identical_samples(llama_dir):
    policy = make_policy(llama_dir)
    first, again, other = sample(policy, seed=3), sample(policy, seed=3), sample(policy, seed=4)
    assert first.responses == again.responses
    assert torch.equal(first.response_ids, again.response_ids)
    assert torch.equal(first.sample_log_probs, again.sample_log_probs)
    assert first.responses != other.responses
    assert [len(group) for group in first.responses] == [4, 4, 4]


class EosLover(torch.nn.Module):
    """A model whose EOS logit is raised by 50: EOS is the first token whenever allowed."""

    def __init__(self, model, eos_id):
        super().__init__()
        self.model, self.eos_id = model, eos_id

    def forward(self, **inputs):
        out = self.model(**inputs)
        out.logits = out.logits + 50.0 * torch.nn.functional.one_hot(
            torch.tensor(self.eos_id), out.logits.shape[-1])
        return out


def test_min_new_tokens_prevents_early_eos(llama_dir):
    model, tokenizer = load_model_and_tokenizer(llama_dir)
    eos_lover = EosLover(model, tokenizer.eos_token_id)
    free = CausalLMPolicy(eos_lover, tokenizer, max_new_tokens=8)
    assert free.greedy(PROMPTS) == [[""]] * 3  # EOS right away
    assert (sample(free).response_mask.sum(-1) == 1).all()
    held = CausalLMPolicy(eos_lover, tokenizer, max_new_tokens=8, min_new_tokens=3)
    assert all(len(text) == 3 for [text] in held.greedy(PROMPTS))  # 3 tokens, then EOS
    samples = sample(held)
    assert (samples.response_mask.sum(-1) == 4).all()
    assert (samples.response_ids[:, 3] == tokenizer.eos_token_id).all()
    assert not (samples.response_ids[:, :3] == tokenizer.eos_token_id).any()


def test_stop_strings_cut_responses(llama_dir):
    policy = make_policy(llama_dir, stop_strings=["3", "+="])
    samples = sample(policy, seed=0, group_size=8)
    texts = [text for group in samples.responses for text in group]
    stopped = [t for t in texts if t.endswith("3") or t.endswith("+=")]
    assert stopped, "no response hit a stop string: the test would not test anything"
    for row, text in enumerate(texts):
        assert "3" not in text[:-1] and "+=" not in text[:-2]
        _, response = real_tokens(samples, row)
        full = policy.tokenizer.decode(response, skip_special_tokens=True)
        assert full == text  # one character per token: nothing follows the stop string
    free = sample(make_policy(llama_dir), seed=0, group_size=8)
    assert any("3" in t[:-1] for group in free.responses for t in group)


def test_greedy_matches_uncached_argmax_decoding(model_dir):
    policy = make_policy(model_dir)
    prompts = [p["prompt"] if isinstance(p, dict) else p for p in PROMPTS]
    assert policy.greedy(PROMPTS) == [[reference_greedy(policy, p)] for p in prompts]


def test_top_k_one_sampling_is_greedy(llama_dir):
    policy = make_policy(llama_dir, top_k=1)
    samples = sample(policy, group_size=3)
    assert samples.responses == [group * 3 for group in policy.greedy(PROMPTS)]


def test_top_p_draws_only_from_the_nucleus(llama_dir):
    # a token is in the nucleus when the tokens strictly likelier than it hold < top_p
    samples = sample(make_policy(llama_dir, top_p=0.3), seed=7, group_size=8, temperature=0.9)
    for row in range(samples.num_responses):
        log_softmax, response = reference_log_softmax(make_policy(llama_dir), samples, row, 0.9)
        probs = log_softmax.exp()  # [t, V]
        chosen = probs.gather(-1, response[:, None])  # [t, 1]
        likelier_mass = torch.where(probs > chosen, probs, torch.zeros_like(probs)).sum(-1)
        assert (likelier_mass < 0.3 + 1e-6).all()
    assert len({t for group in samples.responses for t in group}) > 3  # still random
    tiny = sample(make_policy(llama_dir, top_p=1e-6), group_size=2)
    assert tiny.responses == [group * 2 for group in make_policy(llama_dir).greedy(PROMPTS)]


def test_draw_tokens_follows_the_probabilities():
    # 40000 draws per row: a frequency's standard error is at most 0.0025, so 0.012 is ~5 sigma
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.0, 2.0, 0.0, 2.0]])  # the second row sums to 4
    draws = draw_tokens(probs.repeat_interleave(40000, dim=0), torch.Generator().manual_seed(0))
    frequencies = torch.stack([torch.bincount(row, minlength=4) for row in draws.view(2, -1)]).float() / 40000
    torch.testing.assert_close(frequencies, probs / probs.sum(-1, keepdim=True), atol=0.012, rtol=0)
    assert frequencies[0, 1] == 0 and frequencies[1, 0] == 0 and frequencies[1, 2] == 0


def test_cut_at_stop_string():
    assert cut_at_stop_string("12=34=", ["="]) == "12="
    assert cut_at_stop_string("12+=34", ["=3", "+"]) == "12+"  # the earliest end wins
    assert cut_at_stop_string("1234", ["="]) == "1234"
    assert cut_at_stop_string("1234", []) == "1234"


def test_gradients_are_invariant_to_micro_batching(llama_dir):
    policy = make_policy(llama_dir)
    samples = sample(policy, seed=5)
    params = [p for p in policy.module.parameters() if p.requires_grad]

    def grads(row_groups):
        policy.module.zero_grad()
        for rows in row_groups:
            log_probs, _ = policy.log_probs(samples.rows(rows), temperature=0.8)
            log_probs.sum().backward()
        return [p.grad.clone() for p in params]

    n = samples.num_responses
    whole = grads([torch.arange(n)])
    split = grads([torch.arange(0, n, 2), torch.arange(1, n, 2)])  # different padding per batch
    assert any(g.abs().sum() > 0 for g in whole)
    for full, parts in zip(whole, split):
        torch.testing.assert_close(parts, full, atol=1e-5, rtol=1e-4)


def test_prompt_sharing_matches_full_rows(llama_dir):
    # rows of one prompt share its KV cache when scoring; any row order must still be exact
    samples = sample(make_policy(llama_dir), seed=8)
    order = torch.tensor([0, 1, 4, 5, 6, 2, 3, 8, 9, 10, 11, 7])  # runs of 2, 3, 1, 4, 1, 1 rows

    def scored(share_prompts, rows):
        policy = make_policy(llama_dir, share_prompts=share_prompts)
        log_probs, entropy = policy.log_probs(samples.rows(rows), temperature=0.9, with_entropy=True)
        (log_probs * torch.linspace(-1, 1, log_probs.shape[1])).sum().backward()
        return log_probs.detach(), entropy, [p.grad for p in policy.module.parameters()]

    for rows in (torch.arange(samples.num_responses), order):
        shared, unshared = scored(True, rows), scored(False, rows)
        torch.testing.assert_close(shared[0], unshared[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(shared[1], unshared[1], atol=1e-5, rtol=0)
        for a, b in zip(shared[2], unshared[2]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_gradient_checkpointing_gives_the_same_gradients(llama_dir):
    samples = sample(make_policy(llama_dir), seed=6)

    def grads(policy):
        log_probs, _ = policy.log_probs(samples, temperature=1.0)
        log_probs.sum().backward()
        return [p.grad for p in policy.module.parameters()]

    plain = grads(make_policy(llama_dir))
    checkpointed = grads(make_policy(llama_dir, gradient_checkpointing=True))
    # Recomputing the forward may take other kernels: agreement to float32 rounding of
    # the accumulated sums (gradients here are ~1e-2), not bit for bit.
    for a, b in zip(plain, checkpointed):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_bad_settings_are_rejected(llama_dir):
    with pytest.raises(ValueError, match="min_new_tokens"):
        make_policy(llama_dir, min_new_tokens=20)
    with pytest.raises(ValueError, match="top_p"):
        make_policy(llama_dir, top_p=0.0)
    with pytest.raises(ValueError, match="stop_strings"):
        make_policy(llama_dir, stop_strings="3")
    policy = make_policy(llama_dir)
    with pytest.raises(ValueError, match="temperature"):
        sample(policy, temperature=0.0)
    with pytest.raises(ValueError, match="at least one token"):
        policy.greedy(["12", ""])


def test_build_from_policy_config(llama_dir):
    options = CausalLMOptions(model=str(llama_dir), max_new_tokens=5, stop_strings=["="], dtype="float32")
    policy = build_causal_lm_policy(PolicyConfig(name="causal_lm", options=options))
    assert policy.max_response_length == 5 and policy.sampling.stop_strings == ("=",)
    assert sample(policy).response_ids.shape[1] <= 5
    with pytest.raises(ConfigError, match="unknown option 'max_new_token'; did you mean 'max_new_tokens'"):
        config_from_dict({"task": {"name": "sort_text"},
                          "policy": {"name": "causal_lm", "options": {"model": str(llama_dir), "max_new_token": 5}}})
    with pytest.raises(ValueError, match="model is required"):
        build_causal_lm_policy(PolicyConfig(name="causal_lm", options=CausalLMOptions()))


def test_every_option_is_a_typed_field_with_help(capsys):
    """policy.options and its engine_options are config sections: each option a typed
    field with one line of help, printed (with its rules) by ``rlvr config``."""
    import typing

    from rlvr.cli import main
    from rlvr.engines.vllm import VLLMOptions

    for cls in (CausalLMOptions, VLLMOptions):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            assert f.metadata["help"] and "\n" not in f.metadata["help"], f.name
            assert hints[f.name] in (str, int, float, bool, list, dict, VLLMOptions) or typing.get_args(hints[f.name])
    # every keyword argument of from_pretrained and the constructor that a config sets
    settable = set(inspect.signature(CausalLMPolicy.from_pretrained).parameters) | set(
        inspect.signature(CausalLMPolicy).parameters)
    assert {f.name for f in dataclasses.fields(CausalLMOptions)} <= settable | {"model"}
    assert main(["config", "task.name=sort_text", "policy.name=causal_lm"]) == 0
    shown = capsys.readouterr().out
    for cls in (CausalLMOptions, VLLMOptions):
        for f in dataclasses.fields(cls):
            assert f"{f.name}: " in shown and f.metadata["help"] in shown, f.name
    assert "engine: hf  # what generates" in shown and "[hf | vllm]" in shown
    assert "probe_tolerance: 0.001  # largest" in shown
    assert "options:  # the causal LM" in shown and "engine_options:  # the engine's settings" in shown


def test_prompt_longer_than_the_model_positions_is_a_prompt_error(llama_dir):
    """TINY has 64 positions and max_new_tokens is 12: a 52-token prompt fits, 53 do not.
    Sampling checks its prompts too, before the model sees them."""
    from rlvr.policies.causal_lm import PromptError

    policy = make_policy(llama_dir)
    policy.check_prompts(["1" * 52])
    message = "prompt 1 ('" + "1" * 40 + "'...): 53 tokens + max_new_tokens 12 = 65 > 64"
    with pytest.raises(PromptError, match=re.escape(message)) as err:
        policy.check_prompts(["12>", {"prompt": "1" * 53}])
    assert isinstance(err.value, ConfigError)  # the CLI prints it as one line
    with pytest.raises(PromptError, match=re.escape("eval prompt 1 (")):
        policy.check_prompts(["12>", "1" * 53], what="eval prompt")
    with pytest.raises(PromptError, match=re.escape(message)):
        sample(policy, prompts=["12>", "1" * 53])


def test_character_outside_the_vocabulary_is_a_prompt_error(llama_dir):
    """The char tokenizer has no unknown token: '#' cannot be encoded at all."""
    from rlvr.policies.causal_lm import PromptError

    policy = make_policy(llama_dir)
    assert policy.tokenizer.unk_token_id is None
    message = "prompt 2 ('1 2#3>'): character '#' at index 3 is not in the tokenizer's vocabulary"
    with pytest.raises(PromptError, match=re.escape(message)):
        policy.check_prompts(["12>", "3", "1 2#3>"])
    with pytest.raises(PromptError, match=re.escape(message)):
        policy.greedy(["12>", "3", "1 2#3>"])


def test_max_new_tokens_must_leave_room_for_a_prompt(llama_dir):
    make_policy(llama_dir, max_new_tokens=63)
    with pytest.raises(ValueError, match=re.escape("max_new_tokens=64 leaves no room for a prompt: the model has 64")):
        make_policy(llama_dir, max_new_tokens=64)


def test_every_character_the_prompts_lack_is_named_at_once(tiny_model):
    from rlvr.policies.causal_lm import PromptError

    policy = CausalLMPolicy.from_pretrained(str(tiny_model), max_new_tokens=4)
    prompts = ["12>", "1#2a>", *["3>"] * 1100, "x\n2>"]  # the last two past the first chunk of 1024
    message = ("prompt 1 ('1#2a>'): character '#' at index 1 is not in the tokenizer's vocabulary; all 4 characters "
               "of the prompts that it lacks: '#ax\\n'")
    with pytest.raises(PromptError, match=re.escape(message)):
        policy.check_prompts(prompts)


def test_the_head_at_real_tokens_only_scores_as_the_whole_model(model_dir):
    """The body's hidden states, then the LM head at the real response tokens only (no
    logits over padding): the whole model's log-probs, entropy and gradients."""
    samples = sample(make_policy(model_dir), seed=3)
    assert (~samples.response_mask).any()  # padding to leave out

    def scored(split, entropy_grad=False):
        policy = make_policy(model_dir)
        if not split:
            policy._heads[id(policy.module)] = None  # as for a model whose logits are not head(body)
        log_probs, entropy = policy.log_probs(samples, 0.8, with_entropy=True, entropy_grad=entropy_grad)
        assert (policy._heads[id(policy.module)] is not None) == split
        (log_probs * torch.linspace(-1, 1, log_probs.shape[1]) + entropy * entropy_grad).sum().backward()
        return log_probs.detach(), entropy.detach(), [p.grad for p in policy.module.parameters()]

    for entropy_grad in (False, True):
        split, whole = scored(True, entropy_grad), scored(False, entropy_grad)
        torch.testing.assert_close(split[0], whole[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(split[1], whole[1], atol=1e-5, rtol=0)
        assert (split[0][~samples.response_mask] == 0).all() and (split[1][~samples.response_mask] == 0).all()
        for a, b in zip(split[2], whole[2]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_a_model_whose_logits_are_not_its_head_of_its_body_is_scored_whole(llama_dir):
    from rlvr.policies.scoring import split_head

    policy = make_policy(llama_dir)
    probe = torch.tensor([engine_sync.probe_ids(policy)])
    assert split_head(policy.module, probe) is not None
    module = policy.module

    class ScaledLogits(type(module)):  # as models that scale or cap their logits (Cohere, Gemma 2)
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 0.5
            return out

    module.__class__ = ScaledLogits
    try:
        assert split_head(module, probe) is None
        scaled = make_policy(llama_dir)
        scaled.module.__class__ = ScaledLogits
        samples = sample(scaled, seed=2)
        log_probs, _ = scaled.log_probs(samples, 1.0)
        torch.testing.assert_close(log_probs, samples.sample_log_probs, atol=1e-5, rtol=0)  # the scaled logits'
    finally:
        module.__class__ = ScaledLogits.__bases__[0]


def test_length_buckets_leave_out_the_padding_after_short_responses():
    from rlvr.policies.scoring import length_buckets

    widths = torch.tensor([10, 11, 64, 12, 10, 64, 13, 9] * 4)  # most short, a quarter at 64
    short, long = length_buckets(widths, bucket_cost=160)
    assert short.tolist() == [i for i in range(32) if widths[i] < 64]
    assert long.tolist() == [2, 5, 10, 13, 18, 21, 26, 29]
    assert [t.tolist() for t in length_buckets(torch.tensor([12] * 8), 0)] == [list(range(8))]
    assert len(length_buckets(torch.tensor([12, 13, 12, 14]), 0)) == 1  # saves < 25%: one pass
    assert len(length_buckets(widths, bucket_cost=10**6)) == 1  # another pass costs more than it saves


def test_scoring_in_buckets_of_like_width_equals_scoring_all_rows_at_once(llama_dir, monkeypatch):
    from rlvr.policies import scoring

    samples = sample(make_policy(llama_dir), seed=3)
    ends = samples.response_mask.sum(dim=1)
    assert ends.min() < ends.max()

    def scored():
        policy = make_policy(llama_dir)
        forward, passes = policy.forward, []

        def counted(module=None, **inputs):
            passes.append(inputs["input_ids"].shape)
            return forward(module, **inputs)

        policy.forward = counted
        log_probs, entropy = policy.log_probs(samples, 0.9, with_entropy=True)
        (log_probs * torch.linspace(-1, 1, log_probs.shape[1])).sum().backward()
        return log_probs.detach(), entropy, [p.grad for p in policy.module.parameters()], passes

    monkeypatch.setattr(scoring, "MIN_SAVING", 0.0)
    buckets = scoring.length_buckets(ends, 0)
    assert len(buckets) > 1
    bucketed = scored()
    # the prompts encoded once (their distinct rows), then one pass per bucket (its rows)
    assert bucketed[3] == [samples.prompt_ids[::4].shape] + [(len(rows), int(ends[rows].max()) - 1)
                                                             for rows in buckets]
    monkeypatch.setattr(scoring, "MAX_BUCKETS", 1)
    whole = scored()
    torch.testing.assert_close(bucketed[0], whole[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(bucketed[1], whole[1], atol=1e-5, rtol=0)
    for a, b in zip(bucketed[2], whole[2]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
