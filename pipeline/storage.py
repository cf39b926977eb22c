"""Where files live (a local folder or object storage), atomic files, Parquet with provenance metadata and
page checksums, and messages that name the file.

A location is a local `Path` (plain paths and file:// URIs) or, for any other URL (s3://, gs://, hf://,
http(s)://, memory://), a `UPath` on its fsspec filesystem, with credentials and endpoints from the
standard environment (for S3: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...). Both answer the same path
operations; the few that differ (atomic publication, Parquet access, hashing) are here.

An output appears only complete. Locally it is written under a temporary name in the same folder and
renamed (atomic on POSIX); the temporary name says which host and process wrote it, so the next run can
remove a killed writer's leftovers without touching a live writer's. On object storage it is written to a
local temporary file and published with one upload, which the store makes visible whole or not at all."""

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
STALE_TEMPORARY_S = 24 * 3600  # another host's temporary file this old is a leftover, not a live write


def one_line(error: BaseException) -> str:
    """`Type: first line of the message`, the way every error is reported."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def disk_error_hint(error: OSError) -> str | None:
    """A one-line hint for the OS errors a full, read-only or forbidden work dir gives."""
    hints = {
        errno.ENOSPC: "the disk is full: free space or choose another --work-dir",
        errno.EDQUOT: "the disk quota is exceeded: free space or choose another --work-dir",
        errno.EROFS: "the file system is read-only: choose a writable --work-dir",
        errno.EACCES: "permission denied: choose a --work-dir you can write to",
        errno.EPERM: "operation not permitted: choose a --work-dir you can write to",
    }
    return hints.get(error.errno)


# ---------------------------------------------------------------- locations


def location(value) -> Path:
    """A local Path for plain paths and file:// URIs; a UPath for any other URL (object storage, HTTP)."""
    if hasattr(value, "protocol") or isinstance(value, Path):
        return value
    value = os.fspath(value)
    if value.startswith("file://"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(value).path))
    if "://" not in value:
        return Path(value)
    from upath import UPath

    protocol = value.split("://", 1)[0]
    # listings are not cached: another worker's new record must be seen at once
    options = {"use_listings_cache": False} if protocol in ("s3", "s3a", "gs", "gcs") else {}
    return UPath(value, **options)


def is_remote(path) -> bool:
    """Whether `path` is on an fsspec filesystem other than the local disk."""
    return hasattr(path, "protocol") and getattr(path, "protocol", "") not in ("", "file", "local")


def is_url(text: str) -> bool:
    """Whether a manifest URI names a remote location (s3://, gs://, http://...) rather than a local file."""
    return "://" in text and not text.startswith("file://")


def bucket_of(value) -> str | None:
    """The bucket (container, repository) a URL names: `s3://videobert/run1` -> `videobert`; None locally."""
    from urllib.parse import urlparse

    text = str(value)
    if not is_url(text):
        return None
    parsed = urlparse(text)
    if parsed.scheme in ("http", "https"):
        return None
    if parsed.scheme == "hf":  # hf://datasets/owner/name/...: the repository
        return "/".join(parsed.path.strip("/").split("/")[:2]) or None
    return parsed.netloc or None


def remote_error_types() -> tuple[type[BaseException], ...]:
    """The exceptions object-storage clients raise that are not OSErrors (an unreachable endpoint, missing
    credentials, a refused request), from the clients this process has loaded (none is imported here)."""
    import sys

    found = []
    for module, names in (
        ("botocore.exceptions", ("BotoCoreError", "ClientError")),
        ("aiohttp", ("ClientError",)),
        ("google.auth.exceptions", ("GoogleAuthError",)),
        ("gcsfs.retry", ("HttpError",)),
        ("huggingface_hub.errors", ("HfHubHTTPError",)),
    ):
        loaded = sys.modules.get(module)
        found += [getattr(loaded, name) for name in names if loaded is not None and hasattr(loaded, name)]
    return tuple(found)


def remote_error_line(error: BaseException, *places) -> str:
    """An object-storage failure in one line, naming the bucket of each remote location involved (and the
    S3 endpoint when one is set): which store, not only which request, failed."""
    import re

    named = []
    for place in places:
        bucket = bucket_of(place) if place is not None else None
        if bucket is not None:
            named.append(f"bucket {bucket} ({place})")
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
    if endpoint and any(str(place).startswith(("s3://", "s3a://")) for place in places if place is not None):
        named[-1:] = [f"{named[-1]} at {endpoint}"] if named else [endpoint]
    text = re.sub(r"\?[^\s\"']*", "", one_line(error))  # a request's query string says nothing to a person
    return f"object storage: {', '.join(named) or 'a remote location'}: {text}"


