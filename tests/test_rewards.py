"""rlvr.rewards: the combination rule, loading by name, and safe execution."""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import os
import signal
import sys
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.rewards import (
    RewardError,
    RewardRunner,
    RewardSpec,
    combine_rewards,
    load_reward_function,
)

NAN = math.nan


# reward functions the tests run; module level so that any start method can run them


def length_reward(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


def picky_reward(prompts, completions, **kwargs):
    """Misbehaves on purpose, by completion text."""
    out = []
    for c in completions:
        if c == "zero":
            raise ZeroDivisionError("no zeros")
        if c == "key":
            raise KeyError(c)
        if c == "sleep":
            time.sleep(60)
        if c == "spin":  # a C-level loop: no signal handler runs until it ends
            sum(itertools.repeat(0, 10**13))
        if c == "exit":
            os._exit(3)
        out.append({"none": None, "nan": NAN, "inf": math.inf, "huge": 10**5000, "text": "1.0",
                    "1e308": 1e308}.get(c, 1.0))
    return out


def answer_length_reward(prompts, completions, answer, **kwargs):
    return [float(len(a)) for a in answer]


def wrong_count_reward(prompts, completions, **kwargs):
    return [1.0] * (len(completions) + 1)


def not_a_list_reward(prompts, completions, **kwargs):
    return 1.0


def unpicklable_reward(prompts, completions, **kwargs):
    return [lambda: 1.0 for _ in completions]


class RaisingFloat(float):
    def __float__(self):
        raise ValueError("no float")


class RaisingRepr:
    def __repr__(self):
        raise RuntimeError("no repr")


class NanRaisingRepr(float):
    def __repr__(self):
        raise RuntimeError("no repr")


def odd_values_reward(prompts, completions, **kwargs):
    values = {"float": RaisingFloat(1.0), "repr": RaisingRepr(), "nan repr": NanRaisingRepr(NAN)}
    return [values.get(c, 1.0) for c in completions]


def escaping_reward(prompts, completions, where, **kwargs):
    """Tries to end the process or move it, by completion text; "pid" scores the process id."""
    out = []
    for c in completions:
        if c == "exit":
            sys.exit(0)
        if c == "interrupt":
            raise KeyboardInterrupt
        if c == "cancel":
            raise asyncio.CancelledError
        if c == "generator exit":
            raise GeneratorExit
        if c == "chdir":
            os.chdir(where[0])
        out.append(float(os.getpid()) if c == "pid" else 1.0)
    return out


def array_reward(prompts, completions, form, **kwargs):
    """len(completion) for each completion, as the container ``form`` names."""
    values = [float(len(c)) for c in completions]
    if form[0] == "numpy array":
        return np.array(values)
    if form[0] == "tensor":
        return torch.tensor(values)
    # 0-d tensors, 0-d arrays and numpy scalars, in turn
    makers = [torch.tensor, np.array, np.float32]
    return [makers[i % 3](value) for i, value in enumerate(values)]


# combine_rewards


def test_combine_weighted_sum_over_non_abstaining():
    weights = torch.tensor([1.0, 2.0, 0.0])
    per_function = torch.tensor([
        [1.0, 3.0, 5.0],  # 1*1 + 2*3 = 7; weight 0 takes no part
        [NAN, 3.0, 5.0],  # only f1: 2*3 = 6
        [0.5, NAN, NAN],  # only f0: 0.5
        [NAN, NAN, 5.0],  # only a weight-0 function scored: abstain
        [NAN, NAN, NAN],  # everything abstained: abstain
    ])
    combined = combine_rewards(per_function, weights)
    assert torch.equal(combined[:3], torch.tensor([7.0, 6.0, 0.5]))
    assert torch.isnan(combined[3:]).all()


def _combine_reference(row: list[float], weights: list[float]) -> float:
    terms = [w * r for r, w in zip(row, weights) if not math.isnan(r) and w != 0]
    return math.fsum(terms) if terms else NAN


@settings(max_examples=50, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda f: st.tuples(
            st.lists(st.lists(st.one_of(st.just(NAN), st.floats(-10, 10)), min_size=f, max_size=f),
                     min_size=1, max_size=6),
            st.lists(st.sampled_from([0.0, 0.5, 1.0, -2.0]), min_size=f, max_size=f),
        )
    )
)
def test_combine_matches_reference(case):
    rows, weights = case
    combined = combine_rewards(torch.tensor(rows, dtype=torch.float64), torch.tensor(weights, dtype=torch.float64))
    expected = torch.tensor([_combine_reference(row, weights) for row in rows], dtype=torch.float64)
    torch.testing.assert_close(combined, expected, equal_nan=True, rtol=0, atol=1e-12)


