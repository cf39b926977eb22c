"""The stage commands: a per-shard stage over its shards (through the executor the config or --executor
names), and the whole-collection stages (manifest, kmeans, train), each with its one summary line."""

from __future__ import annotations

import re
import sys
import time

from pipeline import registry
from pipeline.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_TOO_MANY_FAILED,
    SHOWN_PROBLEMS,
    confirm_removal,
    outcomes,
    program_name,
)
from pipeline.contract import CollectionRun


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
    line = (
        f"{stage}: {len(ran)} shard(s) run{what}, {len(skipped)} already current, {len(failed)} failed"
        f"{f', {len(blocked)} could not run' if blocked else ''}; {videos} videos, {clips} clips in {elapsed:.1f}s"
    )
    if errors:
        line += "; video errors: " + ", ".join(f"{name} x{count}" for name, count in errors.items())
    print(line, file=sys.stderr)
    several = [video for r in ran for video in r.get("several_streams") or []]
    if several:
        print(
            f"  {len(several)} video(s) hold several video streams (decoded: the one marked default, else the "
            f"longest; the videos table's video_stream says which): {', '.join(several[:SHOWN_PROBLEMS])}"
            f"{' ...' if len(several) > SHOWN_PROBLEMS else ''}",
            file=sys.stderr,
        )
    outcomes[stage] = f"{len(ran)} shard(s) run, {len(skipped)} already current" + (
        f", {len(failed) + len(blocked)} failed or could not run" if failed or blocked else ""
    )
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
            listed = ", ".join(f"{part:05d}" for part in parts[:SHOWN_PROBLEMS]) + (
                " ..." if len(parts) > SHOWN_PROBLEMS else ""
            )
            print(
                f"  {stage}: {len(parts)} parts could not run ({listed}), for the same reason as the first: {first}",
                file=sys.stderr,
            )
    hidden = (
        max(len(redone) - SHOWN_PROBLEMS, 0)
        + max(len(failed) - SHOWN_PROBLEMS, 0)
        + sum(len(parts) for _, parts in groups[SHOWN_PROBLEMS:])
    )
    if hidden:
        print(f"  ... and {hidden} more ({program_name()} status --work-dir DIR)", file=sys.stderr)


def _blocked_groups(blocked: list[dict]) -> list[tuple[str, list[int]]]:
    """Shards that could not run for the same reason (their part numbers aside) as one entry: (the first
    one's message, the shards), the largest group first."""
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
        print(
            f"{args.command}: {failed} of {videos} videos failed ({failed / videos:.0%}), more than "
            f"executor.max_failed_share={cfg.executor.max_failed_share:g}: see {program_name()} errors "
            f"--work-dir {args.work_dir}",
            file=sys.stderr,
        )
        return EXIT_TOO_MANY_FAILED
    return EXIT_OK


def _preflight(args, cfg, shards: list[int]) -> None:
    """Before the first shard: what the stage needs (weights, models, the hub) is there, unless every
    selected shard is current already. Raises pipeline.contract.PreflightError (one line)."""
    from pipeline.engine.lineage import Lineage

    checker = Lineage(args.work_dir, cfg)
    stages = (args.command, *registry.stage(args.command).also_makes)
    if not any(args.force or not checker.state(stage, shard).current for stage in stages for shard in shards):
        return
    registry.stage(args.command).run_preflight(cfg, args.work_dir)


def run_collection(args, cfg) -> int:
    """A whole-collection stage: its run with its own options, the executor the command chose where it fans
    its work out, and the person at the terminal to ask; its lines printed, its phrase kept for `run`."""
    spec = registry.stage(args.command)
    executor = None
    if spec.workers:
        from pipeline.executors import dispatch

        section_workers = getattr(getattr(cfg, spec.section, None), "workers", None)
        executor = dispatch.make_executor(cfg, args.executor, args.workers or section_workers or None, args.ray_address)
    options = {option.name: getattr(args, option.name) for option in spec.options}
    confirm = confirm_removal(args) if "allow_removal" in options else None
    result = spec.function("run")(
        CollectionRun(cfg, args.work_dir, options, quiet=args.quiet, executor=executor, confirm=confirm)
    )
    for line in result.lines:
        print(line, file=sys.stderr)
    outcomes[args.command] = result.outcome
    args.made_outputs = result.made_outputs
    return EXIT_OK