def canonical(value) -> str:
    """A location as every process and record names it: a URL (object storage) as given, a local path
    made absolute."""
    place = location(str(value))
    return str(place) if is_remote(place) else str(Path(place).resolve())


def relative_name(root, path) -> str:
    """`path`'s name inside `root` ("a/b.json"), the same for local and remote locations."""
    if not is_remote(root):  # by parts: a root of "." holds "a/b.json", whose text does not start with "./"
        try:
            return Path(path).relative_to(Path(root)).as_posix()
        except ValueError:
            raise ValueError(f"{path} is not inside {root}") from None
    root_text, text = str(root).rstrip("/"), str(path)
    if not text.startswith(root_text + "/"):
        raise ValueError(f"{path} is not inside {root}")
    return text[len(root_text) + 1 :]


def user_cache(name: str) -> Path:
    """This user's cache folder `name` (models, calibrated weights, library links, training mirrors):
    $VIDEOBERT_CACHE/name, else $XDG_CACHE_HOME/videobert/name, else ~/.cache/videobert/name. Outside the
    repository and the work dir: one copy per user and machine."""
    if os.environ.get("VIDEOBERT_CACHE"):
        return Path(os.environ["VIDEOBERT_CACHE"]).expanduser() / name
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "videobert" / name


def local_temporary(name: str) -> Path:
    """A fresh local file for a remote output (or input) to be written through; the caller removes it. Its
    name says which host and process made it (as atomic_path's do), so that the next run removes what a
    killed one left (remove_stale_local_temporaries): a k-means fit sample there is gigabytes."""
    import tempfile

    host = socket.gethostname().replace("_", "-")
    handle, path = tempfile.mkstemp(prefix=f"{TEMPORARY_PREFIX}{os.getpid()}_{host}_", suffix=f"_{name}")
    os.close(handle)
    return Path(path)


def remove_stale_local_temporaries() -> list[Path]:
    """Delete the local temporary files (local_temporary) of this host's processes that no longer run."""
    import tempfile

    removed = []
    host = socket.gethostname().replace("_", "-")
    for path in Path(tempfile.gettempdir()).glob(f"{TEMPORARY_PREFIX}*_{host}_*"):
        try:
            if path.is_file() and _writer_is_gone(path.name, time.time() - path.lstat().st_mtime):
                path.unlink()
                removed.append(path)
        except (OSError, ValueError):
            continue  # another user's, or gone meanwhile
    return removed


def publish(local: Path, final) -> None:
    """Upload a finished local file to its remote location in one request: readers never see half of it."""
    final.fs.put_file(str(local), final.path)


def arrow_filesystem(path):
    """(pyarrow filesystem, path in it) for pyarrow's readers: the fsspec filesystem wrapped, or local."""
    if not is_remote(path):
        return None, str(path)
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    return PyFileSystem(FSSpecHandler(path.fs)), path.path


# ---------------------------------------------------------------- atomic writes


def atomic_path(final: Path, folder: Path | None = None) -> Path:
    """A unique temporary name for `final`: two workers racing on one shard never write into the same file.
    The `.partial` suffix and the leading dot keep a killed writer's leftover out of every `*.parquet`,
    `*.json` or `step-*` glob. By default a sibling of `final`; `folder` (on the same file system, so the
    rename stays atomic) keeps it out of a data folder altogether, which some readers (Polars) list whole."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(folder) if folder is not None else final.parent
    folder.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().replace("_", "-")
    return folder / f"{TEMPORARY_PREFIX}{os.getpid()}_{host}_{uuid.uuid4().hex[:8]}_{final.name}{TEMPORARY_SUFFIX}"


def _writer_is_gone(name: str, age_s: float) -> bool:
    """Whether the writer of a temporary file has ended: this host's process no longer runs, or another
    host's file is older than any write takes."""
    try:
        pid, host, _ = name[len(TEMPORARY_PREFIX) :].split("_", 2)
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


