"""The align shards as training reads them: pinned (hard links to the files as they were verified, so a
rewrite during training never mixes old and new parts; on object storage, read in place and checked against
the object training started with), and streamed one record batch at a time into segments whose ids are
checked against the model's vocabulary (a shard of another codebook or tokenizer is refused)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.parquet as pq

from pipeline import storage

if TYPE_CHECKING:
    from videobert.vocab import VocabLayout

EMPTY = np.zeros(0, dtype=np.int64)
_READ_BATCH_ROWS = 1024


class PinnedShards(list):
    """The shards training reads: hard links to the files as they were verified (`pin_shards`), and
    `sha256`, name -> the checksum their records give (what the checkpoint says it read), and `origin`,
    pin -> the work dir's file it pins (the name outputs made from it record), and `identity`, a shard on
    object storage (read in place: nothing to link) -> its size and the store's version of it at the start."""

    sha256: dict[str, str]
    origin: dict[Path, Path]
    identity: dict[str, tuple]


class ShardRewritten(ValueError):
    """A shard on object storage changed after training started (an `align --force` renamed new parts in)."""

    def __init__(self, path):
        super().__init__(
            f"{path} was rewritten while training read it (is align running?): train again when it is done"
        )


def remote_identity(details: dict) -> tuple:
    """A stored object's size and version from one `info()` (or an open file's details): the ETag or
    version id where the store gives one, else its modification time."""
    version = next(
        (
            details[key]
            for key in ("VersionId", "version_id", "ETag", "etag", "generation", "md5Hash")
            if details.get(key)
        ),
        None,
    )
    if version is None:
        version = next(
            (str(details[key]) for key in ("LastModified", "mtime", "updated", "last_modified") if details.get(key)),
            None,
        )
    return int(details.get("size") or 0), version


def check_identity(shards: list[Path], path: Path, details: dict | None = None) -> None:
    """ShardRewritten unless a shard on object storage still is the object training started with (`details`:
    those of the file opened for reading, else one `info()` request)."""
    expected = getattr(shards, "identity", {}).get(str(path))
    if expected is None:
        return
    if details is None:
        try:
            details = path.fs.info(path.path)
        except FileNotFoundError:
            raise ShardRewritten(path) from None
    if remote_identity(details) != expected:
        raise ShardRewritten(path)


def pin_shards(paths: list[Path], pins: Path) -> PinnedShards:
    """Hard links to `paths` in a new folder under `pins` (removed when the process ends, and by the next
    run on this host if it is killed): a shard rewritten during training (`align --force` renames a new
    file over the old) leaves the pinned bytes in place, so an epoch never mixes old and new parts. Object
    storage cannot link: its shards are returned as they are (unpinned). Call `confirm_pins` after the
    shards are verified."""
    import atexit
    import shutil

    pinned = PinnedShards(paths)
    pinned.sha256, pinned.origin, pinned.identity = {}, {}, {}
    if not paths or storage.is_remote(paths[0]):
        # read in place: each one's identity now, checked at every later open (`check_identity`)
        pinned.identity = {str(path): remote_identity(path.fs.info(path.path)) for path in paths}
        return pinned
    # a killed run's pins: this host's only (another host's run may train for days; age says nothing)
    for old in pins.glob(f"{storage.TEMPORARY_PREFIX}*") if pins.is_dir() else []:
        if storage.ended_here(old.name):
            shutil.rmtree(old, ignore_errors=True)
    folder = storage.atomic_path(pins / "train-pins", folder=pins)
    folder.mkdir()
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    pinned.clear()
    for path in paths:
        link = folder / path.name
        try:
            os.link(path, link)
        except OSError:  # a file system without hard links (some network mounts): a private copy
            shutil.copy2(path, link)
        pinned.append(link)
        pinned.origin[link] = path
    return pinned


def confirm_pins(paths: list[Path], pinned: PinnedShards, checksums: dict[str, str]) -> PinnedShards:
    """After `paths` were verified against their records: raise ValueError unless each still is the file
    its pin holds (a rewrite between pinning and verifying would leave the pins unverified)."""
    pinned.sha256 = dict(checksums)
    for path, pin in zip(paths, pinned):
        if pin == path:
            check_identity(pinned, path)
            continue
        now, held = os.stat(path), os.stat(pin)
        if (now.st_ino, now.st_dev, now.st_size) != (held.st_ino, held.st_dev, held.st_size) and storage.file_sha256(
            pin
        ) != checksums.get(path.name):
            raise ValueError(
                f"{path} was rewritten while training started (is align running?): train again when it is done"
            )
    return pinned


