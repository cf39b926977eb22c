"""The command table: one record per command (its name, help, options, the code that runs it and what it
does to a work dir), and the parser built from it. Every stage of the registry is a command; the
other commands (evaluation, reports, the cluster, the whole run) are listed below. Run code is named by
"module:function" and imported only when the command runs, so `--help` stays light."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline import registry
from pipeline.cli.common import program_name

REMEMBERED_HELP = (
    "YAML config (default: the config this work dir remembers, DIR/_state/config.json, recorded by the "
    "last command that succeeded here; for a new work dir the built-in defaults, the paper's values)"
)
CHECK_CONFIG_HELP = (
    "check the outputs against this config too: shards made with other values are stale, "
    "naming the key (default: only that the records agree with each other)"
)


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    pass


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    run: str  # "module:function": (args, cfg) -> exit code
    arguments: Callable[[argparse.ArgumentParser], None] = _no_arguments  # the command's own options
    description: str = ""  # --help's text (default: help)
    config: str | None = ""  # the help of --config: "" the default (the remembered config); None:
    # the command takes no --config or --set
    work_dir_required: bool = True
    writes: bool = False  # writes into the work dir: it must be writable, and the config of a
    # run that succeeded (or made outputs) is remembered
    makes_work_dir: bool = False  # may run where the work dir does not exist yet
    checks_layout: bool = True  # False: runs where there is no work dir layout yet to check
    resolves_config: bool = True  # False: reads and records no remembered config (errors; `run`,
    # whose stages each resolve their own)
    # (args) -> a usage problem in one line, or None: what argparse cannot check alone
    usage_problem: Callable[[argparse.Namespace], str | None] | None = None


def common_options(parser: argparse.ArgumentParser, work_dir_required: bool = True, config: str | None = "") -> None:
    """--config/--work-dir/--set/--quiet. `config` is the help of --config ("": a config that shapes what
    the command makes, the remembered one by default; None: the command takes no config)."""
    if config is not None:
        parser.add_argument("--config", help=config or REMEMBERED_HELP)
    parser.add_argument(
        "--work-dir",
        required=work_dir_required,
        help="where every stage writes: a folder, or a URL on object storage (s3://bucket/run1)",
    )
    if config is not None:
        parser.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a config value, e.g. --set decode.fps=25 (repeatable)",
        )
    else:
        parser.set_defaults(config=None, set=[])
    parser.add_argument("--quiet", action="store_true", help="no progress bars or progress lines")


def executor_options(parser: argparse.ArgumentParser, workers_help: str) -> None:
    parser.add_argument("--executor", choices=("local", "ray"), help="default: executor.kind from the config")
    parser.add_argument("--workers", type=int, help=workers_help)
    parser.add_argument("--ray-address", help="Ray cluster address ('auto' joins a running one)")


def shard_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shard", type=int, help="this task's index (default: $SLURM_ARRAY_TASK_ID)")
    parser.add_argument("--num-shards", type=int, help="number of tasks (default: $SLURM_ARRAY_TASK_COUNT)")
    parser.add_argument("--force", action="store_true", help="redo shards even when they are current")
    executor_options(parser, "local process pool size (default: executor.workers)")


def removal_option(parser: argparse.ArgumentParser, what: str = "the input no longer lists") -> None:
    parser.add_argument(
        "--allow-removal",
        action="store_true",
        help=f"go on when {what} videos with finished outputs (asked on a terminal, "
        f"refused off one); their outputs move to DIR/_state/replaced/",
    )


# ---------------------------------------------------------------- the options of each command


def stage_options(stage: registry.Stage) -> Callable[[argparse.ArgumentParser], None]:
    """The options of a stage's command: a per-shard stage's shard and executor options; a whole-collection
    stage's own (its record's), and the executor options where it fans its work out."""
    if stage.per_shard:
        return shard_options

    def add(parser: argparse.ArgumentParser) -> None:
        for option in stage.options:
            if option.takes_value:
                parser.add_argument(option.flag, required=option.required, help=option.help)
            else:
                parser.add_argument(option.flag, action="store_true", help=option.help)
        if stage.workers:
            executor_options(parser, stage.workers)

    return add


def _eval(parser):
    parser.add_argument(
        "task",
        choices=("zero-shot", "linear-probe", "features", "predict-video", "captioning", "forecast"),
        help="zero-shot: verb/noun classification (the paper's Table 1); linear-probe: the "
        "supervised S3D row; features: downstream features; predict-video: visual words "
        "for --sentence; captioning: YouCook II captions and their metrics (Table 4); "
        "forecast: the top-3 visual words at later steps",
    )
    parser.add_argument("--checkpoint", type=Path, help="default: the latest under DIR/train")
    parser.add_argument("--sentence", action="append", default=[], help="predict-video: a sentence (repeatable)")


def _youcook2_manifest(parser):
    parser.add_argument(
        "--annotations", required=True, type=Path, help="youcookii_annotations_trainval.json (or a file in its format)"
    )
    parser.add_argument(
        "--videos",
        required=True,
        type=Path,
        help="a folder holding the videos named by YouTube id (searched recursively)",
    )
    parser.add_argument(
        "--subset",
        action="append",
        choices=("training", "validation", "testing"),
        help="only the videos of this subset (repeatable; default: all)",
    )
    parser.add_argument("--force", action="store_true", help="assign every video a shard anew")
    removal_option(parser, "the list no longer holds")


def _youcook2_labels(parser):
    parser.add_argument("--annotations", required=True, type=Path)
    parser.add_argument("--out", type=Path, help="default: DIR/eval/youcook2")


def _errors(parser):
    parser.add_argument("--stage", help="only this stage's errors")


def _submit(parser):
    parser.add_argument(
        "stage",
        choices=tuple(name for name in registry.NAMES if name != "manifest") + ("pipeline",),
        help="a stage, or `pipeline`: features, kmeans, quantize, asr and align as one afterok "
        "chain (prints a `STAGE JOB_IDS` line each)",
    )
    parser.add_argument("--executor", choices=("slurm",), default="slurm")
    parser.add_argument(
        "--num-shards",
        type=int,
        help="array tasks (default: one per manifest shard); more than the cluster's "
        "MaxArraySize (or executor.slurm_max_array_size) are submitted as several array jobs",
    )
    parser.add_argument("--array-parallelism", type=int, help="at most this many tasks at once")
    parser.add_argument(
        "--after",
        action="append",
        default=[],
        metavar="JOB_ID",
        help="start after this job succeeds (afterok; repeatable; ids joined by ':' as submit prints them)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the sbatch script(s), submit nothing")
    parser.add_argument(
        "--only-incomplete",
        action="store_true",
        help="only the tasks with a shard that is not current (a retry), numbered as before",
    )
    parser.add_argument("--with-train", action="store_true", help="submit pipeline: train after align too")


def _gallery(parser):
    parser.add_argument("--level", type=int, default=1, help="tree level to show (1 = the top clusters)")
    parser.add_argument("--clusters", type=int, default=12, help="the largest N nodes of the level")
    parser.add_argument("--per-cluster", type=int, default=12, help="thumbnails per node")
    parser.add_argument("--ids", type=int, nargs="*", help="these node ids instead of the largest")


def _export(parser):
    parser.add_argument("--checkpoint", type=Path, help="default: the latest under DIR/train")
    parser.add_argument("out", type=Path, help="the folder to write")


def _validate(parser):
    parser.add_argument(
        "work_dir_positional", nargs="?", metavar="DIR", help="the work dir, as --work-dir (kept for older scripts)"
    )


def _validate_work_dir(args) -> str | None:
    """validate takes its work dir as --work-dir or as the one positional argument."""
    if args.work_dir and args.work_dir_positional and args.work_dir != args.work_dir_positional:
        return f"two work dirs given ({args.work_dir_positional} and --work-dir {args.work_dir}): give one"
    args.work_dir = args.work_dir or args.work_dir_positional
    if args.work_dir is None:
        return f"give the work dir ({program_name()} validate --work-dir DIR)"
    return None


def _run(parser):
    parser.add_argument("--input", required=True, help="the videos: a folder (searched recursively) or a list file")
    parser.add_argument("--force", action="store_true", help="redo every stage even where it is current")
    parser.add_argument("--workers", type=int, help="local process pool size (default: executor.workers)")


def _doctor(parser):
    parser.add_argument("--input", help="the videos the run will read (checked to exist)")


def _config(parser):
    parser.add_argument(
        "action",
        choices=("show", "diff", "history"),
        help="show: the remembered config (YAML); diff: --config/--set against it (without "
        "them: against the one before it); history: one line per config used",
    )


# ---------------------------------------------------------------- the table

STAGE_COMMANDS = "pipeline.cli.stage_commands"
TOOLS = "pipeline.cli.tools"
WHOLE_RUN = "pipeline.cli.whole_run"


def _stage_command(stage: registry.Stage) -> Command:
    help_text = f"{stage.summary} (reads {', '.join(stage.reads) or 'the input videos'}; writes {stage.writes})"
    run = f"{STAGE_COMMANDS}:{'run_stage' if stage.per_shard else 'run_collection'}"
    # the root stage (no stage before it: it lists the input) makes the work dir
    return Command(
        stage.name,
        help_text,
        run,
        stage_options(stage),
        writes=True,
        makes_work_dir=not stage.reads,
        checks_layout=bool(stage.reads),
    )


def commands() -> tuple[Command, ...]:
    """Every command, in the order --help lists them: the stages (the registry's, in run order) first."""
    return (
        *(_stage_command(stage) for stage in registry.STAGES),
        Command("eval", "evaluate a trained VideoBERT", f"{TOOLS}:run_eval", _eval, writes=True),
        Command(
            "youcook2-manifest",
            "the manifest of the videos of a YouCook II annotations file (video_id = YouTube id)",
            f"{TOOLS}:run_youcook2_manifest",
            _youcook2_manifest,
            writes=True,
            makes_work_dir=True,
            checks_layout=False,
        ),
        Command(
            "youcook2-labels",
            "verb and noun lists and per-segment labels from YouCook II captions (POS tagger)",
            f"{TOOLS}:run_youcook2_labels",
            _youcook2_labels,
            writes=True,
            makes_work_dir=True,
        ),
        Command("codebook-info", "levels, occupancy and the largest clusters", f"{TOOLS}:run_codebook_info"),
        Command(
            "summary", "print and write DIR/summary.json, and the dataset card", f"{TOOLS}:run_summary", writes=True
        ),
        Command(
            "card",
            "write the dataset card of the align shards: DIR/README.md (Hugging Face, so "
            "load_dataset(DIR) finds them) and DIR/dataset.json",
            f"{TOOLS}:run_card",
            writes=True,
            config="YAML config: its `license` is the card's (default: the work dir's remembered config)",
        ),
        Command(
            "status",
            "per stage: shards current/stale/failed, failures, slowest shards (with --config: also "
            "what that config would redo)",
            f"{TOOLS}:run_status",
            config=CHECK_CONFIG_HELP,
        ),
        Command(
            "restore",
            "put back the outputs the last re-listing moved to DIR/_state/replaced/ (what they "
            "replace moves there in turn)",
            f"{TOOLS}:run_restore",
            config=None,
        ),
        Command(
            "errors",
            "list failed videos and crashed shards with their messages",
            f"{TOOLS}:run_errors",
            _errors,
            config=None,
            resolves_config=False,
        ),
        # writes its scripts into the work dir, which need not hold a run yet
        Command(
            "submit",
            "write (and submit) a Slurm job array for a stage; train on executor.slurm_nodes nodes",
            f"{TOOLS}:run_submit",
            _submit,
            makes_work_dir=True,
        ),
        Command(
            "gallery", "the visual words as thumbnail grids (HTML + PNG)", f"{TOOLS}:run_gallery", _gallery, writes=True
        ),
        Command("report", "one self-contained HTML report of the run", f"{TOOLS}:run_report", writes=True),
        Command(
            "export",
            "a checkpoint as a folder plain transformers loads (BertForPreTraining, AutoTokenizer "
            "with the visual words)",
            f"{TOOLS}:run_export",
            _export,
            config=None,
        ),
        Command(
            "validate",
            "check every output: schemas, checksums, lineage, invariants",
            f"{TOOLS}:run_validate",
            _validate,
            config=CHECK_CONFIG_HELP,
            work_dir_required=False,
            checks_layout=False,
            usage_problem=_validate_work_dir,
        ),
        Command(
            "run",
            "the whole pipeline in order (manifest, features with decode, kmeans, quantize, asr, align, "
            "then validate and summary), each stage skipping what is current",
            f"{WHOLE_RUN}:run_pipeline",
            _run,
            description="Every stage in order, each skipping what is current, as the stage commands one "
            "by one would run them; stops at the first stage that fails, with its exit code.",
            makes_work_dir=True,
            resolves_config=False,
        ),
        Command(
            "doctor",
            "every stage's preflight at once (models, weights, the work dir, the input): exit 0 only "
            "if the whole run can start",
            f"{WHOLE_RUN}:run_doctor",
            _doctor,
            work_dir_required=False,
            makes_work_dir=True,
        ),
        Command(
            "config",
            "the work dir's remembered config: show it, diff another against it, or list the "
            "configs commands that succeeded used here",
            f"{WHOLE_RUN}:run_config",
            _config,
            config="the config to diff against the remembered one (diff only)",
        ),
    )


def command(name: str) -> Command:
    return next(entry for entry in commands() if entry.name == name)


class _Parser(argparse.ArgumentParser):
    """argparse with a near miss named: `invalid choice: 'kmean' (...); did you mean kmeans?` (subcommands,
    eval tasks, submit's stage: every choice)."""

    def _check_value(self, action, value):
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as error:
            close = difflib.get_close_matches(str(value), [str(choice) for choice in action.choices or ()], n=1)
            if not close:
                raise
            raise argparse.ArgumentError(action, f"{error.message}; did you mean {close[0]}?") from None


def product_version() -> str:
    """The installed distribution's version (pyproject.toml's), or "unknown" outside an install."""
    from importlib import metadata

    try:
        return metadata.version("videobert-pipeline")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser(description: str = "") -> argparse.ArgumentParser:
    parser = _Parser(prog=program_name(), description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {product_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for entry in commands():
        sub = subparsers.add_parser(entry.name, help=entry.help, description=entry.description or entry.help)
        common_options(sub, entry.work_dir_required, entry.config)
        entry.arguments(sub)
    return parser
