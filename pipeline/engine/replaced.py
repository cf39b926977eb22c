"""Finished outputs a re-listing (or a stage's clean-up) would otherwise delete, kept under
DIR/_state/replaced/ instead, and put back with one command (`restore`).

A re-listing that drops videos moves the old manifest, its record and every per-shard output of the shards
whose rows changed into one entry (`manifest-<time>`); restoring that entry moves the current manifest and
the outputs it would overwrite aside in turn (so a restore is undone by another), then moves the kept files
back. Lineage checks the rest: an output that no longer matches the manifest is redone, never reused."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pipeline import registry, storage
from pipeline.engine.workdir import WorkDir

ENTRY_RECORD = "replaced.json"


def folder(work: WorkDir) -> Path:
    return work.state / "replaced"


def shard_files(work: WorkDir, shard: int, stages=None) -> list[Path]:
    """Every file of one shard's per-shard outputs that exists: records, data parts, error rows."""
    found = []
    for name in stages or registry.SHARD_STAGES:
        spec = registry.stage(name)
        candidates = [work.record(name, shard), work.errors(name, shard)]
        candidates += [work.part(name, shard, table) for table in spec.tables]
        found += [path for path in candidates if path.exists()]
    return found


def finished_shards(work: WorkDir, shards) -> list[int]:
    """The shards among `shards` that some per-shard stage finished (its completion record exists)."""
    return sorted(shard for shard in shards if any(work.record(name, shard).exists() for name in registry.SHARD_STAGES))


def _move(source, destination) -> None:
    if storage.is_remote(source):
        source.fs.mv(source.path, destination.path)
        return
    Path(destination).parent.mkdir(parents=True, exist_ok=True)
    os.replace(source, destination)


def _new_entry(work: WorkDir, label: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = folder(work)
    for attempt in range(1000):
        entry = base / (f"{label}-{stamp}" + (f"-{attempt}" if attempt else ""))
        if not entry.exists():
            return entry
    raise FileExistsError(f"{base}: no free name for {label}-{stamp}")


def move_aside(
    work: WorkDir, shards, label: str, reason: str, *, with_manifest: bool, stages=None, details: dict | None = None
) -> Path | None:
    """Move the outputs of `shards` (and, with_manifest, the manifest and its record) into a new entry;
    returns it, or None when there was nothing to move."""
    files = [path for shard in sorted(shards) for path in shard_files(work, shard, stages)]
    if with_manifest:
        files = [path for path in (work.manifest, work.record("manifest")) if path.exists()] + files
    if not files:
        return None
    entry = _new_entry(work, label)
    names = [storage.relative_name(work.root, path) for path in files]
    # the entry's record first: an entry interrupted half-way still says what it was meant to hold
    storage.atomic_write_json(
        entry / ENTRY_RECORD,
        {
            "reason": reason,
            "at": time.time(),
            "shards": sorted(shards),
            "manifest": with_manifest,
            "files": names,
            **(details or {}),
        },
    )
    for path, name in zip(files, names):
        _move(path, entry / name)
    return entry


def entries(work: WorkDir) -> list[tuple[Path, dict]]:
    """(entry, its record) of every entry, oldest first."""
    base = folder(work)
    if not base.exists():
        return []
    found = []
    for entry in sorted(base.iterdir(), key=lambda path: path.name):
        try:
            record = json.loads((entry / ENTRY_RECORD).read_text())
        except (OSError, ValueError):
            record = {}  # train --restart's entries hold a whole train folder and no record
        found.append((entry, record))
    return sorted(found, key=lambda item: (item[1].get("at", 0.0), item[0].name))


def restore(work: WorkDir) -> tuple[Path, Path | None, list[str]]:
    """Put back the newest re-listing's entry. Returns (the entry restored, the entry now holding what it
    replaced, the names put back). Raises LookupError when there is no such entry."""
    kept = [(entry, record) for entry, record in entries(work) if record.get("manifest")]
    if not kept:
        raise LookupError(f"{folder(work)} holds no outputs a re-listing moved aside: nothing to restore")
    entry, record = kept[-1]
    names = [name for name in record.get("files", []) if (entry / name).exists()]
    current_shards = set()
    if work.manifest.exists():
        current_shards = set(storage.read_table(work.manifest, columns=["shard"])["shard"].to_pylist())
    old_shards = set(record.get("shards", []))
    kept_manifest = entry / storage.relative_name(work.root, work.manifest)
    if kept_manifest.exists():
        old_shards |= set(storage.read_table(kept_manifest, columns=["shard"])["shard"].to_pylist())
    # what the kept files overwrite, and the current shards the kept manifest does not list (a stage's
    # clean-up would delete those): aside, so that this restore can be undone the same way
    aside = move_aside(
        work,
        set(record.get("shards", [])) | (current_shards - old_shards),
        "manifest",
        f"replaced by restoring {entry.name}",
        with_manifest=True,
    )
    for name in names:
        _move(entry / name, work.root / name)
    (entry / ENTRY_RECORD).unlink(missing_ok=True)
    if not storage.is_remote(entry):
        for path in sorted(Path(entry).rglob("*"), reverse=True):  # the emptied folders
            if path.is_dir():
                path.rmdir()
        Path(entry).rmdir()
    return entry, aside, names


def summary_lines(work: WorkDir) -> list[str]:
    """One line per entry, for `status`."""
    lines = []
    for entry, record in entries(work):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record["at"])) if record.get("at") else "?"
        what = (
            f"{len(record.get('files', []))} file(s) of shard(s) {_listed(record.get('shards', []))}"
            if record
            else "a training run (train --restart)"
        )
        lines.append(f"  {entry.name}: {what}, {when}: {record.get('reason', 'moved aside')}")
    return lines


def _listed(shards: list[int]) -> str:
    return ", ".join(str(shard) for shard in shards[:10]) + (" ..." if len(shards) > 10 else "") or "-"