def ended_here(name: str) -> bool:
    """Whether a temporary's name says it is this host's, of a process that no longer runs (another host's
    may belong to a run of days: only its own host can tell)."""
    return f"_{socket.gethostname().replace('_', '-')}_" in name and _writer_is_gone(name, 0.0)


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete the temporary files and folders that killed runs left in `folder`; returns them. (Remote
    outputs are written through local temporary files: nothing is left on the store.)"""
    import shutil

    removed = []
    if is_remote(folder):
        return removed
    folder = Path(folder)
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
    if is_remote(final):
        final.write_bytes(data)  # one request: the object appears whole or not at all
        return
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


def write_parquet(
    final: Path,
    table: pa.Table,
    provenance: Provenance,
    *,
    row_group_size: int | None = None,
    compression: str = "zstd",
    temporaries: Path | None = None,
) -> dict:
    """Write `table` atomically with its provenance in the file's key-value metadata; returns the
    written file's {"sha256", "bytes"}."""
    return write_parquet_stream(
        final,
        table.schema,
        provenance,
        [table],
        row_group_size=row_group_size,
        compression=compression,
        temporaries=temporaries,
    )


def write_parquet_stream(
    final: Path,
    schema: pa.Schema,
    provenance: Provenance,
    tables,
    *,
    row_group_size: int | None = None,
    compression: str = "zstd",
    temporaries: Path | None = None,
) -> dict:
    """Write `tables` (an iterable, consumed one at a time: bounded memory) one after another into one
    Parquet file of `schema`, atomically, with `provenance` in its key-value metadata (a file of no rows
    has no row group: every reader, `datasets` included, reads it as the schema alone). Every data page
    carries a CRC32 checksum (Parquet's own), which readers here verify. `temporaries`: the folder of the
    file being written (see atomic_path). Returns the file's {"sha256", "bytes"}, taken from the local
    file before it is published: a record of it needs no second read (nor a download)."""
    schema = schema.with_metadata({**(schema.metadata or {}), **provenance.to_metadata()})
    tmp = local_temporary(final.name) if is_remote(final) else atomic_path(final, temporaries)
    try:
        with pq.ParquetWriter(
            tmp, schema, compression=compression, write_statistics=True, write_page_checksum=True
        ) as writer:
            for table in tables:
                # no row group of 0 rows: Hugging Face `datasets` fails on one ("BatchSize must be greater
                # than 0") for the whole folder; a file with no rows is its schema alone (no row group)
                if table.num_rows:
                    writer.write_table(
                        table if table.schema.equals(schema) else table.cast(schema), row_group_size=row_group_size
                    )
        written = {"sha256": file_sha256(tmp), "bytes": tmp.stat().st_size}
        if is_remote(final):
            publish(tmp, final)
        else:
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return written


def read_table(path: Path, columns: list[str] | None = None, **kwargs) -> pa.Table:
    """A Parquet file with its page checksums verified; an unreadable file is an error naming it."""
    filesystem, name = arrow_filesystem(path)
    try:
        return pq.read_table(name, columns=columns, page_checksum_verification=True, filesystem=filesystem, **kwargs)
    except (OSError, pa.ArrowException) as error:
        if isinstance(error, FileNotFoundError):
            raise FileNotFoundError(f"{path} not found") from None
        raise UnreadableFile(f"cannot read {path}: {one_line(error)}") from None


class UnreadableFile(ValueError):
    """A file that exists but cannot be parsed; the message names it."""


def read_metadata(path: Path) -> Provenance:
    """How a Parquet file was made (its `videobert.*` key-value metadata; reads only the footer)."""
    filesystem, name = arrow_filesystem(path)
    try:
        return metadata.read(pq.read_schema(name, filesystem=filesystem))
    except (OSError, pa.ArrowException) as error:
        if isinstance(error, FileNotFoundError):
            raise FileNotFoundError(f"{path} not found") from None
        raise UnreadableFile(f"cannot read {path}: {one_line(error)}") from None


def parquet_file(path) -> pq.ParquetFile:
    """A Parquet file of either kind, opened for reading with its page checksums verified."""
    if is_remote(path):
        return pq.ParquetFile(path.open("rb"), page_checksum_verification=True)
    return pq.ParquetFile(path, page_checksum_verification=True)


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file, or of a model folder's files (relative names and contents, in name order).
    FileNotFoundError when there is neither: a missing file has no sha256 (not that of no bytes)."""
    path = location(path)
    digest = hashlib.sha256()
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
    else:
        raise FileNotFoundError(f"{path} does not exist")
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode() + b"\0")
        with file.open("rb") as handle:  # a Path or a UPath alike
            while block := handle.read(chunk):
                digest.update(block)
    return digest.hexdigest()


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
