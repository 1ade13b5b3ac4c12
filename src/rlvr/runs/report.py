"""``rlvr report RUN_DIR... [--out FILE]``: one self-contained HTML page of one or more runs.

A summary table per run, the diagnostics' warnings, plots of every logged metric with the runs overlaid (PNG
embedded as base64: no external file, script or style sheet), the per-prompt summary, the evaluation samples and
each run's config. Everything read from a run directory is data: escaped on the page, drawn as plain text (no
mathtext) in the figures, and bounded (``rlvr.runs.reading``; ``MAX_CELL`` on the page).
"""

from __future__ import annotations

import argparse
import base64
import datetime
import html
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlvr.base.errors import RunError
from rlvr.batch.record import Record, plain_text, prompt_text, response_text
from rlvr.loop.diagnostics import (
    classify_prompts,
    epoch_series,
    gold_notes,
    hacking_warnings,
    prompt_curves,
    prompt_summary,
)
from rlvr.runs.reading import Run, load_run, numeric

MAX_CELL = 2000  # characters of one table cell (a sample's prompt or response) on the page


@dataclass
class Panel:
    """One plot: ``keys`` of the records of ``kind`` against the step, every run overlaid."""

    title: str
    kind: str
    keys: tuple[str, ...]
    log_y: bool = False
    note: str = ""
    rate: bool = False  # values in [0, 1], drawn on that whole range


PANELS = (
    Panel("Mean reward (training batch)", "train", ("reward_mean",)),
    Panel("Gold accuracy (training batch solve rate)", "train", ("solve_rate",), rate=True),
    Panel("Evaluation: solve rate and pass@k", "eval", ("greedy_solve_rate", "sampled_solve_rate", "pass@*"),
          note="on the task's eval prompts: held out, or the training prompts when they are fixed", rate=True),
    Panel("KL to the reference (token mean)", "train", ("kl",)),
    Panel("Entropy (token mean, nats)", "train", ("entropy",)),
    Panel("Clip fraction", "train", ("clip_frac",)),
    Panel("Response length (mean tokens)", "train", ("response_length",)),
    Panel("Groups with all deltas zero", "train", ("frac_zero_delta_groups",)),
    Panel("Gradient norm (before clipping)", "train", ("grad_norm",), log_y=True),
    Panel("Gradient noise scale B_simple", "train", ("grad/noise_scale",), log_y=True,
          note="points: each measurement; line: tr(Sigma) / |G|^2 of their running means (5 measurements)"),
    Panel("Gradient signal-to-noise |G|^2 / (tr Sigma / B)", "train", ("grad/snr",), log_y=True),
    Panel("Top-reward responses", "train", ("hack/max_reward_frac", "hack/max_reward_not_gold"),
          note="share of responses at the top reward, and the share of those that fail the gold check"),
    Panel("Asynchronous: sample age (optimizer steps)", "train",
          ("cluster/staleness_steps", "cluster/staleness_steps_max", "cluster/token_age_max")),
    Panel("Asynchronous: response length, trained minus sampled (tokens)", "train", ("async/length_shift",),
          note="mean policy tokens per response over the run; 0 when no sampled batch was dropped"),
    Panel("Asynchronous: solve rate, trained minus sampled", "train", ("async/solve_shift",),
          note="a pipeline that drops what samples slowly trains on a biased share of what it samples"),
)

LINE_STYLES = ("-", "--", ":", "-.")


# ---------------------------------------------------------------- plots


def panel_keys(panel: Panel, runs: list[Run]) -> list[str]:
    """The panel's keys, a trailing ``*`` expanded to the keys the runs logged (pass@1, pass@8)."""
    keys = []
    for key in panel.keys:
        if key.endswith("*"):
            found = {k for run in runs for r in run.records if r.get("kind") == panel.kind for k in r
                     if k.startswith(key[:-1])}
            keys += sorted(found, key=lambda k: (len(k), k))
        else:
            keys.append(key)
    return keys


