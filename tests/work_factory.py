"""Hand-made stage outputs for tests and benchmarks: a part written as the runner writes it (schema-conformed,
tagged) with its completion record, and a manifest from rows."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

import schemas
from pipeline import io


def write_part(work_dir: Path, stage: str, shard: int, table: pa.Table, schema: schemas.Schema, *,
               table_name: str = "", record: dict | None = None, **metadata) -> None:
    """`table` as the shard's output of `stage`; with `record`, also its completion record (the shard's stats)."""
    io.write_parquet(io.stage_output(work_dir, stage, shard, table_name), schemas.conform(table, schema),
                     {"stage": stage, "schema": schema.tag, **metadata})
    if record is not None:
        io.atomic_write_json(io.completion_record(work_dir, stage, shard), record)


def write_manifest_rows(work_dir: Path, rows: list[dict]) -> None:
    """A manifest of these rows (video_id, uri, bytes, transcript_uri, shard)."""
    io.write_parquet(Path(work_dir) / "manifest" / "manifest.parquet",
                     pa.Table.from_pylist(rows, schema=schemas.MANIFEST.arrow), {"schema": schemas.MANIFEST.tag})
