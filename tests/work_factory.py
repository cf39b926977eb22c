"""Hand-made stage outputs for tests and benchmarks: a part written as the runner writes it (schema-conformed,
tagged) with its completion record, and a manifest from rows."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

import schemas
from pipeline import storage
from pipeline.engine import lineage
from pipeline.engine.manifest import write_manifest_table
from pipeline.engine.workdir import WorkDir
from schemas.metadata import Provenance

MADE_BY = "tests.work_factory"


def write_part(
    work_dir: Path,
    stage: str,
    shard: int,
    table: pa.Table,
    schema: schemas.Schema,
    *,
    table_name: str = "",
    record: dict | None = None,
    **provenance,
) -> None:
    """`table` as the shard's output of `stage` (with these Provenance fields); with `record`, also its
    completion record (the shard's stats; a hand-made part names no inputs, its record vouches for its bytes)."""
    storage.write_parquet(
        WorkDir(work_dir).part(stage, shard, table_name),
        schemas.conform(table, schema),
        Provenance(stage=stage, schema=schema.tag, **provenance),
    )
    if record is not None:
        lineage.record_external(work_dir, stage, shard, MADE_BY, record)


def write_manifest_rows(work_dir: Path, rows: list[dict]) -> None:
    """A manifest of these rows (video_id, uri, bytes, transcript_uri, shard) with its record."""
    write_manifest_table(
        work_dir,
        pa.Table.from_pylist(rows, schema=schemas.MANIFEST.arrow),
        lineage.external_lineage(MADE_BY),
        Provenance(schema=schemas.MANIFEST.tag),
    )


def write_quality_of(work_dir: Path, shard: int, clips: pa.Table, excluded: set | None = None) -> None:
    """The quality stage's parts for these clips (a table with video_id, clip_index, start_s, end_s), with
    their record: every clip usable but those in `excluded` ((video_id, clip_index) pairs, flagged black)."""
    excluded = excluded or set()
    keys = clips.select(["video_id", "clip_index", "start_s", "end_s"]).to_pylist()
    rows = []
    for key in keys:
        out = (key["video_id"], key["clip_index"]) in excluded
        flags = [{"reason": "black", "value": 0.0, "threshold": 16.0}] if out else []
        rows.append(dict(key, flags=flags, excluded=out))
    videos = sorted({key["video_id"] for key in keys})
    per_video = [
        {"video_id": video, "clips": sum(k["video_id"] == video for k in keys), "flagged_clips": 0, "flags": []}
        for video in videos
    ]
    for name, table, schema in (
        ("", pa.Table.from_pylist(rows, schema=schemas.QUALITY.arrow), schemas.QUALITY),
        (
            "quality_videos",
            pa.Table.from_pylist(per_video, schema=schemas.QUALITY_VIDEOS.arrow),
            schemas.QUALITY_VIDEOS,
        ),
    ):
        storage.write_parquet(
            WorkDir(work_dir).part("quality", shard, name),
            schemas.conform(table, schema),
            Provenance(stage="quality", schema=schema.tag),
        )
    lineage.record_external(work_dir, "quality", shard, MADE_BY, {"clips": len(rows)})


def clip_measures(video_id: str, clip_index: int) -> dict:
    """What the visual pass measures of a clip, for a hand-made decode part: a usable picture (mid-grey,
    moving), and hashes of its own (distinct for every clip: no hand-made videos are copies)."""
    import hashlib

    digest = hashlib.sha256(f"{video_id}/{clip_index}".encode()).digest()
    hashes = [int.from_bytes(digest[8 * k : 8 * k + 8], "little", signed=True) for k in range(len(schemas.HASHED_AT))]
    return {"luma_mean": 120.0, "luma_contrast": 40.0, "motion_mean": 5.0, "motion_max": 10.0, "phashes": hashes}


def write_no_shots(work_dir: Path, shard: int) -> None:
    """A shots part of no boundaries with its record: hand-made clips of one shot each."""
    storage.write_parquet(
        WorkDir(work_dir).part("shots", shard),
        schemas.empty(schemas.SHOTS),
        Provenance(stage="shots", schema=schemas.SHOTS.tag),
    )
    lineage.record_external(work_dir, "shots", shard, MADE_BY, {"boundaries": 0})


def write_curation_of(work_dir: Path, shard: int, clips: pa.Table | list[dict]) -> None:
    """What align reads of curation for hand-made clips: every clip usable (quality), no shot boundary."""
    table = clips if isinstance(clips, pa.Table) else pa.Table.from_pylist(clips)
    if table.num_rows == 0:
        table = pa.table(
            {
                name: pa.array([], type)
                for name, type in (
                    ("video_id", pa.string()),
                    ("clip_index", pa.int32()),
                    ("start_s", pa.float64()),
                    ("end_s", pa.float64()),
                )
            }
        )
    write_quality_of(work_dir, shard, table)
    write_no_shots(work_dir, shard)
