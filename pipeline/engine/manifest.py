"""The manifest: one row per input video, assigned to shards. Every later stage works shard by shard.

Input: a folder (searched recursively for video files; a `name.vtt`/`name.srt` beside `name.mp4` becomes
its transcript) or a list file: .txt (one path per line), .csv or .parquet (a `path`/`uri` column and an
optional `transcript`/`transcript_uri` column). Relative paths in a list are relative to the list file.

Transcripts are imported only from inside the input's folder (the folder given, or the folder holding the
list file) or a folder named in `asr.transcript_roots`: a list is data, and a transcript column saying
`../../etc/passwd` must not make the asr stage read that file. The manifest refuses nothing; it records
that folder (symlinks resolved) in its metadata as `transcript_root`, and the asr stage checks each path.

`video_id` is derived from the path relative to the input plus a short hash of it: stable across runs,
unique, and safe as a file name on every OS (ASCII letters, digits, `_`, `-`, `.`; no `/` or `..`).

A shard's identity (the digest later stages name) is its videos' ids, sizes and content tags (`content_tag`:
a local file's modification time, an object's ETag or modification time): a video rewritten in place is
redone. A re-run compares every column of every row besides, and rewrites the manifest when a path or a
transcript changed: asr redoes a shard whose transcripts changed by their content, nothing else does."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import unicodedata
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq

import schemas
from pipeline import storage
from pipeline.config import Config
from pipeline.engine import lineage, replaced
from pipeline.engine.records import CorruptFile, read_record
from pipeline.engine.workdir import WorkDir
from pipeline.media.inputs import local_path
from schemas.metadata import Provenance

VIDEO_EXTENSIONS = {
    ".mp4",
    ".m4v",
    ".mov",
    ".mkv",
    ".webm",
    ".avi",
    ".mpg",
    ".mpeg",
    ".ts",
    ".mts",
    ".m2ts",
    ".flv",
    ".wmv",
    ".3gp",
    ".ogv",
    ".mxf",
}
TRANSCRIPT_EXTENSIONS = (".vtt", ".srt")
LIST_EXTENSIONS = {".txt", ".csv", ".parquet"}


class ManifestError(ValueError):
    pass


class NoVideos(ManifestError):
    """The input holds no videos: nothing would run, which a batch job must not report as success."""


class RemovalRefused(ManifestError):
    """A re-listing would drop videos whose outputs are finished, and nobody agreed to it."""


def make_video_id(relative_path: str) -> str:
    digest = hashlib.sha1(relative_path.encode("utf-8", "surrogateescape")).hexdigest()[:10]
    stem = relative_path.rsplit(".", 1)[0] if "." in Path(relative_path).name else relative_path
    ascii_stem = unicodedata.normalize("NFKD", stem).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^A-Za-z0-9]+", "_", ascii_stem).strip("_")[:60] or "video"
    return f"{slug}-{digest}"


def local_tag(info: os.stat_result) -> str:
    """A local file's content tag: its modification time, to the nanosecond the file system keeps."""
    return f"mtime:{info.st_mtime_ns}"


# what object stores say changes with an object's bytes: a content hash first, else a time it was written
_REMOTE_TAG_KEYS = (
    ("ETag", "etag"),
    ("etag", "etag"),
    ("md5Hash", "md5"),
    ("mtime", "mtime"),
    ("LastModified", "mtime"),
    ("last_modified", "mtime"),
    ("updated", "mtime"),
    ("created", "mtime"),
)


def remote_tag(info: dict) -> str | None:
    """An object's content tag from its listing entry (the ETag or md5 where the store gives one, else its
    modification time); None when the listing has neither."""
    return next(
        (
            f"{kind}:{str(info[key]).strip(chr(34))}"
            for key, kind in _REMOTE_TAG_KEYS
            if info.get(key) not in (None, "")
        ),
        None,
    )


