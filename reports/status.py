"""`python -m pipeline status` and `python -m pipeline errors`: where a run stands, read from its files alone
(manifest, completion records and their lineage, error tables, failure records of crashed shards), so they
answer the same for local, Ray and Slurm runs, and while a run is still going.

Only current shards count as done: a shard whose inputs changed since it ran is *stale*, one whose
record or files do not match is *corrupt*, and a shard whose last attempt crashed is *failed* (with its
message). Error rows of a shard that is not current belong to an attempt that will be redone."""

from __future__ import annotations

import time
from collections import Counter

from pipeline import registry, storage
from pipeline.engine.lineage import Lineage
from pipeline.engine.manifest import read_manifest
from pipeline.engine.records import CorruptFile, read_json
from pipeline.engine.workdir import WorkDir
from pipeline.progress import format_rate

SLOWEST_SHARDS = 3  # per stage


def error_rows(work: WorkDir, stage: str, shards: list[int]) -> list[dict]:
    """The error rows of these shards, each with its shard index."""
    rows = []
    for shard_index in shards:
        path = work.errors(stage, shard_index)
        if path.exists():
            rows += [dict(row, shard=shard_index) for row in storage.read_table(path).to_pylist()]
    return rows


def distinct_failures(rows: list[dict]) -> list[dict]:
    """Error rows of several stages with one failure each: the rows of one video with the same error type
    and message (the features pass records its one read as decode's error and its own) are one, with
    `stages` listing the stages that record it, in run order."""
    merged: dict[tuple, dict] = {}
    for row in rows:
        key = (row.get("shard"), row["video_id"], row["error_type"], row["message"])
        entry = merged.setdefault(key, dict(row, stages=[]))
        if row["stage"] not in entry["stages"]:
            entry["stages"].append(row["stage"])
    for entry in merged.values():
        entry["stages"].sort(key=registry.NAMES.index)
    return list(merged.values())


def failed_shards(work: WorkDir, stage: str, shards: list[int]) -> dict[int, dict]:
    """Shards whose last attempt crashed -> their failure record (error line, traceback, host, time)."""
    failures = {}
    for shard_index in shards:
        try:
            failure = read_json(work.failure(stage, shard_index))
        except CorruptFile as error:
            failure = {"error": str(error)}
        if failure is not None and not (
            isinstance(failure.get("error"), str) and isinstance(failure.get("at", 0), (int, float))
        ):
            failure = {"error": f"{work.failure(stage, shard_index)} is not a valid failure record"}
        if failure is not None:
            failures[shard_index] = failure
    return failures


def status_text(work_dir, cfg=None) -> str:
    """With a config, shards made with other values than its own are stale (what a run with it would
    redo); without, only the records' consistency with each other counts."""
    work = WorkDir(work_dir)
    checker = Lineage(work, cfg)
    manifest = checker.manifest_record()
    shards = checker.manifest_shards()
    lines = [
        f"run {work.root}: {manifest.get('videos', 0):,} videos in {len(shards)} manifest shard(s)"
        + ("; checked against the config given (stale: a run with it would redo the shard)" if cfg else ""),
        "",
        f"{'stage':<9} {'shards current':>15} {'videos':>8} {'clips':>9} {'seconds':>9}  "
        f"videos failed, by error type; shards not current",
    ]
    current, problems, states_of = {}, [], {}
    for spec in registry.STAGES:
        if not spec.per_shard:  # a whole-collection stage: its own line, where it has one (the codebook)
            if spec.status_line:
                lines.append(spec.function("status_line")(checker, states_of))
            continue
        stage = spec.name
        states = states_of[stage] = checker.stage_states(stage, verify="size")
        failures = failed_shards(work, stage, shards)
        if all(state.status == "missing" for state in states.values()) and not failures:
            lines.append(f"{stage:<9} {'not started':>15}")
            continue
        records = {shard: state.record for shard, state in states.items() if state.current}
        share = len(records) / len(shards) if shards else 0.0
        error_types = sum((Counter(record.get("error_types", {})) for record in records.values()), Counter())
        errors = ", ".join(f"{name} {count}" for name, count in sorted(error_types.items())) or "-"
        behind = Counter(
            state.status
            for shard, state in states.items()
            if not state.current and not (state.status == "missing" and shard in failures)
        )
        if failures:
            behind["failed"] = len(failures)
        not_current = ", ".join(f"{count} {status}" for status, count in sorted(behind.items()))
        lines.append(
            f"{stage:<9} {f'{len(records)}/{len(shards)} {share:4.0%}':>15} "
            f"{sum(r.get('videos', 0) for r in records.values()):>8,} "
            f"{_clips(records):>9} "
            f"{sum(r.get('seconds', 0) for r in records.values()):>9.1f}  {errors}"
            f"{f'; {not_current}' if not_current else ''}"
        )
        current[stage] = records
        problems += [
            (stage, shard, state.status, state.reason)
            for shard, state in states.items()
            if state.status in ("stale", "corrupt")
        ]
        problems += [
            (
                stage,
                shard,
                "failed",
                f"{failure.get('error', '?')} ({_ago(failure.get('at'))}, {work.failure(stage, shard)})",
            )
            for shard, failure in failures.items()
        ]
    failed_videos = len(
        {row["video_id"] for stage, records in current.items() for row in error_rows(work, stage, list(records))}
    )
    if failed_videos:  # one read failure recorded by several stages (features' pass: decode too) is one video
        lines += ["", f"videos failed in any stage: {failed_videos}"]
    if any(current.values()):
        lines += ["", "slowest shards, per stage:"]
    for stage, records in current.items():
        # a shard made in another stage's pass (shots in decode's) took that shard's time, listed there
        records = {shard: record for shard, record in records.items() if not record.get("made_in")}
        by_time = sorted(records.items(), key=lambda item: -item[1].get("seconds", 0.0))
        for shard_index, record in by_time[:SLOWEST_SHARDS]:
            seconds, clips = record.get("seconds", 0.0), record.get("clips")
            rate = f", {format_rate(clips, seconds, 'clips')}" if clips and seconds else ""
            lines.append(
                f"  {stage} part {shard_index}: {seconds:.1f} s, {record.get('videos', 0)} videos"
                f"{f', {clips:,} clips' if clips is not None else ''}{rate} on {record.get('host', '?')}"
            )
    if problems:
        lines += ["", "shards not current (a rerun of the stage redoes them):"]
        for stage, shard, status, reason in problems:
            lines.append(f"  {stage} part {shard:05d} {status}: {reason}")
    from pipeline.engine import replaced

    kept = replaced.summary_lines(work)
    if kept:
        lines += ["", f"moved aside, in {replaced.folder(work)} (`restore` puts back the newest re-listing's):", *kept]
    from reports.card import card_state

    card = card_state(work)
    if card is not None:
        lines += ["", f"dataset card {work.card}: {card}"]
    return "\n".join(lines)