def finite_series(records: list[Record], kind: str, key: str, positive: bool) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key``'s finite values (and only those > 0 when ``positive``, for a log axis)."""
    xs, ys = [], []
    for r in records:
        value = r.get(key) if r.get("kind") == kind else None
        if isinstance(value, (int, float)) and math.isfinite(value) and (value > 0 or not positive):
            xs.append(r["step"])
            ys.append(float(value))
    return xs, ys


def running_noise_scale(records: list[Record], window: int = 5) -> tuple[list[float], list[float]]:
    """(steps, tr Sigma / |G|^2) from running means over ``window`` measurements: the estimates are unbiased,
    their ratio is not, so they are averaged before dividing."""
    points = [(r["step"], r["grad/trace_cov"], r["grad/true_norm_sq"]) for r in records
              if r.get("kind") == "train" and numeric(r.get("grad/trace_cov")) and numeric(r.get("grad/true_norm_sq"))
              and math.isfinite(r["grad/trace_cov"]) and math.isfinite(r["grad/true_norm_sq"])]
    xs, ys = [], []
    for i in range(len(points)):
        recent = points[max(0, i - window + 1): i + 1]
        trace, signal = sum(p[1] for p in recent), sum(p[2] for p in recent)
        if trace > 0 and signal > 0:
            xs.append(points[i][0])
            ys.append(trace / signal)
    return xs, ys


