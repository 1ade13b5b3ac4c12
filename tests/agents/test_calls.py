"""The joining rule: calls whose prompts extend the sequence so far join it (the ids
between them untrained context), and a rewritten history or a branch starts a segment;
joined by an index, in time linear in the calls; and what the endpoint takes as a
follow-up (the served message sent back whole), and sends of a reply that calls tools."""

import json

import pytest

from rlvr.agents.calls import Call, join_calls


def call(prompt, completion):
    return Call(list(prompt), list(completion), [-0.5] * len(completion), text="".join(map(str, completion)))


def test_calls_that_extend_the_conversation_join_into_one_sequence():
    first = call([1, 2, 3], [4, 5])
    second = call([1, 2, 3, 4, 5, 9, 9], [6])  # the tool result 9 9, then the next completion
    (segment,) = join_calls([first, second])
    assert segment.prompt_ids == [1, 2, 3]
    assert [(t.role, t.ids) for t in segment.turns] == [("policy", [4, 5]), ("environment", [9, 9]), ("policy", [6])]
    assert [t.trained for t in segment.turns] == [True, False, True]
    assert segment.turns[0].log_probs == [-0.5, -0.5] and segment.turns[1].log_probs == []
    assert segment.ids == [1, 2, 3, 4, 5, 9, 9, 6] and segment.calls == [0, 1]


def test_a_follow_up_with_nothing_between_joins_without_a_context_turn():
    (segment,) = join_calls([call([1], [2]), call([1, 2], [3])])
    assert [t.role for t in segment.turns] == ["policy", "policy"] and segment.ids == [1, 2, 3]


def test_a_rewritten_history_starts_a_new_segment():
    calls = [call([1, 2], [3]), call([1, 2, 3, 7], [4]), call([1, 8], [5])]  # the third summarised the history
    segments = join_calls(calls)
    assert [s.calls for s in segments] == [[0, 1], [2]]
    assert segments[1].prompt_ids == [1, 8] and segments[1].turns[0].ids == [5]


def test_a_call_joins_the_segment_it_extends_most():
    # two choices of one request (n = 2), then a follow-up on the second choice
    calls = [call([1], [2]), call([1], [3]), call([1, 3, 6], [4])]
    segments = join_calls(calls)
    assert [s.calls for s in segments] == [[0], [1, 2]]
    assert segments[1].ids == [1, 3, 6, 4]


def test_a_retried_request_is_a_branch_not_an_extension():
    segments = join_calls([call([1, 2], [3]), call([1, 2], [4])])
    assert [s.ids for s in segments] == [[1, 2, 3], [1, 2, 4]]


def pairwise_join(calls):
    """The joining rule read literally: each call against every segment's ids so far."""
    segments = []
    for index, c in enumerate(calls):
        best = max((s for s in segments if c.prompt_ids[:len(s["ids"])] == s["ids"]), key=lambda s: len(s["ids"]),
                   default=None)  # max keeps the first made of equal lengths
        if best is None:
            best = {"ids": list(c.prompt_ids), "calls": []}
            segments.append(best)
        best["ids"] = list(c.prompt_ids) + list(c.completion_ids)
        best["calls"].append(index)
    return [(s["ids"], s["calls"]) for s in segments]


def random_episode(rng, count):
    """``count`` calls as an agent makes them: follow-ups of earlier calls (tool results
    between), n > 1 choices of one prompt, retries, and rewritten histories."""
    calls, sequences = [], [[1, 2, 3]]
    while len(calls) < count:
        base = rng.choice(sequences)
        roll = rng.random()
        if roll < 0.1:
            prompt = base[:rng.randint(1, len(base))] + [rng.randint(20, 30)]  # a rewritten history
        elif roll < 0.3:
            prompt = base  # a retry, or the next of n choices
        else:
            prompt = base + [rng.randint(20, 30) for _ in range(rng.randint(0, 3))]  # a follow-up
        completion = [rng.randint(4, 6) for _ in range(rng.randint(0, 3))]  # few ids: equal completions happen
        calls.append(call(prompt, completion))
        sequences.append(prompt + completion)
    return calls


def test_the_index_joins_as_the_rule_reads():
    import random

    for seed in range(30):
        calls = random_episode(random.Random(seed), 60)
        assert [(s.ids, s.calls) for s in join_calls(calls)] == pairwise_join(calls)