# specs and load_reward_function


def test_spec_names_and_validation():
    assert RewardSpec(length_reward).name == "length_reward"
    assert RewardSpec(functools.partial(length_reward)).name == "length_reward"
    assert RewardSpec(lambda p, c, **k: [], name="mine").name == "mine"
    with pytest.raises(ValueError, match="weight must be finite"):
        RewardSpec(length_reward, weight=math.inf)
    with pytest.raises(ValueError, match="timeout must be positive"):
        RewardSpec(length_reward, timeout=0)
    with pytest.raises(TypeError, match="callable"):
        RewardSpec("length_reward")
    with pytest.raises(ValueError, match="repeated: length_reward"):
        RewardRunner([RewardSpec(length_reward), RewardSpec(length_reward)])


def test_load_reward_function_by_name():
    fn = load_reward_function("rlvr.tasks.sort_text:exact_match_reward")
    assert fn(["1>"], ["1"], answer=["1"]) == [1.0]


@pytest.mark.parametrize("path", ["rlvr.tasks.sort_text", "rlvr.tasks.sort_text:", ":f", "a b:f", "m:f:g", "m:f.g"])
def test_load_reward_function_bad_format(path):
    with pytest.raises(RewardError, match="expected 'module:function'"):
        load_reward_function(path)


def test_load_reward_function_missing_module():
    with pytest.raises(RewardError, match="no module named 'rlvr_no_such_module'"):
        load_reward_function("rlvr_no_such_module:f")
    with pytest.raises(RewardError, match="no module named 'rlvr.no_such'"):
        load_reward_function("rlvr.no_such:f")


