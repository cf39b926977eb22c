"""The step interface: a stage is a function of (config, one manifest shard) to one output file.

Stage modules (`stages/*.py`) define:
    NAME: str
    CONFIG_SECTIONS: tuple[str, ...]   # the config sections whose values shape the output
    SCHEMAS: dict[str, Schema]         # "" -> the main table's schema; other names -> extra tables
    def run_shard(ctx: ShardContext) -> ShardResult
and optionally
    MAX_PARALLEL_SHARDS: int           # e.g. 1 for a stage that already uses every core per shard

`run_one_shard` is all an executor calls: it skips a shard with a completion record, writes the tables,
the error rows and then the completion record, each atomically. Executors only decide where it runs."""

from __future__ import annotations

import importlib
import json
import logging
import platform
import socket
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

import schemas
from pipeline import io
from pipeline.config import SHARD_STAGES, Config

log = logging.getLogger("pipeline")

def stage_module(name: str):
    if name not in SHARD_STAGES:
        raise KeyError(name)
    return importlib.import_module(f"stages.{name}")


@dataclass
class ShardResult:
    tables: dict[str, pa.Table]                        # "" -> main output; other names -> extra tables
    errors: list[dict] = field(default_factory=list)  # {video_id, error_type, message}
    stats: dict = field(default_factory=dict)          # counts for status/summary (videos, clips, ...)
    metadata: dict[str, str] = field(default_factory=dict)   # extra provenance (input hashes ...)
    row_group_size: int | None = None                  # Parquet row groups (None: pyarrow's default)


@dataclass
class ShardContext:
    cfg: Config
    work_dir: Path
    stage: str
    shard_index: int
    videos: list[dict]                                 # this shard's manifest rows
    quiet: bool = False

    def input_path(self, stage: str, table_name: str = "") -> Path:
        return io.stage_output(self.work_dir, stage, self.shard_index, table_name)

    def read_input(self, stage: str, table_name: str = "", columns: list[str] | None = None) -> pa.Table:
        """This shard's output of an earlier stage; a missing one is a clear error (run that stage first)."""
        path = self.input_path(stage, table_name)
        if not completion_record_ok(self.work_dir, stage, self.shard_index):
            raise FileNotFoundError(f"{path} is missing or incomplete: run the {stage} stage first")
        return pq.read_table(path, columns=columns)

    def input_metadata(self, stage: str, table_name: str = "") -> dict[str, str]:
        return io.read_metadata(self.input_path(stage, table_name))

    def progress(self, total: int | None = None, unit: str = "videos", desc: str | None = None):
        from pipeline.progress import Progress
        return Progress(total=total, unit=unit, desc=desc or f"{self.stage} part {self.shard_index}",
                        quiet=self.quiet)


def error_row(video_id: str, error: BaseException | str, error_type: str | None = None) -> dict:
    """An error row: the exception's class is its type; its message is one line."""
    if isinstance(error, BaseException):
        error_type = error_type or type(error).__name__
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    else:
        message = error
    return {"video_id": video_id, "error_type": error_type or "Error", "message": message}


def completion_record_ok(work_dir: Path, stage: str, shard_index: int) -> bool:
    return io.completion_record(work_dir, stage, shard_index).exists()


def read_manifest(work_dir: Path, shard_index: int | None = None, columns: list[str] | None = None) -> pa.Table:
    """The manifest (its `columns`, default all), or only one shard's rows (read through the row groups'
    statistics, so a task of a million-video run does not load every row)."""
    path = Path(work_dir) / "manifest" / "manifest.parquet"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the manifest stage first")
    return pq.read_table(path, columns=columns, filters=None if shard_index is None else [("shard", "=", shard_index)])


def shard_videos(manifest: pa.Table, shard_index: int) -> list[dict]:
    rows = manifest.filter(pa.compute.equal(manifest["shard"], shard_index)).to_pylist()
    return sorted(rows, key=lambda row: row["video_id"])


def manifest_shards(manifest: pa.Table) -> list[int]:
    return sorted(set(manifest["shard"].to_pylist()))


def output_metadata(cfg: Config, stage: str, schema: schemas.Schema, extra: dict[str, str]) -> dict[str, str]:
    module = stage_module(stage)
    sections = getattr(module, "CONFIG_SECTIONS", ())
    metadata = {
        "stage": stage,
        "schema": schema.tag,
        "config": cfg.section_json(*sections),
        "config_hash": cfg.section_hash(*sections),
    }
    metadata.update(extra)
    return metadata


def run_one_shard(cfg: Config, work_dir: Path, stage: str, shard_index: int, *, force: bool = False,
                  quiet: bool = False, compute: Callable[[ShardContext], ShardResult] | None = None) -> dict:
    """Run one stage on one manifest shard unless its completion record exists. Returns its stats.
    `compute` replaces the stage's run_shard with an executor's own way to the same result (the Ray
    executor's features: decode tasks feeding shared model actors); the files are written the same way."""
    work_dir = Path(work_dir)
    record = io.completion_record(work_dir, stage, shard_index)
    if record.exists() and not force:
        stats = json.loads(record.read_text())
        stats["skipped"] = True
        return stats
    module = stage_module(stage)
    manifest = read_manifest(work_dir, shard_index)
    ctx = ShardContext(cfg=cfg, work_dir=work_dir, stage=stage, shard_index=shard_index,
                       videos=shard_videos(manifest, shard_index), quiet=quiet)
    started = time.time()
    result: ShardResult = (compute or module.run_shard)(ctx)
    elapsed = time.time() - started
    # the completion record goes last and is what marks the shard done: outputs first
    if force and record.exists():
        record.unlink()
    for table_name, schema in module.SCHEMAS.items():
        table = schemas.conform(result.tables[table_name], schema)
        io.write_parquet(io.stage_output(work_dir, stage, shard_index, table_name), table,
                         output_metadata(cfg, stage, schema, result.metadata),
                         row_group_size=result.row_group_size)
    errors = [dict(row, stage=stage) for row in result.errors]
    error_table = schemas.conform(pa.Table.from_pylist(errors, schema=schemas.ERRORS.arrow)
                                  if errors else schemas.empty(schemas.ERRORS), schemas.ERRORS)
    io.write_parquet(io.error_output(work_dir, stage, shard_index), error_table,
                     {"stage": stage, "schema": schemas.ERRORS.tag})
    stats = dict(result.stats)
    stats.update(stage=stage, shard=shard_index, videos=len(ctx.videos), errors=len(errors),
                 error_types=_count([row["error_type"] for row in errors]), seconds=round(elapsed, 3),
                 host=socket.gethostname(), python=platform.python_version(), finished_at=time.time())
    io.atomic_write_json(record, stats)
    return stats


def run_one_shard_safely(cfg: Config, work_dir: Path, stage: str, shard_index: int, **kwargs) -> dict:
    """For pool workers: a crash of a whole shard comes back as stats with `failed` and the traceback."""
    try:
        return run_one_shard(cfg, work_dir, stage, shard_index, **kwargs)
    except Exception as error:  # noqa: BLE001 - reported per shard, the run ends non-zero
        return {"stage": stage, "shard": shard_index, "failed": True,
                "error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}


def _count(values: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return dict(sorted(counts.items()))
