"""The run report's stages section: per stage, from its completion records, shards, videos, clips, errors,
seconds and throughput (per worker and over the wall-clock span of the stage), the decode status of the
videos, errors by type with examples."""

from __future__ import annotations

import html
from pathlib import Path

from pipeline import storage
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir
from pipeline.progress import format_rate
from pipeline.registry import SHARD_STAGES
from reports import summary
from reports.cells import SHOWN_MESSAGE, counted, number, shortened
from reports.page import html_table as _table

ERROR_EXAMPLES = 20


def stage_runs(work_dir: Path) -> dict[str, dict]:
    """Per stage, from its completion records: shards, videos, clips, errors, seconds and throughput."""
    stages = {}
    for stage in SHARD_STAGES:
        records = list(Lineage(work_dir).current_records(stage).values())
        if not records:
            continue
        seconds = sum(record.get("seconds", 0.0) for record in records)
        if summary.made_in(records):  # made in another stage's pass (decode in features'): its time is that one's
            stages[stage] = {
                "shards": len(records),
                "seconds": 0.0,
                "wall_seconds": None,
                "made_in": summary.made_in(records),
                **{
                    key: sum(record.get(key, 0) for record in records)
                    for key in ("videos", "clips", "errors")
                    if any(key in record for record in records)
                },
            }
            continue
        ends = [record["finished_at"] for record in records if "finished_at" in record]
        starts = [record["finished_at"] - record.get("seconds", 0.0) for record in records if "finished_at" in record]
        entry = {
            "shards": len(records),
            "seconds": round(seconds, 3),
            "wall_seconds": round(max(ends) - min(starts), 3) if ends else None,
        }
        for key in ("videos", "clips", "errors", "audio_s", "segments", "sentences"):
            if any(key in record for record in records):
                entry[key] = sum(record.get(key, 0) for record in records)
        work = entry.get("clips", entry.get("videos", 0))
        entry["clips_per_s" if "clips" in entry else "videos_per_s"] = round(work / seconds, 3) if seconds else None
        if entry["wall_seconds"]:
            entry["wall_rate"] = round(work / entry["wall_seconds"], 3)
        if "audio_s" in entry and seconds:
            entry["realtime_factor"] = round(entry["audio_s"] / seconds, 2)
        stages[stage] = entry
    return stages


def error_examples(work_dir: Path, limit: int = ERROR_EXAMPLES) -> list[dict]:
    examples = []
    for stage in SHARD_STAGES:
        for shard in Lineage(work_dir).current_records(stage):
            path = WorkDir(work_dir).errors(stage, shard)
            if not path.exists():
                continue  # parts made outside the stages have no error table
            for row in storage.read_table(path, columns=["stage", "video_id", "error_type", "message"]).to_pylist():
                if len(examples) == limit:
                    return _one_per_failure(examples)
                examples.append(dict(row, shard=shard))
    return _one_per_failure(examples)


def _one_per_failure(rows: list[dict]) -> list[dict]:
    """One read failure recorded by several stages is one example (its `stages` listed)."""
    from reports.status import distinct_failures

    return [{key: value for key, value in row.items() if key != "shard"} for row in distinct_failures(rows)]


def stages_html(data: dict) -> str:
    run, stages = data["summary"], data["stages"]
    rows = []
    for stage in SHARD_STAGES:
        done_counts = run["stages"].get(stage)
        entry = stages.get(stage)
        if not done_counts or not entry:
            rows.append([stage, f"0/{run['shards']}", "-", "-", "-", "-", "-", "-", "not run"])
            continue
        unit = "clips" if "clips_per_s" in entry else "videos"
        done = entry.get(unit, 0)
        extra = f"{entry['realtime_factor']}x real time" if "realtime_factor" in entry else ""
        if entry.get("made_in"):
            rows.append(
                [
                    stage,
                    f"{done_counts['shards_complete']}/{done_counts['shards_total']}",
                    number(entry.get("videos")),
                    number(done_counts["rows"]),
                    number(entry.get("errors", 0)),
                    f"in {entry['made_in']}",
                    "-",
                    "-",
                    f"made in the {entry['made_in']} stage's pass (one read of each video): its time is counted there",
                ]
            )
            continue
        rows.append(
            [
                stage,
                f"{done_counts['shards_complete']}/{done_counts['shards_total']}",
                number(entry.get("videos")),
                number(done_counts["rows"]),
                number(entry.get("errors", 0)),
                number(entry["seconds"]),
                format_rate(done, entry["seconds"], unit),
                format_rate(done, entry["wall_seconds"] or 0, unit),
                extra,
            ]
        )
    parts = [
        "<h2>Stages</h2>",
        _table(
            [
                "stage",
                "shards",
                "videos",
                "rows out",
                "error rows",
                "shard-seconds",
                "per worker",
                "over the run",
                "note",
            ],
            rows,
        ),
        '<p class="note">per worker: output per second of shard work; over the run: output per second '
        "between the first shard's start and the last shard's end (all workers together).</p>",
    ]
    if "videos_by_status" in run:
        parts.append(
            "<p>videos by decode status: "
            + html.escape(", ".join(f"{status} {count}" for status, count in run["videos_by_status"].items()))
            + "</p>"
        )
    if run["errors"]:
        failed = run.get("failed_videos")
        parts.append(f"<p>{counted(failed, 'failed video') if failed is not None else '? failed videos'}</p>")
        parts.append(
            _table(
                ["error type", "videos", "recorded by"],
                [
                    [error_type, entry["videos"], ", ".join(entry["stages"])]
                    for error_type, entry in run.get("failures_by_type", {}).items()
                ],
            )
        )
        parts.append(
            _table(
                ["stages", "video", "error type", "message"],
                [
                    [
                        ", ".join(row.get("stages", [row["stage"]])),
                        row["video_id"],
                        row["error_type"],
                        shortened(row["message"]),
                    ]
                    for row in data["error_examples"]
                ],
            )
        )
        if any(shortened(row["message"]) != row["message"] for row in data["error_examples"]):
            parts.append(
                f'<p class="note">messages longer than {SHOWN_MESSAGE} characters are cut short here; '
                f"report.json and `videobert errors` have them in full.</p>"
            )
    else:
        parts.append("<p>errors: none</p>")
    return "\n".join(parts)
