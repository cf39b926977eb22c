"""`python -m pipeline status` and `python -m pipeline errors`: where a run stands, read from its files alone
(manifest, completion records, error tables, the Ray executor's shard logs), so they answer the same for
local, Ray and Slurm runs, and while a run is still going.

Only shards with a completion record count: an error table whose shard has no record belongs to an
attempt that was killed before finishing, and the rerun rewrites it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from pipeline import io
from pipeline.config import SHARD_STAGES
from pipeline.ray_executor import last_attempt_failure, shard_log_path
from pipeline.runner import manifest_shards, read_manifest

SLOWEST_SHARDS = 3   # per stage


def error_rows(work_dir: Path, stage: str, shards: list[int]) -> list[dict]:
    """The error rows of these completed shards, each with its shard index."""
    rows = []
    for shard_index in shards:
        path = io.error_output(work_dir, stage, shard_index)
        if path.exists():
            rows += [dict(row, shard=shard_index) for row in pq.read_table(path).to_pylist()]
    return rows


def failed_shards(work_dir: Path, stage: str, all_shards: list[int], completed: set[int]) -> dict[int, str]:
    """Shards without a completion record whose last logged attempt failed -> that failure's last line."""
    failures = {}
    for shard_index in all_shards:
        if shard_index not in completed:
            failure = last_attempt_failure(shard_log_path(work_dir, stage, shard_index))
            if failure is not None:
                failures[shard_index] = failure
    return failures


def _codebook_line(work_dir: Path) -> str:
    sidecar = Path(work_dir) / "kmeans" / "codebook.json"
    if not sidecar.exists():
        return f"{'kmeans':<9} {'not run':>15}"
    info = json.loads(sidecar.read_text())
    config = info.get("config", {})
    return (f"{'kmeans':<9} {'done':>15}  codebook depth {config.get('depth', '?')}, k {config.get('k', '?')}, "
            f"fit on {info.get('sample_size', 0):,} clips")


def status_text(work_dir: Path) -> str:
    work_dir = Path(work_dir)
    manifest = read_manifest(work_dir, columns=["shard"])
    shards = manifest_shards(manifest)
    lines = [f"run {work_dir}: {manifest.num_rows:,} videos in {len(shards)} manifest shard(s)", "",
             f"{'stage':<9} {'shards done':>15} {'videos':>8} {'clips':>9} {'seconds':>9}  "
             f"videos failed, by error type"]
    completed, failures = {}, []
    for stage in SHARD_STAGES:
        records = io.completion_records(work_dir, stage)
        if stage == "quantize":
            lines.append(_codebook_line(work_dir))
        if not records and not (work_dir / stage).exists():
            lines.append(f"{stage:<9} {'not started':>15}")
            continue
        done = len(records)
        share = done / len(shards) if shards else 0.0
        error_types = sum((Counter(record.get("error_types", {})) for record in records.values()), Counter())
        errors = ", ".join(f"{name} {count}" for name, count in sorted(error_types.items())) or "-"
        lines.append(f"{stage:<9} {f'{done}/{len(shards)} {share:4.0%}':>15} "
                     f"{sum(r.get('videos', 0) for r in records.values()):>8,} "
                     f"{sum(r.get('clips', 0) for r in records.values()):>9,} "
                     f"{sum(r.get('seconds', 0) for r in records.values()):>9.1f}  {errors}")
        completed[stage] = records
        failures += [(stage, shard_index, message) for shard_index, message in
                     failed_shards(work_dir, stage, shards, set(records)).items()]
    if any(completed.values()):
        lines += ["", "slowest shards, per stage:"]
    for stage, records in completed.items():
        by_time = sorted(records.items(), key=lambda item: -item[1].get("seconds", 0.0))
        for shard_index, record in by_time[:SLOWEST_SHARDS]:
            seconds, clips = record.get("seconds", 0.0), record.get("clips")
            rate = f", {clips / seconds:.1f} clips/s" if clips and seconds else ""
            lines.append(f"  {stage} part {shard_index}: {seconds:.1f} s, {record.get('videos', 0)} videos"
                         f"{f', {clips:,} clips' if clips is not None else ''}{rate} on {record.get('host', '?')}")
    if failures:
        lines += ["", "failed shards (no completion record; their last attempt failed):"]
        for stage, shard_index, message in failures:
            log = shard_log_path(work_dir, stage, shard_index)
            lines.append(f"  {stage} part {shard_index}: {message}  (log {log})")
    return "\n".join(lines)


def errors_text(work_dir: Path, stage: str | None = None) -> str:
    """Every failed video of the completed shards (of one stage), with its error type and message."""
    work_dir = Path(work_dir)
    if stage is not None and stage not in SHARD_STAGES:
        raise ValueError(f"--stage must be one of {', '.join(SHARD_STAGES)} (got {stage!r})")
    manifest = read_manifest(work_dir, columns=["video_id", "uri"])
    uris = dict(zip(manifest["video_id"].to_pylist(), manifest["uri"].to_pylist(), strict=True))
    lines = []
    for name in (stage,) if stage else SHARD_STAGES:
        rows = error_rows(work_dir, name, sorted(io.completion_records(work_dir, name)))
        for row in sorted(rows, key=lambda r: (r["shard"], r["video_id"])):
            uri = uris.get(row["video_id"], "")
            where = f"  [{uri}]" if uri and uri not in row["message"] else ""
            lines.append(f"{name:<9} part {row['shard']:05d}  {row['video_id']}  "
                         f"{row['error_type']}: {row['message']}{where}")
    scope = f"the {stage} stage" if stage else "any stage"
    header = f"{len(lines)} failed video(s) in {scope} of {work_dir}" if lines else \
        f"no failed videos in {scope} of {work_dir}"
    return "\n".join([header] + lines)
