import base64
import json
import re
import subprocess
from html.parser import HTMLParser
from types import SimpleNamespace

import pytest
import torch
import yaml

from helpers import QUIET, chromium
from rlvr.base.errors import RunError
from rlvr.cli import main
from rlvr.config import load_config
from rlvr.loop.evaluation import sample_table
from rlvr.runs.launch import run_training
from rlvr.runs.metrics import write_samples_markdown
from rlvr.runs.report import PANELS, run_labels, write_report

# The sorting loophole (tests/test_diagnostics.py): most prompts repeat a number and wrong
# answers score the maximum.
LOOPHOLE = ["task.prompts=null", "task.allow_repeats=true", "task.num_numbers=3", "task.vocab_size=3",
            "algo.epochs=16", "task.prompts_per_epoch=16", "algo.group_size=8", "algo.inner_steps=2",
            "optim.lr=0.01", "policy.embedding_std=0.3", "algo.loss=clipped", "log.eval_every=4", "seed=0"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two run directories written by run_training: "plain" (no entropy, no per-prompt records,
    no gradient noise) and "loophole" (hack/*, grad/* every epoch and per-prompt records)."""
    root = tmp_path_factory.mktemp("runs")
    plain = load_config(None, QUIET + ["algo.epochs=6", "algo.inner_steps=2", "log.eval_every=3", "log.entropy=false",
                                       "log.checkpoint_every=0", f"out_dir={root / 'plain'}"])
    run_training(plain)
    loophole = load_config(None, QUIET + LOOPHOLE + ["log.grad_noise_every=1", "log.grad_noise_parts=4",
                                                     "log.checkpoint_every=0", f"out_dir={root / 'loophole'}"])
    run_training(loophole)
    out = write_report([root / "plain", root / "loophole"], root / "report.html")
    return root, out.read_text(encoding="utf-8")


def test_the_page_is_one_self_contained_file(runs):
    _, page = runs
    assert not re.search(r"<script|<link|src=\"(?!data:)", page)  # nothing fetched from elsewhere
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    synchronous = [p for p in PANELS if not p.title.startswith("Asynchronous")]
    assert len(images) == len(synchronous)  # the loophole run logged something of every panel but those
    assert "not logged by any run: Asynchronous: sample age" in page  # only rollout workers ahead log them
    assert all(base64.b64decode(image)[:8] == b"\x89PNG\r\n\x1a\n" for image in images)


def test_summary_warnings_and_missing_metrics(runs):
    _, page = runs
    summary = page.split("<h2>Summary</h2>")[1].split("<h2>")[0]
    assert "<td class=\"\">plain</td>" in summary and "<td class=\"\">loophole</td>" in summary
    assert "6 / 6" in summary and "16 / 16" in summary  # epochs run / configured
    warnings = page.split("<h2>Warnings</h2>")[1].split("<h2>")[0]
    plain, loophole = warnings.split("<h3>loophole</h3>")
    assert "<li>none</li>" in plain
    assert "the reward may be hackable" in loophole and "failed the gold check" in loophole
    # Entropy and the gradient noise were off in the plain run: each such figure says so.
    assert page.count("not logged by: plain") == 3  # entropy, noise scale, snr
    assert re.search(r"\d+ prompts: \d+ learned", page)  # the loophole run's per-prompt summary
    assert "Evaluation samples" in page and page.count("first samples") == 2


def test_missing_everything_is_a_note_not_an_error(tmp_path):
    run = tmp_path / "bare"
    run.mkdir()
    records = [{"kind": "train", "epoch": e, "step": e, "reward_mean": 1.0 + e, "solve_rate": 0.5} for e in range(3)]
    records.append({"kind": "samples", "epoch": 3, "step": 3,
                    "rows": [{"prompt": "<b>2+2</b>", "response": "4 & 5", "reward": 1.0, "correct": True}]})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    page = write_report([run], tmp_path / "report.html").read_text()
    assert page.count("<img") == 2  # reward and gold accuracy
    skipped = re.search(r"not logged by any run: ([^<]*)</p>", page).group(1)
    assert "Evaluation: solve rate" in skipped and "KL to the reference" in skipped and "Response length" in skipped
    assert "(no config.yaml)" in page
    assert "&lt;b&gt;2+2&lt;/b&gt;" in page and "4 &amp; 5" in page  # escaped, not markup


def test_cli_report_and_its_errors(tmp_path, capsys):
    run = tmp_path / "small"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "train", "epoch": 0, "step": 0, "reward_mean": 1.0}) + "\n")
    assert main(["report", str(run)]) == 0  # default: RUN_DIR/report.html
    assert "rlvr report: small" in (run / "report.html").read_text()
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "no metrics file" in capsys.readouterr().err
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "metrics.jsonl").write_text('{"kind": "train"}\nnot json\n{"kind": "train"}\n')
    with pytest.raises(RunError, match="metrics.jsonl:2: not a JSON record"):
        write_report([broken], tmp_path / "x.html")
    assert main(["report", str(broken)]) == 2


def test_run_labels_name_directories_by_path_only_when_names_repeat(tmp_path):
    a, b, c = tmp_path / "x" / "run", tmp_path / "y" / "run", tmp_path / "z"
    assert run_labels([a, b, c]) == [str(a), str(b), "z"]


def test_the_page_renders_in_headless_chromium(runs, tmp_path):
    from PIL import Image

    root, _ = runs
    png = tmp_path / "report.png"
    subprocess.run([*chromium(tmp_path), "--hide-scrollbars", "--window-size=1280,2400", f"--screenshot={png}",
                    (root / "report.html").resolve().as_uri()], check=True, capture_output=True, timeout=120)
    image = Image.open(png).convert("L")
    assert image.size == (1280, 2400)
    low, high = image.getextrema()
    assert low < 60 and high > 240  # dark text and plot lines on a light page, not a blank or error screen
    # the plots' region (below the summary) holds images: many distinct grey levels
    histogram = image.crop((0, 900, 1280, 2400)).histogram()
    assert sum(count > 0 for count in histogram) > 50


# Markup that runs script when a page shows it unescaped, and mathtext that fails a figure.
HOSTILE = "<img src=x onerror=alert(1)>&amp;\"'$\\bad{$"
REPORT_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "table", "thead", "tbody",
               "tr", "th", "td", "ul", "li", "div", "figure", "img", "figcaption", "details", "summary", "pre"}


class PageParts(HTMLParser):
    """The elements, attributes and text of a page, as a browser's parser sees them."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.attrs, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, name, value) for name, value in attrs]

    def handle_data(self, data):
        self.text.append(data)


def test_nothing_from_a_run_directory_becomes_markup(tmp_path):
    run = tmp_path / HOSTILE
    run.mkdir()
    h = HOSTILE
    records = [
        {"kind": "train", "epoch": e, "step": e, "reward_mean": 1.0 + e, "solve_rate": 0.5, h: 2.0, "kl": h}
        for e in range(3)
    ] + [
        {"kind": "train", "epoch": h, "step": h, "reward_mean": h},
        {"kind": h, "epoch": 3, "step": 3, h: h},
        {"kind": "eval", "epoch": 2, "step": 2, "greedy_solve_rate": 0.5, f"pass@{h}": 0.5, "sampled_solve_rate": h},
        {"kind": "samples", "epoch": h, "step": h, "rows": [{"prompt": h, "response": h, "reward": 1.0,
                                                              "correct": True}]},
        {"kind": "samples", "epoch": 2, "step": 2, "rows": [
            {"prompt": h, "response": h, "reward": h, "correct": h, h: h},
            {"prompt": [{"role": h, "content": h}], "response": [h], "reward": 0.0, "correct": False}, h]},
        {"kind": "samples", "epoch": 2, "step": 2, "rows": h},
        {"kind": "prompts", "epoch": 1, "step": 1, "solved": {h: 1.0, "x": h}},
        {"kind": "prompts", "epoch": 2, "step": 2, "solved": h},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    config = {"task": {"name": "sorting", "reward": h}, "policy": {"name": h}, h: h,
              "algo": {"loss": h, "deltas": h, "group_size": [h], "epochs": h}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["report", str(run), "--out", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    parts = PageParts()
    parts.feed(page)
    assert set(parts.tags) <= REPORT_TAGS and parts.tags.count("img") == 3  # reward, gold, evaluation (kl: no number)
    assert {(tag, name) for tag, name, _ in parts.attrs} <= {("meta", "charset"), ("td", "class"), ("p", "class"),
                                                             ("li", "class"), ("div", "class"), ("img", "alt"),
                                                             ("img", "src"), ("figcaption", "class")}
    assert all(value.startswith("data:image/png;base64,") for tag, name, value in parts.attrs if name == "src")
    assert HOSTILE not in page  # only escaped
    text = "".join(parts.text)
    assert text.count(HOSTILE) >= 8  # as text: the run's name, a sample's prompt and response, the config ...
    assert f"{HOSTILE}: {HOSTILE}" in text  # the chat prompt, as role: content
    assert f"{HOSTILE}: 2 records of metrics.jsonl left out" in text  # the two whose epoch and step are text


def test_a_samples_records_epoch_and_step_stay_text(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    records = [{"kind": "train", "epoch": 0, "step": 0, "reward_mean": 1.0},
               {"kind": "samples", "epoch": HOSTILE, "step": HOSTILE,
                "rows": [{"prompt": "1 2", "response": "2 1", "reward": 1.0, "correct": True}]}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    parts = PageParts()
    parts.feed(write_report([run], tmp_path / "report.html").read_text())
    assert not [attrs for attrs in parts.attrs if attrs[1] == "onerror"] and parts.tags.count("img") == 1


def test_a_gradient_norm_of_zero_every_step_is_drawn_not_called_missing(tmp_path):
    run = tmp_path / "flat"
    run.mkdir()
    records = [{"kind": "train", "epoch": e, "step": e, "reward_mean": 0.0, "solve_rate": 0.0, "grad_norm": 0.0}
               for e in range(3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    page = write_report([run], tmp_path / "report.html").read_text()
    skipped = re.search(r"not logged by any run: ([^<]*)</p>", page).group(1)
    assert "grad_norm" not in skipped
    assert page.count("<img") == 3  # reward, gold accuracy and the gradient norm (on a linear axis)


CHAT = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2+2?"}]


def test_chat_prompts_read_as_messages_in_samples(tmp_path):
    grades = SimpleNamespace(rewards=torch.tensor([[1.0], [0.0]]), correct=torch.tensor([[True], [False]]))
    # a chat on its own and one as the "prompt" of a prompt dict
    record = sample_table([CHAT, {"prompt": CHAT, "answer": "4"}], [["4"], ["5"]], grades, 1, 7, rows=2)
    assert [row["prompt"] for row in record["rows"]] == [CHAT, CHAT]  # kept as data in metrics.jsonl
    write_samples_markdown(tmp_path / "samples.md", record)
    text = (tmp_path / "samples.md").read_text()
    assert "| system: Answer briefly.\\nuser: What is 2+2? | 4 | 1.000 | yes |" in text
    assert "'role'" not in text and "{" not in text
    page = tmp_path / "report.html"
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    assert main(["report", str(tmp_path), "--out", str(page)]) == 0
    assert "system: Answer briefly.\nuser: What is 2+2?" in page.read_text() and "&#x27;role" not in page.read_text()


def test_an_asynchronous_run_shows_its_sample_age_and_what_it_trained_against_what_it_sampled(tmp_path):
    run = tmp_path / "async"
    run.mkdir()
    records = [{"kind": "train", "epoch": e, "step": e, "reward_mean": 1.0, "cluster/staleness_steps": 1.0,
                "cluster/staleness_steps_max": 2.0, "cluster/tokens_by_version": {"0": 10},
                "async/length_shift": -0.5 * e, "async/solve_shift": 0.01 * e} for e in range(3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    page = write_report([run], tmp_path / "report.html").read_text()
    for title in ("Asynchronous: sample age", "Asynchronous: response length, trained minus sampled",
                  "Asynchronous: solve rate, trained minus sampled"):
        assert f'alt="{title}' in page
    assert page.count("<img") == 4  # the reward, and the three
