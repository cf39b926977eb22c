"""Running one shard of one stage: the only thing an executor calls. Executors decide where it runs.

`run_one_shard` skips a shard that is current (its record's lineage matches what its inputs and config
give now and its files still have their recorded sha256), and otherwise (re)makes it: the tables, the
per-video error rows and then the completion record, each atomically. A stale or corrupt shard is redone
automatically, and the reason is returned in its stats (`redone`). A shard whose input is not current
cannot run: `InputNotReady`, one line naming the input and the stage to run first.

The stage code itself (`stages/<name>/run.py`, named by its record) is a function of a `ShardContext`
to a `ShardResult` (pipeline/contract.py): it never sees paths of other stages' records or any executor."""

from __future__ import annotations

import logging
import platform
import socket
import time
import traceback
from collections.abc import Callable

import pyarrow as pa

import schemas
from pipeline import registry, storage
from pipeline.config import Config
from pipeline.contract import ShardContext, ShardResult, Stage
from pipeline.engine import lineage, replaced
from pipeline.engine.lineage import InputNotReady, Lineage
from pipeline.engine.records import CorruptFile
from pipeline.engine.workdir import WorkDir
from schemas.metadata import Provenance

log = logging.getLogger("pipeline")


def output_provenance(cfg: Config, stage: Stage, schema: schemas.Schema, stage_says: Provenance) -> Provenance:
    return stage_says.merged(
        stage=stage.name,
        schema=schema.tag,
        config=cfg.section_json(*stage.config_sections),
        config_hash=cfg.section_hash(*stage.config_sections),
    )


def run_one_shard(
    cfg: Config,
    work_dir,
    stage: str,
    shard_index: int,
    *,
    force: bool = False,
    quiet: bool = False,
    compute: Callable[[ShardContext], ShardResult] | None = None,
) -> dict:
    """Run one stage on one manifest shard unless it is current. Returns its stats (`skipped` when it
    was current; `redone` with the reason when a stale or corrupt shard was made again).
    `compute` replaces the stage's run function with an executor's own way to the same result (the Ray
    executor's producer tasks feeding encoder actors); the files are written the same way. The results of
    stages made in the same pass (`also_makes`) are written as those stages' shards, each with its own
    record, unless that shard is current (and not forced)."""
    work = WorkDir(work_dir)
    spec = registry.stage(stage)
    checker = Lineage(work, cfg)
    expected = checker.expected(stage, shard_index)  # raises InputNotReady: nothing runs
    redone = None
    if not force:
        state = checker.state(stage, shard_index, verify=True)
        if state.current:
            return dict(state.record, skipped=True)
        if state.status != "missing":
            redone = f"{state.status}: {state.reason}"
            log.info("%s part %05d is %s; redoing it", stage, shard_index, redone)
    ctx = ShardContext(
        cfg=cfg,
        work=work,
        stage=stage,
        shard_index=shard_index,
        videos=checker.shard_videos(shard_index),
        lineage=checker,
        quiet=quiet,
    )
    started = time.time()
    result: ShardResult = (compute or spec.function("run"))(ctx)
    elapsed = time.time() - started
    for other in spec.also_makes:
        if force or not checker.state(other, shard_index, verify=True).current:
            # its seconds are this pass's: summaries count them once, under this stage
            result.also[other].stats["made_in"] = stage
            _write_shard(
                cfg, work, checker, registry.stage(other), shard_index, result.also[other], elapsed, len(ctx.videos)
            )
    stats = _write_shard(cfg, work, checker, spec, shard_index, result, elapsed, len(ctx.videos), expected)
    if redone:
        stats["redone"] = redone
    return stats


def _write_shard(
    cfg: Config,
    work: WorkDir,
    checker: Lineage,
    spec: Stage,
    shard_index: int,
    result: ShardResult,
    elapsed: float,
    n_videos: int,
    expected: dict | None = None,
) -> dict:
    """One stage's tables, error rows and completion record for one shard, each atomically."""
    stage = spec.name
    expected = expected if expected is not None else checker.expected(stage, shard_index)
    # the old record goes first and the new one last: no moment where a record vouches for other files
    work.record(stage, shard_index).unlink(missing_ok=True)
    outputs = {}
    for table_name, schema in spec.tables.items():
        table = schemas.conform(result.tables[table_name], schema)
        path = work.part(stage, shard_index, table_name)
        written = storage.write_parquet(
            path,
            table,
            output_provenance(cfg, spec, schema, result.provenance),
            row_group_size=result.row_group_size,
            temporaries=work.temporaries,
        )
        outputs.update(lineage.output_entry(work, path, table.num_rows, written))
    errors = [dict(row, stage=stage) for row in result.errors]
    error_table = schemas.conform(
        pa.Table.from_pylist(errors, schema=schemas.ERRORS.arrow) if errors else schemas.empty(schemas.ERRORS),
        schemas.ERRORS,
    )
    errors_path = work.errors(stage, shard_index)
    written = storage.write_parquet(errors_path, error_table, Provenance(stage=stage, schema=schemas.ERRORS.tag))
    outputs.update(lineage.output_entry(work, errors_path, error_table.num_rows, written))
    stats = dict(result.stats)
    stats.update(
        videos=n_videos,
        errors=len(errors),
        failed_videos=len({row["video_id"] for row in errors}),
        error_types=_count([row["error_type"] for row in errors]),
        seconds=round(elapsed, 3),
        host=socket.gethostname(),
        python=platform.python_version(),
        finished_at=time.time(),
    )
    lineage.write_record(work, stage, shard_index, expected, outputs, stats)
    work.failure(stage, shard_index).unlink(missing_ok=True)
    stats.update(stage=stage, shard=shard_index)
    return stats


