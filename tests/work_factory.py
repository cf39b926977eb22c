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
