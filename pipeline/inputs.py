"""Opening a manifest URI for reading, the one way the decode, features and asr stages open their inputs:
local paths and file:// URIs, the network protocols FFmpeg reads itself, and object storage (s3://, gs://,
hf://) through fsspec with a bounded read-ahead. Anything that is not a regular file is refused unopened, and
every wait on an input is bounded: an input is never what hangs a shard."""

from __future__ import annotations

import os
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



def open_target(uri: str) -> str:
    """What FFmpeg opens for a manifest URI: a file:// URI as its percent-decoded path (FFmpeg's own file
    protocol would not decode it), a plain path as it is, any other scheme left to FFmpeg's protocols."""
    return unquote(urlparse(uri).path) if uri.startswith("file://") else uri


_NOT_REGULAR = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def refuse_non_regular_file(uri: str, target: str) -> None:
    """Raise NotARegularFile when a local input is not a regular file, from its stat alone: opening a FIFO
    for reading blocks until some writer comes (forever, in a pipeline), a device like /dev/zero never ends,
    and none of them is a video. A path that cannot be stat'ed is left to the opener, whose error names why;
    network URLs are left to FFmpeg's protocols and the time limits."""
    if "://" in target:
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
    if is_object_storage(target):
        target = remote_file(target)
    else:
        refuse_non_regular_file(uri, target)
    try:
        return av.open(target, metadata_errors="ignore", timeout=timeout_s)
    except av.error.ExitError as error:
        raise input_timeout(uri, timeout_s, "while opening it") from error


# FFmpeg reads these itself (with its own time limits); any other URL scheme is read through fsspec
FFMPEG_PROTOCOLS = ("http", "https", "ftp", "rtmp", "rtsp", "srt", "udp", "tcp")
REMOTE_BLOCK_BYTES = 8 << 20     # fsspec's read-ahead block: the bounded local cache of a remote video


def is_object_storage(uri: str) -> bool:
    """s3://, gs://, hf://, memory://...: a URL FFmpeg cannot open, read through fsspec instead."""
    return "://" in uri and uri.split("://", 1)[0].lower() not in FFMPEG_PROTOCOLS


def remote_file(uri: str):
    """A video on object storage as a seekable file whose bytes stream through a bounded read-ahead
    cache: range requests, never a full copy of the video (let alone of the collection) on local disk."""
    from pipeline.storage import location
    return location(uri).open("rb", block_size=REMOTE_BLOCK_BYTES, cache_type="readahead")
