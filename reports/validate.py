"""`python -m pipeline validate DIR`: the whole chain of a run, file by file, and the invariants across files.

- integrity: every recorded file has the sha256 its completion record gives it, every value of every
  Parquet part is read with its page checksums verified, the codebook matches the sha256 in its sidecar;
- lineage: every record is consistent with the upstream outputs that exist now (with a config, also
  with its values: `validate DIR --config FILE`); stale, corrupt and unrecorded files are named;
- schemas: every part against its schema and version;
- invariants: every clip of the features tokenised once, tokens and ids inside their vocabularies, times
  in order, every tokenised clip in exactly one training segment: the checks each stage's record names per
  table (`checks`: functions of a pipeline.contract.Part, in the stage's folder or pipeline/table_checks.py).

Returns the problems, each naming its file; an empty list means valid."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

import schemas
from pipeline import registry, storage
from pipeline.contract import Invalid, Part, Stage, resolve
from pipeline.engine.lineage import InputNotReady, Lineage, rows_digest
from pipeline.engine.records import CorruptFile, read_json, relative
from pipeline.engine.workdir import WorkDir
from schemas import metadata


def _check_schema(path: Path, schema: schemas.Schema) -> None:
    try:
        found = storage.parquet_file(path).schema_arrow
    except (OSError, pa.ArrowException) as error:
        raise Invalid(f"cannot read {path}: {storage.one_line(error)}") from None
    if not found.remove_metadata().equals(schema.arrow, check_metadata=False):
        expected = {f.name: str(f.type) for f in schema.arrow}
        actual = {f.name: str(f.type) for f in found}
        differences = sorted(set(expected.items()) ^ set(actual.items()))
        raise Invalid(f"{path}: schema differs from {schema.tag}: {differences[:4]}")
    tag = metadata.read(found).schema
    if tag is not None and tag != schema.tag:
        raise Invalid(f"{path}: written as {tag}, this code reads {schema.tag}")


def _visual_vocab_size(work: WorkDir) -> int | None:
    try:
        info = read_json(work.codebook_sidecar)
    except CorruptFile:
        return None
    return int(info["k"]) ** int(info["depth"]) if info else None


def _streamed_shard_digests(path) -> tuple[dict[str, str], list[str]]:
    """(shard -> the digest of its rows, the video ids given twice) of a manifest file, read a row group at a
    time (rows are in shard order, a few shards to a group): memory holds one group's rows and the ids."""
    digests, duplicates, seen = {}, [], set()
    pending: dict[int, list[dict]] = {}
    for batch in storage.parquet_file(path).iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            if row["video_id"] in seen:
                duplicates.append(row["video_id"])
            seen.add(row["video_id"])
            if pending and row["shard"] not in pending and row["shard"] > max(pending):
                for shard in sorted(pending):  # shards before this one are complete
                    digests[str(shard)] = rows_digest(pending.pop(shard))
            pending.setdefault(row["shard"], []).append(row)
    for shard in sorted(pending):
        digests[str(shard)] = rows_digest(pending.pop(shard))
    return dict(sorted(digests.items(), key=lambda item: int(item[0]))), duplicates


def _check_manifest(work: WorkDir, checker: Lineage) -> list[str]:
    if not work.manifest.exists():
        return [f"{work.manifest} not found: nothing to validate (run the manifest stage)"]
    try:
        record = checker.manifest_record()
    except (InputNotReady, CorruptFile) as error:
        return [str(error)]
    state = checker.state("manifest", verify=True)
    if not state.current:
        return [f"{work.manifest}: {state.status}: {state.reason}"]
    try:
        _check_schema(work.manifest, schemas.MANIFEST)
        digests, duplicates = _streamed_shard_digests(work.manifest)  # a row group at a time
    except (Invalid, storage.UnreadableFile) as problem:
        return [str(problem)]
    problems = []
    if duplicates:
        problems.append(f"{work.manifest}: duplicate video_id")
    if digests != record.get("shards"):
        problems.append(f"{work.manifest}: its rows do not match the shard digests of {work.record('manifest')}")
    return problems


def _check_stage_parts(work: WorkDir, checker: Lineage, stage: Stage, visual_vocab: int | None) -> list[str]:
    """Every manifest shard of a per-shard stage: lineage and sha256, then schema, values and invariants of
    the current ones; and files no record accounts for."""
    problems = []
    shards = checker.manifest_shards()
    for shard in shards:
        state = checker.state(stage.name, shard, verify=True)
        if state.status in ("stale", "corrupt"):
            problems.append(
                f"{work.record(stage.name, shard)}: {stage.name} part {shard:05d} is {state.status}: {state.reason}"
            )
        if not state.current:
            continue
        for table, schema in list(stage.tables.items()) + [("errors", schemas.ERRORS)]:
            path = work.errors(stage.name, shard) if table == "errors" else work.part(stage.name, shard, table)
            if table == "errors" and not path.exists():
                continue  # parts made outside the stages have no error table
            try:
                _check_schema(path, schema)
                storage.read_table(path)  # every value, with the page checksums verified
                part = Part(work, path, path.name.split("part-")[-1], visual_vocab)
                for check in stage.checks.get(table, ()):
                    resolve(check)(part)
            except (Invalid, storage.UnreadableFile) as problem:
                problems.append(str(problem))
    recorded = set()
    for shard in shards:
        try:
            recorded |= set((checker.record(stage.name, shard) or {}).get("outputs", {}))
        except CorruptFile:
            pass
    for table in stage.tables:
        for path in sorted(work.data_folder(stage.name, table).glob("part-*.parquet")):
            if relative(work, path) not in recorded:
                problems.append(
                    f"{path}: no completion record accounts for this file (a killed run's output, or "
                    f"a shard no longer in the manifest); a rerun of {stage.name} redoes or removes it"
                )
    return problems


def validate_work_dir(work_dir, cfg=None) -> list[str]:
    """Problems of the run in `work_dir`, each naming its file; with `cfg`, outputs made with other config
    values than `cfg`'s are stale too."""
    work = WorkDir(work_dir)
    if not work.root.is_dir():
        return [f"{work.root} is not a folder"]
    checker = Lineage(work, cfg)
    problems = _check_manifest(work, checker)
    if problems and not work.manifest.exists():
        return problems
    try:
        checker.manifest_record()
    except (InputNotReady, CorruptFile):  # named by _check_manifest; no shard can be checked without it
        return problems
    visual_vocab = _visual_vocab_size(work)
    for stage in registry.STAGES:
        if stage.per_shard:
            problems += _check_stage_parts(work, checker, stage, visual_vocab)
    for stage in registry.STAGES:  # then the whole-collection stages' outputs (the codebook, checkpoints)
        if stage.validate:
            problems += stage.function("validate")(work, checker)
    return problems
