"""Samples.completion_ids: TRL's completion_ids, each response's ids without padding, made when read."""

import pickle

import torch

from rlvr.batch.rollout import CompletionIds, Samples


def samples() -> Samples:
    ids = torch.tensor([[5, 6, 2, 0], [7, 2, 0, 0], [8, 9, 4, 2]])  # right-padded with 0
    return Samples(None, ids, ids > 0, ids[:, :1], torch.ones(3, 1, dtype=torch.bool))


def test_each_response_without_its_padding():
    ids = samples().completion_ids()
    assert len(ids) == 3
    assert ids[1] == [7, 2] and ids[-1] == [8, 9, 4, 2]
    assert list(ids) == [[5, 6, 2], [7, 2], [8, 9, 4, 2]] and ids == [[5, 6, 2], [7, 2], [8, 9, 4, 2]]


def test_a_slice_is_the_rows_of_one_call_and_a_worker_gets_a_plain_list():
    part = samples().completion_ids()[1:3]
    assert isinstance(part, CompletionIds) and list(part) == [[7, 2], [8, 9, 4, 2]]
    sent = pickle.loads(pickle.dumps(part))
    assert type(sent) is list and sent == [[7, 2], [8, 9, 4, 2]]
