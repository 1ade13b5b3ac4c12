"""The endpoint driven by the real openai client: chat, n > 1, log-probs, follow-ups that
join into one sequence equal to the whole conversation rendered, tools, and OpenAI-style
errors for what it refuses."""

import json

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def endpoint(chat_model):
    from rlvr.agents.server import Endpoint
    from rlvr.policies.causal_lm import CausalLMPolicy

    policy = CausalLMPolicy.from_pretrained(str(chat_model), max_new_tokens=12)
    served = Endpoint(policy)
    served.start()
    yield served
    served.close()


def client(endpoint, episode_id, key=None):
    return openai.OpenAI(base_url=endpoint.url(episode_id), api_key=key or endpoint.api_key, max_retries=0)


QUESTION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]


def test_a_chat_completion_is_recorded_token_in_token_out(endpoint):
    episode = endpoint.open(seed=7, temperature=1.0, max_tokens=200)
    reply = client(endpoint, episode).chat.completions.create(model="rlvr-policy", messages=QUESTION, n=3,
                                                              logprobs=True)
    record = endpoint.finish(episode)
    assert len(reply.choices) == 3 and len(record.calls) == 3
    tok = endpoint.policy.tokenizer
    whole = tok.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    for choice, call in zip(reply.choices, record.calls):
        assert call.prompt_ids == tok.encode(whole, add_special_tokens=False)
        assert [t.logprob for t in choice.logprobs.content] == pytest.approx(call.log_probs)
        assert all(lp <= 0 for lp in call.log_probs) and len(call.completion_ids) == len(call.log_probs)
        assert choice.message.content == tok.decode(call.completion_ids, skip_special_tokens=True)
        assert choice.finish_reason == call.finish_reason
    assert reply.usage.prompt_tokens == len(record.calls[0].prompt_ids)
    # three seeds: three different draws
    assert len({tuple(c.completion_ids) for c in record.calls}) == 3


def test_the_same_seed_draws_the_same_episode(endpoint):
    replies = []
    for _ in range(2):
        episode = endpoint.open(seed=11, temperature=1.0, max_tokens=200)
        client(endpoint, episode).chat.completions.create(model="m", messages=QUESTION)
        replies.append(endpoint.finish(episode).calls[0].completion_ids)
    assert replies[0] == replies[1]


def test_follow_ups_join_into_the_whole_conversation_as_rendered(endpoint):
    """Token faithfulness over random episodes run at once: each joined sequence holds the
    sampled ids as its trained turns, and is what the template renders for the whole
    conversation (every policy turn as sampled, EOS after a turn cut at max_tokens)."""
    import asyncio
    import random

    from rlvr.agents.calls import join_calls

    tok = endpoint.policy.tokenizer
    rng = random.Random(0)
    plans = [[(rng.randint(1, 12), rng.choice(["user", "tool"]), "".join(rng.choices("abc 123?", k=rng.randint(0, 9))))
              for _ in range(rng.randint(1, 4))] for _ in range(16)]

    async def agent(episode, plan):
        async with openai.AsyncOpenAI(base_url=endpoint.url(episode), api_key=endpoint.api_key, max_retries=0) as api:
            messages = list(QUESTION)
            for max_tokens, role, text in plan:
                reply = await api.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens)
                messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": role, "content": text}]
            return messages

    async def run_all(episodes):
        return await asyncio.gather(*(agent(e, plan) for e, plan in zip(episodes, plans)))

    episodes = [endpoint.open(seed=100 + i, temperature=1.0, max_tokens=600) for i in range(len(plans))]
    conversations = asyncio.run(run_all(episodes))
    for episode, messages in zip(episodes, conversations):
        record = endpoint.finish(episode)
        (segment,) = join_calls(record.calls)
        assert [t.ids for t in segment.turns if t.trained] == [c.completion_ids for c in record.calls]
        assert len(segment.turns) == 2 * len(record.calls) - 1
        sampled = iter(record.calls)
        whole = [dict(m, content=tok.decode(next(sampled).completion_ids).removesuffix("<eos>"))
                 if m["role"] == "assistant" else m for m in messages]
        last = record.calls[-1]
        rendered = tok.apply_chat_template(whole[:-2], tokenize=False, add_generation_prompt=True)
        assert tok.decode(last.prompt_ids) == rendered  # the last call's prompt: the conversation before it
        assert segment.ids == last.prompt_ids + last.completion_ids