def _clips(records: dict[int, dict]) -> str:
    """The clips of a stage's current shards; "-" for a stage that counts none (asr counts sentences)."""
    counted = [record["clips"] for record in records.values() if record.get("clips") is not None]
    return f"{sum(counted):,}" if counted else "-"


def _ago(at: float | None) -> str:
    if not at:
        return "at an unknown time"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def crashed_shards(work_dir, stage: str | None = None) -> int:
    """Shards (of one stage) whose last attempt crashed."""
    work = WorkDir(work_dir)
    shards = Lineage(work).manifest_shards()
    return sum(len(failed_shards(work, name, shards)) for name in ((stage,) if stage else registry.SHARD_STAGES))


def errors_text(work_dir, stage: str | None = None) -> str:
    """Every failed video of the current shards (of one stage), with its error type and message, and
    every shard whose last attempt crashed."""
    work = WorkDir(work_dir)
    if stage is not None and stage not in registry.SHARD_STAGES:
        import difflib

        close = difflib.get_close_matches(stage, registry.SHARD_STAGES, n=1)
        raise ValueError(
            f"--stage must be one of {', '.join(registry.SHARD_STAGES)} (got {stage!r}"
            f"{f'; did you mean {close[0]}?' if close else ''})"
        )
    checker = Lineage(work)
    shards = checker.manifest_shards()
    manifest = read_manifest(work, columns=["video_id", "uri"])
    uris = dict(zip(manifest["video_id"].to_pylist(), manifest["uri"].to_pylist(), strict=True))
    lines, crashed = [], []
    rows = []
    for name in (stage,) if stage else registry.SHARD_STAGES:
        current = [shard for shard, state in checker.stage_states(name).items() if state.current]
        rows += [dict(row, stage=name) for row in error_rows(work, name, current)]
    failures = distinct_failures(rows)
    for row in sorted(failures, key=lambda r: (r["shard"], r["video_id"])):
        uri = uris.get(row["video_id"], "")
        where = f"  [{uri}]" if uri and uri not in row["message"] else ""
        lines.append(
            f"{', '.join(row['stages']):<9} part {row['shard']:05d}  {row['video_id']}  "
            f"{row['error_type']}: {row['message']}{where}"
        )
    for name in (stage,) if stage else registry.SHARD_STAGES:
        for shard, failure in failed_shards(work, name, shards).items():
            crashed.append(
                f"{name:<9} part {shard:05d}  (whole shard)  {failure.get('error', '?')}  "
                f"[traceback in {work.failure(name, shard)}]"
            )
    scope = f"the {stage} stage" if stage else "any stage"
    failed_videos = len({row["video_id"] for row in failures})
    header = (
        f"{failed_videos} failed video(s) in {scope} of {work.root}"
        if lines
        else f"no failed videos in {scope} of {work.root}"
    )
    if crashed:
        header += f"; {len(crashed)} shard(s) crashed"
    return "\n".join([header] + lines + crashed)
