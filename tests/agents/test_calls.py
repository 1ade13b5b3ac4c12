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
