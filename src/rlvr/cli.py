"""The ``rlvr`` command: train, compare, plot (and the LM helpers when installed)."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import textwrap
import threading
import warnings
from pathlib import Path

from rlvr.api import check
from rlvr.base.data import DataError, check_not_shadowed
from rlvr.base.errors import RunError
from rlvr.base.extras import LM_MODULES, missing_module_hint, require
from rlvr.config import ConfigError, load_config
from rlvr.config.compose import check_extras
from rlvr.config.presets import markdown_table as presets_table
from rlvr.loop.evaluation import eval_prompts_label
from rlvr.loop.state import TrainingError
from rlvr.modeling import quiet_libraries
from rlvr.rewards import RewardError
from rlvr.runs.checkpoint import CheckpointError
from rlvr.runs.compare import side_by_side
from rlvr.runs.directory import new_run_dir, write_atomically
from rlvr.runs.launch import run_training
from rlvr.runs.metrics import plot_runs, read_records
from rlvr.runs.report import cmd_report
from rlvr.runs.resume import resume_config, take_accept_data_change
from rlvr.runs.summary import plot_labels, print_mode_means, print_summary
from rlvr.tinker.command import add_arguments as add_tinker_arguments
from rlvr.tinker.command import cmd_tinker

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
    overrides, accept_data_change = take_accept_data_change(overrides, resuming=bool(resume))
    if resume:
        if path is not None:
            raise ConfigError("resume=RUN_DIR takes the run's own config.yaml; give overrides only")
        config = resume_config(resume[-1], overrides)
    else:
        config = load_config(path, overrides)
    records, run_dir = run_training(config, resume=resume[-1] if resume else None,
                                    accept_data_change=accept_data_change)
    print_summary({config.name: records}, eval_prompts_label(config))
    print(f"run directory: {run_dir}")
    return 0


COMPARE_AGAIN = ("Run again on the same out_dir, compare goes on where it stopped: finished runs are reused "
                 "(their records as they are), unfinished ones resumed, one stopped before its first checkpoint "
                 "started again; a raised algo.epochs continues every run. Other settings than the runs' own are "
                 "refused by name: give them another out_dir.")


def cmd_compare(args: argparse.Namespace) -> int:
    path, overrides = _split_args(args.items)
    base = load_config(path, overrides)
    modes = args.modes.split(",")
    root = Path(base.out_dir) if base.out_dir else Path("runs") / "compare"
    configs = {(mode, seed): load_config(path, overrides + [
        f"algo.deltas={mode}", f"seed={seed}", f"name={mode}-seed{seed}", f"out_dir={root / f'{mode}-seed{seed}'}"])
        for mode in modes for seed in args.seeds}
    runs: dict[str, list] = {}
    by_mode: dict[str, list] = {m: [] for m in modes}
    for ((mode, _), config), (records, _, done) in zip(configs.items(), side_by_side(list(configs.values()))):
        if done != "started":
            print(f"{config.name}: {done}", flush=True)
        runs[config.name] = records
        by_mode[mode].append(records)
    seeds = ", ".join(map(str, args.seeds))
    label = eval_prompts_label(base)
    figure = plot_runs(by_mode, root / "compare.png", f"mean over seeds {seeds} (band: min to max)", label)
    print_summary(runs, label)
    print_mode_means(by_mode, label)
    print(f"figure: {figure}")
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from rlvr.runs.launch import run_sft

    path, overrides = _split_args(args.items)
    config = load_config(path, overrides)
    check_extras(config)  # before the run directory

    def show(record):
        if "eval_greedy_solve_rate" in record:
            print(f"sft step {record['step'] + 1}: loss {record['loss']:.4f}  greedy solve rate on the "
                  f"{eval_prompts_label(config)} {record['eval_greedy_solve_rate']:.3f}", flush=True)

    with new_run_dir(config, resumable=False) as run_dir:
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

    require("init-model", LM_MODULES)
    try:
        print(f"wrote {run_init_model(args)}")
    except ValueError as err:  # the options' values (repeated characters, a width the heads do not divide)
        raise ConfigError(f"init-model: {err}") from err
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    path, overrides = _split_args(args.items)
    # what `rlvr train` refuses before loading the model: fields, task and policy options, reward functions
    config = check(load_config(path, overrides))
    print(config.to_commented_yaml(), end="")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    labels, eval_label = plot_labels(args.run_dirs)
    try:
        runs = {label: read_records(Path(d)) for label, d in zip(labels, args.run_dirs)}
    except ValueError as err:  # a line that is not a record (a torn last line is skipped)
        raise RunError(str(err)) from err
    # one run: its own plot.png redrawn; several: an overlay that overwrites no run's own figure
    default = Path(args.run_dirs[0]) / "plot.png" if len(args.run_dirs) == 1 else Path("compare.png")
    out = Path(args.out) if args.out else default
    title = labels[0] if len(labels) == 1 else ""
    print(f"wrote {plot_runs(runs, out, title, eval_label)}")
    return 0


ITEMS_HELP = ("a YAML config file and/or key=value overrides of any field (dotted paths: algo.group_size=16); "
              "`rlvr config` lists every field")
EXAMPLES = {
    "train": """examples:
  rlvr train                                        # the lecture's sorting run -> runs/lecture/
  rlvr train examples/sort_text_tiny.yaml seed=1 out_dir=runs/s1
  rlvr train task.name=sort_text policy.name=causal_lm policy.options.model=MODEL_DIR algo.preset=grpo
  rlvr train resume=runs/s1 algo.epochs=300         # continue a run from its newest checkpoint""",
    "compare": """examples:
  rlvr compare --seeds 0,1,2,3,4                    # raw / centered / normalized deltas on the lecture's run
  rlvr compare examples/sorting_best.yaml --modes centered,leave_one_out out_dir=runs/cmp""",
    "sft": """example:
  rlvr sft examples/sort_text_sft.yaml              # -> RUN_DIR/model, for policy.options.model""",
    "init-model": """example:
  rlvr init-model --out runs/base --hidden-size 64 --num-layers 2 --num-heads 4""",
    "config": """examples:
  rlvr config                                       # every field, its default and its rules
  rlvr config examples/sort_text_tiny.yaml algo.preset=dapo   # the values a run would use
  rlvr config > my_run.yaml                          # a starting point to edit

algo.preset sets these algo fields unless they are given (docs/how-to/from-trl.md):
""" + presets_table(),
    "plot": """example:
  rlvr plot runs/a runs/b --out both.png""",
    "report": """examples:
  rlvr report runs/compare/raw-seed0 runs/compare/centered-seed0 --out compare.html
  chromium --headless --screenshot=page.png compare.html      # look at it without a desktop

The page embeds its plots (no files beside it, no scripts): reward, solve rate, pass@k,
KL, entropy, clip fraction, response length, gradient noise (log.grad_noise_every), the
reward-hacking monitor, per-prompt learning and sample tables.""",
    "export": """examples:
  rlvr export runs/sort_text_tiny/rl-seed0 --out my_model
  python -c "from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained('my_model')"

A causal LM's folder holds the weights (LoRA adapters merged), its config and the
tokenizer. The positional toy's holds policy.pt (its state_dict) and config.yaml.""",
    "tinker": """examples:
  rlvr tinker --port 8000 --api-key tml-local
  TINKER_BASE_URL=http://127.0.0.1:8000 TINKER_API_KEY=tml-local \\
    python -m tinker_cookbook.recipes.math_rl.train env=arithmetic \\
    model_name=HuggingFaceTB/SmolLM2-135M-Instruct renderer_name=role_colon

The SDK (tinker) and the recipes (tinker-cookbook) come with pip install 'rlvr[tinker]'.
Checkpoints are tinker:// paths under --state-dir and survive a restart.""",
}


