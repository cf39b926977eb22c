"""The run summary: what went in, what came out, what failed. `DIR/summary.json` and a printed table.

It reads only the stages' output files (through their schemas' columns), one column at a time, and the
`warnings` of the codebook sidecar (when the codebook is current) and of the training log's latest start or
resume record: data that cannot teach, said where the run is summed up; and what curation found
(reports/curation.py: shot boundaries, quality flags, near-duplicate groups)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from pipeline import storage
from pipeline.engine.lineage import Lineage
from pipeline.engine.records import parquet_rows, read_json, read_record
from pipeline.engine.workdir import WorkDir
from pipeline.registry import SHARD_STAGES
from reports.curation import curation_lines, curation_stats


def _parts(work_dir, stage: str, table_name: str = "") -> list[Path]:
    """The outputs of current shards only: a killed run's file without its record, or a stale one, does
    not count."""
    return [path for _, path in Lineage(work_dir).current_parts(stage, table_name)]


def token_counts(work_dir: Path, num_leaves: int = 0) -> np.ndarray:
    """Clips per visual token over the complete quantize parts (at least `num_leaves` entries), one part at
    a time: memory stays bounded by a shard and the vocabulary, not the collection."""
    counts = np.zeros(num_leaves, dtype=np.int64)
    for path in _parts(work_dir, "quantize"):
        part_counts = np.bincount(
            storage.read_table(path, columns=["token"])["token"].to_numpy(), minlength=len(counts)
        )
        counts = np.pad(counts, (0, len(part_counts) - len(counts))) + part_counts
    return counts


def log_records(work_dir: Path) -> list[dict]:
    """The training log's records of the latest run: from its last start record on (a resume continues
    the run, a start begins another); a line cut off by a killed run is skipped."""
    path = WorkDir(work_dir).train_log
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if record.get("event") == "start":
            records = []
        records.append(record)
    return records


def train_header(records: list[dict]) -> dict | None:
    """The latest start or resume record of the training log's `records` (None without one)."""
    headers = [record for record in records if record.get("event") in ("start", "resume")]
    return headers[-1] if headers else None


def warnings(work_dir: Path) -> list[dict]:
    """[{"stage": "kmeans" | "train", "message"}]: the current codebook's sidecar warnings, then those of
    the latest training run (its log's start or resume record; absent from older logs)."""
    work = WorkDir(work_dir)
    found = []
    if work.codebook_sidecar.exists() and Lineage(work).current("kmeans"):
        sidecar = read_json(work.codebook_sidecar) or {}
        found += [{"stage": "kmeans", "message": str(message)} for message in sidecar.get("warnings") or []]
    header = train_header(log_records(work_dir)) or {}
    found += [{"stage": "train", "message": str(message)} for message in header.get("warnings") or []]
    return found


def made_in(records: list[dict]) -> str | None:
    """The stage whose pass made every one of these records (features makes decode's), or None."""
    stages = {record.get("made_in") for record in records}
    return stages.pop() if len(stages) == 1 and None not in stages else None


