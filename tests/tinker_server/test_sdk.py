"""rlvr's Tinker server driven by the real ``tinker`` SDK: LoRA training clients, each loss against rlvr.core's on
the same tensors, the Adam step against torch's AdamW, sampling log-probs against forward's, checkpoints that
restore bit-identically and survive a restart, futures under concurrency, and every refusal's message."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.tinker
tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from rlvr import core  # noqa: E402
from rlvr.tinker.models import Adapters, build_model  # noqa: E402
from rlvr.tinker.names import ServedModel, place_tokenizer, served_model  # noqa: E402
from rlvr.tinker.server import Running  # noqa: E402

KEY = "tml-test-key"
FAILED = (tinker.RequestFailedError, tinker.APIStatusError)


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory):
    """(the server, its state folder, the base model's name) for the tiny model."""
    model = served_model(str(tiny_model))
    state = tmp_path_factory.mktemp("tinker-state")
    with Running([model], state, KEY) as server:
        yield server, state, model


@pytest.fixture(scope="module")
def client(served):
    service = tinker.ServiceClient(base_url=served[0].url, api_key=KEY)
    yield service
    service.close("success").result()


def lora(client, served, rank=4, **options):
    return client.create_lora_training_client(base_model=served[2].name, rank=rank, seed=3, **options).result()


def datum(tokens, **inputs):
    """A datum predicting ``tokens[1:]`` from ``tokens[:-1]``, with per-position ``inputs``."""
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], **inputs})


def rl_datums(seed, lengths=(6, 9, 4)):
    """Datums as an RL recipe sends them: sampled log-probs near the model's, advantages of either sign."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        tokens = torch.randint(3, 20, (n,), generator=g).tolist()
        out.append(datum(tokens, weights=torch.rand(n - 1, generator=g).tolist(),
                         advantages=(torch.randn(n - 1, generator=g)).tolist(),
                         logprobs=(-3.5 + 0.4 * torch.randn(n - 1, generator=g)).tolist()))
    return out


def reference_log_probs(folder, datums):
    """log p(target | prefix) of each datum under the base model, computed here with transformers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for d in datums:
            ids = torch.tensor([d.model_input.to_ints()])
            logits = model(input_ids=ids).logits[0]
            target = torch.tensor(d.loss_fn_inputs["target_tokens"].tolist())
            out.append(torch.log_softmax(logits, -1).gather(-1, target[:, None])[:, 0])
    return out


def column(d, key):
    return torch.tensor(d.loss_fn_inputs[key].tolist(), dtype=torch.float32)[None]  # [1, T]


def state_of(state_dir, path):
    """The trainable weights a checkpoint holds, read from the server's state folder."""
    from safetensors.torch import load_file

    run_id, kind, name = path[len("tinker://"):].split("/")
    return load_file(str(state_dir / "runs" / run_id / kind / name / "weights.safetensors"))


# ---- the client, the losses, the optimizer ------------------------------------------------------------------


def test_a_lora_client_on_the_tiny_model_and_its_tokenizer(client, served):
    training = lora(client, served, rank=4)
    info = training.get_info()
    assert info.is_lora and info.lora_rank == 4 and info.model_data.model_name == served[2].name
    tokenizer = training.get_tokenizer()
    text = tokenizer.decode([5, 6, 7])
    assert tokenizer.encode(text, add_special_tokens=False) == [5, 6, 7]


# Each loss_fn, its config, and rlvr.core's loss on the same tensors (lp: the returned log-probs [1, T]).
EXPECTED = {
    "cross_entropy": ({}, lambda lp, d: core.policy_loss(lp, column(d, "weights"), "naive")[0]),
    "importance_sampling": ({}, lambda lp, d: core.policy_loss(lp, column(d, "advantages"), "ratio",
                                                               column(d, "logprobs"))[0]),
    "ppo": ({"clip_low_threshold": 0.7, "clip_high_threshold": 1.3},
            lambda lp, d: core.policy_loss(lp, column(d, "advantages"), "clipped", column(d, "logprobs"), 0.3,
                                           0.3)[0]),
    "cispo": ({"clip_low_threshold": 0.7, "clip_high_threshold": 1.3},
              lambda lp, d: core.policy_loss(lp, column(d, "advantages"), "cispo", column(d, "logprobs"), 0.3,
                                             0.3)[0]),
    "dro": ({"beta": 0.1}, lambda lp, d: core.policy_loss(lp, column(d, "advantages"), "naive")[0]
            + 0.1 * core.kl_loss_term(lp, column(d, "logprobs"), "k2")),
}