def stored_uri(path: str) -> str:
    """A local path as the manifest stores it: as it is, or, for a name that is not valid UTF-8 (os.walk
    gives its bytes as surrogate escapes, which no Parquet string holds), a file:// URI of its bytes
    percent-encoded, which every opener decodes back to those bytes (inputs.open_target)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "file://" + quote(os.fsencode(path))
    return path


def _find_videos(folder: Path) -> list[tuple[str, str | None, int | None, str | None]]:
    """(uri, transcript uri, size, content tag) of every video file under a local folder, in name order."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            if path.suffix.lower() not in VIDEO_EXTENSIONS or name.startswith("."):
                continue
            transcript = next(
                (str(path.with_suffix(ext)) for ext in TRANSCRIPT_EXTENSIONS if path.with_suffix(ext).exists()), None
            )
            try:
                info = path.stat()
                size, tag = info.st_size, local_tag(info)
            except OSError:
                size, tag = None, None  # decode reports it as an error row naming the video
            found.append((str(path), transcript, size, tag))
    return found


def _find_remote_videos(folder) -> list[tuple[str, str | None, int | None, str | None]]:
    """The same for a folder on object storage: one listing gives the names and sizes."""
    listing = folder.fs.find(folder.path, detail=True)
    names = set(listing)
    found = []
    for name in sorted(listing):
        stem, dot, extension = name.rpartition(".")
        if not dot or f".{extension.lower()}" not in VIDEO_EXTENSIONS or name.rsplit("/", 1)[-1].startswith("."):
            continue
        transcript = next((f"{stem}{ext}" for ext in TRANSCRIPT_EXTENSIONS if f"{stem}{ext}" in names), None)
        url = lambda key: f"{folder.protocol}://{key}"  # noqa: E731 - the listing's keys carry no protocol
        found.append(
            (url(name), url(transcript) if transcript else None, listing[name].get("size"), remote_tag(listing[name]))
        )
    return found


def _read_list(list_file) -> list[tuple[str, str | None, None, None]]:
    suffix = list_file.suffix.lower()
    try:
        data = list_file.read_bytes()
        if suffix == ".txt":
            lines = data.decode("utf-8").splitlines()
            rows = [(line.strip(), None) for line in lines if line.strip() and not line.lstrip().startswith("#")]
        else:
            if suffix == ".csv":
                records = list(csv.DictReader(data.decode("utf-8").splitlines()))
            else:
                records = pq.read_table(pa.BufferReader(data)).to_pylist()
            columns = set(records[0]) if records else set()
            path_column = next((c for c in ("path", "uri", "video") if c in columns), None)
            if records and path_column is None:
                raise ManifestError(f"{list_file}: needs a 'path' (or 'uri') column; found {sorted(columns)}")
            transcript_column = next((c for c in ("transcript_uri", "transcript") if c in columns), None)
            rows = [
                (
                    str(record[path_column]).strip(),
                    (str(record[transcript_column]).strip() or None)
                    if transcript_column and record[transcript_column]
                    else None,
                )
                for record in records
                if record[path_column]
            ]
    except (OSError, UnicodeDecodeError, pa.ArrowException, csv.Error) as error:
        raise ManifestError(f"cannot read the video list {list_file}: {error}") from None
    base = list_file.parent

    def absolute(path: str | None) -> str | None:
        """Relative entries are relative to the list's folder (local or remote); every spelling of a local
        file (file:, local://, simplecache::file://) becomes its path, opened and stat'ed as one."""
        local = local_path(path) if path is not None else None
        if local is None:
            return path
        if local != path:
            return os.path.normpath(os.path.abspath(local))
        if storage.is_remote(base):
            return str(base / path)
        return os.path.normpath(os.path.abspath(base / path)) if not Path(path).is_absolute() else path

    return [(absolute(path), absolute(transcript), None, None) for path, transcript in rows]


def input_folder(input_path: str | Path) -> str:
    """The folder an input's transcripts are confined to: a folder input itself, else the list's folder
    (symlinks resolved for a local one)."""
    place = storage.location(input_path)
    folder = place if place.is_dir() else place.parent
    return str(folder).rstrip("/") if storage.is_remote(folder) else os.path.realpath(folder)


