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
    return openai.OpenAI(base_url=endpoint.url(episode_id), api_key=key or endpoint.key(episode_id), max_retries=0)


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
        async with openai.AsyncOpenAI(base_url=endpoint.url(episode), api_key=endpoint.key(episode),
                                      max_retries=0) as api:
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


def test_an_episode_key_is_good_for_its_own_episode_alone(endpoint):
    """Every agent gets a key of its own: knowing another episode's id (its URL) is not
    enough to add calls to it, nor is the endpoint's own key."""
    mine, theirs = (endpoint.open(seed=0, temperature=1.0, max_tokens=50) for _ in range(2))
    assert endpoint.key(mine) != endpoint.key(theirs)
    for key in (endpoint.key(mine), endpoint.api_key):
        api = client(endpoint, theirs, key=key)
        with pytest.raises(openai.AuthenticationError, match="key of its own") as err:
            api.chat.completions.create(model="m", messages=QUESTION, max_tokens=2)
        assert err.value.status_code == 401
        with pytest.raises(openai.AuthenticationError):
            api.models.list()
    client(endpoint, theirs).chat.completions.create(model="m", messages=QUESTION, max_tokens=2)
    assert len(endpoint.finish(theirs).calls) == 1 and endpoint.finish(mine).calls == []


def test_an_episode_has_a_budget_of_calls(endpoint, monkeypatch):
    """Requests at once, n=16 each, past the episode's calls: refused (400, the reason), never
    recorded, and the episode truncated."""
    import asyncio

    monkeypatch.setattr(endpoint, "max_calls", 40)
    episode = endpoint.open(seed=0, temperature=1.0, max_tokens=64)

    async def flood():
        async with openai.AsyncOpenAI(base_url=endpoint.url(episode), api_key=endpoint.key(episode),
                                      max_retries=0) as api:
            return await asyncio.gather(*(api.completions.create(model="m", prompt="12+", n=16, max_tokens=1)
                                          for _ in range(12)), return_exceptions=True)

    replies = asyncio.run(flood())
    record = endpoint.finish(episode)
    refused = [r for r in replies if isinstance(r, Exception)]
    assert len(record.calls) == 32 and len(replies) - len(refused) == 2  # a third request of 16 is past 40
    assert all(isinstance(r, openai.BadRequestError) and r.code == "episode_budget_exceeded" for r in refused)
    assert "budget of calls (40, task.options.max_calls" in refused[0].message
    assert record.truncated


def test_an_episode_has_a_budget_of_sampled_tokens(endpoint, monkeypatch):
    """Calls that each start afresh (none extends the last, so the token budget of the sequence
    does not bind) still sample no more than the episode's tokens in all."""
    monkeypatch.setattr(endpoint, "max_sampled_tokens", 10)
    episode = endpoint.open(seed=0, temperature=1.0, max_tokens=64)
    api = client(endpoint, episode).completions
    sampled = 0
    for _ in range(11):  # each call samples a token at least: the 11th at the latest is refused
        try:
            sampled += api.create(model="m", prompt="12+", max_tokens=4).usage.completion_tokens
        except openai.BadRequestError as err:
            assert err.code == "episode_budget_exceeded" and "sampled tokens (10 in all" in err.message
            break
    else:
        raise AssertionError("no call was refused")
    record = endpoint.finish(episode)
    assert sum(len(call.completion_ids) for call in record.calls) == sampled <= 10
    assert record.truncated


def test_a_request_of_a_finished_episode_leaves_its_record_as_returned(endpoint):
    """The episode finished (its agent timed out, say) before its request's tokens were
    reserved: the request is refused as of no live episode, and the record, returned already,
    is not marked truncated."""
    import asyncio

    from rlvr.agents.chat import RequestError

    episode_id = endpoint.open(seed=0, temperature=1.0, max_tokens=50)
    episode = endpoint._live(episode_id)
    record = endpoint.finish(episode_id)
    with pytest.raises(RequestError) as err:
        asyncio.run(endpoint._sample(episode, [1, 2, 3], 1, 4, ()))
    assert err.value.status == 404 and not record.truncated and record.calls == []


def test_a_call_sampled_after_its_episode_finished_is_not_recorded(endpoint, monkeypatch):
    """The episode finishes while its request's completion is being sampled: the record
    returned by ``finish`` gets no call afterwards, and the request is refused (404)."""
    episode = endpoint.open(seed=0, temperature=1.0, max_tokens=50)
    put, records = endpoint._batcher.put, []

    def finished_meanwhile(job):
        records.append(endpoint.finish(episode))
        put(job)

    monkeypatch.setattr(endpoint._batcher, "put", finished_meanwhile)
    with pytest.raises(openai.NotFoundError):
        client(endpoint, episode).completions.create(model="m", prompt="12+", max_tokens=2)
    assert len(records) == 1 and records[0].calls == [] and records[0].prompt is None


