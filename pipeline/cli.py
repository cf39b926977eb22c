"""`python -m pipeline COMMAND ...`: every stage and tool of the product.

    python -m pipeline STAGE --config FILE --work-dir DIR [--set key=value ...]
                             [--shard I --num-shards N] [--force] [--executor local|ray] [--quiet]

Stages, in run order: manifest (with --input), decode, features, kmeans, quantize, asr, align, train;
then eval (zero-shot, linear-probe, features, predict-video, captioning, forecast). YouCook II: youcook2-manifest (the manifest
from its annotations file) and youcook2-labels (verb/noun lists and labels from its captions). A stage redoes what is stale (its inputs or config changed since it ran) and skips what is
current. Exit codes: 0 done; 1 a shard failed or could not run, or a file is unreadable; 2 a usage or
config error; 3 the input holds no videos, or more videos failed than executor.max_failed_share allows;
141 the reader of the output stopped reading (`| head -1`)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from pipeline import registry
from pipeline.config import ConfigError, load_config
from pipeline.config_rules import check_devices

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_TOO_MANY_FAILED = 0, 1, 2, 3
EXIT_BROKEN_PIPE = 141   # the reader of stdout stopped reading (128 + SIGPIPE, as a shell reports it)
SHOWN_PROBLEMS = 5   # per stage run: failed or blocked shards listed one line each


REMEMBERED_HELP = ("YAML config (default: the config this work dir remembers, DIR/_state/config.json, recorded by the "
                   "last command that succeeded here; for a new work dir the built-in defaults, the paper's values)")
CHECK_CONFIG_HELP = ("check the outputs against this config too: shards made with other values are stale, "
                     "naming the key (default: only that the records agree with each other)")


def _common(parser: argparse.ArgumentParser, work_dir_required: bool = True, config: str | None = "") -> None:
    """--config/--work-dir/--set/--quiet. `config` is the help of --config and --set ("": a config that
    shapes what the command makes; None: the command takes no config)."""
    if config is not None:
        parser.add_argument("--config", help=config or REMEMBERED_HELP)
    parser.add_argument("--work-dir", required=work_dir_required,
                        help="where every stage writes: a folder, or a URL on object storage (s3://bucket/run1)")
    if config is not None:
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                            help="override a config value, e.g. --set decode.fps=25 (repeatable)")
    else:
        parser.set_defaults(config=None, set=[])
    parser.add_argument("--quiet", action="store_true", help="no progress bars or progress lines")


def _shard_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shard", type=int, help="this task's index (default: $SLURM_ARRAY_TASK_ID)")
    parser.add_argument("--num-shards", type=int, help="number of tasks (default: $SLURM_ARRAY_TASK_COUNT)")
    parser.add_argument("--force", action="store_true", help="redo shards even when they are current")
    parser.add_argument("--executor", choices=("local", "ray"), help="default: executor.kind from the config")
    parser.add_argument("--workers", type=int, help="local process pool size (default: executor.workers)")
    parser.add_argument("--ray-address", help="Ray cluster address ('auto' joins a running one)")


class _Parser(argparse.ArgumentParser):
    """argparse with a near miss named: `invalid choice: 'kmean' (...); did you mean kmeans?` (subcommands,
    eval tasks, submit's stage: every choice)."""

    def _check_value(self, action, value):
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as error:
            import difflib
            close = difflib.get_close_matches(str(value), [str(choice) for choice in action.choices or ()], n=1)
            if not close:
                raise
            raise argparse.ArgumentError(action, f"{error.message}; did you mean {close[0]}?") from None


def _program_name() -> str:
    """How the user called it: the console command (`videobert`) or `python -m pipeline`."""
    return "videobert" if sys.argv and Path(sys.argv[0]).name == "videobert" else "python -m pipeline"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=_program_name(), description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    for stage in registry.STAGES:
        help_text = f"{stage.summary} (reads {', '.join(stage.reads) or 'the input videos'}; writes {stage.writes})"
        sub = commands.add_parser(stage.name, help=help_text, description=help_text)
        _common(sub)
        if stage.name == "manifest":
            sub.add_argument("--input", required=True,
                             help="a folder (searched recursively) or a .txt/.csv/.parquet list of videos, local "
                                  "or on object storage (s3://, gs://, hf://)")
            sub.add_argument("--force", action="store_true",
                             help="assign every video a shard anew (default: listed videos keep theirs)")
            sub.add_argument("--allow-removal", action="store_true",
                             help="go on when the input no longer lists videos with finished outputs (asked on "
                                  "a terminal, refused off one); their outputs move to DIR/_state/replaced/")
        elif stage.name == "train":
            sub.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
            sub.add_argument("--restart", action="store_true",
                             help="move the existing checkpoints aside and train anew")
        elif stage.per_shard:
            _shard_options(sub)
        else:   # kmeans: one run for the collection, its subtrees in parallel
            sub.add_argument("--force", action="store_true", help="refit even when the codebook is current")
            sub.add_argument("--executor", choices=("local", "ray"), help="default: executor.kind")
            sub.add_argument("--workers", type=int, help="processes fitting subtrees (default: kmeans.workers)")
            sub.add_argument("--ray-address", help="Ray cluster address ('auto' joins a running one)")

    evaluate = commands.add_parser("eval", help="evaluate a trained VideoBERT")
    evaluate.add_argument("task", choices=("zero-shot", "linear-probe", "features", "predict-video",
                                           "captioning", "forecast"),
                          help="zero-shot: verb/noun classification (the paper's Table 1); linear-probe: the "
                               "supervised S3D row; features: downstream features; predict-video: visual words "
                               "for --sentence; captioning: YouCook II captions and their metrics (Table 4); forecast: "
                               "the top-3 visual words at later steps")
    _common(evaluate)
    evaluate.add_argument("--checkpoint", type=Path, help="default: the latest under DIR/train")
    evaluate.add_argument("--sentence", action="append", default=[], help="predict-video: a sentence (repeatable)")

    youcook_manifest = commands.add_parser(
        "youcook2-manifest", help="the manifest of the videos of a YouCook II annotations file (video_id = YouTube id)")
    _common(youcook_manifest)
    youcook_manifest.add_argument("--annotations", required=True, type=Path,
                                  help="youcookii_annotations_trainval.json (or a file in its format)")
    youcook_manifest.add_argument("--videos", required=True, type=Path,
                                  help="a folder holding the videos named by YouTube id (searched recursively)")
    youcook_manifest.add_argument("--subset", action="append", choices=("training", "validation", "testing"),
                                  help="only the videos of this subset (repeatable; default: all)")
    youcook_manifest.add_argument("--force", action="store_true", help="assign every video a shard anew")
    youcook_manifest.add_argument("--allow-removal", action="store_true",
                                  help="go on when the list no longer holds videos with finished outputs (asked "
                                       "on a terminal, refused off one); their outputs move to DIR/_state/replaced/")
    youcook_labels = commands.add_parser(
        "youcook2-labels", help="verb and noun lists and per-segment labels from YouCook II captions (POS tagger)")
    _common(youcook_labels)
    youcook_labels.add_argument("--annotations", required=True, type=Path)
    youcook_labels.add_argument("--out", type=Path, help="default: DIR/eval/youcook2")

    info = commands.add_parser("codebook-info", help="levels, occupancy and the largest clusters")
    _common(info)

    summary = commands.add_parser("summary", help="print and write DIR/summary.json, and the dataset card")
    _common(summary)

    card = commands.add_parser("card", help="write the dataset card of the align shards: DIR/README.md (Hugging "
                                            "Face, so load_dataset(DIR) finds them) and DIR/dataset.json")
    _common(card, config="YAML config: its `license` is the card's (default: the work dir's remembered config)")

    status = commands.add_parser("status", help="per stage: shards current/stale/failed, failures, slowest shards "
                                                "(with --config: also what that config would redo)")
    _common(status, config=CHECK_CONFIG_HELP)
    restore = commands.add_parser("restore", help="put back the outputs the last re-listing moved to "
                                                  "DIR/_state/replaced/ (what they replace moves there in turn)")
    _common(restore, config=None)
    errors = commands.add_parser("errors", help="list failed videos and crashed shards with their messages")
    _common(errors, config=None)
    errors.add_argument("--stage", help="only this stage's errors")

    submit = commands.add_parser("submit", help="write (and submit) a Slurm job array for a stage; train on "
                                                "executor.slurm_nodes nodes")
    submit.add_argument("stage", choices=tuple(name for name in registry.NAMES if name != "manifest") + ("pipeline",),
                        help="a stage, or `pipeline`: features, kmeans, quantize, asr and align as one afterok "
                             "chain (prints a `STAGE JOB_IDS` line each)")
    _common(submit)
    submit.add_argument("--executor", choices=("slurm",), default="slurm")
    submit.add_argument("--num-shards", type=int,
                        help="array tasks (default: one per manifest shard); more than the cluster's "
                             "MaxArraySize (or executor.slurm_max_array_size) are submitted as several array jobs")
    submit.add_argument("--array-parallelism", type=int, help="at most this many tasks at once")
    submit.add_argument("--after", action="append", default=[], metavar="JOB_ID",
                        help="start after this job succeeds (afterok; repeatable; ids joined by ':' as "
                             "submit prints them)")
    submit.add_argument("--dry-run", action="store_true", help="print the sbatch script(s), submit nothing")
    submit.add_argument("--only-incomplete", action="store_true",
                        help="only the tasks with a shard that is not current (a retry), numbered as before")
    submit.add_argument("--with-train", action="store_true", help="submit pipeline: train after align too")

    gallery = commands.add_parser("gallery", help="the visual words as thumbnail grids (HTML + PNG)")
    _common(gallery)
    gallery.add_argument("--level", type=int, default=1, help="tree level to show (1 = the top clusters)")
    gallery.add_argument("--clusters", type=int, default=12, help="the largest N nodes of the level")
    gallery.add_argument("--per-cluster", type=int, default=12, help="thumbnails per node")
    gallery.add_argument("--ids", type=int, nargs="*", help="these node ids instead of the largest")

    report = commands.add_parser("report", help="one self-contained HTML report of the run")
    _common(report)

    export = commands.add_parser("export", help="a checkpoint as a folder plain transformers loads "
                                                "(BertForPreTraining, AutoTokenizer with the visual words)")
    _common(export, config=None)
    export.add_argument("--checkpoint", type=Path, help="default: the latest under DIR/train")
    export.add_argument("out", type=Path, help="the folder to write")

    validate = commands.add_parser("validate", help="check every output: schemas, checksums, lineage, invariants")
    validate.add_argument("work_dir_positional", nargs="?", metavar="DIR",
                          help="the work dir, as --work-dir (kept for older scripts)")
    _common(validate, work_dir_required=False, config=CHECK_CONFIG_HELP)
    _add_whole_run_commands(commands)
    return parser


# ---------------------------------------------------------------- per-shard stages

def _failed_share(results: list[dict]) -> tuple[int, int]:
    """(videos with an error row, videos) over the shards of this run that completed."""
    done = [r for r in results if not r.get("failed") and not r.get("blocked")]
    return sum(r.get("failed_videos", 0) for r in done), sum(r.get("videos", 0) for r in done)


def _print_stage_summary(stage: str, results: list[dict], elapsed: float) -> None:
    ran = [r for r in results if not (r.get("skipped") or r.get("failed") or r.get("blocked"))]
    skipped = [r for r in results if r.get("skipped")]
    failed = [r for r in results if r.get("failed")]
    blocked = [r for r in results if r.get("blocked")]
    redone = [r for r in ran if r.get("redone")]
    videos = sum(r.get("videos", 0) for r in ran)
    clips = sum(r.get("clips", 0) for r in ran)
    errors: dict[str, int] = {}
    for r in ran:
        for name, count in r.get("error_types", {}).items():
            errors[name] = errors.get(name, 0) + count
    what = f" ({len(redone)} redone: stale or corrupt)" if redone else ""
    line = (f"{stage}: {len(ran)} shard(s) run{what}, {len(skipped)} already current, {len(failed)} failed"
            f"{f', {len(blocked)} could not run' if blocked else ''}; {videos} videos, {clips} clips in {elapsed:.1f}s")
    if errors:
        line += "; video errors: " + ", ".join(f"{name} x{count}" for name, count in errors.items())
    print(line, file=sys.stderr)
    several = [video for r in ran for video in r.get("several_streams") or []]
    if several:
        print(f"  {len(several)} video(s) hold several video streams (decoded: the one marked default, else the "
              f"longest; the videos table's video_stream says which): {', '.join(several[:SHOWN_PROBLEMS])}"
              f"{' ...' if len(several) > SHOWN_PROBLEMS else ''}", file=sys.stderr)
    _outcomes[stage] = (f"{len(ran)} shard(s) run, {len(skipped)} already current"
                        + (f", {len(failed) + len(blocked)} failed or could not run" if failed or blocked else ""))
    for r in redone[:SHOWN_PROBLEMS]:
        print(f"  {stage} part {r['shard']:05d} redone ({r['redone']})", file=sys.stderr)
    for r in failed[:SHOWN_PROBLEMS]:
        details = ", ".join(str(r[key]) for key in ("failure_record", "log") if r.get(key))
        print(f"  {stage} part {r['shard']:05d} FAILED: {r['error']} (details: {details or '-'})", file=sys.stderr)
    groups = _blocked_groups(blocked)
    for first, parts in groups[:SHOWN_PROBLEMS]:
        if len(parts) == 1:
            print(f"  {stage} part {parts[0]:05d} could not run: {first}", file=sys.stderr)
        else:
            listed = ", ".join(f"{part:05d}" for part in parts[:SHOWN_PROBLEMS]) + (" ..." if len(parts) > SHOWN_PROBLEMS else "")
            print(f"  {stage}: {len(parts)} parts could not run ({listed}), for the same reason as the first: "
                  f"{first}", file=sys.stderr)
    hidden = max(len(redone) - SHOWN_PROBLEMS, 0) + max(len(failed) - SHOWN_PROBLEMS, 0) + \
        sum(len(parts) for _, parts in groups[SHOWN_PROBLEMS:])
    if hidden:
        print(f"  ... and {hidden} more ({_program_name()} status --work-dir DIR)", file=sys.stderr)


def _blocked_groups(blocked: list[dict]) -> list[tuple[str, list[int]]]:
    """Shards that could not run for the same reason (their part numbers aside) as one entry: (the first
    one's message, the shards), the largest group first."""
    import re
    groups: dict[str, tuple[str, list[int]]] = {}
    for r in blocked:
        reason = re.sub(r"\bpart \d{5}\b", "part N", str(r["error"]))
        groups.setdefault(reason, (str(r["error"]), []))[1].append(r["shard"])
    return sorted(groups.values(), key=lambda group: -len(group[1]))


def run_stage(args, cfg) -> int:
    from pipeline.engine import runner
    from pipeline.engine.lineage import Lineage
    from pipeline.executors import dispatch

    for note in runner.prepare_stage(cfg, args.work_dir, args.command):
        print(f"  {note}", file=sys.stderr)
    shards = dispatch.select_shards(Lineage(args.work_dir).manifest_shards(), args.shard, args.num_shards)
    _preflight(args, cfg, shards)
    executor = dispatch.make_executor(cfg, args.executor, args.workers, args.ray_address)
    started = time.time()
    results = executor.run_shards(args.work_dir, args.command, shards, force=args.force, quiet=args.quiet)
    _print_stage_summary(args.command, results, time.time() - started)
    # outputs were made with this config (at least one shard done): it is the one to remember
    args.made_outputs = any(not (r.get("skipped") or r.get("failed") or r.get("blocked")) for r in results)
    if any(r.get("failed") or r.get("blocked") for r in results):
        return EXIT_FAILED
    failed, videos = _failed_share(results)
    if videos and failed / videos > cfg.executor.max_failed_share:
        print(f"{args.command}: {failed} of {videos} videos failed ({failed / videos:.0%}), more than "
              f"executor.max_failed_share={cfg.executor.max_failed_share:g}: see {_program_name()} errors "
              f"--work-dir {args.work_dir}", file=sys.stderr)
        return EXIT_TOO_MANY_FAILED
    return EXIT_OK


def _preflight(args, cfg, shards: list[int]) -> None:
    """Before the first shard: what the stage needs (weights, models, the hub) is there, unless every
    selected shard is current already. Raises preflight.PreflightError (one line)."""
    from pipeline import preflight
    from pipeline.engine.lineage import Lineage
    checker = Lineage(args.work_dir, cfg)
    stages = (args.command, *registry.stage(args.command).also_makes)
    if not any(args.force or not checker.state(stage, shard).current for stage in stages for shard in shards):
        return
    speech_needed = True
    if args.command == "asr":
        from pipeline.engine.manifest import read_manifest
        speech_needed = not all(read_manifest(args.work_dir, columns=["transcript_uri"])["transcript_uri"].to_pylist())
    preflight.check_stage(cfg, args.command, speech_needed=speech_needed)


# ---------------------------------------------------------------- commands

def run_manifest(args, cfg) -> int:
    from pipeline.engine.manifest import write_manifest

    path, table, changes = write_manifest(cfg, args.input, args.work_dir, incremental=not args.force,
                                          confirm_removal=_confirm_removal(args))
    shards = len(set(table["shard"].to_pylist()))
    _outcomes["manifest"] = (f"{table.num_rows} video(s) in {shards} shard(s)"
                             f"{', unchanged' if changes.get('unchanged') else ''}")
    if changes.get("unchanged"):
        print(f"manifest: unchanged, {table.num_rows} videos in {shards} shard(s) ({path})", file=sys.stderr)
        return EXIT_OK
    line = f"manifest: {table.num_rows} videos in {shards} shard(s) -> {path}"
    if changes["new_videos"] is not None:
        line += f"; {changes['new_videos']} new, {changes['removed_videos']} removed"
    changed = changes["changed_shards"]
    if changed and changes["new_videos"] is not None:
        listed = ", ".join(str(shard) for shard in changed[:10]) + (" ..." if len(changed) > 10 else "")
        line += f"; later stages redo shard(s) {listed}"
    updated = changes.get("updated_shards") or []
    if updated:
        listed = ", ".join(str(shard) for shard in updated[:10]) + (" ..." if len(updated) > 10 else "")
        line += f"; paths or transcripts changed in shard(s) {listed} (asr redoes those whose transcripts changed)"
    if changes.get("replaced"):
        line += f"; the outputs of the dropped videos' shards moved to {changes['replaced']}"
    print(line, file=sys.stderr)
    return EXIT_OK


def _confirm_removal(args):
    """--allow-removal says yes; a person at a terminal is asked; anything else (a batch job) is refused."""
    if args.allow_removal:
        return lambda message: True
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return None

    def ask(message: str) -> bool:
        print(f"{args.command}: {message}.", file=sys.stderr)
        print("Go on? [y/N] ", end="", file=sys.stderr, flush=True)   # stdout stays the command's output
        return sys.stdin.readline().strip().lower() in ("y", "yes")
    return ask


def run_restore(args, cfg) -> int:
    from pipeline.engine import replaced
    from pipeline.engine.workdir import WorkDir
    try:
        entry, aside, names = replaced.restore(WorkDir(args.work_dir))
    except LookupError as error:
        print(f"restore: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(f"restore: {len(names)} file(s) put back from {entry}"
          + (f"; what they replaced is in {aside}" if aside else ""), file=sys.stderr)
    return EXIT_OK


def run_kmeans(args, cfg) -> int:
    from pipeline.executors import dispatch
    from stages import kmeans
    executor = dispatch.make_executor(cfg, args.executor, args.workers or cfg.kmeans.workers or None,
                                       args.ray_address)
    stats = kmeans.run(cfg, args.work_dir, executor, force=args.force, quiet=args.quiet)
    _outcomes["kmeans"] = "the codebook is current" if stats.get("skipped") else "codebook fitted"
    if stats.get("skipped"):
        print(f"kmeans: the codebook is current ({stats['codebook']})", file=sys.stderr)
    else:
        print(json.dumps(stats, indent=2, default=str), file=sys.stderr)
    return EXIT_OK


def run_train(args, cfg) -> int:
    from pipeline import preflight
    from pipeline.engine.workdir import WorkDir
    from videobert import train
    if args.restart or not any(WorkDir(args.work_dir).checkpoints.glob("*")):   # a resumed run loads its own
        preflight.check_stage(cfg, "train")
    stats = train.train(cfg, args.work_dir, resume=args.resume, restart=args.restart, quiet=args.quiet)
    print(json.dumps(stats, indent=2, default=str), file=sys.stderr)
    return EXIT_OK


def run_eval(args, cfg) -> int:
    from videobert.eval import evaluate
    if args.task == "zero-shot":
        from videobert.eval import zero_shot
        zero_shot.zero_shot(cfg, args.work_dir, checkpoint=args.checkpoint, quiet=args.quiet)
    elif args.task == "linear-probe":
        from videobert.eval import probe
        probe.linear_probe(cfg, args.work_dir, quiet=args.quiet)
    elif args.task == "features":
        print(evaluate.extract_features(cfg, args.work_dir, checkpoint=args.checkpoint))
    elif args.task == "captioning":
        from videobert.eval import captioning
        captioning.run_captioning(cfg, args.work_dir, checkpoint=args.checkpoint, quiet=args.quiet)
    elif args.task == "forecast":
        from videobert.eval import forecast
        report = forecast.forecast(cfg, args.work_dir, checkpoint=args.checkpoint)
        for word in report["words"]:
            print(f"v{word['leaf']}: " + "; ".join(
                f"+{report['horizons'][step]['label']}: " + ", ".join(f"v{f['leaf']} {f['prob']:.2f}" for f in found)
                for step, found in word["forecasts"].items()))
        if not args.quiet:
            forecast.print_accuracy(report)
    else:
        if not args.sentence:
            print("eval predict-video: give at least one --sentence", file=sys.stderr)
            return EXIT_USAGE
        path = evaluate.predict_video(cfg, args.work_dir, args.sentence, checkpoint=args.checkpoint)
        _print_predictions(path)
    return EXIT_OK


def run_youcook2(args, cfg) -> int:
    from videobert.eval import youcook2
    if args.command == "youcook2-manifest":
        path, table, found = youcook2.write_manifest(cfg, args.annotations, args.videos, args.work_dir,
                                                     subsets=args.subset, incremental=not args.force,
                                                     confirm_removal=_confirm_removal(args))
        line = (f"youcook2-manifest: {table.num_rows} of {found['annotated']} annotated videos in "
                f"{len(set(table['shard'].to_pylist()))} shard(s) -> {path}")
        if found["missing"]:
            shown = ", ".join(found["missing"][:10]) + (" ..." if len(found["missing"]) > 10 else "")
            line += f"; {len(found['missing'])} not in {args.videos}: {shown}"
        if found.get("replaced"):
            line += f"; the outputs of the dropped videos' shards moved to {found['replaced']}"
        print(line, file=sys.stderr)
    else:
        out = args.out or youcook2.labels_folder(args.work_dir)
        summary = youcook2.write_labels(cfg, args.annotations, out)
        print(f"youcook2-labels: {len(summary['verbs'])} verbs, {len(summary['nouns'])} nouns from the "
              f"{', '.join(summary['list_subsets'])} captions, labels of {summary['segments']} segments -> {out}",
              file=sys.stderr)
        print(f"  verbs: {', '.join(list(summary['verbs'])[:15])}{' ...' if len(summary['verbs']) > 15 else ''}",
              file=sys.stderr)
        print(f"  nouns: {', '.join(list(summary['nouns'])[:15])}{' ...' if len(summary['nouns']) > 15 else ''}",
              file=sys.stderr)
    return EXIT_OK


def run_validate(args, cfg) -> int:
    from reports import validate
    problems = validate.validate_work_dir(args.work_dir, cfg if args.config or args.set else None)
    if problems:
        print(f"INVALID: {problems[0]}", file=sys.stderr)
        for problem in problems[1:20]:
            print(f"  also: {problem}", file=sys.stderr)
        if len(problems) > 20:
            print(f"  ... and {len(problems) - 20} more", file=sys.stderr)
        return EXIT_FAILED
    _outcomes["validate"] = "valid"
    print(f"valid: every output under {args.work_dir} matches its schema, checksums, lineage and invariants",
          file=sys.stderr)
    return EXIT_OK


def run_tool(args, cfg) -> int:
    command = args.command
    if command == "codebook-info":
        from stages import kmeans
        print(kmeans.codebook_info(args.work_dir))
    elif command == "summary":
        from reports import card, summary
        print(summary.render(summary.write_summary(args.work_dir)))
        try:   # the card stays current with the run the summary describes
            path, _ = card.write_card(args.work_dir, cfg.license)
            print(f"dataset card: {path}", file=sys.stderr)
        except card.CardError as error:
            print(f"dataset card not written: {error}", file=sys.stderr)
    elif command == "card":
        from reports import card
        try:
            for path in card.write_card(args.work_dir, cfg.license):
                print(path)
        except card.CardError as error:
            print(f"card: {error}", file=sys.stderr)
            return EXIT_FAILED
    elif command == "status":
        from reports import status
        print(status.status_text(args.work_dir, cfg if args.config or args.set else None))
    elif command == "errors":
        from reports import status
        print(status.errors_text(args.work_dir, args.stage))
        if status.crashed_shards(args.work_dir, args.stage):
            return EXIT_FAILED   # a shard crashed: the run is not done (failed videos alone are reported, exit 0)
    elif command == "gallery":
        from reports import gallery
        for path in gallery.write_gallery(cfg, args.work_dir, level=args.level, clusters=args.clusters,
                                          per_cluster=args.per_cluster, node_ids=args.ids, quiet=args.quiet):
            print(path)
    elif command == "report":
        from reports import report
        print(report.write_report(cfg, args.work_dir))
    elif command == "submit":
        from pipeline.executors import slurm
        return slurm.submit(cfg, args)
    else:
        raise AssertionError(command)
    return EXIT_OK


# the commands that write into the work dir (submit writes only with sbatch present; validate, status and
# errors only read)
WRITING_COMMANDS = set(registry.NAMES) | {"eval", "summary", "card", "gallery", "report", "youcook2-manifest",
                                          "youcook2-labels"}
def run_export(args, cfg) -> int:
    from videobert import export
    print(export.export(args.work_dir, args.out, args.checkpoint))
    return EXIT_OK


COMMANDS = {"manifest": run_manifest, "restore": run_restore, "kmeans": run_kmeans, "train": run_train, "eval": run_eval,
            "export": run_export,
            "youcook2-manifest": run_youcook2, "youcook2-labels": run_youcook2,
            "validate": run_validate, **{name: run_stage for name in registry.SHARD_STAGES}}


# the commands that take no config (errors): the work dir's remembered config is neither read nor written
CONFIGLESS_COMMANDS = {"errors"}


def _command_config(args):
    """The config the command runs with: --config and --set, or without --config the work dir's remembered
    config with --set on top; the notes about it (which one, what differs from the remembered) printed."""
    from pipeline import remembered
    from pipeline.config import check_given_once
    if args.command in CONFIGLESS_COMMANDS:
        return load_config(None, [])
    check_given_once(getattr(args, "set", None) or [])   # --set a=1 --set a=2: which one did the user mean?
    cfg, notes = remembered.resolve(args, writes=args.command in WRITING_COMMANDS)
    args.config_differs = any(note.startswith(remembered.DIFFERS) for note in notes)
    for note in notes:
        if _run_notes is not None:   # inside `run`: each note once, not once per stage
            if note in _run_notes:
                continue
            _run_notes.add(note)
        if not (args.quiet and note.startswith("config: this work dir's")):
            print(note, file=sys.stderr)
    return cfg


def _remember_config(args, cfg) -> None:
    if args.command not in CONFIGLESS_COMMANDS:
        from pipeline import remembered
        try:
            remembered.record(args.work_dir, cfg, args.command)
        except OSError as error:   # best effort: a full disk was already reported by the command itself
            logging.getLogger("pipeline").warning("the work dir's config was not recorded: %s", error)


# the commands that make a work dir (the manifests), or write into one that need not hold a run yet
# (youcook2-labels' lists, submit's scripts): the others refuse a work dir that does not exist
MAKES_WORK_DIR = {"manifest", "youcook2-manifest", "youcook2-labels", "submit"}


def _missing_work_dir(args) -> str | None:
    """One line when the command needs an existing local work dir and --work-dir names none (a typo must
    not become a new, empty work dir)."""
    from pipeline import storage
    if args.command in MAKES_WORK_DIR or args.work_dir is None:
        return None
    where = storage.location(args.work_dir)
    if storage.is_remote(where) or where.exists():
        return None
    return (f"{args.command}: cannot run: the work dir {args.work_dir} does not exist: run the manifest stage first "
            f"({_program_name()} manifest --work-dir {args.work_dir} --input VIDEOS)")


def _configure_logging(quiet: bool, as_program: bool = True) -> None:
    """Log lines start with the same ISO 8601 time as progress lines, and are written above a progress bar
    (through tqdm), never over it; run as the program, Python warnings go the same way."""
    from pipeline.progress import timestamp

    class Formatter(logging.Formatter):
        def formatTime(self, record, datefmt=None):
            return timestamp(record.created)

    class AboveProgressBars(logging.StreamHandler):
        def emit(self, record):
            try:
                from tqdm import tqdm
                tqdm.write(self.format(record), file=sys.stderr)
            except Exception:  # noqa: BLE001 - logging's own policy for a failed emit
                self.handleError(record)

    handler = AboveProgressBars()
    handler.setFormatter(Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, handlers=[handler])
    if as_program:   # a process-wide switch: not flipped by a call from Python (tests, notebooks)
        logging.captureWarnings(True)


EXIT_INTERRUPTED = 130   # 128 + SIGINT, as shells report it


def _interrupted(command: str) -> int:
    print(f"{command or 'pipeline'}: interrupted; rerun the same command to continue (finished shards are kept, "
          f"the one cut short is redone)", file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


def _end_on_interrupt() -> None:
    """SIGINT (Ctrl-C) ends the program like SIGTERM does, at once and without a traceback, after one line:
    outputs appear only complete (a temporary name, then a rename), so nothing half-written is left; the
    pool's worker processes end with it."""
    import multiprocessing
    import os
    import signal

    def handler(signum, frame):
        for child in multiprocessing.active_children():
            child.terminate()
        command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), "")
        _interrupted(command)
        os._exit(EXIT_INTERRUPTED)

    signal.signal(signal.SIGINT, handler)


