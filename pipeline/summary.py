"""The run summary: what went in, what came out, what failed. `DIR/summary.json` and a printed table.

It reads only the stages' output files (through their schemas' columns), one column at a time."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import io

STAGES = ("decode", "features", "quantize", "asr", "align")


def _parts(work_dir: Path, stage: str, prefix: str = "part-") -> list[Path]:
    return sorted((Path(work_dir) / stage).glob(f"{prefix}*.parquet"))


def _column(paths: list[Path], column: str) -> list:
    values = []
    for path in paths:
        values += pq.read_table(path, columns=[column])[column].to_pylist()
    return values


def collect(work_dir: Path) -> dict:
    work_dir = Path(work_dir)
    manifest_path = work_dir / "manifest" / "manifest.parquet"
    manifest = pq.read_table(manifest_path, columns=["shard"]) if manifest_path.exists() else None
    total_shards = len(set(manifest["shard"].to_pylist())) if manifest is not None else 0
    summary: dict = {"work_dir": str(work_dir), "videos_in": manifest.num_rows if manifest is not None else 0,
                     "shards": total_shards, "stages": {}}
    for stage in STAGES:
        done = sorted((work_dir / stage / "_done").glob("*.json"))
        if not done:
            continue
        records = [json.loads(path.read_text()) for path in done]
        entry = {"shards_complete": len(records), "shards_total": total_shards,
                 "seconds": round(sum(r.get("seconds", 0) for r in records), 1)}
        parts = _parts(work_dir, stage)
        entry["rows"] = sum(pq.read_metadata(p).num_rows for p in parts)
        summary["stages"][stage] = entry
    videos = _parts(work_dir, "decode", "videos-part-")
    if videos:
        statuses = _column(videos, "status")
        summary["videos_by_status"] = {s: statuses.count(s) for s in sorted(set(statuses))}
        summary["clips"] = summary["stages"]["decode"]["rows"]
    if "quantize" in summary["stages"]:
        tokens = _column(_parts(work_dir, "quantize"), "token")
        summary["distinct_visual_tokens"] = len(set(tokens))
    align_parts = _parts(work_dir, "align")
    if align_parts:
        kinds = _column(align_parts, "kind")
        summary["segments_by_kind"] = {k: kinds.count(k) for k in sorted(set(kinds))}
        clips_in_text = clips_all = 0
        for path in align_parts:
            table = pq.read_table(path, columns=["kind", "visual_ids"])
            lengths = pc.list_value_length(table["visual_ids"]).to_pylist()
            for kind, length in zip(table["kind"].to_pylist(), lengths):
                clips_all += length
                clips_in_text += length if kind == "text_video" else 0
        summary["text_coverage"] = round(clips_in_text / clips_all, 4) if clips_all else 0.0
    errors: dict[str, dict[str, int]] = {}
    for path in sorted((work_dir / "errors").glob("*.parquet")):
        table = pq.read_table(path, columns=["stage", "error_type"])
        for stage, error_type in zip(table["stage"].to_pylist(), table["error_type"].to_pylist()):
            errors.setdefault(stage, {}).setdefault(error_type, 0)
            errors[stage][error_type] += 1
    summary["errors"] = errors
    return summary


def write_summary(work_dir: Path) -> dict:
    summary = collect(work_dir)
    io.atomic_write_json(Path(work_dir) / "summary.json", summary)
    return summary


def render(summary: dict) -> str:
    lines = [f"Run summary for {summary['work_dir']}",
             f"  videos in: {summary['videos_in']} in {summary['shards']} shard(s)"]
    if "videos_by_status" in summary:
        lines.append("  videos by decode status: " + ", ".join(f"{k} {v}" for k, v in summary["videos_by_status"].items()))
    if "clips" in summary:
        lines.append(f"  clips: {summary['clips']}")
    lines.append(f"  {'stage':<10}{'shards':>12}{'rows':>10}{'seconds':>10}")
    for stage, entry in summary["stages"].items():
        lines.append(f"  {stage:<10}{entry['shards_complete']:>6}/{entry['shards_total']:<5}"
                     f"{entry['rows']:>10}{entry['seconds']:>10}")
    if "distinct_visual_tokens" in summary:
        lines.append(f"  distinct visual tokens used: {summary['distinct_visual_tokens']}")
    if "segments_by_kind" in summary:
        lines.append("  segments: " + ", ".join(f"{k} {v}" for k, v in summary["segments_by_kind"].items()))
        lines.append(f"  text coverage (share of clips inside a sentence): {summary['text_coverage']:.1%}")
    if summary["errors"]:
        lines.append("  errors:")
        for stage, counts in summary["errors"].items():
            lines.append(f"    {stage}: " + ", ".join(f"{name} x{count}" for name, count in counts.items()))
    else:
        lines.append("  errors: none")
    return "\n".join(lines)