def test_an_exception_is_a_500_with_its_one_line_and_reaches_no_server_log(endpoint, monkeypatch):
    """An error of the endpoint's own: the agent gets a 500 whose message is the error's one line,
    and the app raises nothing further (uvicorn would log it with its traceback)."""
    import asyncio

    def broken(*args, **kwargs):
        raise ValueError("the chat template adds no end-of-turn\nafter an assistant turn")

    monkeypatch.setattr(endpoint, "_chat_prompt", broken)
    episode = endpoint.open(seed=0, temperature=1.0, max_tokens=50)
    line = "ValueError: the chat template adds no end-of-turn after an assistant turn"
    with pytest.raises(openai.InternalServerError) as err:
        client(endpoint, episode).chat.completions.create(model="m", messages=QUESTION)
    assert err.value.status_code == 500 and err.value.response.json()["error"]["message"] == line
    # the app as uvicorn runs it: nothing escapes it
    sent = []
    body = json.dumps({"model": "m", "messages": QUESTION}).encode()
    requests = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        return requests.pop(0) if requests else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    path = f"/episodes/{episode}/v1/chat/completions"
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"authorization", f"Bearer {endpoint.key(episode)}".encode()),
                         (b"content-type", b"application/json")], "server": ("127.0.0.1", 80),
             "client": ("127.0.0.1", 1)}
    asyncio.run(endpoint.app()(scope, receive, send))
    assert sent[0]["status"] == 500 and json.loads(sent[1]["body"])["error"]["message"] == line
    assert endpoint.finish(episode).calls == []


def test_the_budgets_are_task_options(endpoint, tmp_path):
    from rlvr.agents.server import MAX_CALLS
    from rlvr.tasks.agent import AgentTask

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"digit": d}) + "\n" for d in range(4)))
    task = AgentTask(str(data), agent="agents_for_tests:two_calls", eval_size=1, max_calls=7, max_sampled_tokens=99)
    served = task.policy_for(endpoint.policy).endpoint
    assert (served.max_calls, served.max_sampled_tokens) == (7, 99)
    default = AgentTask(str(data), agent="agents_for_tests:two_calls", eval_size=1).policy_for(endpoint.policy)
    assert (default.endpoint.max_calls, default.endpoint.max_sampled_tokens) == (MAX_CALLS, None)


def test_the_budgets_are_options_of_a_verifiers_task_too(endpoint, monkeypatch):
    """Without verifiers itself: the taskset stands in, the options reach the endpoint."""
    from rlvr.base import extras
    from rlvr.tasks import verifiers_env
    from rlvr.tasks.agent import AgentTask

    class Taskset:
        def __init__(self, *args):
            pass

        def rows(self, max_tasks):
            return [{"task": i} for i in range(4)]

        def run(self, client, row):
            return 0.0

    monkeypatch.setattr(extras, "require", lambda *args: None)
    monkeypatch.setattr(verifiers_env, "_Verifiers", Taskset)
    task = verifiers_env.VerifiersTask("arithmetic", eval_size=1, max_calls=7, max_sampled_tokens=99)
    assert (task.policy_for(endpoint.policy).endpoint.max_calls, task.endpoint.max_sampled_tokens) == (7, 99)
    assert {name: verifiers_env.VerifiersTask.options[name] for name in ("max_calls", "max_sampled_tokens")} == \
        {name: AgentTask.options[name] for name in ("max_calls", "max_sampled_tokens")}


def closed(connection) -> bool:
    """Whether the endpoint closed ``connection`` (waited for, 10 s at most); False while it holds it."""
    try:
        return connection.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_idle_connections_give_way_and_a_request_must_arrive_in_time(endpoint):
    """At its cap of connections the endpoint closes the least recently active idle one before
    it accepts another, so the agents' requests get in; a request that does not arrive whole
    within ``read_timeout`` has its connection closed, the first on a connection or a later one."""
    import http.client
    import socket

    from rlvr.agents.server import Endpoint

    capped, timed = Endpoint(endpoint.policy, max_connections=4), Endpoint(endpoint.policy, read_timeout=1.0)
    held = []
    try:
        capped.start()
        for _ in range(6):
            connection = socket.create_connection(("127.0.0.1", capped.port), timeout=10)
            connection.sendall(b"GET /v1/models HTTP/1.1\r\n")  # headers never end
            held.append(connection)
        assert closed(held[0]) and closed(held[1])  # the 5th and 6th made room: the two oldest went
        episode = capped.open(seed=0, temperature=1.0, max_tokens=50)
        api = openai.OpenAI(base_url=capped.url(episode), api_key=capped.key(episode), max_retries=0)
        assert api.chat.completions.create(model="m", messages=QUESTION, max_tokens=2).choices
        assert len(capped.finish(episode).calls) == 1
        held[-1].setblocking(False)
        with pytest.raises(BlockingIOError):  # the newest idle one is still held (no deadline closed it)
            held[-1].recv(1)
        timed.start()
        slow = socket.create_connection(("127.0.0.1", timed.port), timeout=10)
        held.append(slow)
        for part in (b"GET /v1/mo", b"dels HTTP/1.1\r\n", b"Host: x\r\n"):  # never the blank line that ends it
            slow.sendall(part)
        assert closed(slow)
        reused = http.client.HTTPConnection("127.0.0.1", timed.port, timeout=10)
        reused.request("GET", "/v1/models")
        answer = reused.getresponse()
        assert answer.status == 401 and answer.read() and not answer.will_close  # answered whole, the connection kept
        held.append(reused.sock)
        reused.sock.sendall(b"GET /v1/models HT")  # the next request, begun within the keep-alive time, never ends
        assert closed(reused.sock)
    finally:
        for connection in held:
            connection.close()
        capped.close()
        timed.close()
