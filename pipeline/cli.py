"""`python -m pipeline COMMAND ...`: every stage and tool of the product.

    python -m pipeline STAGE --config FILE --work-dir DIR [--set key=value ...]
                             [--shard I --num-shards N] [--force] [--executor local|ray] [--quiet]

STAGE is manifest (with --input), decode, features, kmeans, quantize, asr, align, train or eval."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from pipeline.config import SHARD_STAGES, ConfigError, load_config


def _common(parser: argparse.ArgumentParser, work_dir_required: bool = True) -> None:
    parser.add_argument("--config", help="YAML config (default: the built-in defaults, the paper's values)")
    parser.add_argument("--work-dir", required=work_dir_required, type=Path, help="where every stage writes")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set decode.fps=25 (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars or progress lines")


def _shard_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shard", type=int, help="this task's index (default: $SLURM_ARRAY_TASK_ID)")
    parser.add_argument("--num-shards", type=int, help="number of tasks (default: $SLURM_ARRAY_TASK_COUNT)")
    parser.add_argument("--force", action="store_true", help="redo shards that have a completion record")
    parser.add_argument("--executor", choices=("local", "ray"), help="default: executor.kind from the config")
    parser.add_argument("--workers", type=int, help="local process pool size (default: executor.workers)")
    parser.add_argument("--ray-address", help="Ray cluster address ('auto' joins a running one)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    manifest = commands.add_parser("manifest", help="list the input videos and assign shards")
    _common(manifest)
    manifest.add_argument("--input", required=True, type=Path,
                          help="a folder (searched recursively) or a .txt/.csv/.parquet list of videos")
    manifest.add_argument("--force", action="store_true", help="rewrite an existing manifest")

    for stage in SHARD_STAGES + ("kmeans",):
        sub = commands.add_parser(stage, help=f"run the {stage} stage")
        _common(sub)
        _shard_options(sub)

    train = commands.add_parser("train", help="train the bundled VideoBERT on DIR/align")
    _common(train)
    train.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")

    evaluate = commands.add_parser("eval", help="evaluate a trained VideoBERT")
    evaluate.add_argument("task", choices=("zero-shot", "features", "predict-video"))
    _common(evaluate)
    evaluate.add_argument("--checkpoint", type=Path, help="default: the latest under DIR/train")
    evaluate.add_argument("--sentence", action="append", default=[], help="predict-video: a sentence (repeatable)")

    info = commands.add_parser("codebook-info", help="levels, occupancy and the largest clusters")
    _common(info)

    summary = commands.add_parser("summary", help="print and write DIR/summary.json")
    _common(summary)

    status = commands.add_parser("status", help="per stage: shards done/total, failures, slowest shards")
    _common(status)
    errors = commands.add_parser("errors", help="list failed videos with their messages")
    _common(errors)
    errors.add_argument("--stage", help="only this stage's errors")

    submit = commands.add_parser("submit", help="write (and submit) a Slurm job array for a stage")
    submit.add_argument("stage", choices=SHARD_STAGES + ("kmeans", "train"))
    _common(submit)
    submit.add_argument("--executor", choices=("slurm",), default="slurm")
    submit.add_argument("--num-shards", type=int, required=True, help="array tasks")
    submit.add_argument("--array-parallelism", type=int, help="at most this many tasks at once")
    submit.add_argument("--after", action="append", default=[], metavar="JOB_ID",
                        help="start after this job succeeds (afterok; repeatable)")
    submit.add_argument("--dry-run", action="store_true", help="print the sbatch script, submit nothing")

    gallery = commands.add_parser("gallery", help="the visual words as thumbnail grids (HTML + PNG)")
    _common(gallery)
    gallery.add_argument("--level", type=int, default=1, help="tree level to show (1 = the top clusters)")
    gallery.add_argument("--clusters", type=int, default=12, help="the largest N nodes of the level")
    gallery.add_argument("--per-cluster", type=int, default=12, help="thumbnails per node")
    gallery.add_argument("--ids", type=int, nargs="*", help="these node ids instead of the largest")

    report = commands.add_parser("report", help="one self-contained HTML report of the run")
    _common(report)

    validate = commands.add_parser("validate", help="check every output against its schema and invariants")
    validate.add_argument("work_dir_positional", nargs="?", type=Path, metavar="DIR")
    _common(validate, work_dir_required=False)
    return parser


def _print_stage_summary(stage: str, results: list[dict], elapsed: float) -> None:
    ran = [r for r in results if not r.get("skipped") and not r.get("failed")]
    skipped = [r for r in results if r.get("skipped")]
    failed = [r for r in results if r.get("failed")]
    videos = sum(r.get("videos", 0) for r in ran)
    clips = sum(r.get("clips", 0) for r in ran)
    errors: dict[str, int] = {}
    for r in ran:
        for name, count in r.get("error_types", {}).items():
            errors[name] = errors.get(name, 0) + count
    line = (f"{stage}: {len(ran)} shard(s) run, {len(skipped)} already complete, {len(failed)} failed; "
            f"{videos} videos, {clips} clips in {elapsed:.1f}s")
    if errors:
        line += "; video errors: " + ", ".join(f"{name} x{count}" for name, count in errors.items())
    print(line, file=sys.stderr)
    for r in failed:
        print(f"  shard {r['shard']} FAILED: {r['error']}\n{r.get('traceback', '')}", file=sys.stderr)


def run_stage(args, cfg) -> int:
    from pipeline import executors, runner
    manifest = runner.read_manifest(args.work_dir, columns=["shard"])
    shards = executors.select_shards(runner.manifest_shards(manifest), args.shard, args.num_shards)
    executor = executors.make_executor(cfg, args.executor, args.workers, args.ray_address)
    started = time.time()
    results = executor.run_shards(args.work_dir, args.command, shards, force=args.force, quiet=args.quiet)
    _print_stage_summary(args.command, results, time.time() - started)
    return 1 if any(r.get("failed") for r in results) else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("faiss").setLevel(logging.WARNING)   # its loader's INFO lines are noise here
    if args.command == "validate":
        args.work_dir = args.work_dir or args.work_dir_positional
        if args.work_dir is None:
            print("validate: give the work dir (python -m pipeline validate DIR)", file=sys.stderr)
            return 2
    try:
        cfg = load_config(args.config, args.set)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    try:
        return dispatch(args, cfg)
    except (FileNotFoundError, FileExistsError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def dispatch(args, cfg) -> int:
    command = args.command
    if command == "manifest":
        from pipeline.manifest import ManifestError, write_manifest
        path = args.work_dir / "manifest" / "manifest.parquet"
        if path.exists() and not args.force:
            print(f"manifest: {path} exists (use --force to rebuild it)", file=sys.stderr)
            return 0
        try:
            path, table = write_manifest(cfg, args.input, args.work_dir)
        except ManifestError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        shards = len(set(table["shard"].to_pylist()))
        print(f"manifest: {table.num_rows} videos in {shards} shard(s) -> {path}", file=sys.stderr)
        return 0
    if command in SHARD_STAGES:
        return run_stage(args, cfg)
    if command == "kmeans":
        from pipeline import executors
        from stages import kmeans
        executor = executors.make_executor(cfg, args.executor, args.workers or cfg.kmeans.workers or None,
                                           args.ray_address)
        stats = kmeans.run(cfg, args.work_dir, executor, force=args.force, quiet=args.quiet)
        print(json.dumps(stats, indent=2, default=str), file=sys.stderr)
        return 0
    if command == "codebook-info":
        from stages import kmeans
        print(kmeans.codebook_info(args.work_dir))
        return 0
    if command == "train":
        from videobert import train
        stats = train.train(cfg, args.work_dir, resume=args.resume, quiet=args.quiet)
        print(json.dumps(stats, indent=2, default=str), file=sys.stderr)
        return 0
    if command == "eval":
        from videobert import evaluate
        if args.task == "zero-shot":
            evaluate.zero_shot(cfg, args.work_dir, checkpoint=args.checkpoint, quiet=args.quiet)
        elif args.task == "features":
            print(evaluate.extract_features(cfg, args.work_dir, checkpoint=args.checkpoint))
        else:
            if not args.sentence:
                print("eval predict-video: give at least one --sentence", file=sys.stderr)
                return 2
            print(evaluate.predict_video(cfg, args.work_dir, args.sentence, checkpoint=args.checkpoint))
        return 0
    if command == "summary":
        from pipeline import summary
        print(summary.render(summary.write_summary(args.work_dir)))
        return 0
    if command in ("status", "errors"):
        from pipeline import status
        print(status.status_text(args.work_dir) if command == "status"
              else status.errors_text(args.work_dir, args.stage))
        return 0
    if command == "submit":
        from pipeline import slurm
        return slurm.submit(cfg, args)
    if command == "gallery":
        from pipeline import gallery
        for path in gallery.write_gallery(cfg, args.work_dir, level=args.level, clusters=args.clusters,
                                          per_cluster=args.per_cluster, node_ids=args.ids, quiet=args.quiet):
            print(path)
        return 0
    if command == "report":
        from pipeline import report
        print(report.write_report(cfg, args.work_dir))
        return 0
    if command == "validate":
        from schemas import validate
        problems = validate.validate_work_dir(args.work_dir)
        if problems:
            print(f"INVALID: {problems[0]}", file=sys.stderr)
            for problem in problems[1:10]:
                print(f"  also: {problem}", file=sys.stderr)
            return 1
        print(f"valid: every output under {args.work_dir} matches its schema and invariants", file=sys.stderr)
        return 0
    raise AssertionError(command)