def recorded_transcript_root(work_dir) -> str | None:
    """The transcript folder the manifest stage recorded; None for a manifest made without one."""
    return storage.read_metadata(WorkDir(work_dir).manifest).transcript_root


def list_videos(input_path: str | Path) -> list[dict]:
    """One row per input video (video_id, uri, bytes, content_tag, transcript_uri), in video_id order, no
    shards yet.
    The input is a folder or a list, on the local disk or on object storage; a video's id comes from its
    path relative to the folder, so the same collection gets the same ids wherever it is stored."""
    place = storage.location(input_path)
    if place.is_dir():
        entries = _find_remote_videos(place) if storage.is_remote(place) else _find_videos(place)
        root = str(place).rstrip("/")
    elif place.suffix.lower() in LIST_EXTENSIONS and place.exists():
        entries, root = _read_list(place), None
    elif place.exists():
        raise ManifestError(f"--input {input_path}: expected a folder or a .txt/.csv/.parquet list of videos")
    else:
        raise ManifestError(f"--input {input_path} does not exist")
    rows, seen = [], set()
    for uri, transcript, size, tag in entries:
        local = local_path(uri)
        key = uri if local is None else os.path.normpath(os.path.abspath(local))
        if key in seen:
            continue  # duplicate paths are listed once
        seen.add(key)
        if root is not None and key.startswith(root.rstrip("/") + "/"):
            relative = key[len(root.rstrip("/")) + 1 :]
        elif root is not None and not storage.is_url(key):
            relative = os.path.relpath(key, os.path.abspath(root))
        else:
            relative = key.split("://", 1)[1] if "://" in key else key.lstrip("/")
        if size is None and not storage.is_url(key):
            try:
                info = os.stat(key)
                size, tag = info.st_size, local_tag(info)
            except OSError:
                size = None  # decode reports it as an error row naming the video
        if transcript and local_path(transcript) is not None:
            transcript = os.path.abspath(local_path(transcript))
        if transcript and local_path(transcript) is not None:
            transcript = stored_uri(transcript)
        rows.append(
            {
                "video_id": make_video_id(relative.replace(os.sep, "/")),
                "uri": key if local is None else stored_uri(key),
                "bytes": size,
                "content_tag": tag,
                "transcript_uri": transcript,
            }
        )
    ids = [row["video_id"] for row in rows]
    if len(set(ids)) != len(ids):
        raise ManifestError("two inputs map to the same video_id; rename one of them")
    return sorted(rows, key=lambda row: row["video_id"])


