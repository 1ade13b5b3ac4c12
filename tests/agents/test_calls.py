"""The joining rule: calls whose prompts extend the sequence so far join it (the ids
between them untrained context), and a rewritten history or a branch starts a segment."""

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
    clock = time.perf_counter()
    segments = join_calls(calls)
    elapsed = time.perf_counter() - clock
    assert elapsed < 1.0, f"5,000 calls joined in {elapsed:.2f} s"
    assert sum(len(s.calls) for s in segments) == 5000 and len(segments) > 1000
    assert sorted(i for s in segments for i in s.calls) == list(range(5000))