@pytest.mark.parametrize("loss_fn", list(EXPECTED))
def test_each_loss_is_rlvrs_own_on_the_same_tensors(client, served, loss_fn):
    config, expected = EXPECTED[loss_fn]
    training = lora(client, served)  # fresh: LoRA's B starts at zero, so the model is the base model
    datums = rl_datums(seed=1)
    out = training.forward_backward(datums, loss_fn, loss_fn_config=config or None).result()
    got = [torch.tensor(o["logprobs"].tolist()) for o in out.loss_fn_outputs]
    for mine, theirs in zip(got, reference_log_probs(served[2].folder, datums)):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)
    want = sum(float(expected(lp[None], d).sum()) for lp, d in zip(got, datums))
    assert out.metrics["loss:sum"] == pytest.approx(want, rel=1e-5, abs=1e-5)
    if loss_fn == "ppo":  # the thresholds' orientation, by hand: -min(r A, clip(r, 0.7, 1.3) A)
        by_hand = 0.0
        for lp, d in zip(got, datums):
            a, q = column(d, "advantages")[0], column(d, "logprobs")[0]
            r = torch.exp(lp - q)
            by_hand -= float(torch.minimum(r * a, r.clamp(0.7, 1.3) * a).sum())
        assert out.metrics["loss:sum"] == pytest.approx(by_hand, rel=1e-5)


def test_optim_step_is_torchs_adamw_step(client, served):
    training = lora(client, served, rank=4, train_unembed=False)
    before = training.save_state("before").result().path
    datums = rl_datums(seed=2)
    adam = types.AdamParams(learning_rate=1e-2, beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.1, grad_clip_norm=0.05)
    for _ in range(2):
        training.forward_backward(datums, "cross_entropy").result()
        training.optim_step(adam).result()
    after = state_of(served[1], training.save_state("after").result().path)

    model, _ = build_model(served[2].folder, Adapters(rank=4, train_unembed=False), seed=0)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state_of(served[1], before).items():
            params[name].copy_(value)
    trained = [params[name] for name in after]
    optimizer = torch.optim.AdamW(trained, lr=1e-2, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1, foreach=False)
    for _ in range(2):
        loss = 0.0
        for d in datums:
            ids = torch.tensor([d.model_input.to_ints()])
            target = torch.tensor([d.loss_fn_inputs["target_tokens"].tolist()])
            lp = torch.log_softmax(model(input_ids=ids).logits, -1).gather(-1, target[..., None])[..., 0]
            loss = loss - (lp * column(d, "weights")).sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 0.05)
        optimizer.step()
        optimizer.zero_grad()
    moved = 0
    for name, value in after.items():
        torch.testing.assert_close(value, params[name].detach(), atol=2e-6, rtol=1e-5)
        moved += int(not torch.equal(value, state_of(served[1], before)[name]))
    assert moved == len(after)  # every trained weight moved (the A matrices by weight decay at first)


# ---- sampling ---------------------------------------------------------------------------------------------------


def test_sampled_log_probs_are_forwards_within_1e_4(client, served):
    training = lora(client, served)
    training.forward_backward(rl_datums(seed=3), "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    sampler = training.save_weights_and_get_sampling_client().result()
    prompt = [5, 17, 13, 9]
    result = sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=4, include_prompt_logprobs=True,
                            sampling_params=types.SamplingParams(max_tokens=6, temperature=1.0, seed=11)).result()
    assert len(result.sequences) == 4 and len({tuple(s.tokens) for s in result.sequences}) > 1
    for seq in result.sequences:
        full = prompt + list(seq.tokens)
        out = training.forward([datum(full, weights=[1.0] * (len(full) - 1))], "cross_entropy").result()
        forward = out.loss_fn_outputs[0]["logprobs"].tolist()
        assert max(abs(a - b) for a, b in zip(forward[len(prompt) - 1:], seq.logprobs)) < 1e-4
        assert seq.stop_reason in ("stop", "length")
    assert result.prompt_logprobs[0] is None
    assert max(abs(a - b) for a, b in zip(result.prompt_logprobs[1:], forward[:len(prompt) - 1])) < 1e-4