def plot_panel(panel: Panel, runs: list[Run]) -> tuple[str | None, list[str]]:
    """The panel as a base64 PNG (None when no run logged its keys) and the labels of the runs that lack them."""
    from matplotlib.figure import Figure

    keys = panel_keys(panel, runs)
    # a log axis only when something is above 0 (a gradient norm of 0 every step is logged, and drawn)
    log_y = panel.log_y and any(finite_series(run.records, panel.kind, key, True)[0] for run in runs for key in keys)
    fig = Figure(figsize=(5.6, 3.3), dpi=100)
    ax = fig.subplots()
    colors = [f"C{i % 10}" for i in range(len(runs))]
    missing, drawn = [], 0
    for run, color in zip(runs, colors):
        lines = 0
        for style, key in zip(LINE_STYLES * 4, keys):
            xs, ys = finite_series(run.records, panel.kind, key, log_y)
            if not xs:
                continue
            label = plain_text(run.label if len(keys) == 1 else f"{run.label}: {key}" if len(runs) > 1 else key)
            if panel.keys == ("grad/noise_scale",):
                ax.plot(xs, ys, ".", color=color, alpha=0.4, markersize=4)
                xs, ys = running_noise_scale(run.records)
            marker = "o" if panel.kind == "eval" else None
            ax.plot(xs, ys, style, color=color, label=label, marker=marker, markersize=3, linewidth=1.3)
            lines += 1
        drawn += lines
        if not lines:
            missing.append(run.label)
    if not drawn:
        return None, missing
    if log_y:
        ax.set_yscale("log")
    if panel.rate:  # a rate's whole range: a constant 0 reads as 0, not as noise around it
        ax.set_ylim(-0.03, 1.03)
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel("optimizer step", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    if len(runs) > 1 or len(keys) > 1:
        ax.legend(fontsize=7)
    fig.subplots_adjust(left=0.14, right=0.97, top=0.9, bottom=0.15)  # fixed: tight_layout would double the time
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode("ascii"), missing


# ---------------------------------------------------------------- tables


def _number(value: Any, digits: int = 3) -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return f"{value:.{digits}f}"
    return "-"


def _cell(value: Any) -> str:
    """A value from a run directory as one table cell: a scalar's text, cut to MAX_CELL characters."""
    text = value if isinstance(value, str) else str(value) if isinstance(value, (int, float, bool)) else "-"
    return text if len(text) <= MAX_CELL else f"{text[:MAX_CELL]} ... ({len(text) - MAX_CELL:,} more characters)"


def _section(config: dict, name: str) -> dict:
    section = config.get(name)
    return section if isinstance(section, dict) else {}


def _sorting_reward(task: dict) -> Any:
    """The sorting task's reward in a run's config: an option, or a key of the section in a run written before."""
    if task.get("name") != "sorting":
        return ""
    return _section(task, "options").get("reward", task.get("reward"))


def _last(records: list[Record], kind: str, key: str) -> Any:
    values = [r[key] for r in records if r.get("kind") == kind and key in r]
    return values[-1] if values else None


def summary_row(run: Run) -> dict[str, str]:
    """The run's headline numbers as the summary table shows them."""
    c = run.config or {}
    task, policy, algo = (_section(c, name) for name in ("task", "policy", "algo"))
    epochs, rewards = epoch_series(run.records, "reward_mean")
    _, gold = epoch_series(run.records, "solve_rate")
    steps = [r["step"] for r in run.records if r.get("kind") == "train"]
    passes = sorted({k for r in run.records if r.get("kind") == "eval" for k in r if k.startswith("pass@")},
                    key=lambda k: (len(k), k))
    _, zero = epoch_series(run.records, "frac_zero_delta_groups")
    return {
        "run": run.label,
        "task": " ".join(_cell(x) for x in (task.get("name"), _sorting_reward(task)) if x) or "-",
        "policy": _cell(policy.get("name", "-")),
        "algorithm": f"{_cell(algo.get('loss', '-'))} loss, {_cell(algo.get('deltas', '-'))} deltas, "
                     f"G={_cell(algo.get('group_size', '-'))}",
        "epochs": f"{len(epochs)} / {_cell(algo.get('epochs', '?'))}",
        "steps": str(len(steps)),
        "reward first → last": f"{_number(rewards[0])} → {_number(rewards[-1])}" if rewards else "-",
        "gold first → last": f"{_number(gold[0])} → {_number(gold[-1])}" if gold else "-",
        "eval greedy": _number(_last(run.records, "eval", "greedy_solve_rate")),
        **{f"eval {k}": _number(_last(run.records, "eval", k)) for k in passes},
        "zero-delta groups (mean)": _number(sum(zero) / len(zero)) if zero else "-",
    }


def html_table(rows: list[dict[str, Any]], numeric: set[str] = frozenset()) -> str:
    """An HTML table of ``rows`` (dicts); columns are the union of their keys in order."""
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(
        f"<td class=\"{'num' if c in numeric else ''}\">{html.escape(str(row.get(c, '-')))}</td>" for c in columns)
        + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def samples_html(run: Run) -> str:
    """The run's last samples table (eval prompts, a sampled response each), the first in a fold."""
    tables = [r for r in run.records if r.get("kind") == "samples" and r.get("rows")]
    if not tables:
        return "<p class=\"note\">no samples records</p>"

    def table(record: Record) -> str:
        rows = [{"prompt": _cell(prompt_text(row.get("prompt"))),
                 "response": _cell(response_text(row.get("response"))), "reward": _number(row.get("reward")),
                 "correct": "yes" if row.get("correct") is True else "no",
                 **({"note": _cell(str(row["note"]))} if row.get("note") else {})}
                for row in record["rows"]]
        heading = html.escape(f"epoch {record['epoch']} (step {record['step']})")
        return f"<p>{heading}</p>" + html_table(rows, {"reward"})

    out = table(tables[-1])
    if len(tables) > 1:
        out += f"<details><summary>first samples</summary>{table(tables[0])}</details>"
    return out


def prompts_html(run: Run) -> str:
    """The per-prompt summary line and, when per-prompt records exist, a few prompts per category."""
    out = f"<p>{html.escape(prompt_summary(run.records))}</p>"
    curves = prompt_curves(run.records)
    if curves:
        rows = [{"category": name.replace("_", " "), "prompts": len(keys),
                 "examples": _cell(", ".join(keys[:8]) + (" ..." if len(keys) > 8 else ""))}
                for name, keys in classify_prompts(curves).items() if keys]
        out += html_table(rows, {"prompts"})
    return out


# ---------------------------------------------------------------- the page

STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1500px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ccc; }
h3 { font-size: 15px; margin-bottom: 4px; }
table { border-collapse: collapse; font-size: 13px; margin: 6px 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; white-space: pre-wrap; }
th { background: #f2f2f2; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 12px; }
.grid figure { margin: 0; } .grid img { width: 100%; max-width: 560px; }
.note { color: #666; font-size: 12px; } .warn { color: #a40000; } pre { font-size: 12px; background: #f7f7f7; }
"""


def build_page(runs: list[Run]) -> str:
    """The report's HTML: summary, warnings, plots, per-prompt summaries, samples, configs."""
    when = datetime.datetime.now().isoformat(timespec="seconds")
    parts = [f"<h1>rlvr report: {html.escape(', '.join(r.label for r in runs))}</h1>",
             f"<p class=\"note\">{when}; run directories: "
             f"{html.escape(', '.join(str(r.path) for r in runs))}</p>",
             "<h2>Summary</h2>", html_table([summary_row(r) for r in runs]), "<h2>Warnings</h2>"]
    for run in runs:
        warnings = hacking_warnings(run.records)
        items = "".join(f"<li class=\"warn\">{html.escape(w)}</li>" for w in warnings)
        items += "".join(f"<li>{html.escape(note)}</li>" for note in gold_notes(run.records))
        items = items or "<li>none</li>"
        parts.append(f"<h3>{html.escape(run.label)}</h3><ul>{items}</ul>")
    figures, skipped = [], []
    for panel in PANELS:
        image, missing = plot_panel(panel, runs)
        if image is None:
            skipped.append(f"{panel.title} ({', '.join(panel.keys)})")
            continue
        notes = [panel.note] if panel.note else []
        if missing:
            notes.append("not logged by: " + ", ".join(missing))
        caption = "".join(f"<figcaption class=\"note\">{html.escape(n)}</figcaption>" for n in notes)
        figures.append(f"<figure><img alt=\"{html.escape(panel.title)}\" src=\"data:image/png;base64,{image}\">"
                       f"{caption}</figure>")
    parts += ["<h2>Metrics</h2>", f"<div class=\"grid\">{''.join(figures)}</div>"]
    if skipped:
        parts.append(f"<p class=\"note\">not logged by any run: {html.escape('; '.join(skipped))}</p>")
    for run in runs:
        if run.unreadable:
            count = f"{run.unreadable} record{'s' * (run.unreadable != 1)}"
            parts.append(f"<p class=\"note\">{html.escape(run.label)}: {count} of metrics.jsonl left out (not of "
                         "the shape rlvr writes: a kind, an integer epoch and step)</p>")
    parts.append("<h2>Prompts</h2>")
    parts += [f"<h3>{html.escape(r.label)}</h3>{prompts_html(r)}" for r in runs]
    parts.append("<h2>Evaluation samples</h2>")
    parts += [f"<h3>{html.escape(r.label)}</h3>{samples_html(r)}" for r in runs]
    parts.append("<h2>Configs</h2>")
    for run in runs:
        text = yaml.safe_dump(run.config, sort_keys=False) if run.config else "(no config.yaml)"
        parts.append(f"<details><summary>{html.escape(run.label)}</summary><pre>{html.escape(text)}</pre></details>")
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>rlvr report</title>"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>\n")


def run_labels(paths: list[Path]) -> list[str]:
    """The directories' names, or their full paths where two names are the same."""
    names = [p.name or str(p) for p in paths]
    return [name if names.count(name) == 1 else str(path) for name, path in zip(names, paths)]


def write_report(run_dirs: list[str | Path], out_path: str | Path) -> Path:
    """Read the run directories and write the report page to ``out_path``."""
    paths = [Path(d) for d in run_dirs]
    if not paths:
        raise RunError("rlvr report needs at least one run directory")
    runs = [load_run(path, label) for path, label in zip(paths, run_labels(paths))]
    out = Path(out_path)
    out.write_text(build_page(runs), encoding="utf-8")
    return out


def cmd_report(args: argparse.Namespace) -> int:
    """``rlvr report RUN_DIR... [--out FILE]`` (default: RUN_DIR/report.html of the first)."""
    out = Path(args.out) if args.out else Path(args.run_dirs[0]) / "report.html"
    print(f"wrote {write_report(args.run_dirs, out)}")
    return 0
