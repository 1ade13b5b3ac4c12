"""What the evaluation is on: the lecture's training prompts or held-out ones, and the summary saying which."""

from helpers import QUIET
from rlvr.cli import main


def test_summary_says_the_lecture_evaluates_its_training_prompts(tmp_path, capsys):
    assert main(["train", f"out_dir={tmp_path / 'a'}", "algo.epochs=1", *QUIET]) == 0
    out = capsys.readouterr().out
    assert "held-out" not in out and "training prompts" in out
    assert main(["train", f"out_dir={tmp_path / 'b'}", "algo.epochs=1", "task.prompts=null", "task.eval_size=4",
                 *QUIET]) == 0
    assert "held-out" in capsys.readouterr().out


def test_eval_prompts_label():
    from rlvr.config import load_config
    from rlvr.loop.evaluation import eval_prompts_label

    assert eval_prompts_label(load_config(None, [])) == "training prompts"
    assert eval_prompts_label(load_config(None, ["task.prompts=null"])) == "held-out prompts"
    assert eval_prompts_label(load_config(None, ["task.name=sort_text", "policy.name=causal_lm"])) == \
        "held-out prompts"  # task.prompts is the sorting task's alone


def test_an_evaluation_of_several_chunks_says_when_it_starts_and_ends_without_a_progress_bar(tmp_path, capsys):
    """log.progress=false draws nothing while the held-out prompts are decoded, which takes
    minutes for a real LM: one line before such an evaluation, one after; an evaluation of
    one chunk (a batch's worth of sampling) says nothing."""
    import re

    args = ["train", "algo.epochs=1", "task.prompts=null", "task.eval_size=5", "log.eval_samples=2", *QUIET]
    assert main([*args, f"out_dir={tmp_path / 'a'}", "log.eval_batch_size=2"]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    start = "rlvr: evaluating 5 held-out prompts (greedy and 2 sampled responses each, 2 prompts at a time)"
    end = r"rlvr: evaluated 5 held-out prompts in \d+\.\d s: greedy solve rate \d\.\d{3}"
    assert len(lines) == 4 and all(line == start for line in lines[::2]), lines  # at the start and the end
    assert all(re.fullmatch(end, line) for line in lines[1::2]), lines
    assert main([*args, f"out_dir={tmp_path / 'b'}", "log.eval_batch_size=5"]) == 0
    assert capsys.readouterr().err == ""