def assign_shards(rows: list[dict], videos_per_shard: int, previous: dict[str, int] | None = None) -> list[dict]:
    """Give every row its shard. Without `previous` (video_id -> shard of the last manifest), shard s
    holds the rows s*videos_per_shard.. in video_id order. With it, a listed video keeps its shard and new
    videos fill new shards after the last one, so that adding videos to a large collection redoes only
    the new shards (and the shards that lost a video), not every shard after the first new id."""
    if previous is None:
        return [dict(row, shard=position // videos_per_shard) for position, row in enumerate(rows)]
    kept = [dict(row, shard=previous[row["video_id"]]) for row in rows if row["video_id"] in previous]
    new = [row for row in rows if row["video_id"] not in previous]
    first = max(previous.values(), default=-1) + 1
    added = [dict(row, shard=first + position // videos_per_shard) for position, row in enumerate(new)]
    return sorted(kept + added, key=lambda row: (row["shard"], row["video_id"]))


def build_manifest(cfg: Config, input_path: str | Path, previous: dict[str, int] | None = None) -> pa.Table:
    rows = assign_shards(list_videos(input_path), cfg.shards.videos_per_shard, previous)
    rows.sort(key=lambda row: (row["shard"], row["video_id"]))
    return pa.Table.from_pylist(rows, schema=schemas.MANIFEST.arrow)


def previous_assignment(cfg: Config, work: WorkDir) -> dict[str, int] | None:
    """video_id -> shard of the existing manifest, when it was made with the same shard size."""
    try:
        record = read_record(work.record("manifest"), "manifest")
    except CorruptFile:
        return None
    if (
        record is None
        or not work.manifest.exists()
        or record.get("lineage", {}).get("config") != json.loads(cfg.section_json("shards"))
    ):
        return None
    table = storage.read_table(work.manifest, columns=["video_id", "shard"])
    return dict(zip(table["video_id"].to_pylist(), table["shard"].to_pylist()))


def _old_rows(work: WorkDir) -> dict[str, int]:
    """video_id -> shard of the existing manifest, whatever its shard size; {} without a readable one."""
    if not work.manifest.exists():
        return {}
    try:
        table = storage.read_table(work.manifest, columns=["video_id", "shard"])
    except (OSError, ValueError, pa.ArrowException):
        return {}
    return dict(zip(table["video_id"].to_pylist(), table["shard"].to_pylist()))


def guard_removal(
    work: WorkDir, ids: set[str], changed: list[int], listing: str, source: str, confirm_removal
) -> str | None:
    """Before a new listing (`ids`, changing shards `changed`) replaces the manifest: when it drops videos
    whose shards some stage finished, go on only if `confirm_removal(message)` returns True (else
    RemovalRefused naming `listing`), and move the old manifest and the outputs of every finished shard whose
    rows change to DIR/_state/replaced/; returns that entry (None when nothing finished is dropped)."""
    old_rows = _old_rows(work)
    dropped = sorted(set(old_rows) - ids)
    at_risk = replaced.finished_shards(work, {old_rows[video] for video in dropped})
    if not at_risk:
        return None
    moved = replaced.finished_shards(work, set(changed) | set(at_risk))
    lost = [video for video in dropped if old_rows[video] in at_risk]
    message = (
        f"{listing} no longer lists {len(lost)} video(s) with finished outputs "
        f"(e.g. {lost[0]}) in shard(s) {_listed(at_risk)}; the outputs of shard(s) {_listed(moved)} "
        f"would move to {replaced.folder(work)} (`restore --work-dir {work.root}` puts them back)"
    )
    if confirm_removal is None or not confirm_removal(message):
        raise RemovalRefused(f"{message}: give --allow-removal to go on")
    return replaced.move_aside(
        work,
        moved,
        "manifest",
        f"re-listed from {source}: {len(dropped)} video(s) dropped",
        with_manifest=True,
        details={"dropped_videos": dropped[:1000]},
    )


def write_manifest(
    cfg: Config, input_path: str | Path, work_dir, *, incremental: bool = True, confirm_removal=None
) -> tuple[Path, pa.Table, dict]:
    """List the input and write the manifest with its completion record (the digest of each shard's rows,
    which every later stage's lineage names). Returns (path, table, changes): changes has the shards whose
    rows changed and the counts of new and removed videos.

    A listing that drops videos whose shards some stage finished (a wrong --input costs GPU-hours) goes on
    only when `confirm_removal(message)` returns True; else RemovalRefused. Going on, the old manifest and
    the outputs of every finished shard whose rows change move to DIR/_state/replaced/ (`restore` puts them
    back); changes["replaced"] names that entry."""
    work = WorkDir(work_dir)
    previous = previous_assignment(cfg, work) if incremental else None
    table = build_manifest(cfg, input_path, previous)
    if table.num_rows == 0:
        raise NoVideos(f"--input {input_path}: no videos found (looked for {', '.join(sorted(VIDEO_EXTENSIONS))})")
    digests = shard_digests(table)
    try:
        old = read_record(work.record("manifest"), "manifest") or {}
    except CorruptFile:
        old = {}
    old_digests = old.get("shards", {})
    changed = sorted(int(s) for s in set(digests) | set(old_digests) if digests.get(s) != old_digests.get(s))
    ids = set(table["video_id"].to_pylist())
    changes = {
        "changed_shards": changed,
        "new_videos": len(ids - set(previous or {})) if previous is not None else None,
        "removed_videos": len(set(previous or {}) - ids) if previous is not None else None,
    }
    config = json.loads(cfg.section_json("shards"))
    input_name = storage.canonical(input_path)  # a URL as given, a local path absolute
    provenance = Provenance(
        stage="manifest",
        schema=schemas.MANIFEST.tag,
        config=cfg.section_json("shards"),
        config_hash=cfg.section_hash("shards"),
        input=input_name,
        transcript_root=input_folder(input_path),
    )
    # the digests name the videos (ids, sizes, content tags); paths and transcripts are compared row by row:
    # a caption that arrives after the first pass, or a moved input folder, rewrites the rows
    changes["updated_shards"] = sorted(set(_updated_shards(work, table, provenance)) - set(changed))
    moved_to = guard_removal(
        work, ids, changed, f"--input {input_path}", storage.canonical(input_path), confirm_removal
    )
    if moved_to:
        changes["replaced"] = moved_to
    if (
        not changed
        and not changes["updated_shards"]
        and old.get("lineage", {}).get("config") == config
        and work.manifest.exists()
    ):
        changes["unchanged"] = True
        return work.manifest, table, changes
    write_manifest_table(
        work,
        table,
        {"version": lineage.VERSION, "config": config, "input": input_name},
        provenance,
        row_group_size=cfg.shards.videos_per_shard * 16,
    )
    return work.manifest, table, changes


def _listed(shards) -> str:
    shards = sorted(shards)
    return ", ".join(str(shard) for shard in shards[:10]) + (" ..." if len(shards) > 10 else "")


def _updated_shards(work: WorkDir, table: pa.Table, provenance: Provenance) -> list[int]:
    """Shards whose rows differ from the existing manifest's in any column (uri, transcript_uri, ...); every
    shard when the recorded input or transcript folder differs, or the manifest cannot be read."""
    every = sorted(set(table["shard"].to_pylist()))
    if not work.manifest.exists():
        return every
    try:
        recorded = storage.read_metadata(work.manifest)
        old_rows = storage.read_table(work.manifest).to_pylist()
    except (OSError, ValueError, pa.ArrowException):
        return every
    if (recorded.input, recorded.transcript_root, recorded.schema) != (
        provenance.input,
        provenance.transcript_root,
        provenance.schema,
    ):
        return every
    old_by_id = {row["video_id"]: row for row in old_rows}
    new_ids = set(table["video_id"].to_pylist())
    updated = {row["shard"] for row in table.to_pylist() if old_by_id.get(row["video_id"]) != row}
    updated |= {row["shard"] for row in old_rows if row["video_id"] not in new_ids}
    return sorted(updated)


def shard_digests(table: pa.Table) -> dict[str, str]:
    """shard -> the digest of its rows, as the manifest's record holds them."""
    by_shard: dict[int, list[dict]] = {}
    for row in table.to_pylist():
        by_shard.setdefault(row["shard"], []).append(row)
    return {str(shard): lineage.rows_digest(rows) for shard, rows in sorted(by_shard.items())}


def write_manifest_table(
    work_dir, table: pa.Table, lineage_record: dict, provenance: Provenance, *, row_group_size: int | None = None
) -> dict[str, str]:
    """Write a manifest table and its completion record: the digest of each shard's rows, which every
    later stage's lineage names. Returns shard -> digest."""
    work = WorkDir(work_dir)
    digests = shard_digests(table)
    work.record("manifest").unlink(missing_ok=True)
    # rows are in shard order: row groups of a few shards let a shard task read just its own
    written = storage.write_parquet(
        work.manifest, table, provenance, row_group_size=row_group_size, temporaries=work.temporaries
    )
    lineage.write_record(
        work,
        "manifest",
        None,
        lineage_record,
        lineage.output_entry(work, work.manifest, table.num_rows, written),
        {"videos": table.num_rows, "shards": digests},
    )
    return digests


def read_manifest(work_dir, shard_index: int | None = None, columns: list[str] | None = None) -> pa.Table:
    """The manifest (its `columns`, default all), or only one shard's rows (read through the row groups'
    statistics, so a task of a million-video run does not load every row)."""
    path = WorkDir(work_dir).manifest
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the manifest stage first")
    return storage.read_table(
        path, columns=columns, filters=None if shard_index is None else [("shard", "=", shard_index)]
    )
