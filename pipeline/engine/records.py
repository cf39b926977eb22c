"""Completion records as files: reading one (parsed once per mtime and size on a local disk), checking its
shape, and checking the files it lists against their recorded size and sha256. An unparsable record, one of
the wrong shape, or a file whose bytes differ from its record is a CorruptFile naming the path. What a record
must say for its output to be current is pipeline/engine/lineage.py."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline import storage
from pipeline.engine.workdir import WorkDir
from pipeline.file_cache import FileCache


class CorruptFile(ValueError):
    """A file whose bytes are not what its record says, or that cannot be parsed; names the path."""


_RECORDS: FileCache[dict] = FileCache(max_entries=100_000)


def read_json(path: Path) -> dict | None:
    """A JSON object file; None when absent. Unparsable content is a CorruptFile naming the path.
    Local records are read many times by lineage checks: parsed once per (mtime, size)."""
    if storage.is_remote(path):
        try:
            return _parse_json(path, path.read_bytes())
        except FileNotFoundError:
            return None
    path = Path(path)
    try:
        return _RECORDS.get(path, lambda: _parse_json(path, path.read_bytes()))
    except FileNotFoundError:
        return None


def _parse_json(path, data: bytes) -> dict:
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CorruptFile(f"{path} is not a valid JSON record ({error}); it will be redone") from None
    except RecursionError:
        raise CorruptFile(f"{path} is not a valid JSON record (nested too deeply); it will be redone") from None
    if not isinstance(value, dict):
        raise CorruptFile(f"{path} is not a valid JSON record (not an object); it will be redone")
    return value


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def record_problem(record: dict, stage: str) -> str | None:
    """What is wrong with the shape of a completion record (valid JSON, but not what write_record writes),
    or None: every key a reader of it (lineage checks, status, summary, validate) takes is of its type."""
    lineage = record.get("lineage")
    if not isinstance(lineage, dict):
        return "no lineage object"
    for key in ("config", "inputs", "identities", "schemas"):
        if key in lineage and not isinstance(lineage[key], dict):
            return f"lineage.{key} is not an object"
    outputs = record.get("outputs")
    if not isinstance(outputs, dict):
        return "no outputs object"
    for name, entry in outputs.items():
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("sha256"), str)
            or not _is_count(entry.get("bytes"))
            or ("rows" in entry and not _is_count(entry["rows"]))
        ):
            return f"outputs.{name} is not an object of sha256, bytes and rows"
    for key in ("videos", "errors", "failed_videos", "seconds", "clips"):
        if key in record and not _is_number(record[key]) and not (key == "clips" and record[key] is None):
            return f"{key} is not a number"
    error_types = record.get("error_types", {})
    if not isinstance(error_types, dict) or not all(_is_count(count) for count in error_types.values()):
        return "error_types is not an object of counts"
    if stage == "manifest":
        shards = record.get("shards")
        if not isinstance(shards, dict) or not all(
            isinstance(key, str) and key.isdigit() and isinstance(digest, str) for key, digest in shards.items()
        ):
            return "shards is not an object of shard digests"
    return None


def read_record(path: Path, stage: str) -> dict | None:
    """A completion record; None when absent. Unparsable content, or a record of the wrong shape, is a
    CorruptFile naming the path: its shard is redone by the next run of its stage."""
    record = read_json(path)
    if record is not None:
        problem = record_problem(record, stage)
        if problem:
            raise CorruptFile(f"{path} is not a valid completion record ({problem}); it will be redone")
    return record


def relative(work: WorkDir, path: Path) -> str:
    """`path`'s name inside the work dir, the same on a local disk and on object storage."""
    return storage.relative_name(work.root, path)


def verify_outputs(work: WorkDir, record: dict, where: str, *, hashes: bool = True) -> str | None:
    """None when every file of the record is present with its recorded size and (with `hashes`) sha256,
    else what is wrong, naming the file."""
    for name, entry in sorted(record.get("outputs", {}).items()):
        path = work.root / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return f"{path} is missing although {where} lists it"
        if size != entry["bytes"]:
            return f"{path} has {size} bytes, {where} says {entry['bytes']}: the file is cut off or was changed"
        if hashes and storage.file_sha256(path) != entry["sha256"]:
            return f"{path} does not match its sha256 in {where}: the file is corrupt or was changed"
    return None


def verify_file(work: WorkDir, record: dict, path: Path, where: str) -> None:
    """Raise CorruptFile unless `path` has the sha256 its record gives it (read before use: a bit flip
    in a file that still parses would otherwise flow into every later stage)."""
    entry = record.get("outputs", {}).get(relative(work, path))
    if entry is None:
        raise CorruptFile(f"{path} is not listed in {where}")
    try:
        actual = storage.file_sha256(path)
    except FileNotFoundError:
        raise CorruptFile(f"{path} is missing although {where} lists it") from None
    if actual != entry["sha256"]:
        raise CorruptFile(f"{path} does not match its sha256 in {where}: the file is corrupt or was changed")


def parquet_rows(path: Path) -> int:
    return storage.parquet_file(path).metadata.num_rows