def current_shards(cfg: Config, work_dir, stage: str, shards: list[int], threads: int = 1) -> dict[int, dict]:
    """The shards of `stage` that are current (lineage and file hashes, as `run_one_shard` checks before it
    skips): shard -> its skip stats. Asked by an executor before it starts workers, so that a rerun with
    nothing to do starts none; hashing releases the GIL, so `threads` hash files in parallel."""
    checker = Lineage(WorkDir(work_dir), cfg)

    def skip(shard_index: int) -> dict | None:
        try:
            state = checker.state(stage, shard_index, verify=True)
        except Exception:  # noqa: BLE001 - anything odd is the worker's to find and report
            return None
        return dict(state.record, skipped=True) if state.current else None

    if threads > 1 and len(shards) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(threads, len(shards))) as pool:
            found = list(pool.map(skip, shards))
    else:
        found = [skip(shard_index) for shard_index in shards]
    return {shard_index: stats for shard_index, stats in zip(shards, found) if stats is not None}


def run_one_shard_safely(cfg: Config, work_dir, stage: str, shard_index: int, **kwargs) -> dict:
    """For executors: a shard that cannot run (an input not ready) comes back `blocked` with one line;
    a crash comes back `failed` with its error line, and the traceback is kept in the shard's failure
    record (DIR/_state/failed) so that `status` and `errors` show it."""
    try:
        return run_one_shard(cfg, work_dir, stage, shard_index, **kwargs)
    except (InputNotReady, CorruptFile) as error:
        return {"stage": stage, "shard": shard_index, "blocked": True, "error": str(error)}
    except Exception as error:  # noqa: BLE001 - recorded per shard; the run ends non-zero
        line = storage.one_line(error)
        hint = storage.disk_error_hint(error) if isinstance(error, OSError) else None
        return record_failure(
            WorkDir(work_dir), stage, shard_index, f"{line} ({hint})" if hint else line, traceback.format_exc()
        )


def record_failure(work: WorkDir, stage: str, shard_index: int, error: str, trace: str) -> dict:
    """The failure of one shard's attempt (`error`: one line), written where `status` and `errors` read it
    (best effort: on a full or read-only disk the report still comes back to the caller)."""
    failure = {
        "stage": stage,
        "shard": shard_index,
        "failed": True,
        "error": error,
        "traceback": trace,
        "host": socket.gethostname(),
        "at": time.time(),
    }
    path = work.failure(stage, shard_index)
    try:
        storage.atomic_write_json(path, failure)
        failure["failure_record"] = str(path)
    except OSError as write_error:
        failure["failure_record"] = f"not written ({storage.one_line(write_error)})"
    return failure


def prepare_stage(cfg: Config, work_dir, stage: str) -> list[str]:
    """Before a per-shard stage runs (once per invocation, not per shard): its whole-collection inputs
    must be current (the codebook for quantize), temporary files of killed runs are removed and outputs
    of shards no longer in the manifest are deleted, for the stage and those it makes in the same pass.
    Returns notes to print."""
    notes = []
    for other in registry.stage(stage).also_makes:
        notes += prepare_stage(cfg, work_dir, other)
    work = WorkDir(work_dir)
    checker = Lineage(work, cfg)
    spec = registry.stage(stage)
    for upstream in spec.reads:
        if upstream != "manifest" and not registry.stage(upstream).per_shard:
            state = checker.state(upstream, verify=True)
            if not state.current:
                raise InputNotReady(
                    f"{stage} needs the {upstream} stage's output, which is {state.status}"
                    f"{f' ({state.reason})' if state.reason else ''}: run the {upstream} stage first"
                )
    folders = [work.data_folder(stage, table) for table in spec.tables] + [
        work.records_folder(stage),
        work.errors_folder,
        work.temporaries,
    ]
    for folder in folders:
        storage.remove_stale_temporaries(folder)
    storage.remove_stale_local_temporaries()  # what killed runs wrote through for a remote work dir
    shards = set(checker.manifest_shards())
    found = {int(path.stem.split("-")[1]) for path in work.records_folder(stage).glob("part-*.json")}
    for table in spec.tables:
        found |= {int(path.stem.split("-")[1]) for path in work.data_folder(stage, table).glob("part-*.parquet")}
    for shard in sorted(found - shards):
        # kept, not deleted: finished work a wrong listing dropped can be put back (`restore`)
        entry = replaced.move_aside(
            work, {shard}, stage, f"shard {shard} is no longer in the manifest", with_manifest=False, stages=[stage]
        )
        notes.append(f"{stage} part {shard:05d}: moved to {entry} (shard {shard} is no longer in the manifest)")
    return notes


def _count(values: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return dict(sorted(counts.items()))