def test_tools_are_described_and_a_call_comes_back_as_tool_calls(endpoint, monkeypatch):
    from rlvr.agents import chat
    from rlvr.environments.tool_parsing import shown_tools

    tools = [{"type": "function", "function": {"name": "add", "description": "a + b",
                                               "parameters": {"type": "object", "properties": {}}}}]
    rendered, template_tools = shown_tools(endpoint.policy.tokenizer.get_chat_template(), chat.messages(QUESTION),
                                           tools, "json")
    assert template_tools is None  # this template has no tools slot: the system message describes them
    assert rendered[0]["content"].startswith("Be brief.\n\nYou can call these tools.") and '"name": "add"' in \
        rendered[0]["content"]
    message, reason = chat.reply('Sum: <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
                                 ["add"], "call_0_")
    assert reason == "tool_calls" and message["content"] == "Sum:"
    assert message["tool_calls"] == [{"id": "call_0_0", "type": "function",
                                      "function": {"name": "add", "arguments": json.dumps({"a": 2, "b": 3})}}]
    # through the endpoint: a tool the model calls, answered by a tool message, joins as one sequence
    said = 'Sum: <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    tok = endpoint.policy.tokenizer
    original = endpoint._batcher._generate

    def scripted(jobs, temperature, stop):  # the first call writes the tool call, as a trained model would
        if len(jobs[0].prompt_ids) < 400:
            ids = tok.encode(said, add_special_tokens=False) + [tok.eos_token_id]
            for job in jobs:
                job.future.set_result((ids, [-1.0] * len(ids), said, "stop"))
            return
        original(jobs, temperature, stop)

    monkeypatch.setattr(endpoint._batcher, "_generate", scripted)
    episode = endpoint.open(seed=1, temperature=1.0, max_tokens=600)
    chat_api = client(endpoint, episode).chat.completions
    first = chat_api.create(model="m", messages=QUESTION, tools=tools)
    assert first.choices[0].finish_reason == "tool_calls"
    (tool_call,) = first.choices[0].message.tool_calls
    assert tool_call.function.name == "add" and json.loads(tool_call.function.arguments) == {"a": 2, "b": 3}
    follow = [*QUESTION, first.choices[0].message.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": tool_call.id, "content": "5"}]
    chat_api.create(model="m", messages=follow, tools=tools)
    record = endpoint.finish(episode)
    from rlvr.agents.calls import join_calls

    (segment,) = join_calls(record.calls)
    assert segment.turns[1].role == "environment" and tok.decode(segment.turns[1].ids) == \
        "\n<|tool|>\n5<eos>\n<|assistant|>\n"


def test_refusals_are_openai_errors(endpoint):
    with pytest.raises(openai.NotFoundError, match="no live episode"):
        client(endpoint, "nosuch").chat.completions.create(model="m", messages=QUESTION)
    episode = endpoint.open(seed=0, temperature=1.0, max_tokens=50)
    with pytest.raises(openai.AuthenticationError):
        client(endpoint, episode, key="wrong").chat.completions.create(model="m", messages=QUESTION)
    api = client(endpoint, episode).chat.completions
    with pytest.raises(openai.BadRequestError, match="role must be one of"):
        api.create(model="m", messages=[{"role": "wizard", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="'n' must be an integer"):
        api.create(model="m", messages=QUESTION, n=0)
    with pytest.raises(openai.APIStatusError, match="more than") as err:
        api.create(model="m", messages=[{"role": "user", "content": "x" * (endpoint.max_body_bytes + 1)}])
    assert err.value.status_code == 413
    # past the episode's token budget: context_length_exceeded, and the episode is truncated
    long = [{"role": "user", "content": "1"}]
    reply = api.create(model="m", messages=long)
    grown = [*long, reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "2" * 60}]
    with pytest.raises(openai.BadRequestError, match="token budget"):
        api.create(model="m", messages=grown)
    assert endpoint.finish(episode).truncated


def test_models_and_text_completions(endpoint):
    episode = endpoint.open(seed=0, temperature=1.0, max_tokens=100)
    api = client(endpoint, episode)
    assert [m.id for m in api.models.list()] == ["rlvr-policy"]
    reply = api.completions.create(model="m", prompt="12+", max_tokens=4, logprobs=1)
    record = endpoint.finish(episode)
    assert record.calls[0].prompt_ids == endpoint.policy.tokenizer.encode("12+", add_special_tokens=False)
    assert reply.choices[0].logprobs.token_logprobs == pytest.approx(record.calls[0].log_probs)


def test_a_streamed_reply_is_the_same_reply_in_chunks(endpoint, monkeypatch):
    """``stream: true`` (as most agent frameworks ask): the same draw as unstreamed, tool
    calls and usage included, read by the openai client's own stream accumulator."""
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    said = 'Sum: <tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>'
    tok = endpoint.policy.tokenizer

    def scripted(jobs, temperature, stop):
        ids = tok.encode(said, add_special_tokens=False) + [tok.eos_token_id]
        for job in jobs:
            job.future.set_result((ids, [-1.0] * len(ids), said, "stop"))

    plain = {}
    for stream in (False, True):
        episode = endpoint.open(seed=3, temperature=1.0, max_tokens=100)
        api = client(endpoint, episode).chat.completions
        if stream:
            chunks = list(api.create(model="m", messages=QUESTION, n=2, stream=True,
                                     stream_options={"include_usage": True}))
            assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain["usage"].completion_tokens
            texts = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == k)
                     for k in range(2)]
            assert texts == [choice.message.content for choice in plain["reply"].choices]
            finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            assert finishes == [choice.finish_reason for choice in plain["reply"].choices]
            assert endpoint.finish(episode).calls[0].completion_ids == plain["ids"]
        else:
            reply = api.create(model="m", messages=QUESTION, n=2)
            plain = {"reply": reply, "usage": reply.usage, "ids": endpoint.finish(episode).calls[0].completion_ids}
    # tool calls arrive as deltas the client's accumulator puts together
    monkeypatch.setattr(endpoint._batcher, "_generate", scripted)
    episode = endpoint.open(seed=3, temperature=1.0, max_tokens=100)
    with client(endpoint, episode).chat.completions.stream(model="m", messages=QUESTION, tools=tools) as stream:
        final = stream.get_final_completion()
    endpoint.finish(episode)
    (call,) = final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "tool_calls" and call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 2} and final.choices[0].message.content == "Sum:"
    # text completions stream too; a malformed flag is refused before anything is sampled
    episode = endpoint.open(seed=0, temperature=1.0, max_tokens=100)
    api = client(endpoint, episode)
    chunks = list(api.completions.create(model="m", prompt="12+", max_tokens=3, stream=True))
    assert chunks[0].choices[0].text == endpoint.finish(episode).calls[0].text
    episode = endpoint.open(seed=0, temperature=1.0, max_tokens=100)
    with pytest.raises(openai.BadRequestError, match="'stream' must be true or false"):
        client(endpoint, episode).chat.completions.create(model="m", messages=QUESTION, extra_body={"stream": "yes"})
    assert endpoint.finish(episode).calls == []
