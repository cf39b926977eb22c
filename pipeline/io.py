"""Atomic Parquet output with provenance metadata, and the paths every stage's files live at.

An output appears only complete: it is written under a temporary name in the same folder and renamed
(atomic on POSIX), so a killed run never leaves a file that a reader could take for a finished one."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

METADATA_PREFIX = "videobert."


def part_name(shard_index: int) -> str:
    return f"part-{shard_index:05d}.parquet"


def stage_output(work_dir: Path, stage: str, shard_index: int, table_name: str = "") -> Path:
    prefix = f"{table_name}-" if table_name else ""
    return Path(work_dir) / stage / f"{prefix}{part_name(shard_index)}"


def error_output(work_dir: Path, stage: str, shard_index: int) -> Path:
    return Path(work_dir) / "errors" / f"{stage}-{part_name(shard_index)}"


def completion_record(work_dir: Path, stage: str, shard_index: int) -> Path:
    return Path(work_dir) / stage / "_done" / f"part-{shard_index:05d}.json"


def completed_shards(work_dir: Path, stage: str) -> list[int]:
    """Shard indexes of `stage` that have a completion record, in order. Only `part-*.json` counts: a
    killed writer's `.tmp-*.partial` record is not one."""
    done = Path(work_dir) / stage / "_done"
    return sorted(int(record.stem.split("-")[1]) for record in done.glob("part-*.json"))


def completion_records(work_dir: Path, stage: str) -> dict[int, dict]:
    """Shard index -> its completion record (the shard's stats), for every completed shard of `stage`."""
    return {shard: json.loads(completion_record(work_dir, stage, shard).read_text())
            for shard in completed_shards(work_dir, stage)}


def completed_outputs(work_dir: Path, stage: str, table_name: str = "") -> list[tuple[int, Path]]:
    """(shard index, path) of a stage's outputs that have a completion record, in shard order."""
    outputs = [(shard, stage_output(work_dir, stage, shard, table_name)) for shard in completed_shards(work_dir, stage)]
    return [(shard, path) for shard, path in outputs if path.exists()]


def required_outputs(work_dir: Path, stage: str) -> list[tuple[int, Path]]:
    """(shard index, path) of every completed shard of an earlier stage that a whole-collection step needs;
    none at all, or a record whose file is gone, is a clear error naming what to rerun."""
    shards = completed_shards(work_dir, stage)
    if not shards:
        raise FileNotFoundError(f"no completed {stage} shards under {Path(work_dir) / stage}: "
                                f"run the {stage} stage first")
    outputs = [(shard, stage_output(work_dir, stage, shard)) for shard in shards]
    for shard, path in outputs:
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing although its completion record exists: "
                                    f"rerun the {stage} stage for shard {shard}")
    return outputs


def atomic_path(final: Path) -> Path:
    """A unique temporary sibling: two workers racing on one shard never write into the same file. The
    `.partial` suffix keeps a killed writer's leftover out of every `*.parquet` or `*.json` glob."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return final.with_name(f".tmp-{uuid.uuid4().hex[:12]}-{final.name}.partial")


def atomic_write_bytes(final: Path, data: bytes) -> None:
    tmp = atomic_path(final)
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, final)


def atomic_write_json(final: Path, value) -> None:
    atomic_write_bytes(final, (json.dumps(value, indent=2, sort_keys=True, default=str) + "\n").encode())


def write_parquet(final: Path, table: pa.Table, metadata: dict[str, str], *,
                  row_group_size: int | None = None, compression: str = "zstd") -> None:
    """Write `table` atomically with `metadata` (str -> str) in the file's key-value metadata."""
    write_parquet_stream(final, table.schema, metadata, [table], row_group_size=row_group_size,
                         compression=compression)


def write_parquet_stream(final: Path, schema: pa.Schema, metadata: dict[str, str], tables, *,
                         row_group_size: int | None = None, compression: str = "zstd") -> None:
    """Write `tables` (an iterable, consumed one at a time: bounded memory) one after another into one
    Parquet file of `schema`, atomically, with `metadata` (str -> str) added to its key-value metadata."""
    existing = dict(schema.metadata or {})
    existing.update({(METADATA_PREFIX + key).encode(): str(value).encode() for key, value in metadata.items()})
    schema = schema.with_metadata(existing)
    tmp = atomic_path(final)
    try:
        with pq.ParquetWriter(tmp, schema, compression=compression, write_statistics=True) as writer:
            for table in tables:
                writer.write_table(table if table.schema.equals(schema) else table.cast(schema),
                                   row_group_size=row_group_size)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()


def schema_metadata(schema: pa.Schema) -> dict[str, str]:
    """The `videobert.*` key-value metadata of a Parquet file's (or a table's) schema, prefix removed."""
    raw = schema.metadata or {}
    return {key.decode()[len(METADATA_PREFIX):]: value.decode()
            for key, value in raw.items() if key.decode().startswith(METADATA_PREFIX)}


def read_metadata(path: Path) -> dict[str, str]:
    """The `videobert.*` key-value metadata of a Parquet file, prefix removed (reads only the footer)."""
    return schema_metadata(pq.read_schema(path))


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file, or of a model folder's files (relative names and contents, in name order)."""
    path = Path(path)
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as handle:
            while block := handle.read(chunk):
                digest.update(block)
    return digest.hexdigest()


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
