"""Checkpoints and resume: exact continuation, kills, corruption, Ctrl-C and SIGTERM,
crafted checkpoints, changed configs, damaged metrics files, a finished run."""

import hashlib
import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import QUIET, sigkill_mid_run
from rlvr.base.errors import ConfigError
from rlvr.cli import main
from rlvr.runs.checkpoint import list_checkpoints, load_latest
from rlvr.runs.metrics import read_records, without_timings

BASE = ["log.progress=false", "log.plot=false", "algo.loss=clipped", "algo.kl_coef=0.05",
        "algo.ref_update_every=3", "log.eval_every=2", "seed=5"]


def final_weights(run_dir):
    _, payload = load_latest(run_dir)
    return payload["policy"]


def assert_same_run(a, b):
    assert without_timings(read_records(a)) == without_timings(read_records(b))
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


def test_resume_after_k_epochs_equals_straight_run(tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["train", f"out_dir={straight}", "algo.epochs=12", *BASE]) == 0
    assert main(["train", f"out_dir={split}", "algo.epochs=6", *BASE]) == 0
    assert main(["train", f"resume={split}", "algo.epochs=12"]) == 0
    assert_same_run(straight, split)


def test_sigkill_at_a_random_point_then_resume(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    args = ["algo.epochs=300", "log.checkpoint_every=1", *BASE]
    assert main(["train", f"out_dir={straight}", *args]) == 0
    sigkill_mid_run([f"out_dir={killed}", *args], killed)
    assert main(["train", f"resume={killed}"]) == 0
    assert_same_run(straight, killed)


def test_corrupted_checkpoint_falls_back_to_the_previous(tmp_path):
    out = tmp_path / "run"
    assert main(["train", f"out_dir={out}", "algo.epochs=4", "log.checkpoint_every=2", *BASE]) == 0
    older, newest = list_checkpoints(out)
    data = (newest / "trainer.pt").read_bytes()
    (newest / "trainer.pt").write_bytes(data[: len(data) // 2])  # truncated
    with pytest.warns(UserWarning, match="does not match its checksum"):
        checkpoint, payload = load_latest(out)
    assert checkpoint == older and payload["epoch"] == 2


def test_half_written_checkpoint_is_ignored(tmp_path):
    out = tmp_path / "run"
    assert main(["train", f"out_dir={out}", "algo.epochs=2", *BASE]) == 0
    (out / "checkpoints" / ".tmp-step-000000030").mkdir()  # a kill during a write leaves this
    checkpoint, payload = load_latest(out)
    assert checkpoint.name == "step-000000020" and payload["epoch"] == 2


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_signal_stops_after_the_step_with_a_checkpoint_and_resumes_exactly(tmp_path, signum, code):
    # SIGTERM is what schedulers and `docker stop` send: it must act like Ctrl-C.
    straight, out = tmp_path / "straight", tmp_path / "run"
    args = ["algo.epochs=400", "algo.inner_steps=7", "log.checkpoint_every=1000", *BASE]
    assert main(["train", f"out_dir={straight}", *args]) == 0
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.cli", "train", f"out_dir={out}", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 60
    # Signal as soon as training is under way (a few records written), well before the end.
    while (not metrics.exists() or metrics.read_text().count("\n") < 5) and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "resume=" in err and signal.Signals(signum).name in err
    (checkpoint,) = list_checkpoints(out)
    _, payload = load_latest(out)
    train_records = [r for r in read_records(out) if r["kind"] == "train"]
    assert len(read_records(out)) == payload["num_records"]
    assert checkpoint.name == f"step-{payload['step']:09d}" and len(train_records) == payload["step"] < 400 * 7
    assert main(["train", f"resume={out}"]) == 0
    assert_same_run(straight, out)


def test_resume_from_the_middle_of_an_epoch(tmp_path):
    # A checkpoint written mid-epoch carries that epoch's batch: resuming takes the
    # remaining inner steps on the same responses.
    from rlvr.config import load_config
    from rlvr.runs.launch import run_training

    straight, split = tmp_path / "straight", tmp_path / "split"
    args = ["algo.epochs=4", "algo.inner_steps=5", *BASE]
    assert main(["train", f"out_dir={straight}", *args]) == 0
    config = load_config(None, args + [f"out_dir={split}"])
    from rlvr.loop.seams import LocalLearner

    original = LocalLearner.optimizer_step
    calls = {"n": 0}

    def stop_after_eight(self, st, rollout):
        record = original(self, st, rollout)
        calls["n"] += 1
        if calls["n"] == 8:  # epoch 1, inner step 3 of 5
            st.stop_requested = True
        return record

    LocalLearner.optimizer_step = stop_after_eight
    try:
        with pytest.raises(KeyboardInterrupt):
            run_training(config)
    finally:
        LocalLearner.optimizer_step = original
    _, payload = load_latest(split)
    assert (payload["epoch"], payload["inner_step"], payload["step"]) == (1, 3, 8)
    assert payload["rollout"] is not None
    assert main(["train", f"resume={split}"]) == 0
    assert_same_run(straight, split)


def test_a_rollout_saved_before_the_policy_mask_loads_with_the_response_mask():
    # Checkpoints written before Samples had a policy mask hold none: every response token was the policy's.
    from rlvr.batch.rollout import Rollout, Samples

    mask = torch.tensor([[True, True, False], [True, False, False]])
    samples = Samples(None, torch.zeros(2, 3, dtype=torch.long), mask, torch.zeros(2, 1, dtype=torch.long),
                      torch.ones(2, 1, dtype=torch.bool))
    saved = Rollout(samples, torch.zeros(2), None, None, mask.float(), {}).to_dict()
    assert torch.equal(saved["samples"].pop("policy_mask"), mask)  # written now, absent before
    loaded = Rollout.from_dict(saved)
    assert torch.equal(loaded.samples.policy_mask, mask) and torch.equal(loaded.rows(slice(1, 2)).samples.policy_mask,
                                                                          mask[1:])


def test_resume_of_a_directory_without_a_run_is_a_clear_error(tmp_path, capsys):
    assert main(["train", f"resume={tmp_path}"]) == 2
    assert "no config.yaml" in capsys.readouterr().err


@pytest.mark.parametrize("epochs", [[], ["algo.epochs=1"]])
def test_resume_of_a_finished_run_says_so(tmp_path, capsys, epochs):
    out = tmp_path / "run"
    assert main(["train", f"out_dir={out}", "algo.epochs=2", *QUIET]) == 0
    before = (out / "metrics.jsonl").read_bytes()
    assert main(["train", f"resume={out}", *epochs]) == 2
    err = capsys.readouterr().err
    assert "is finished" in err and "algo.epochs=2" in err and "raise algo.epochs" in err
    assert (out / "metrics.jsonl").read_bytes() == before and not (out / "resumes.jsonl").exists()


def test_a_run_killed_before_its_first_checkpoint_resumes_from_the_start(tmp_path, monkeypatch):
    # Killed in epoch 0 (no checkpoint yet): its config is there, its partial metrics are
    # discarded, and resuming runs it from the beginning.
    from rlvr.config import load_config
    from rlvr.loop.seams import LocalLearner
    from rlvr.runs.launch import run_training

    class Killed(BaseException):
        pass

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    args = ["algo.epochs=3", *BASE]
    assert main(["train", f"out_dir={straight}", *args]) == 0
    original, calls = LocalLearner.optimizer_step, []

    def die_at_the_fourth_step(self, st, rollout):
        calls.append(1)
        if len(calls) == 4:
            raise Killed
        return original(self, st, rollout)

    monkeypatch.setattr(LocalLearner, "optimizer_step", die_at_the_fourth_step)
    with pytest.raises(Killed):
        run_training(load_config(None, args + [f"out_dir={killed}"]))
    monkeypatch.setattr(LocalLearner, "optimizer_step", original)
    assert not list_checkpoints(killed) and len(read_records(killed)) > 3
    assert main(["train", f"resume={killed}"]) == 0
    assert_same_run(straight, killed)


class RunsCode:
    """Unpickling this calls open(marker, "w"): a file that runs code when loaded."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def rewrite_manifest(checkpoint):
    files = sorted(p for p in checkpoint.rglob("*") if p.is_file() and p.name != "manifest.json")
    manifest = {str(p.relative_to(checkpoint)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("kind, message", [
    ("runs code", "refused"),
    ("foreign", "not an rlvr trainer checkpoint"),
])
def test_a_crafted_or_foreign_checkpoint_is_refused_without_running_code(tmp_path, capsys, kind, message):
    out, marker = tmp_path / "run", tmp_path / "marker"
    assert main(["train", f"out_dir={out}", "algo.epochs=1", *BASE]) == 0
    (checkpoint,) = list_checkpoints(out)
    payload = {"policy": RunsCode(marker)} if kind == "runs code" else {"weights": torch.zeros(3)}
    torch.save(payload, checkpoint / "trainer.pt")
    rewrite_manifest(checkpoint)  # a valid manifest: the checksum cannot tell
    with pytest.warns(UserWarning, match="skipping checkpoint"):
        assert main(["train", f"resume={out}", "algo.epochs=2"]) == 2
    assert not marker.exists()
    assert message in capsys.readouterr().err


def test_resume_refuses_config_changes_it_cannot_honour_by_name(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", f"out_dir={out}", "algo.epochs=2", *BASE]) == 0
    count = len(read_records(out))
    assert main(["train", f"resume={out}", "algo.epochs=4", "optim.lr=0.01", "policy.embedding_dim=12"]) == 2
    err = capsys.readouterr().err
    assert "resume cannot change policy.options.embedding_dim (was 10, now 12), optim.lr (was 0.001, now 0.01)" in err
    assert "allowed on resume: algo.epochs" in err
    assert len(read_records(out)) == count and not (out / "resumes.jsonl").exists()


def test_resume_records_the_changes_it_accepts(tmp_path):
    from rlvr.config import load_config

    out = tmp_path / "run"
    assert main(["train", f"out_dir={out}", "algo.epochs=2", *BASE]) == 0
    assert main(["train", f"resume={out}", "algo.epochs=3", "log.eval_every=1"]) == 0
    (entry,) = [json.loads(line) for line in (out / "resumes.jsonl").read_text().splitlines()]
    assert entry["changes"] == {"algo.epochs": {"was": 2, "now": 3}, "log.eval_every": {"was": 2, "now": 1}}
    assert (entry["epoch"], entry["step"]) == (2, 20)
    saved = load_config(out / "config.yaml")
    assert (saved.algo.epochs, saved.log.eval_every) == (3, 1)
    assert [r["epoch"] for r in read_records(out) if r["kind"] == "eval"] == [0, 2, 3]


def test_a_torn_last_metrics_line_is_dropped_by_resume_and_plot(tmp_path):
    # A kill in the middle of a write leaves half a line at the end of metrics.jsonl.
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["train", f"out_dir={straight}", "algo.epochs=4", *BASE]) == 0
    assert main(["train", f"out_dir={split}", "algo.epochs=2", *BASE]) == 0
    with (split / "metrics.jsonl").open("a") as f:
        f.write('{"kind": "train", "epoch": 2, "st')
    assert main(["plot", str(split)]) == 0
    assert main(["train", f"resume={split}", "algo.epochs=4"]) == 0
    assert_same_run(straight, split)


def test_a_metrics_file_shorter_than_its_checkpoint_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", f"out_dir={out}", "algo.epochs=2", *BASE]) == 0
    metrics = out / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join(lines[:-3]))
    assert main(["train", f"resume={out}", "algo.epochs=3"]) == 2
    err = capsys.readouterr().err
    assert f"metrics.jsonl holds {len(lines) - 3} records but checkpoint step-000000020 follows {len(lines)}" in err


def test_a_mid_epoch_text_checkpoint_is_plain_data_and_resumes_exactly(tmp_path, monkeypatch):
    # Text responses are lists of strings and the reward metrics ride along in the
    # rollout: all of it must load with weights_only=True and continue exactly.
    pytest.importorskip("transformers")
    from rlvr.config import load_config
    from rlvr.loop.seams import LocalLearner
    from rlvr.modeling import init_model
    from rlvr.runs.launch import run_training

    model = tmp_path / "model"
    init_model(model, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, seed=0)
    straight, split = tmp_path / "straight", tmp_path / "split"
    args = ["task.name=sort_text", "task.prompts_per_epoch=2", "task.options={num_digits: 3, num_eval: 4}",
            "policy.name=causal_lm", f"policy.options={{model: '{model}', max_new_tokens: 5}}",
            "algo.epochs=2", "algo.inner_steps=3", "algo.group_size=2", "algo.loss=clipped",
            "rewards.functions=['faulty_rewards:sometimes_nan']", "rewards.timeout=null",
            "log.eval_samples=2", "log.progress=false", "log.plot=false", "seed=2"]
    assert main(["train", f"out_dir={straight}", *args]) == 0
    original, calls = LocalLearner.optimizer_step, []

    def stop_after_four(self, st, rollout):
        record = original(self, st, rollout)
        calls.append(1)
        st.stop_requested = len(calls) == 4  # epoch 1, inner step 1 of 3
        return record

    monkeypatch.setattr(LocalLearner, "optimizer_step", stop_after_four)
    with pytest.raises(KeyboardInterrupt):
        run_training(load_config(None, args + [f"out_dir={split}"]))
    monkeypatch.setattr(LocalLearner, "optimizer_step", original)
    (checkpoint,) = list_checkpoints(split)
    payload = torch.load(checkpoint / "trainer.pt", weights_only=True)
    responses = payload["rollout"]["samples"]["responses"]
    assert isinstance(responses[0][0], str) and payload["inner_step"] == 1
    assert main(["train", f"resume={split}"]) == 0
    assert_same_run(straight, split)


# ---------------------------------------------------------------- the data a run read


def dataset_run(run_dir, data, model, *overrides):
    """``rlvr train`` arguments: a tiny LM on the dataset task reading ``data``."""
    return ["train", f"out_dir={run_dir}", "task.name=dataset",
            f"task.options={{path: {data}, answer_column: answer, gold: exact, eval_fraction: 0.25}}",
            "task.prompts_per_epoch=2", "policy.name=causal_lm",
            f"policy.options={{model: {model}, max_new_tokens: 3}}",
            "algo.group_size=2", "algo.inner_steps=1", "algo.epochs=2", "log.eval_every=100", "log.eval_at_start=false",
            "log.progress=false", "log.plot=false", "threads=1", *overrides]


def test_resume_refuses_edited_data_naming_the_file_unless_accepted(tmp_path, tiny_model, capsys):
    """Rows reordered in the file move the held-out split and the training order: the
    resume stops naming the file, trains nothing, and goes on only when told to."""
    rows = [json.dumps({"prompt": f"{i} {i}", "answer": str(2 * i)}) + "\n" for i in range(8)]
    data, run = tmp_path / "d.jsonl", tmp_path / "run"
    data.write_text("".join(rows))
    assert main(dataset_run(run, data, tiny_model)) == 0
    records = read_records(run)
    data.write_text("".join(reversed(rows)))
    capsys.readouterr()
    assert main(["train", f"resume={run}", "algo.epochs=4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"rlvr: error: resume: the run's data changed since it started: {data} changed (sha256 ")
    assert err.endswith("accept the change with resume_accept_data_change=true") and "\n" not in err
    assert read_records(run) == records and len(list_checkpoints(run)) == 1  # nothing trained
    assert main(["train", f"resume={run}", "algo.epochs=4", "resume_accept_data_change=true"]) == 0
    last = json.loads((run / "resumes.jsonl").read_text().splitlines()[-1])
    assert list(last["data_changes"]) == [str(data)]
    assert last["data_changes"][str(data)]["now"] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert main(["train", f"resume={run}", "algo.epochs=5"]) == 0  # the accepted data is the run's now


def test_a_changed_datasets_folder_names_the_file_that_changed(tmp_path):
    from rlvr.runs.resume import data_file_changes, record_data_files

    folder, run = tmp_path / "saved", tmp_path / "run"
    folder.mkdir(), run.mkdir()
    (folder / "data-00000.arrow").write_bytes(b"rows")
    (folder / "state.json").write_text("{}")
    record_data_files(run, [folder])
    assert data_file_changes(run) == {}
    (folder / "data-00000.arrow").write_bytes(b"other rows")
    (folder / "data-00001.arrow").write_bytes(b"more")
    with pytest.raises(ConfigError, match=rf"{folder / 'data-00000.arrow'} changed \(sha256 .*; "
                                          rf"{folder / 'data-00001.arrow'} is new; the held-out split"):
        data_file_changes(run)
    (folder / "state.json").unlink()
    changes = data_file_changes(run, accept=True)
    assert changes[str(folder / "state.json")] == {"was": hashlib.sha256(b"{}").hexdigest(), "now": None}


def test_data_fingerprints_hash_in_chunks(tmp_path, monkeypatch):
    import rlvr.base.data
    from rlvr.runs.resume import data_fingerprints

    monkeypatch.setattr(rlvr.base.data, "HASH_BLOCK", 7)  # 100 bytes: 15 chunks, the last one short
    content = bytes(range(100))
    (tmp_path / "d.jsonl").write_bytes(content)
    assert data_fingerprints([tmp_path / "d.jsonl"]) == {str(tmp_path / "d.jsonl"): hashlib.sha256(content).hexdigest()}


@pytest.mark.parametrize("args, message", [
    (["resume_accept_data_change=true"], "resume_accept_data_change goes with resume=RUN_DIR"),
    (["resume={run}", "resume_accept_data_change=yes"], "resume_accept_data_change='yes' is not allowed; give true"),
])
def test_accepting_data_changes_is_checked(tmp_path, capsys, args, message):
    run = tmp_path / "run"
    assert main(["train", f"out_dir={run}", "algo.epochs=1", *BASE]) == 0
    capsys.readouterr()
    assert main(["train", *(a.format(run=run) for a in args)]) == 2
    assert message in capsys.readouterr().err


def test_resume_checks_the_run_before_importing_its_reward_modules(tmp_path, tiny_model, monkeypatch, capsys):
    # A run directory's config.yaml names modules that resume imports: a damaged or foreign
    # run is refused by the checks that need no import first.
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "marking_reward.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('imported').touch()\n\n\n"
        "def reward(completions, **kwargs):\n    return [len(c) / 10 for c in completions]\n")
    monkeypatch.syspath_prepend(str(lib))
    out = tmp_path / "run"
    assert main(["train", f"out_dir={out}", "task.name=sort_text", "task.prompts_per_epoch=2",
                 "task.options={num_digits: 3, num_eval: 2}", "policy.name=causal_lm",
                 f"policy.options={{model: '{tiny_model}', max_new_tokens: 5}}", "algo.epochs=1", "algo.group_size=2",
                 "rewards.functions=['marking_reward:reward']", "rewards.timeout=null", "log.eval_samples=1",
                 "log.progress=false", "log.plot=false"]) == 0
    (lib / "imported").unlink()
    monkeypatch.delitem(sys.modules, "marking_reward")
    metrics = out / "metrics.jsonl"
    metrics.write_text("".join(metrics.read_text().splitlines(keepends=True)[:-1]))
    assert main(["train", f"resume={out}", "algo.epochs=2"]) == 2
    assert "records but checkpoint" in capsys.readouterr().err
    assert not (lib / "imported").exists()