def test_sampling_the_base_model_and_a_saved_sampler_checkpoint(client, served):
    training = lora(client, served)
    path = training.save_weights_for_sampler("fresh").result().path
    base = client.create_sampling_client(base_model=served[2].name).result()
    saved = client.create_sampling_client(model_path=path).result()
    params = types.SamplingParams(max_tokens=5, seed=4)
    one = base.sample(prompt=types.ModelInput.from_ints([3, 4, 5]), num_samples=2, sampling_params=params).result()
    two = saved.sample(prompt=types.ModelInput.from_ints([3, 4, 5]), num_samples=2, sampling_params=params).result()
    # a fresh LoRA (B = 0) samples as the base model does, seed for seed
    assert [s.tokens for s in one.sequences] == [s.tokens for s in two.sequences]
    assert saved.get_base_model() == served[2].name


# ---- checkpoints --------------------------------------------------------------------------------------------------


def test_a_client_restored_with_its_optimizer_continues_bit_identically(client, served):
    training = lora(client, served)
    adam = types.AdamParams(learning_rate=1e-2)
    training.forward_backward(rl_datums(seed=4), "cross_entropy").result()
    training.optim_step(adam).result()
    middle = training.save_state("middle").result().path
    training.forward_backward(rl_datums(seed=5), "cross_entropy").result()
    training.optim_step(adam).result()
    end = state_of(served[1], training.save_state("end").result().path)

    restored = client.create_training_client_from_state_with_optimizer(middle).result()
    restored.forward_backward(rl_datums(seed=5), "cross_entropy").result()
    restored.optim_step(adam).result()
    again = state_of(served[1], restored.save_state("again").result().path)
    assert all(torch.equal(end[name], again[name]) for name in end)

    fresh_adam = client.create_training_client_from_state(middle).result()  # weights alone: Adam starts over
    fresh_adam.forward_backward(rl_datums(seed=5), "cross_entropy").result()
    fresh_adam.optim_step(adam).result()
    other = state_of(served[1], fresh_adam.save_state("other").result().path)
    assert not all(torch.equal(end[name], other[name]) for name in end)


