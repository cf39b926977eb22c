"""Atomic files, Parquet with provenance metadata and page checksums, and messages that name the file.

An output appears only complete: it is written under a temporary name in the same folder and renamed
(atomic on POSIX), so a killed run never leaves a file that a reader could take for a finished one. The
temporary name says which host and process wrote it, so the next run can remove a killed writer's
leftovers without touching a live writer's."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from schemas import metadata
from schemas.metadata import Provenance

TEMPORARY_PREFIX = ".tmp_"
TEMPORARY_SUFFIX = ".partial"
STALE_TEMPORARY_S = 24 * 3600     # another host's temporary file this old is a leftover, not a live write


def one_line(error: BaseException) -> str:
    """`Type: first line of the message`, the way every error is reported."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def disk_error_hint(error: OSError) -> str | None:
    """A one-line hint for the OS errors a full, read-only or forbidden work dir gives."""
    hints = {errno.ENOSPC: "the disk is full: free space or choose another --work-dir",
             errno.EDQUOT: "the disk quota is exceeded: free space or choose another --work-dir",
             errno.EROFS: "the file system is read-only: choose a writable --work-dir",
             errno.EACCES: "permission denied: choose a --work-dir you can write to",
             errno.EPERM: "operation not permitted: choose a --work-dir you can write to"}
    return hints.get(error.errno)


# ---------------------------------------------------------------- atomic writes

def atomic_path(final: Path) -> Path:
    """A unique temporary sibling: two workers racing on one shard never write into the same file. The
    `.partial` suffix and the leading dot keep a killed writer's leftover out of every `*.parquet`,
    `*.json` or `step-*` glob."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().replace("_", "-")
    return final.with_name(f"{TEMPORARY_PREFIX}{os.getpid()}_{host}_{uuid.uuid4().hex[:8]}_{final.name}"
                           f"{TEMPORARY_SUFFIX}")


def _writer_is_gone(name: str, age_s: float) -> bool:
    """Whether the writer of a temporary file has ended: this host's process no longer runs, or another
    host's file is older than any write takes."""
    try:
        pid, host, _ = name[len(TEMPORARY_PREFIX):].split("_", 2)
        pid = int(pid)
    except ValueError:
        return age_s > STALE_TEMPORARY_S
    if host != socket.gethostname().replace("_", "-"):
        return age_s > STALE_TEMPORARY_S
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete the temporary files and folders that killed runs left in `folder`; returns them."""
    import shutil

    folder = Path(folder)
    removed = []
    if not folder.is_dir():
        return removed
    now = time.time()
    for path in folder.glob(f"{TEMPORARY_PREFIX}*{TEMPORARY_SUFFIX}"):
        try:
            age = now - path.lstat().st_mtime
        except FileNotFoundError:
            continue
        if _writer_is_gone(path.name, age):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def atomic_write_bytes(final: Path, data: bytes) -> None:
    tmp = atomic_path(final)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_json(final: Path, value) -> None:
    atomic_write_bytes(final, (json.dumps(value, indent=2, sort_keys=True, default=str) + "\n").encode())


# ---------------------------------------------------------------- Parquet

def write_parquet(final: Path, table: pa.Table, provenance: Provenance, *,
                  row_group_size: int | None = None, compression: str = "zstd") -> None:
    """Write `table` atomically with its provenance in the file's key-value metadata."""
    write_parquet_stream(final, table.schema, provenance, [table], row_group_size=row_group_size,
                         compression=compression)


def write_parquet_stream(final: Path, schema: pa.Schema, provenance: Provenance, tables, *,
                         row_group_size: int | None = None, compression: str = "zstd") -> None:
    """Write `tables` (an iterable, consumed one at a time: bounded memory) one after another into one
    Parquet file of `schema`, atomically, with `provenance` in its key-value metadata. Every data page
    carries a CRC32 checksum (Parquet's own), which readers here verify."""
    schema = schema.with_metadata({**(schema.metadata or {}), **provenance.to_metadata()})
    tmp = atomic_path(final)
    try:
        with pq.ParquetWriter(tmp, schema, compression=compression, write_statistics=True,
                              write_page_checksum=True) as writer:
            for table in tables:
                writer.write_table(table if table.schema.equals(schema) else table.cast(schema),
                                   row_group_size=row_group_size)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def read_table(path: Path, columns: list[str] | None = None, **kwargs) -> pa.Table:
    """A Parquet file with its page checksums verified; an unreadable file is an error naming it."""
    try:
        return pq.read_table(path, columns=columns, page_checksum_verification=True, **kwargs)
    except (OSError, pa.ArrowException) as error:
        if isinstance(error, FileNotFoundError):
            raise FileNotFoundError(f"{path} not found") from None
        raise UnreadableFile(f"cannot read {path}: {one_line(error)}") from None


class UnreadableFile(ValueError):
    """A file that exists but cannot be parsed; the message names it."""


def read_metadata(path: Path) -> Provenance:
    """How a Parquet file was made (its `videobert.*` key-value metadata; reads only the footer)."""
    try:
        return metadata.read(pq.read_schema(path))
    except (OSError, pa.ArrowException) as error:
        if isinstance(error, FileNotFoundError):
            raise FileNotFoundError(f"{path} not found") from None
        raise UnreadableFile(f"cannot read {path}: {one_line(error)}") from None


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