def dispatch(args, cfg) -> int:
    return COMMANDS.get(args.command, run_tool)(args, cfg)


def main(argv: list[str] | None = None) -> int:
    from pipeline import storage
    from pipeline.engine.lineage import CorruptFile, InputNotReady
    from pipeline.engine.manifest import ManifestError, NoVideos
    from pipeline.engine.workdir import LayoutError, WorkDir
    from pipeline.registry import PreflightError
    from schemas.codebook import CorruptCodebook
    from videobert.checkpoints import TrainingDiverged, TrainingLocked

    if argv is None:   # run as the program (not called from Python): Ctrl-C ends it in one line
        _end_on_interrupt()
    args = build_parser().parse_args(argv)
    _configure_logging(args.quiet, as_program=argv is None)
    logging.getLogger("faiss").setLevel(logging.WARNING)   # its loader's INFO lines are noise here
    for client in ("botocore", "aiobotocore"):    # "Found credentials in environment variables", ...
        logging.getLogger(client).setLevel(logging.WARNING)
    problem = _option_problem(args)
    if problem:
        print(f"{args.command}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "validate":
        if args.work_dir and args.work_dir_positional and args.work_dir != args.work_dir_positional:
            print(f"validate: two work dirs given ({args.work_dir_positional} and --work-dir {args.work_dir}): "
                  f"give one", file=sys.stderr)
            return EXIT_USAGE
        args.work_dir = args.work_dir or args.work_dir_positional
        if args.work_dir is None:
            print(f"validate: give the work dir ({_program_name()} validate --work-dir DIR)", file=sys.stderr)
            return EXIT_USAGE
    try:
        cfg = _command_config(args)
        if (getattr(args, "executor", None) or cfg.executor.kind) != "ray":   # Ray: the workers' GPUs
            check_devices(cfg, args.command)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return EXIT_USAGE
    except storage.remote_error_types() as error:   # the remembered config sits on an unreachable store
        line = storage.remote_error_line(error, args.work_dir, getattr(args, "input", None))
        print(f"{args.command}: error: {line}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as error:
        if not _store_refused(error, args):
            raise
        print(f"{args.command}: error: {_store_line(error, args)}", file=sys.stderr)
        return EXIT_FAILED
    blocker = _file_in_the_way(args.work_dir)
    if blocker is not None:
        print(f"{args.command}: --work-dir {args.work_dir}: {blocker} is a file, not a folder: give a folder "
              f"(one that does not exist yet is made)", file=sys.stderr)
        return EXIT_USAGE
    missing = _missing_work_dir(args)
    if missing:
        print(missing, file=sys.stderr)
        return EXIT_FAILED
    left_empty = _folders_made_by(args)
    try:
        if args.command not in ("manifest", "youcook2-manifest", "validate") and args.work_dir is not None:
            WorkDir(args.work_dir).check_layout()
        if args.command in WRITING_COMMANDS:
            WorkDir(args.work_dir).check_writable()
        code = dispatch(args, cfg)
        if args.command in WRITING_COMMANDS and (code == EXIT_OK or getattr(args, "made_outputs", False)):
            # what its outputs were made with: a refused config, or one every shard failed with, is not
            _remember_config(args, cfg)
        return code
    except storage.remote_error_types() as error:   # an unreachable endpoint, no credentials, a refused request
        line = storage.remote_error_line(error, args.work_dir, getattr(args, "input", None))
        print(f"{args.command}: error: {line}", file=sys.stderr)
        return EXIT_FAILED
    except NoVideos as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_TOO_MANY_FAILED
    except PreflightError as error:
        print(f"{args.command}: cannot start: {error}", file=sys.stderr)
        return EXIT_USAGE
    except ConfigError as error:   # found after loading (a value the command needs is not set, train's init checkpoint)
        print(f"{args.command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (TrainingDiverged, TrainingLocked) as error:
        print(f"{args.command}: {error}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return _interrupted(args.command)
    except (InputNotReady, CorruptFile, CorruptCodebook, storage.UnreadableFile, LayoutError, ManifestError) as error:
        print(f"{args.command}: cannot run: {error}", file=sys.stderr)
        if isinstance(error, InputNotReady) and getattr(args, "config_differs", False):
            print("  (the config given differs from the one this work dir's outputs were made with, named "
                  "above: leave out --config and --set to go on with that one)", file=sys.stderr)
        return EXIT_FAILED
    except (FileExistsError, ValueError) as error:
        print(f"{args.command}: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as error:
        if _store_refused(error, args):
            print(f"{args.command}: error: {_store_line(error, args)}", file=sys.stderr)
            return EXIT_FAILED
        hint = storage.disk_error_hint(error)
        if hint is None and not isinstance(error, FileNotFoundError):
            raise
        where = f"{error.filename}: " if error.filename else ""
        bucket = storage.bucket_of(args.work_dir) if args.work_dir else None
        on = f" (object storage: bucket {bucket})" if bucket else ""
        print(f"{args.command}: error: {where}{error.strerror or error}{on}" + (f" ({hint})" if hint else ""),
              file=sys.stderr)
        return EXIT_FAILED
    finally:
        _remove_if_empty(left_empty)


def _folders_made_by(args) -> list[Path]:
    """The local work dir and its _state/ folder where they do not exist yet (the writable check makes
    them): a command that fails before writing anything must not leave them behind, empty."""
    from pipeline import storage
    from pipeline.engine.workdir import WorkDir
    if args.work_dir is None or args.command not in WRITING_COMMANDS or storage.is_url(str(args.work_dir)):
        return []
    work = WorkDir(args.work_dir)
    return [folder for folder in (work.state, Path(work.root)) if not folder.exists()]


def _remove_if_empty(folders: list[Path]) -> None:
    for folder in folders:   # the innermost first
        try:
            folder.rmdir()   # only an empty folder goes
        except OSError:
            pass


def _store_refused(error: OSError, args) -> bool:
    """An OSError an object-storage client made of a refused request (s3fs: wrong credentials, no
    permission: a PermissionError without an errno), while the input or the work dir is on a store."""
    from pipeline import storage
    places = (getattr(args, "work_dir", None), getattr(args, "input", None))
    return isinstance(error, PermissionError) and error.errno is None and any(place is not None and storage.is_url(str(place)) and
                                       not str(place).startswith("file:") for place in places)


def _store_line(error: OSError, args) -> str:
    from pipeline import storage
    line = storage.remote_error_line(error, getattr(args, "work_dir", None), getattr(args, "input", None))
    if isinstance(error, PermissionError):
        line += " (check the store's credentials, e.g. AWS_ACCESS_KEY_ID / AWS_PROFILE, and the bucket's permissions)"
    return line


def _option_problem(args) -> str | None:
    """A --shard, --num-shards, --workers or --array-parallelism that no run can take, in one line."""
    from pipeline.config_fields import MAX_WORKERS

    workers = getattr(args, "workers", None)
    if workers is not None and not 0 <= workers <= MAX_WORKERS:
        return f"--workers must be >= 0 and <= {MAX_WORKERS} (0: the config's value) (got {workers})"
    for option in ("num_shards", "array_parallelism"):
        value = getattr(args, option, None)
        if value is not None and value < 1:
            return f"--{option.replace('_', '-')} must be >= 1 (got {value})"
    if hasattr(args, "shard"):
        from pipeline.executors.dispatch import shard_problem
        return shard_problem(args.shard, args.num_shards)
    return None


def _file_in_the_way(work_dir) -> Path | None:
    """The regular file a local --work-dir is, or lies under (nothing could be written into it)."""
    from pipeline import storage
    if work_dir is None or storage.is_url(str(work_dir)):
        return None
    path = Path(work_dir)
    for place in (path, *path.parents):
        if place.exists():
            return None if place.is_dir() else place
    return None


# ---------------------------------------------------------------- run, doctor, config

# the stages `run` runs, in order (features also writes decode's outputs, in the same read of each video)
RUN_STAGES = ("manifest", "features", "kmeans", "quantize", "asr", "align")
# the stages whose preflight `doctor` checks (and `run` before its first stage)
CHECKED_STAGES = ("features", "asr", "align", "train")
_outcomes: dict[str, str] = {}   # command -> what it did, one phrase (set by the stage commands for `run`)
_run_notes: set[str] | None = None   # while `run` runs its stages: the config notes already printed


def _add_whole_run_commands(commands) -> None:
    run = commands.add_parser(
        "run", help="the whole pipeline in order (manifest, features with decode, kmeans, quantize, asr, align, "
                    "then validate and summary), each stage skipping what is current",
        description="Every stage in order, each skipping what is current, as the stage commands one by one would "
                    "run them; stops at the first stage that fails, with its exit code.")
    _common(run)
    run.add_argument("--input", required=True, help="the videos: a folder (searched recursively) or a list file")
    run.add_argument("--force", action="store_true", help="redo every stage even where it is current")
    run.add_argument("--workers", type=int, help="local process pool size (default: executor.workers)")
    doctor = commands.add_parser(
        "doctor", help="every stage's preflight at once (models, weights, the work dir, the input): exit 0 only "
                       "if the whole run can start")
    _common(doctor, work_dir_required=False)
    doctor.add_argument("--input", help="the videos the run will read (checked to exist)")
    config = commands.add_parser("config", help="the work dir's remembered config: show it, diff another against "
                                                "it, or list the configs commands that succeeded used here")
    config.add_argument("action", choices=("show", "diff", "history"),
                        help="show: the remembered config (YAML); diff: --config/--set against it (without "
                             "them: against the one before it); history: one line per config used")
    _common(config, config="the config to diff against the remembered one (diff only)")


def _stage_argv(args, stage: str) -> list[str]:
    argv = [stage, "--work-dir", str(args.work_dir)]
    if args.config:
        argv += ["--config", str(args.config)]
    for value in args.set:
        argv += ["--set", value]
    if args.quiet:
        argv.append("--quiet")
    if stage == "manifest":
        argv += ["--input", str(args.input)]
    if args.force:
        argv.append("--force")
    if args.workers is not None and stage != "manifest":
        argv += ["--workers", str(args.workers)]
    return argv


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _refuse(header: str, problems: list[str]) -> int:
    """The problems that stop a run before it starts: a header line, then one line each; usage exit."""
    print(header, file=sys.stderr)
    for line in problems:
        print(f"  {line}", file=sys.stderr)
    return EXIT_USAGE


def run_pipeline(args, cfg) -> int:
    """`run`: the stage commands one by one (each as if typed, so the same shards, records and exit codes),
    after one preflight of every stage that has work to do; a table of what each did at the end."""
    from pipeline import remembered
    started = time.time()
    cfg, _ = remembered.resolve(args, writes=True)   # the config the stages will resolve, as they will
    problems = _doctor_problems(cfg, args.work_dir, args.input, stages=("features", "asr", "align"))
    if problems:
        return _refuse(f"run: cannot start ({_count(len(problems), 'problem')}, nothing was run):", problems)
    steps = [*RUN_STAGES, "validate", "summary"]
    done: list[tuple[str, int, float, str]] = []
    global _run_notes
    _run_notes = set()
    try:
        code = _run_steps(args, steps, done)
    finally:
        _run_notes = None
    _print_run_table(args, steps, done, code, time.time() - started)
    return code


def _run_steps(args, steps: list[str], done: list) -> int:
    """The steps one by one, each as its own command, until one fails: its exit code (0 when none did)."""
    code = EXIT_OK
    for number, stage in enumerate(steps, 1):
        if not args.quiet:
            print(f"run: [{number}/{len(steps)}] {stage}", file=sys.stderr, flush=True)
        argv = (["validate", "--work-dir", str(args.work_dir)] if stage == "validate" else
                ["summary", "--work-dir", str(args.work_dir), "--quiet"] if stage == "summary" else
                _stage_argv(args, stage))
        _outcomes.pop(stage, None)
        stage_started = time.time()
        code = main(argv)
        done.append((stage, code, time.time() - stage_started, _outcomes.get(stage, "")))
        if code != EXIT_OK:
            break
    return code


def _print_run_table(args, steps: list[str], done: list, code: int, seconds: float) -> None:
    shown = _program_name()
    width = max(len(stage) for stage in steps)
    verdict = "done" if code == EXIT_OK else f"stopped at {done[-1][0]} (exit {code})"
    print(f"run: {verdict} in {seconds:.1f}s, work dir {args.work_dir}", file=sys.stderr)
    for stage, stage_code, stage_seconds, outcome in done:
        status = outcome or ("ok" if stage_code == EXIT_OK else f"exit {stage_code}")
        print(f"  {stage:<{width}} {stage_seconds:7.1f}s  {status}", file=sys.stderr)
    if code == EXIT_OK:
        print(f"next: {shown} train --work-dir {args.work_dir} --resume, then {shown} report --work-dir "
              f"{args.work_dir}", file=sys.stderr)
    elif code != EXIT_USAGE:
        print(f"  what failed: {shown} errors --work-dir {args.work_dir}; rerun the same command to go on "
              f"(finished shards are kept)", file=sys.stderr)


def _doctor_problems(cfg, work_dir, input_path=None, stages=CHECKED_STAGES) -> list[str]:
    """Every reason the run cannot start, one line each: a model or weights that cannot load (each stage's
    preflight, for the stages that have work to do), a work dir that cannot be written, an input that is
    not there."""
    import os

    from pipeline import preflight, storage
    from pipeline.engine.lineage import Lineage
    from pipeline.engine.workdir import WorkDir
    from pipeline.packaging import collisions
    problems = collisions()   # another distribution owning one of the product's top-level package names
    if input_path is not None and not storage.is_url(str(input_path)) and not Path(input_path).exists():
        problems.append(f"--input {input_path}: no such file or folder")
    if work_dir is not None and not storage.is_url(str(work_dir)):
        place = Path(work_dir)
        existing = next((p for p in (place, *place.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            problems.append(f"--work-dir {work_dir}: {existing} is a file, not a folder")
        elif existing is not None and not os.access(existing, os.W_OK | os.X_OK):
            problems.append(f"--work-dir {work_dir}: {existing} is not writable here")
    checker = None
    if work_dir is not None and (storage.is_remote(storage.location(work_dir)) or
                                 WorkDir(work_dir).manifest.exists()):
        checker = Lineage(work_dir, cfg)
    for stage in stages:
        speech_needed = True
        if checker is not None and stage != "train":
            try:   # a stage with nothing to do needs nothing (as the stage itself decides)
                if all(state.current for state in checker.stage_states(stage).values()):
                    continue
                if stage == "asr":
                    from pipeline.engine.manifest import read_manifest
                    uris = read_manifest(work_dir, columns=["transcript_uri"])["transcript_uri"].to_pylist()
                    speech_needed = not all(uris)
            except Exception:  # noqa: BLE001 - an unreadable run is the stage's to report; check everything
                pass
        try:
            preflight.check_stage(cfg, stage, speech_needed=speech_needed)
        except preflight.PreflightError as error:
            problems.append(f"{stage}: {error}")
    return problems


def run_doctor(args, cfg) -> int:
    from pipeline import remembered
    cfg, _ = remembered.resolve(args, writes=args.work_dir is not None)   # the work dir's, as a stage's
    problems = _doctor_problems(cfg, args.work_dir, args.input)
    where = f" for {args.work_dir}" if args.work_dir else ""
    if problems:
        return _refuse(f"doctor: the run cannot start{where}: {_count(len(problems), 'problem')}", problems)
    print(f"doctor: ok{where}: every stage ({', '.join(CHECKED_STAGES)}) can start with this config",
          file=sys.stderr)
    return EXIT_OK


def run_config(args, cfg) -> int:
    from pipeline import remembered
    if args.action == "show":
        text = remembered.show(args.work_dir)
    elif args.action == "history":
        text = remembered.history_text(args.work_dir)
    else:
        given = cfg if (args.config or args.set) else None
        text = remembered.diff_text(args.work_dir, given)
    if text is None:
        print(f"config: {args.work_dir} remembers no config yet (a command that wrote there and succeeded "
              f"records it)", file=sys.stderr)
        return EXIT_FAILED
    print(text)
    return EXIT_OK


COMMANDS.update({"run": run_pipeline, "doctor": run_doctor, "config": run_config})
# run's stages resolve, check and remember their own config; doctor and config only read
CONFIGLESS_COMMANDS.add("run")
MAKES_WORK_DIR.update({"run", "doctor"})


def _print_predictions(path) -> None:
    """predict-video's answer: each sentence with the visual words predicted for it (their probabilities),
    then where the table is."""
    from pipeline import storage
    for row in storage.read_table(path).to_pylist():
        words = ", ".join(f"v{leaf} {prob:.2f}" for leaf, prob in zip(row["visual_ids"], row["probs"]))
        print(f"{row['sentence']!r}: {words}")
    print(f"(visual word ids are codebook leaves: `gallery --ids` shows their clips) -> {path}")