def training_shards(shards: list[Path]) -> list[Path]:
    """The shards holding at least one segment (an empty one would starve a stream)."""
    kept = [path for path in shards if storage.parquet_file(path).metadata.num_rows > 0]
    if not kept:
        raise ValueError(f"the align shards ({len(shards)}) hold no segments")
    if isinstance(shards, PinnedShards):
        pinned = PinnedShards(kept)
        pinned.sha256 = {path.name: shards.sha256[path.name] for path in kept if path.name in shards.sha256}
        pinned.origin = {path: shards.origin[path] for path in kept if path in shards.origin}
        pinned.identity = {str(path): shards.identity[str(path)] for path in kept if str(path) in shards.identity}
        return pinned
    return kept


class Segment:
    __slots__ = ("video_id", "text_ids", "visual_ids")

    def __init__(self, video_id: str, text_ids: np.ndarray, visual_ids: np.ndarray):
        self.video_id, self.text_ids, self.visual_ids = video_id, text_ids, visual_ids


def _list_column(column) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets) of a list<int32> column: row i is values[offsets[i]:offsets[i+1]] (also for a
    sliced column, whose `values` are the unsliced ones)."""
    offsets = column.offsets.to_numpy()
    values = column.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]].astype(np.int64)
    return values, offsets - offsets[0]


def _check_ids(
    path: Path, video_ids: list[str], values: np.ndarray, offsets: np.ndarray, limit: int, what: str
) -> None:
    if values.size and (values.min() < 0 or values.max() >= limit):
        bad = int(np.flatnonzero((values < 0) | (values >= limit))[0])
        row = int(np.searchsorted(offsets, bad, side="right")) - 1
        raise ValueError(
            f"{path}: video {video_ids[row]!r} has {what} id {int(values[bad])} outside "
            f"[0, {limit}): the shard was made with another codebook or tokenizer"
        )


def _open_shard(path: Path, shards: list[Path] | None) -> pq.ParquetFile:
    """A shard opened for reading; one on object storage that `shards` knows must still be the object
    training started with (the open's own `info()` says; s3fs then reads with If-Match on that ETag)."""
    if str(path) not in getattr(shards, "identity", {}):
        return storage.parquet_file(path)
    handle = path.open("rb")
    try:
        check_identity(shards, path, getattr(handle, "details", None))
    except ShardRewritten:
        handle.close()
        raise
    return pq.ParquetFile(handle, page_checksum_verification=True)


def read_segments(
    path: Path, layout: VocabLayout, columns: tuple[str, ...] = (), start_row: int = 0, shards: list[Path] | None = None
) -> Iterator[tuple[Segment, dict]]:
    """Stream a shard's segments from row `start_row` on, one record batch at a time; `columns` are extra
    columns returned as a dict. Row groups before `start_row` are not read. `shards`: the training shards
    `path` is one of (`PinnedShards` on object storage: checked at the open, `_open_shard`)."""
    file = _open_shard(path, shards)
    groups, skip, first = [], start_row, 0
    for index in range(file.metadata.num_row_groups):
        rows = file.metadata.row_group(index).num_rows
        if first + rows > start_row:
            groups.append(index)
        else:
            skip -= rows
        first += rows
    for batch in file.iter_batches(
        batch_size=_READ_BATCH_ROWS, row_groups=groups, columns=["video_id", "kind", "text_ids", "visual_ids", *columns]
    ):
        if skip >= batch.num_rows:
            skip -= batch.num_rows
            continue
        batch, skip = batch.slice(skip), 0
        video_ids = batch.column("video_id").to_pylist()
        kinds = batch.column("kind").to_pylist()
        text_values, text_offsets = _list_column(batch.column("text_ids"))
        visual_values, visual_offsets = _list_column(batch.column("visual_ids"))
        _check_ids(path, video_ids, text_values, text_offsets, layout.text_vocab_size, "text")
        _check_ids(path, video_ids, visual_values, visual_offsets, layout.num_visual, "visual")
        extra = {name: batch.column(name).to_pylist() for name in columns}
        for row, video_id in enumerate(video_ids):
            text = text_values[text_offsets[row] : text_offsets[row + 1]] if kinds[row] == "text_video" else EMPTY
            visual = visual_values[visual_offsets[row] : visual_offsets[row + 1]]
            yield Segment(video_id, text, visual), {name: values[row] for name, values in extra.items()}
