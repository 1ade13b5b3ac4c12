import torch

from rlvr.policies.positional import PositionalModel, PositionalPolicy


def lecture_forward(model: PositionalModel, prompts: torch.Tensor) -> torch.Tensor:
    """The lecture's einsum formulation, the reference for the fused matmuls."""
    x = model.embedding(prompts)
    state = torch.einsum("bpd,pde->be", x, model.encode)
    out = torch.einsum("be,pef->bpf", state, model.decode)
    return out @ model.embedding.weight.T


def test_forward_equals_lecture_einsums():
    torch.manual_seed(0)
    model = PositionalModel(vocab_size=7, embedding_dim=6, num_numbers=4).double()
    prompts = torch.randint(0, 7, (5, 4))
    torch.testing.assert_close(model(prompts), lecture_forward(model, prompts), rtol=1e-12, atol=1e-12)


def test_sampling_shapes_seed_and_log_probs():
    torch.manual_seed(0)
    policy = PositionalPolicy(vocab_size=5, embedding_dim=10, num_numbers=3)
    prompts = torch.tensor([[1, 0, 2], [3, 2, 4]])
    a = policy.sample(prompts, 6, 0.7, torch.Generator().manual_seed(1))
    b = policy.sample(prompts, 6, 0.7, torch.Generator().manual_seed(1))
    assert a.responses.shape == (2, 6, 3) and a.response_ids.shape == (12, 3)
    assert torch.equal(a.responses, b.responses)
    # Row b*G + g is response g of prompt b.
    assert torch.equal(a.response_ids[6 + 2], a.responses[1, 2])
    assert torch.equal(a.prompt_ids[7], prompts[1])
    assert a.response_mask.all()
    # Sampling log-probs are the scored log-probs at the same temperature.
    scored, entropy = policy.log_probs(a, 0.7, with_entropy=True)
    torch.testing.assert_close(a.sample_log_probs, scored.detach(), rtol=0, atol=1e-6)
    assert entropy.shape == (12, 3) and (entropy >= 0).all()
    # And they are log softmax(logits / T) at the chosen tokens.
    logits = lecture_forward(policy.module, a.prompt_ids) / 0.7
    want = torch.log_softmax(logits, -1).gather(-1, a.response_ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(scored, want, rtol=1e-5, atol=1e-5)


def test_sample_frequencies_follow_the_policy():
    torch.manual_seed(0)
    policy = PositionalPolicy(vocab_size=4, embedding_dim=4, num_numbers=2)
    prompts = torch.tensor([[1, 3]])
    samples = policy.sample(prompts, 20000, 1.0, torch.Generator().manual_seed(0))
    probs = torch.softmax(policy.module(prompts), -1)[0, 0].detach()  # position 0, [V]
    freq = torch.bincount(samples.responses[0, :, 0], minlength=4).float() / 20000
    # 5 standard errors of a proportion at n = 20000 is at most 5 * 0.5 / sqrt(20000) = 0.018.
    assert (freq - probs).abs().max() < 0.018


def test_greedy_is_argmax():
    torch.manual_seed(0)
    policy = PositionalPolicy(vocab_size=5, embedding_dim=10, num_numbers=3)
    prompts = torch.tensor([[1, 0, 2]])
    assert torch.equal(policy.greedy(prompts)[:, 0], policy.module(prompts).argmax(-1))


def test_fused_log_probs_gradient_equals_autograd():
    torch.manual_seed(0)
    policy = PositionalPolicy(vocab_size=6, embedding_dim=5, num_numbers=4)
    policy.module.double()
    prompts = torch.randint(0, 6, (3, 4))
    samples = policy.sample(prompts, 5, 1.3, torch.Generator().manual_seed(0))
    weights = torch.randn(15, 4, dtype=torch.float64)
    for temperature in (1.0, 1.3):
        policy.module.zero_grad()
        lp, entropy = policy.log_probs(samples, temperature, with_entropy=True)
        (weights * lp).sum().backward()
        fused = [p.grad.clone() for p in policy.module.parameters()]
        policy.module.zero_grad()
        logits = lecture_forward(policy.module, samples.prompt_ids) / temperature
        all_lp = torch.log_softmax(logits, -1)
        ref = all_lp.gather(-1, samples.response_ids.unsqueeze(-1)).squeeze(-1)
        (weights * ref).sum().backward()
        torch.testing.assert_close(lp, ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(entropy, -(all_lp.exp() * all_lp).sum(-1), rtol=1e-12, atol=1e-12)
        for got, want in zip(fused, [p.grad for p in policy.module.parameters()]):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_consecutive_groups_equal_unique_consecutive():
    from rlvr.policies.positional import consecutive_groups

    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 3, (40, 2), generator=gen).repeat_interleave(3, dim=0)
    rows[5] = rows[4]  # a run spanning two groups with the same prompt merges, as in unique_consecutive
    got = consecutive_groups(rows)
    want = torch.unique_consecutive(rows, dim=0, return_inverse=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_log_probs_of_another_module_are_that_modules_and_leave_the_policy_alone():
    # the KL reference is scored through ``module=``: same numbers as a policy that owns
    # those weights, and the policy's own module is neither swapped nor changed
    torch.manual_seed(0)
    policy, reference = (PositionalPolicy(vocab_size=5, embedding_dim=6, num_numbers=3) for _ in range(2))
    own = policy.module
    samples = policy.sample(torch.tensor([[1, 0, 2], [3, 2, 4]]), 4, 1.0, torch.Generator().manual_seed(0))
    got, got_entropy = policy.log_probs(samples, 0.7, with_entropy=True, module=reference.module)
    want, want_entropy = reference.log_probs(samples, 0.7, with_entropy=True)
    assert torch.equal(got, want) and torch.equal(got_entropy, want_entropy)
    assert policy.module is own
    assert not torch.equal(policy.log_probs(samples, 0.7)[0], want)  # the two modules differ