def collect(work_dir: Path) -> dict:
    work = WorkDir(work_dir)
    checker = Lineage(work)
    manifest = read_record(work.record("manifest"), "manifest") or {}
    total_shards = len(manifest.get("shards", {}))
    summary: dict = {
        "work_dir": str(work.root),
        "videos_in": manifest.get("videos", 0),
        "shards": total_shards,
        "stages": {},
    }
    for stage in SHARD_STAGES:
        records = list(checker.current_records(stage).values())
        if not records:
            continue
        entry = {
            "shards_complete": len(records),
            "shards_total": total_shards,
            "seconds": round(sum(r.get("seconds", 0) for r in records), 1),
        }
        if made_in(records):  # one pass made both: its time is counted once, under the stage that ran it
            entry.update(seconds=0.0, made_in=made_in(records))
        parts = _parts(work_dir, stage)
        entry["rows"] = sum(parquet_rows(p) for p in parts)
        summary["stages"][stage] = entry
    videos = _parts(work, "decode", "videos")
    if videos:
        statuses: dict[str, int] = {}
        for path in videos:
            counts = pc.value_counts(storage.read_table(path, columns=["status"])["status"]).to_pylist()
            for entry in counts:
                statuses[entry["values"]] = statuses.get(entry["values"], 0) + entry["counts"]
        summary["videos_by_status"] = dict(sorted(statuses.items()))
        summary["clips"] = summary["stages"]["decode"]["rows"]
    if "quantize" in summary["stages"]:
        summary["distinct_visual_tokens"] = int(np.count_nonzero(token_counts(work_dir)))
    align_parts = _parts(work_dir, "align")
    if align_parts:
        kinds: dict[str, int] = {}
        clips_in_text = clips_all = 0
        for path in align_parts:
            table = storage.read_table(path, columns=["kind", "visual_ids"])
            lengths = pc.list_value_length(table["visual_ids"])
            for kind in pc.unique(table["kind"]).to_pylist():
                selected = pc.equal(table["kind"], kind)
                kinds[kind] = kinds.get(kind, 0) + int(pc.sum(selected).as_py())
                count = pc.sum(pc.filter(lengths, selected)).as_py() or 0
                clips_all += count
                clips_in_text += count if kind == "text_video" else 0
        summary["segments_by_kind"] = dict(sorted(kinds.items()))
        summary["text_coverage"] = round(clips_in_text / clips_all, 4) if clips_all else 0.0
    errors: dict[str, dict[str, int]] = {}
    rows = []
    for stage in SHARD_STAGES:
        for shard in checker.current_records(stage):
            if not work.errors(stage, shard).exists():
                continue  # parts made outside the stages have no error table
            table = storage.read_table(work.errors(stage, shard), columns=["video_id", "error_type", "message"])
            for row in table.to_pylist():
                errors.setdefault(stage, {}).setdefault(row["error_type"], 0)
                errors[stage][row["error_type"]] += 1
                rows.append(dict(row, stage=stage, shard=shard))
    summary["errors"] = errors
    summary["curation"] = curation_stats(work_dir)
    summary["warnings"] = warnings(work_dir)
    summary.update(failure_counts(rows))
    return summary


def failure_counts(rows: list[dict]) -> dict:
    """`failed_videos`: videos with an error row in any stage, each once; `failures_by_type`: error type ->
    {videos, stages}, one read failure recorded by several stages (the features pass's decode) counted once."""
    from reports.status import distinct_failures

    failures = distinct_failures(rows)
    by_type: dict[str, dict] = {}
    for failure in failures:
        entry = by_type.setdefault(failure["error_type"], {"videos": 0, "stages": []})
        entry["videos"] += 1
        entry["stages"] = sorted(set(entry["stages"]) | set(failure["stages"]), key=SHARD_STAGES.index)
    return {
        "failed_videos": len({failure["video_id"] for failure in failures}),
        "failures_by_type": dict(sorted(by_type.items())),
    }


def write_summary(work_dir: Path) -> dict:
    summary = collect(work_dir)
    storage.atomic_write_json(WorkDir(work_dir).summary, summary)
    return summary


def render(summary: dict) -> str:
    lines = [
        f"Run summary for {summary['work_dir']}",
        f"  videos in: {summary['videos_in']} in {summary['shards']} shard(s)",
    ]
    if "videos_by_status" in summary:
        lines.append(
            "  videos by decode status: " + ", ".join(f"{k} {v}" for k, v in summary["videos_by_status"].items())
        )
    if "clips" in summary:
        lines.append(f"  clips: {summary['clips']}")
    lines.append(f"  {'stage':<10}{'shards':>12}{'rows':>10}{'seconds':>14}")
    for stage, entry in summary["stages"].items():
        seconds = f"in {entry['made_in']}" if entry.get("made_in") else entry["seconds"]
        lines.append(
            f"  {stage:<10}{entry['shards_complete']:>6}/{entry['shards_total']:<5}{entry['rows']:>10}{seconds:>14}"
        )
    if "distinct_visual_tokens" in summary:
        lines.append(f"  distinct visual tokens used: {summary['distinct_visual_tokens']}")
    if "segments_by_kind" in summary:
        lines.append("  segments: " + ", ".join(f"{k} {v}" for k, v in summary["segments_by_kind"].items()))
        lines.append(f"  text coverage (share of clips inside a sentence): {summary['text_coverage']:.1%}")
    lines += curation_lines(summary.get("curation") or {})
    if summary["errors"]:
        lines.append(f"  errors: {summary['failed_videos']} failed video(s)")
        for name, entry in summary["failures_by_type"].items():
            lines.append(f"    {name} x{entry['videos']} (recorded by {', '.join(entry['stages'])})")
    else:
        lines.append("  errors: none")
    for warning in summary.get("warnings", []):
        lines.append(f"  warning ({warning['stage']}): {warning['message']}")
    return "\n".join(lines)