def test_checkpoints_survive_a_restart_of_the_server(client, served):
    training = lora(client, served)
    training.forward_backward(rl_datums(seed=6), "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    path = training.save_state("kept").result().path
    probe = rl_datums(seed=7)
    before = training.forward(probe, "cross_entropy").result()
    with Running([served[2]], served[1], KEY) as restarted:
        later = tinker.ServiceClient(base_url=restarted.url, api_key=KEY)
        restored = later.create_training_client_from_state(path).result()
        after = restored.forward(probe, "cross_entropy").result()
        runs = tinker.RestClient(base_url=restarted.url, api_key=KEY).list_checkpoints(path.split("/")[2]).result()
        later.close("success").result()
    assert [o["logprobs"].tolist() for o in after.loss_fn_outputs] == \
        [o["logprobs"].tolist() for o in before.loss_fn_outputs]
    assert path in [c.tinker_path for c in runs.checkpoints]


# ---- concurrency --------------------------------------------------------------------------------------------------


def test_futures_under_concurrency_each_get_their_own_result(client, served):
    trainers = [lora(client, served) for _ in range(2)]
    sampler = client.create_sampling_client(base_model=served[2].name).result()
    probes = [rl_datums(seed=10 + i) for i in range(6)]
    alone = [trainers[i % 2].forward(p, "cross_entropy").result() for i, p in enumerate(probes)]
    params = [types.SamplingParams(max_tokens=4, seed=i) for i in range(6)]
    sample_alone = [sampler.sample(prompt=types.ModelInput.from_ints([7, 8]), num_samples=2, sampling_params=p)
                    .result() for p in params]

    def submit(i):
        return (trainers[i % 2].forward(probes[i], "cross_entropy"),
                sampler.sample(prompt=types.ModelInput.from_ints([7, 8]), num_samples=2, sampling_params=params[i]))

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        pending = list(pool.map(submit, range(6)))
    for i, (forward, sample) in enumerate(pending):
        assert [o["logprobs"].tolist() for o in forward.result().loss_fn_outputs] == \
            [o["logprobs"].tolist() for o in alone[i].loss_fn_outputs]
        assert [s.tokens for s in sample.result().sequences] == [s.tokens for s in sample_alone[i].sequences]


# ---- refusals -------------------------------------------------------------------------------------------------


def test_each_refusal_names_what_is_wrong(client, served):
    def refused(match, call):
        with pytest.raises(FAILED, match=match):
            call()

    refused("is not served here.*serves", lambda: client.create_lora_training_client(base_model="no/such-model",
                                                                                       rank=4).result())
    refused("lora rank 999 is more than", lambda: lora(client, served, rank=999))
    training = lora(client, served)
    good = rl_datums(seed=8)
    refused("'gspo' is not supported", lambda: training.forward_backward(good, "gspo").result())
    refused("not read by loss_fn 'ppo'", lambda: training.forward(good, "ppo", loss_fn_config={"clip": 0.1}).result())
    refused("needs loss_fn_inputs logprobs, advantages", lambda: training.forward(
        [datum([3, 4, 5], weights=[1.0, 1.0])], "importance_sampling").result())
    refused("has shape \\[3\\], the model_input has 2", lambda: training.forward(
        [datum([3, 4, 5], weights=[1.0, 1.0, 1.0])], "cross_entropy").result())
    refused("outside the vocabulary", lambda: training.forward([datum([3, 10**6, 5], weights=[1.0, 1.0])],
                                                               "cross_entropy").result())
    refused("more than the model's 256 positions", lambda: training.forward(
        [datum([3 + i % 15 for i in range(260)], weights=[1.0] * 259)], "cross_entropy").result())
    refused("no checkpoint tinker://", lambda: client.create_training_client_from_state(
        f"tinker://{training.model_id}/weights/missing").result())
    refused("not a tinker:// path", lambda: client.create_training_client_from_state("/etc/passwd").result())
    refused("not a valid name", lambda: training.save_state("../escape").result())
    sampler = training.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints([3, 4])
    refused("topk_prompt_logprobs is not supported", lambda: sampler.sample(
        prompt=prompt, num_samples=1, sampling_params=types.SamplingParams(max_tokens=2), include_prompt_logprobs=True,
        topk_prompt_logprobs=2).result())
    refused("num_samples must be 1 to 1024", lambda: sampler.sample(
        prompt=prompt, num_samples=5000, sampling_params=types.SamplingParams(max_tokens=2)).result())
    refused("passes the model's 256 positions", lambda: sampler.sample(
        prompt=prompt, num_samples=1, sampling_params=types.SamplingParams(max_tokens=300)).result())


def test_routes_it_does_not_serve_and_a_wrong_key_answer_in_the_sdks_shape(served):
    import httpx

    url = served[0].url
    missing = httpx.post(f"{url}/api/v1/no_such_route", json={}, headers={"X-API-Key": KEY})
    assert missing.status_code == 404 and "does not serve POST /api/v1/no_such_route" in missing.json()["detail"]
    wrong = httpx.post(f"{url}/api/v1/create_session", json={}, headers={"X-API-Key": "tml-wrong"})
    assert wrong.status_code == 401 and "API key" in wrong.json()["detail"]
    broken = httpx.post(f"{url}/api/v1/forward_backward", content=b"\xff\x00 not a proto",
                        headers={"X-API-Key": KEY, "Content-Type": "application/x-protobuf"})
    assert broken.status_code == 400 and "not a ForwardBackwardRequest" in broken.json()["detail"]
    with pytest.raises(tinker.AuthenticationError):
        tinker.RestClient(base_url=url, api_key="tml-wrong").get_server_capabilities().result()


def test_a_silent_session_ends_and_releases_its_models(served):
    import httpx

    url, headers = served[0].url, {"X-API-Key": KEY}

    def post(route, **body):
        return httpx.post(f"{url}/api/v1/{route}", json=body, headers=headers, timeout=60)

    session = post("create_session").json()["session_id"]
    created = post("create_model", session_id=session, model_seq_id=0, base_model=served[2].name,
                   lora_config={"rank": 2}).json()
    assert post("retrieve_future", request_id=created["request_id"]).json()["model_id"] == created["model_id"]
    assert post("session_heartbeat", session_id=session).status_code == 200
    served[0].service.sessions[session].last_seen -= 1000  # silent past the timeout
    ended = post("session_heartbeat", session_id=session)
    assert ended.status_code == 410 and "has ended" in ended.json()["detail"]  # the SDK stops beating on 410
    assert post("get_info", model_id=created["model_id"]).status_code == 404
    assert post("create_model", session_id=session, model_seq_id=1, base_model=served[2].name).status_code == 404


# ---- SmolLM2, its tokenizer by hub name offline ---------------------------------------------------------------

SMOLLM2_CLIENT = r"""
import json, sys
import tinker
from tinker import types
service = tinker.ServiceClient(base_url=sys.argv[1], api_key=sys.argv[2])
training = service.create_lora_training_client(base_model="HuggingFaceTB/SmolLM2-135M-Instruct", rank=8).result()
tokenizer = training.get_tokenizer()
prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True)
ids = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                    loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})
first = training.forward_backward([datum], "cross_entropy").result().metrics["loss:sum"]
training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
second = training.forward([datum], "cross_entropy").result().metrics["loss:sum"]
sampler = training.save_weights_and_get_sampling_client()
seq = sampler.sample(prompt=types.ModelInput.from_ints(ids), num_samples=1,
                     sampling_params=types.SamplingParams(max_tokens=8, seed=0)).result().sequences[0]
full = ids + list(seq.tokens)
check = types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                    loss_fn_inputs={"target_tokens": full[1:], "weights": [1.0] * (len(full) - 1)})
forward = training.forward([check], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
diff = max(abs(a - b) for a, b in zip(forward[len(ids) - 1:], seq.logprobs))
print(json.dumps({"tokenizer": type(tokenizer).__name__, "vocab": len(tokenizer), "first": first, "second": second,
                  "diff": diff, "text": tokenizer.decode(seq.tokens)}))
"""


def test_smollm2_by_its_hub_name_with_its_tokenizer_offline(smollm2, tmp_path):
    _, folder, _ = smollm2
    hub = "HuggingFaceTB/SmolLM2-135M-Instruct"
    model = ServedModel(hub, (hub, "smollm2-135m-instruct"), str(folder), hub)
    cache = tmp_path / "hub"
    assert place_tokenizer(model, str(cache)) is not None
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "home"))
    with Running([model], tmp_path / "state", KEY, place_tokenizers=False) as server:
        done = subprocess.run([sys.executable, "-c", SMOLLM2_CLIENT, server.url, KEY], env=env, capture_output=True,
                              text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    from transformers import AutoTokenizer

    assert result["vocab"] == len(AutoTokenizer.from_pretrained(folder))
    assert result["second"] < result["first"]  # one Adam step on the datum lowers its loss
    assert result["diff"] < 1e-4


# ---- the command --------------------------------------------------------------------------------------------------


def test_the_command_prints_its_url_and_key_serves_and_stops_on_sigterm(tiny_model, tmp_path):
    import signal

    import httpx

    refused = subprocess.run([sys.executable, "-m", "rlvr", "tinker", "--api-key", "secret"], capture_output=True,
                             text=True, timeout=120, cwd=tmp_path)
    assert refused.returncode == 2 and "--api-key must start with tml-" in refused.stderr
    server = subprocess.Popen([sys.executable, "-m", "rlvr", "tinker", "--model", str(tiny_model), "--port", "0",
                               "--state-dir", str(tmp_path / "state")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=tmp_path)
    try:
        lines = [server.stdout.readline() for _ in range(4)]
        url = lines[1].split("TINKER_BASE_URL=")[1].strip()
        key = lines[2].split("TINKER_API_KEY=")[1].strip()
        assert url.startswith("http://127.0.0.1:") and key.startswith("tml-") and len(key) > 20
        assert httpx.get(f"{url}/api/v1/healthz", headers={"X-API-Key": key}).json() == {"status": "ok"}
        listed = tinker.RestClient(base_url=url, api_key=key).get_server_capabilities().result()
        assert str(tiny_model.resolve()) in [m.model_name for m in listed.supported_models]
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=60)
    assert server.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in err
