"""Opening a manifest URI for reading, the one way the decode, features and asr stages open their inputs:
local paths and file:// URIs, the network protocols FFmpeg reads itself, and object storage (s3://, gs://,
hf://) through fsspec with a bounded read-ahead. Anything that is not a regular file is refused unopened, and
every wait on an input is bounded: an input is never what hangs a shard."""

from __future__ import annotations

import os
import re
import stat
from urllib.parse import unquote, urlparse

import av


class InputError(Exception):
    """The input cannot be read at all, whichever of its streams is wanted (asr reports these too)."""


class NotARegularFile(InputError):
    """A local input that is a FIFO, a device, a socket or a folder: refused without being opened."""


class InputTimeout(InputError):
    """Opening the input, or reading its next packet, took longer than decode.io_timeout_s."""


def input_timeout(uri: str, timeout_s: float, when: str) -> InputTimeout:
    return InputTimeout(f"{uri}: no data for {timeout_s:g} s {when} (decode.io_timeout_s)")


# fsspec's protocols that are the local disk (fsspec.implementations.local and morefs' async twin)
LOCAL_PROTOCOLS = ("file", "local", "asynclocal")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(.*)$", re.DOTALL)
_CHAIN_PART = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*(?:://.*)?$", re.DOTALL)


def _chain(uri: str) -> list[str]:
    """An fsspec URL's chain (`simplecache::file:///x` -> [simplecache, file:///x]); a plain path with
    `::` in a file name is one part."""
    parts = uri.split("::")
    return parts if len(parts) > 1 and all(_CHAIN_PART.match(part) for part in parts[:-1]) else [uri]


def _local_part(part: str) -> str | None:
    """The local path of one chain part: a plain path, `file:`/`file://` (percent-decoded, as a URI is) or
    fsspec's local protocols (`local://`, as fsspec reads them); None for any other scheme."""
    scheme = _SCHEME.match(part)
    if scheme is None or "/" in scheme.group(1):
        return part
    name, rest = scheme.group(1).lower(), scheme.group(2)
    if name not in LOCAL_PROTOCOLS:
        return None
    if name == "file" and rest.startswith("//"):
        # bytes that are not UTF-8 (a name the manifest percent-encoded) come back as the same bytes
        return unquote(urlparse(part).path, errors="surrogateescape")
    return rest[2:] if rest.startswith("//") else rest


def local_file(uri: str) -> str | None:
    """The file on the local disk that reading `uri` reads, whatever the spelling: a plain path, a file:
    URI, fsspec's local protocols, a chained URL ending in one (`simplecache::file:///x`, and the archive
    of `zip://member::file:///x.zip`); None for a URL elsewhere. Whatever is read from the local disk is
    stat'ed first: a FIFO opened by fsspec's plain open() blocks in the kernel, where no time limit reaches."""
    chain = _chain(uri)
    return (
        _local_part(chain[-1])
        if len(chain) > 1 or "://" in uri or uri.lower().startswith(tuple(f"{name}:" for name in LOCAL_PROTOCOLS))
        else uri
    )


def local_path(uri: str) -> str | None:
    """The local path a URI names when reading it reads just that file (a plain path, a file: URI,
    `local://`, a chain of fsspec caches over one of them); None for a URL elsewhere or an archive member."""
    chain = _chain(uri)
    if any("://" in part for part in chain[:-1]):
        return None  # zip://member::file:///x.zip: the member of a local archive, read through fsspec
    return local_file(uri)


def open_target(uri: str) -> str:
    """What FFmpeg opens for a manifest URI: every local spelling as its path (a file:// URI percent-decoded,
    which FFmpeg's own file protocol would not do; a relative path that looks like an FFmpeg protocol,
    `pipe:0` or `concat:a|b`, made absolute so it stays a file name), any other URL as it is."""
    path = local_path(uri)
    if path is None:
        return uri
    return os.path.abspath(path) if _SCHEME.match(path) else path


_NOT_REGULAR = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


def refuse_non_regular_file(uri: str, target: str) -> None:
    """Raise NotARegularFile when a local input is not a regular file, from its stat alone: opening a FIFO
    for reading blocks until some writer comes (forever, in a pipeline), a device like /dev/zero never ends,
    and none of them is a video. A path that cannot be stat'ed is left to the opener, whose error names why;
    network URLs are left to FFmpeg's protocols and the time limits. `target` is the local file (a plain
    path: `local_file`), else the URL, which is left alone."""
    target = local_file(target)
    if target is None:
        return
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _NOT_REGULAR if test(mode)), "not a regular file")
    raise NotARegularFile(f"{uri} is {kind}, not a regular file: not opened")


def open_input(uri: str, timeout_s: float) -> av.container.InputContainer:
    """A manifest URI opened for reading: the one way decode, features and asr open their inputs.
    Raises NotARegularFile before opening anything that is not a regular file; FFmpeg's own errors
    (OSError, ValueError, av.error.FFmpegError) are the caller's to report.

    `timeout_s` limits, separately, opening the input, probing its streams and every later read of one
    packet: FFmpeg's interrupt callback ends a wait that lasts longer with av.error.ExitError, which
    readers turn into InputTimeout (`input_timeout`). It reaches what FFmpeg waits on itself (network
    protocols, which poll); a read() stuck inside the kernel (a hard-mounted share that went away) it
    cannot interrupt."""
    target = open_target(uri)
    refuse_non_regular_file(uri, uri)
    if is_object_storage(target):
        target = remote_file(target)
    try:
        return av.open(target, metadata_errors="ignore", timeout=timeout_s)
    except av.error.ExitError as error:
        raise input_timeout(uri, timeout_s, "while opening it") from error


# FFmpeg reads these itself (with its own time limits); any other URL scheme is read through fsspec
FFMPEG_PROTOCOLS = ("http", "https", "ftp", "rtmp", "rtsp", "srt", "udp", "tcp")
REMOTE_BLOCK_BYTES = 8 << 20  # fsspec's read-ahead block: the bounded local cache of a remote video


def is_object_storage(uri: str) -> bool:
    """s3://, gs://, hf://, memory://...: a URL FFmpeg cannot open, read through fsspec instead (a local
    spelling is not: it is opened as its path)."""
    return local_path(uri) is None and "://" in uri and uri.split("://", 1)[0].lower() not in FFMPEG_PROTOCOLS


def remote_file(uri: str):
    """A video on object storage as a seekable file whose bytes stream through a bounded read-ahead
    cache: range requests, never a full copy of the video (let alone of the collection) on local disk."""
    from pipeline.storage import location

    return location(uri).open("rb", block_size=REMOTE_BLOCK_BYTES, cache_type="readahead")