def test_load_reward_function_module_that_fails_to_import(tmp_path, monkeypatch):
    (tmp_path / "broken_rewards_mod.py").write_text("import rlvr_missing_dependency\n")
    (tmp_path / "raising_rewards_mod.py").write_text("raise RuntimeError('bad config')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RewardError, match="importing 'broken_rewards_mod' failed: No module named 'rlvr_missing"):
        load_reward_function("broken_rewards_mod:f")
    with pytest.raises(RewardError, match="raised RuntimeError: bad config"):
        load_reward_function("raising_rewards_mod:f")


def test_load_reward_function_missing_or_not_callable():
    with pytest.raises(RewardError, match="has no 'nope'; it defines: .*exact_match_reward"):
        load_reward_function("rlvr.tasks.sort_text:nope")
    with pytest.raises(RewardError, match="'DEFAULT_WEIGHTS' is a dict, not a callable"):
        load_reward_function("rlvr.tasks.sort_text:DEFAULT_WEIGHTS")


# in-process execution


def test_in_process_scores_columns_and_counts():
    completions = ["a", "bb", "none", "zero", "nan", "text"]
    specs = [RewardSpec(length_reward), RewardSpec(picky_reward, weight=2.0), RewardSpec(answer_length_reward, 0.0)]
    result = RewardRunner(specs)(["p"] * 6, completions, {"answer": ["xyz"] * 6})
    assert result.per_function.shape == (6, 3)
    assert result.per_function[:, 0].tolist() == [1.0, 2.0, 4.0, 4.0, 3.0, 4.0]
    assert result.per_function[:, 2].tolist() == [3.0] * 6
    # picky: 1.0 on a and bb; None, an error, NaN and a string abstain
    assert result.per_function[:2, 1].tolist() == [1.0, 1.0]
    assert torch.isnan(result.per_function[2:, 1]).all()
    assert result.rewards.tolist() == [1 + 2.0, 2 + 2.0, 4.0, 4.0, 3.0, 4.0]
    stats = result.stats["picky_reward"]
    assert (stats.scored, stats.abstained, stats.errors, stats.invalid, stats.timeouts) == (2, 1, 1, 2, 0)
    assert stats.mean == 1.0
    for s in result.stats.values():  # every completion is counted exactly once
        assert s.scored + s.abstained + s.errors + s.timeouts + s.invalid == 6


def test_errors_abstain_only_where_raised_and_log_once_per_type(caplog):
    runner = RewardRunner([RewardSpec(picky_reward)])
    with caplog.at_level(logging.WARNING, logger="rlvr.rewards"):
        result = runner(["p"] * 6, ["ok", "zero", "zero", "key", "ok", "zero"])
        runner(["p"], ["zero"])  # a later batch: counted, not logged again
    assert result.per_function[:, 0].tolist()[0] == 1.0
    assert result.stats["picky_reward"].errors == 4
    assert result.stats["picky_reward"].scored == 2
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3
    assert "raised ZeroDivisionError on completion 1" in messages[0]
    assert "Traceback" in messages[0] and "no zeros" in messages[0]
    assert "raised KeyError on completion 3" in messages[1]
    # 4 of 6 failed: said once more, with the share and the first failure's own line
    assert messages[2] == ("reward function 'picky_reward' failed on 67% of its completions (4 of 6); first failure: "
                           "raised ZeroDivisionError: no zeros; its completions abstain")


@pytest.mark.parametrize(
    "completion, message",
    [
        ("zero", r"'picky_reward' raised ZeroDivisionError on completion 1(.|\n)*no zeros"),
        ("nan", r"'picky_reward' returned nan, not a finite number on completion 1"),
        ("inf", r"'picky_reward' returned inf, not a finite number"),
        ("huge", r"'picky_reward' returned an int of 16610 bits, too large"),
        ("1e308", r"'picky_reward' returned 1e\+308, beyond the bound of 1e\+09 on a reward's size"),
        ("text", r"'picky_reward' returned '1.0' \(str\), not a number"),
    ],
)
def test_strict_makes_the_first_failure_fatal(completion, message):
    runner = RewardRunner([RewardSpec(picky_reward)], strict=True)
    with pytest.raises(RewardError, match=message):
        runner(["p", "p"], ["ok", completion])
    assert runner(["p"], ["ok"]).rewards.tolist() == [1.0]


@pytest.mark.parametrize(
    "fn, message",
    [(wrong_count_reward, "returned 3 values for 2 completions"), (not_a_list_reward, "returned a float, not a list")],
)
def test_malformed_return_abstains_or_raises(fn, message):
    result = RewardRunner([RewardSpec(fn)])(["p", "p"], ["a", "b"])
    assert torch.isnan(result.rewards).all()
    assert next(iter(result.stats.values())).invalid == 2
    with pytest.raises(RewardError, match=f"'{fn.__name__}' {message}"):
        RewardRunner([RewardSpec(fn)], strict=True)(["p", "p"], ["a", "b"])


def test_score_groups_shapes_columns_and_abstained_groups():
    runner = RewardRunner([RewardSpec(picky_reward), RewardSpec(answer_length_reward, weight=0.0)])
    prompts = [{"prompt": "p0", "answer": "a"}, {"prompt": "p1", "answer": "bbb"}]
    result = runner.score_groups(prompts, [["ok", "none", "ok"], ["none", "zero", "none"]])
    assert result.rewards.shape == (2, 3) and result.per_function.shape == (2, 3, 2)
    assert result.column("answer_length_reward").tolist() == [[1.0] * 3, [3.0] * 3]
    assert result.rewards[0, 0] == 1.0 and torch.isnan(result.rewards[1]).all()
    metrics = result.metrics()
    assert metrics["reward/abstained_groups"] == 1.0
    assert metrics["reward/abstained"] == 4.0
    assert metrics["reward/picky_reward/errors"] == 1.0
    with pytest.raises(ValueError, match="groups differ in size"):
        runner.score_groups(prompts, [["a"], ["a", "b"]])
    with pytest.raises(ValueError, match="prompt 1 has keys"):
        runner.score_groups([prompts[0], {"prompt": "p1"}], [["a"], ["b"]])


def test_only_runs_the_named_functions():
    runner = RewardRunner([RewardSpec(length_reward), RewardSpec(picky_reward)])
    result = runner(["p"], ["zero"], only=["length_reward"])  # picky would raise: it must not run
    assert list(result.stats) == ["length_reward"]
    assert result.rewards.tolist() == [4.0]
    with pytest.raises(ValueError, match="unknown reward names"):
        runner(["p"], ["a"], only=["nope"])


def test_arguments_are_passed_by_keyword_as_trl_does():
    def completions_only(completions, **kwargs):  # the signature of TRL's own format rewards
        return [float(c == "yes") for c in completions]

    runner = RewardRunner([RewardSpec(completions_only)])
    assert runner(["prompt text"] * 2, ["yes", "no"], {"answer": ["a", "b"]}).rewards.tolist() == [1.0, 0.0]


def test_columns_must_align():
    runner = RewardRunner([RewardSpec(length_reward)])
    with pytest.raises(ValueError, match="answer has 1 entries for 2 completions"):
        runner(["p", "p"], ["a", "b"], {"answer": ["x"]})


def test_values_whose_float_or_repr_raise_are_invalid(caplog):
    runner = RewardRunner([RewardSpec(odd_values_reward)])
    with caplog.at_level(logging.WARNING, logger="rlvr.rewards"):
        result = runner(["p"] * 4, ["ok", "float", "repr", "nan repr"])
    stats = result.stats["odd_values_reward"]
    assert (stats.scored, stats.invalid) == (1, 3)
    assert result.rewards[0] == 1.0 and torch.isnan(result.rewards[1:]).all()
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert "returned 1.0 (RaisingFloat), which raised ValueError when converted to a float on completion 1" in messages
    for completion, message in [
        ("float", "raised ValueError when converted"),
        ("repr", r"returned a RaisingRepr \(its repr raised RuntimeError\), not a number"),
        ("nan repr", "returned nan, not a finite number"),
    ]:
        with pytest.raises(RewardError, match=message):
            RewardRunner([RewardSpec(odd_values_reward)], strict=True)(["p"], [completion])


def test_exit_interrupt_and_chdir_in_process_are_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(os.getcwd())  # restores the directory after the test, should the runner not
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)  # as under the trainer
    try:
        _exit_interrupt_and_chdir(tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_interrupt_propagates_under_the_default_ctrl_c_handler():
    # library use, no rlvr handler: Python's own (a test runner's worker may have set another)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            RewardRunner([RewardSpec(escaping_reward)])(["p"], ["interrupt"], {"where": ["."]})
    finally:
        signal.signal(signal.SIGINT, previous)


def _exit_interrupt_and_chdir(tmp_path):
    cwd = os.getcwd()
    runner = RewardRunner([RewardSpec(escaping_reward)])
    completions = ["ok", "chdir", "exit", "interrupt"]
    result = runner(["p"] * 4, completions, {"where": [str(tmp_path)] * 4})
    assert os.getcwd() == cwd
    stats = result.stats["escaping_reward"]
    assert (stats.scored, stats.errors) == (1, 3)
    assert result.rewards[0] == 1.0
    strict = RewardRunner([RewardSpec(escaping_reward)], strict=True)
    for completion, message in [
        ("exit", "'escaping_reward' raised SystemExit on completion 0"),
        ("interrupt", "'escaping_reward' raised KeyboardInterrupt on completion 0"),
        ("chdir", f"'escaping_reward' changed the working directory on completion 0(.|\n)*{cwd}"),
    ]:
        with pytest.raises(RewardError, match=message):
            strict(["p"], [completion], {"where": [str(tmp_path)]})
        assert os.getcwd() == cwd


@pytest.mark.parametrize("timeout", [None, 2.0])
@pytest.mark.parametrize("form", ["numpy array", "tensor", "0-d values"])
def test_arrays_and_zero_dim_values_are_accepted(form, timeout):
    with RewardRunner([RewardSpec(array_reward, timeout=timeout)], num_workers=1) as runner:
        result = runner(["p"] * 4, ["a", "bb", "ccc", "dddd"], {"form": [form] * 4})
    assert result.stats["array_reward"].scored == 4
    assert result.rewards.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_a_tensor_of_finite_floats_is_judged_as_a_whole_with_the_same_verdict():
    # In-process, a 1-d floating tensor of finite values skips the value-by-value judging;
    # the values (float64 rounded to float32 once) and the stats are those of the list.
    values = [0.1, 1 / 3, 2.0, 1e-8]
    as_list = RewardSpec(lambda prompts, completions, **kw: values, name="as_list")
    as_tensor = RewardSpec(lambda prompts, completions, **kw: torch.tensor(values, dtype=torch.float64),
                           name="as_tensor")
    result = RewardRunner([as_list, as_tensor])(["p"] * 4, ["a", "b", "c", "d"])
    assert torch.equal(result.column("as_list"), result.column("as_tensor"))
    assert result.stats["as_list"] == result.stats["as_tensor"]  # mean from the float64 values, in both
    assert result.stats["as_tensor"].mean == math.fsum(values) / 4


@pytest.mark.parametrize("bad", [NAN, math.inf])
def test_a_tensor_with_a_non_finite_value_is_judged_value_by_value(bad, caplog):
    spec = RewardSpec(lambda prompts, completions, **kw: torch.tensor([1.0, bad, 3.0]), name="vector")
    with caplog.at_level(logging.WARNING, logger="rlvr.rewards"):
        result = RewardRunner([spec])(["p"] * 3, ["a", "b", "c"])
    assert (result.stats["vector"].scored, result.stats["vector"].invalid) == (2, 1)
    assert result.stats["vector"].mean == 2.0
    assert "not a finite number on completion 1" in caplog.text


# worker processes


def test_hang_times_out_without_blocking_and_worker_restarts():
    with RewardRunner([RewardSpec(picky_reward, timeout=0.5)], num_workers=2) as runner:
        runner(["p"], ["warm up"])  # start the workers outside the timed part
        start = time.monotonic()
        result = runner(["p"] * 6, ["ok", "sleep", "ok", "spin", "ok", "ok"])
        elapsed = time.monotonic() - start
        # the two hangs run side by side on the two workers: one limit, not two
        assert elapsed < 1.0, elapsed
        stats = result.stats["picky_reward"]
        assert (stats.scored, stats.timeouts) == (4, 2)
        assert torch.isnan(result.rewards[[1, 3]]).all()
        # the killed workers were replaced: the runner keeps working
        assert runner(["p"] * 3, ["a", "b", "c"]).rewards.tolist() == [1.0, 1.0, 1.0]


def test_worker_errors_and_deaths_are_counted():
    with RewardRunner([RewardSpec(picky_reward, timeout=2.0)], num_workers=1) as runner:
        result = runner(["p"] * 4, ["zero", "exit", "ok", "nan"])
        stats = result.stats["picky_reward"]
        assert (stats.errors, stats.invalid, stats.scored) == (2, 1, 1)
        assert result.rewards[2] == 1.0
        with pytest.raises(RewardError, match="ZeroDivisionError(.|\n)*Traceback(.|\n)*no zeros"):
            RewardRunner([RewardSpec(picky_reward, timeout=2.0)], strict=True)(["p"], ["zero"])


def test_exit_and_interrupt_in_a_worker_are_errors_without_a_traceback(capfd, tmp_path):
    with RewardRunner([RewardSpec(escaping_reward, timeout=5.0)], num_workers=1) as runner:
        where = {"where": [str(tmp_path)] * 3}
        first_pid = runner(["p"], ["pid"], {"where": [str(tmp_path)]}).rewards.tolist()
        result = runner(["p"] * 3, ["interrupt", "exit", "pid"], where)
    stats = result.stats["escaping_reward"]
    assert (stats.errors, stats.scored) == (2, 1)
    assert result.rewards[2:].tolist() == first_pid  # the same worker: neither ended it
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_cancelled_error_and_generator_exit_are_errors_logged_once(timeout, capfd, caplog):
    """Both are BaseExceptions, not Exceptions: in-process they used to end the run, in a
    worker to kill it with a traceback on every call."""
    completions = ["cancel", "generator exit", "pid", "cancel", "generator exit", "cancel"]
    with caplog.at_level(logging.WARNING, logger="rlvr.rewards"):
        with RewardRunner([RewardSpec(escaping_reward, timeout=timeout)], num_workers=1) as runner:
            result = runner(["p"] * 6, completions, {"where": ["."] * 6})
            again = runner(["p"], ["pid"], {"where": ["."]})
    stats = result.stats["escaping_reward"]
    assert (stats.errors, stats.scored) == (5, 1)
    assert again.rewards.tolist() == result.rewards[2:3].tolist()  # the same worker (or this process) lives on
    assert "lost its worker" not in caplog.text
    assert caplog.text.count("raised CancelledError on completion 0") == 1
    assert caplog.text.count("raised GeneratorExit on completion 1") == 1
    assert caplog.text.count("Traceback") == 2  # one per exception type, none for the repeats
    assert "Traceback" not in capfd.readouterr().err


def test_unpicklable_result_is_judged_in_the_worker_not_a_crash():
    with RewardRunner([RewardSpec(unpicklable_reward, timeout=2.0)], num_workers=1) as runner:
        stats = runner(["p"], ["a"]).stats["unpicklable_reward"]
        assert stats.invalid == 1  # a function is not a number; only that verdict crosses the pipe


def test_chunks_that_raise_are_retried_per_completion():
    with RewardRunner([RewardSpec(picky_reward, timeout=2.0)], num_workers=1, chunk_size=4) as runner:
        result = runner(["p"] * 4, ["ok", "zero", "ok", "ok"])
    assert result.stats["picky_reward"].errors == 1
    assert result.rewards[[0, 2, 3]].tolist() == [1.0, 1.0, 1.0]


def test_fork_workers_run_closures():
    offset = 10.0
    spec = RewardSpec(lambda prompts, completions, **kw: [offset + len(c) for c in completions], name="closure",
                      timeout=2.0)
    with RewardRunner([spec], num_workers=1) as runner:
        assert runner(["p", "p"], ["a", "bb"]).rewards.tolist() == [11.0, 12.0]


def test_spawn_rejects_closures_and_runs_importable_functions():
    with pytest.raises(RewardError, match="'closure' cannot be sent to a 'spawn' worker"):
        RewardRunner([RewardSpec(lambda p, c, **k: [], name="closure", timeout=1.0)], start_method="spawn")
    fn = load_reward_function("rlvr.tasks.sort_text:exact_match_reward")
    with RewardRunner([RewardSpec(fn, timeout=30.0)], num_workers=1, start_method="spawn") as runner:
        result = runner(["2 1>", "2 1>"], ["1 2", "2 1"], {"answer": ["1 2", "1 2"]})
    assert result.rewards.tolist() == [1.0, 0.0]


def huge_tensor_reward(prompts, completions, **kwargs):
    return torch.full((len(completions),), 1e308, dtype=torch.float64)


@pytest.mark.parametrize("fn", [picky_reward, huge_tensor_reward])
def test_huge_finite_rewards_are_invalid_not_an_overflow(fn):
    """Two rewards of 1e308 overflow any sum (the tally's mean, a group's std): they are
    invalid values that abstain, as NaN is, and the run goes on."""
    result = RewardRunner([RewardSpec(fn)])(["p", "p"], ["1e308", "1e308"])
    assert all(math.isnan(r) for r in result.rewards.tolist())