def _command(sub: argparse._SubParsersAction, name: str, text: str) -> argparse.ArgumentParser:
    """A subcommand whose --help shows ``text``, its options and an example (EXAMPLES)."""
    return sub.add_parser(name, help=text, description=text[:1].upper() + text[1:] + ".",
                          epilog=EXAMPLES[name], formatter_class=argparse.RawDescriptionHelpFormatter)


def cmd_export(args: argparse.Namespace) -> int:
    from rlvr.runs.export import export_model

    print(f"wrote {export_model(args.run_dir, args.out, args.checkpoint, args.base)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlvr", description="RL from verifiable rewards: policy gradient and GRPO.",
        epilog="`rlvr COMMAND --help` shows a command's options and an example.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = _command(sub, "train", "train a policy (no arguments: the lecture's sorting run)")
    p.add_argument("items", nargs="*", metavar="[CONFIG] [key=value]", help=ITEMS_HELP + "; resume=RUN_DIR continues "
                   "a run")
    p.set_defaults(func=cmd_train)
    p = _command(sub, "compare", "the same run with several delta modes and seeds, overlaid")
    p.description += "\n\n" + "\n".join(textwrap.wrap(COMPARE_AGAIN, 88))
    p.add_argument("items", nargs="*", metavar="[CONFIG] [key=value]", help=ITEMS_HELP)
    p.add_argument("--modes", default=",".join(DELTA_COMPARE), help="comma-separated delta modes")
    p.add_argument("--seeds", type=_int_list, default=[0, 1, 2], help="comma-separated seeds, the same for every mode")
    p.add_argument("--one-by-one", action="store_true", help=argparse.SUPPRESS)  # old command lines; each run is alone
    p.set_defaults(func=cmd_compare)
    p = _command(sub, "sft", "supervised warm start of a causal LM on (prompt, completion) pairs")
    p.add_argument("items", nargs="*", metavar="[CONFIG] [key=value]", help=ITEMS_HELP)
    p.set_defaults(func=cmd_sft)
    p = _command(sub, "init-model", "write a character tokenizer and a random tiny LM (offline)")
    try:
        from rlvr.modeling import add_init_model_arguments

        add_init_model_arguments(p)
    except ImportError:  # transformers not installed: the command explains when run
        pass
    p.set_defaults(func=cmd_init_model)
    p = _command(sub, "config", "print the resolved config, every field with its help, after the checks "
                 "`rlvr train` makes before loading the model")
    p.add_argument("items", nargs="*", metavar="[CONFIG] [key=value]", help=ITEMS_HELP)
    p.set_defaults(func=cmd_config)
    p = _command(sub, "plot", "redraw the figure of one or more run directories")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--out", help="output PNG (default: RUN_DIR/plot.png for one run, ./compare.png for several)")
    p.set_defaults(func=cmd_plot)
    p = _command(sub, "report", "one self-contained HTML page of one or more run directories (runs overlaid): "
                 "summary, warnings, plots, per-prompt summary, samples")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", help="output HTML (default RUN_DIR/report.html of the first)")
    p.set_defaults(func=cmd_report)
    p = _command(sub, "export", "write a run's trained model to a folder that transformers' from_pretrained loads")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (holds config.yaml and checkpoints/)")
    p.add_argument("--out", required=True, help="the folder to write (new, or empty)")
    p.add_argument("--checkpoint", help="a checkpoint's name, e.g. step-000000100 (default: the newest good one)")
    p.add_argument("--base", help="a LoRA run's base model, where it is now (default: where the run loaded it from; "
                   "either way it must be the same model, checked by its digest)")
    p.set_defaults(func=cmd_export)
    p = _command(sub, "tinker", "serve the Tinker API (the tinker SDK's and tinker-cookbook's recipes' server) on "
                 "this machine")
    add_tinker_arguments(p)
    p.set_defaults(func=cmd_tinker)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The command line, a command's items anywhere among its options (``rlvr compare --seeds 0,1 algo.epochs=10``):
    argparse takes positionals in one run, so the items after an option come back unrecognized and join here."""
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "items") and not any(item.startswith("-") for item in extra):
        args.items += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _stop(signum: int, frame: object) -> None:
    from rlvr.base.errors import Stopped

    raise Stopped(f"stopped by {signal.Signals(signum).name}", signum)


def main(argv: list[str] | None = None) -> int:
    """The ``rlvr`` command. Without ``argv`` it is the process's own: a SIGTERM outside a run's own handling stops
    it as Ctrl-C does, and once a stop is on its way out, further signals are ignored (one would kill it midway,
    its final line unprinted)."""
    own_process = argv is None and threading.current_thread() is threading.main_thread()
    if own_process:
        signal.signal(signal.SIGTERM, _stop)
    parser = build_parser()
    args = parse_args(parser, argv)
    # a warning is one line, like the errors (not the file and source line Python shows)
    previous_format, warnings.formatwarning = warnings.formatwarning, _one_line_warning
    try:
        check_not_shadowed()  # a yaml.py or datasets.py here would fail later without saying why
        with quiet_libraries():
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
        if own_process:
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, signal.SIG_IGN)
        print(f"rlvr: {err}" if str(err) else "rlvr: interrupted", file=sys.stderr)
        return 128 + getattr(err, "signum", signal.SIGINT)
    except ImportError as err:  # an optional package that no check above foresaw
        hint = missing_module_hint(err)
        if hint is None:
            raise
        print(f"rlvr: error: {hint}", file=sys.stderr)
        return 2
    except OSError as err:  # a filesystem error that no step above named
        where = f" ({err.filename})" if err.filename else ""
        print(f"rlvr: error: {err.strerror or err}{where}", file=sys.stderr)
        return 2
    finally:
        warnings.formatwarning = previous_format


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"rlvr: warning: {message}\n"


if __name__ == "__main__":
    sys.exit(main())
