"""The ``rlvr`` command: train, compare, plot (and the LM helpers when installed)."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
from pathlib import Path

from rlvr.checkpoint import CheckpointError
from rlvr.config import ConfigError, check_options, load_config
from rlvr.data import DataError
from rlvr.errors import RunError
from rlvr.metrics import plot_runs, read_records, summary
from rlvr.resume import resume_config
from rlvr.rewards import RewardError
from rlvr.run_dir import new_run_dir, write_atomically
from rlvr.runs import run_training
from rlvr.trainer import TrainingError

DELTA_COMPARE = ("raw", "centered", "normalized")


def _split_args(items: list[str]) -> tuple[str | None, list[str]]:
    """``[CONFIG] [key=value ...]`` -> (config path or None, overrides)."""
    path = None
    overrides = []
    for item in items:
        if "=" in item:
            overrides.append(item)
        elif path is None:
            path = item
        else:
            raise ConfigError(f"unexpected argument {item!r}: give one CONFIG file and key=value overrides")
    return path, overrides


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from err


def cmd_train(args: argparse.Namespace) -> int:
    path, overrides = _split_args(args.items)
    resume = [o.split("=", 1)[1] for o in overrides if o.startswith("resume=")]
    overrides = [o for o in overrides if not o.startswith("resume=")]
    if resume:
        if path is not None:
            raise ConfigError("resume=RUN_DIR takes the run's own config.yaml; give overrides only")
        config = resume_config(resume[-1], overrides)
    else:
        config = load_config(path, overrides)
    records, run_dir = run_training(config, resume=resume[-1] if resume else None)
    print_summary({config.name: records})
    print(f"run directory: {run_dir}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    path, overrides = _split_args(args.items)
    base = load_config(path, overrides)
    modes = args.modes.split(",")
    for mode in modes:
        load_config(path, overrides + [f"algo.deltas={mode}"])  # validate every mode before any work
    root = Path(base.out_dir) if base.out_dir else Path("runs") / "compare"
    runs: dict[str, list] = {}
    by_mode: dict[str, list] = {m: [] for m in modes}
    for mode in modes:
        for seed in args.seeds:
            name = f"{mode}-seed{seed}"
            extra = [f"algo.deltas={mode}", f"seed={seed}", f"name={name}", f"out_dir={root / name}"]
            config = load_config(path, overrides + extra)
            records, _ = run_training(config, plot=False)
            runs[name] = records
            by_mode[mode].append(records)
    seeds = ", ".join(map(str, args.seeds))
    figure = plot_runs(by_mode, root / "compare.png", f"mean over seeds {seeds} (band: min to max)")
    print_summary(runs)
    print_mode_means(by_mode)
    print(f"figure: {figure}")
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from rlvr.sft import run_sft

    path, overrides = _split_args(args.items)
    config = load_config(path, overrides)

    def show(record):
        if "eval_greedy_solve_rate" in record:
            print(f"sft step {record['step'] + 1}: loss {record['loss']:.4f}  "
                  f"held-out greedy solve rate {record['eval_greedy_solve_rate']:.3f}", flush=True)

    with new_run_dir(config) as run_dir:
        config.out_dir = str(run_dir)
        try:
            write_atomically(run_dir / "config.yaml", config.to_yaml())
            model_dir = run_sft(config, run_dir, on_record=show)
        except BaseException:
            shutil.rmtree(run_dir, ignore_errors=True)  # no half-written run is left behind
            raise
    print(f"model: {model_dir}  (use policy.options.model={model_dir} for RL)")
    return 0


def cmd_init_model(args: argparse.Namespace) -> int:
    from rlvr.modeling import run_init_model

    print(f"wrote {run_init_model(args)}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    path, overrides = _split_args(args.items)
    config = load_config(path, overrides)
    check_options(config)  # unknown policy and task options, as `rlvr train` would refuse them
    print(config.to_commented_yaml(), end="")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    try:
        runs = {Path(d).name: read_records(Path(d)) for d in args.run_dirs}
    except ValueError as err:  # a line that is not a record (a torn last line is skipped)
        raise RunError(str(err)) from err
    out = Path(args.out) if args.out else Path(args.run_dirs[0]) / "plot.png"
    print(f"wrote {plot_runs(runs, out)}")
    return 0


COLUMNS = (
    ("reward_start", "reward start"),
    ("reward_end", "reward end"),
    ("solve_rate_end", "solve rate"),
    ("frac_zero_delta_groups_end", "zero-delta groups"),
    ("eval_greedy_solve_rate", "held-out greedy"),
    ("eval_sampled_solve_rate", "held-out sampled"),
)


def print_summary(runs: dict[str, list]) -> None:
    width = max(len(n) for n in runs) + 2
    print("".join([f"{'run':<{width}}"] + [f"{label:>18}" for _, label in COLUMNS]))
    for name, records in runs.items():
        s = summary(records)
        print("".join([f"{name:<{width}}"] + [f"{s.get(key, float('nan')):>18.3f}" for key, _ in COLUMNS]))


def print_mode_means(by_mode: dict[str, list]) -> None:
    print("\nmean over seeds")
    for mode, runs in by_mode.items():
        sums = [summary(r) for r in runs]
        reward = sum(s["reward_end"] for s in sums) / len(sums)
        greedy = sum(s.get("eval_greedy_solve_rate", 0.0) for s in sums) / len(sums)
        print(f"  {mode:<12} reward end {reward:7.3f}   held-out greedy solve rate {greedy:6.3f}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlvr", description="RL from verifiable rewards: policy gradient and GRPO.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train a policy (no arguments: the lecture's sorting run)")
    p.add_argument("items", nargs="*", metavar="[CONFIG] [key=value]", help="YAML config and overrides")
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("compare", help="the same run with several delta modes and seeds, overlaid")
    p.add_argument("items", nargs="*", metavar="[CONFIG] [key=value]")
    p.add_argument("--modes", default=",".join(DELTA_COMPARE), help="comma-separated delta modes")
    p.add_argument("--seeds", type=_int_list, default=[0, 1, 2], help="comma-separated seeds, the same for every mode")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("sft", help="supervised warm start of a causal LM on (prompt, completion) pairs")
    p.add_argument("items", nargs="*", metavar="[CONFIG] [key=value]")
    p.set_defaults(func=cmd_sft)
    p = sub.add_parser("init-model", help="write a character tokenizer and a random tiny LM (offline)")
    try:
        from rlvr.modeling import add_init_model_arguments

        add_init_model_arguments(p)
    except ImportError:  # transformers not installed: the command explains when run
        pass
    p.set_defaults(func=cmd_init_model)
    p = sub.add_parser("config", help="print the resolved config, every field with its help")
    p.add_argument("items", nargs="*", metavar="[CONFIG] [key=value]")
    p.set_defaults(func=cmd_config)
    p = sub.add_parser("plot", help="redraw the figure of one or more run directories")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--out", help="output PNG (default RUN_DIR/plot.png)")
    p.set_defaults(func=cmd_plot)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, RunError, CheckpointError, DataError, FileNotFoundError) as err:
        print(f"rlvr: error: {err}", file=sys.stderr)
        return 2
    except TrainingError as err:
        print(f"rlvr: training stopped: {err}", file=sys.stderr)
        return 3
    except RewardError as err:
        print(f"rlvr: reward error (rewards.strict=true): {err}", file=sys.stderr)
        return 4
    except KeyboardInterrupt as err:  # Ctrl-C, or runs.Stopped (SIGINT, SIGTERM): 128 + the signal
        print(f"rlvr: {err}" if str(err) else "rlvr: interrupted", file=sys.stderr)
        return 128 + getattr(err, "signum", signal.SIGINT)
    except OSError as err:  # a filesystem error that no step above named
        where = f" ({err.filename})" if err.filename else ""
        print(f"rlvr: error: {err.strerror or err}{where}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
