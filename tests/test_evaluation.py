"""What the evaluation is on: the lecture's training prompts or held-out ones, and the summary saying which."""

from conftest import QUIET
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