def test_thousands_of_calls_join_in_well_under_a_second():
    """n = 16 choices of hundreds of requests in one episode (a budget of 64 tokens after a
    first prompt of 40): 5,000 calls, most of them branches, join in a fraction of a second."""
    import random
    import time

    rng = random.Random(0)
    first = [rng.randint(100, 200) for _ in range(40)]
    calls, replies = [], [first]
    while len(calls) < 5000:
        prompt = rng.choice(replies)
        if len(prompt) < len(first) + 56:
            prompt = prompt + [rng.randint(100, 200) for _ in range(4)]  # the tool's result, the turn markers
        for _ in range(16):
            completion = [rng.randint(0, 99) for _ in range(rng.randint(1, 4))]
            calls.append(call(prompt, completion))
            replies.append(prompt + completion)
    calls = calls[:5000]
    clock = time.process_time()  # this process's CPU time: other processes' load does not count
    segments = join_calls(calls)
    elapsed = time.process_time() - clock
    assert elapsed < 1.0, f"5,000 calls joined in {elapsed:.2f} s of CPU"
    assert sum(len(s.calls) for s in segments) == 5000 and len(segments) > 1000
    assert sorted(i for s in segments for i in s.calls) == list(range(5000))


TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b",
                                           "parameters": {"type": "object", "properties": {}}}}]
QUESTION = [{"role": "user", "content": "What is 2+3?"}]


@pytest.fixture(scope="module")
def endpoint(chat_model):
    pytest.importorskip("openai")
    pytest.importorskip("starlette")
    from rlvr.agents.server import Endpoint
    from rlvr.policies.causal_lm import CausalLMPolicy

    served = Endpoint(CausalLMPolicy.from_pretrained(str(chat_model), max_new_tokens=12))
    served.start()
    yield served
    served.close()


def scripted_episode(endpoint, monkeypatch, said, edit=lambda message: message):
    """An episode whose model always writes ``said``: a first call with ``TOOLS``, then its
    reply sent back (after ``edit``) with the tool's result. The episode's calls and the
    first reply."""
    import openai

    tok = endpoint.policy.tokenizer

    def scripted(jobs, temperature, stop):
        ids = tok.encode(said, add_special_tokens=False) + [tok.eos_token_id]
        for job in jobs:
            job.future.set_result((ids, [-1.0] * len(ids), said, "stop"))

    monkeypatch.setattr(endpoint._batcher, "_generate", scripted)
    episode = endpoint.open(seed=1, temperature=1.0, max_tokens=1000)
    api = openai.OpenAI(base_url=endpoint.url(episode), api_key=endpoint.key(episode), max_retries=0).chat.completions
    first = api.create(model="m", messages=QUESTION, tools=TOOLS).choices[0].message
    sent = edit(first.model_dump(exclude_none=True))
    api.create(model="m", messages=[*QUESTION, sent, {"role": "tool", "tool_call_id": sent["tool_calls"][0]["id"],
                                                      "content": "5"}], tools=TOOLS)
    return endpoint.finish(episode).calls, first


CALLS_ADD = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def test_a_reply_sent_back_whole_is_a_follow_up_and_an_edited_one_is_not(endpoint, monkeypatch):
    calls, _ = scripted_episode(endpoint, monkeypatch, "Sum: " + CALLS_ADD)
    assert [s.calls for s in join_calls(calls)] == [[0, 1]]  # as served: one sequence

    def edited(message):  # the same id, other arguments: not what the model wrote
        message["tool_calls"][0]["function"]["arguments"] = json.dumps({"a": 2, "b": 4})
        return message

    calls, _ = scripted_episode(endpoint, monkeypatch, "Sum: " + CALLS_ADD, edited)
    assert [s.calls for s in join_calls(calls)] == [[0], [1]]
    tok = endpoint.policy.tokenizer
    assert '"b": 4' in tok.decode(calls[1].prompt_ids)  # the conversation as the agent sent it, rendered
    assert '"b": 4' not in tok.decode(calls[0].completion_ids)


def test_the_text_around_tool_calls_reaches_the_agent(endpoint, monkeypatch):
    """Every token sampled trains: the text before, between and after the calls is the
    reply's content, and the reply sent back whole still follows up as one sequence."""
    said = "Sum: " + CALLS_ADD + "\nthen " + CALLS_ADD + " I think 5."
    calls, first = scripted_episode(endpoint, monkeypatch, said)
    assert first.content == "Sum: \nthen  I think 5." and len(first.tool_calls) == 2
    assert [s.calls for s in join_calls(calls)] == [[0, 1]]
    assert endpoint.policy.tokenizer.decode(calls[0].completion_ids).startswith(said)
