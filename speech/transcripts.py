"""Existing transcripts (WebVTT, SRT, JSON) read into the same word stream the asr stage gets from Whisper.

Word times come from the caption's inline timestamps where it has them (YouTube auto-captions:
`word<00:00:01.230><c> next</c>`), otherwise a cue's words share its span in proportion to their length.
Cues are taken in time order, whatever their order in the file.
Imported words carry no probability (prob is null). A malformed file raises TranscriptError naming the
file, the line and what was expected there, never the line's text: a transcript path can point at any file
(a misconfigured list, a symlink), and error messages travel into error tables, `pipeline errors` and the
HTML report."""

from __future__ import annotations

import html
import json
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from pipeline.media.inputs import is_object_storage, local_file, open_target
from pipeline.storage import location


class TranscriptError(ValueError):
    """A transcript that cannot be read; the message names the file and, where there is one, the line."""


@dataclass(frozen=True)
class SegmentSignals:
    """What Whisper says of the segment (one decoded stretch of text) a recognised word came from."""

    no_speech_prob: float  # probability that the window held no speech
    avg_logprob: float  # mean log-probability of the segment's tokens
    compression_ratio: float  # gzip ratio of the segment's text: high for repetition loops


@dataclass
class Word:
    text: str  # as it joins into sentence text: Whisper's leading space included
    start_s: float
    end_s: float
    prob: float | None  # recogniser confidence; None for imported words
    segment: SegmentSignals | None = None  # None for imported words


@dataclass
class Transcript:
    words: list[Word]
    format: str  # vtt | srt | json
    language: str | None  # as the file states it, else None


_VTT_TIME = re.compile(r"^(?:(\d+):)?([0-5]\d):([0-5]\d)\.(\d{3})$")
_SRT_TIME = re.compile(r"^(\d+):([0-5]\d):([0-5]\d)[,.](\d{1,3})$")
_TIMING = re.compile(r"^\s*(\S+)\s+-->\s+(\S+)(?:\s.*)?$")
_VTT_EXAMPLE = "00:00:01.000 --> 00:00:02.500"
_SRT_EXAMPLE = "00:00:01,000 --> 00:00:02,500"
_INLINE_TIME = re.compile(r"<((?:\d+:)?[0-5]\d:[0-5]\d\.\d{3})>")
_TAG = re.compile(r"<[^>]*>|\{\\[^}]*\}")  # <i>, <c.colour>, <v Name>, SSA {\an8}
_ANNOTATION = re.compile(r"\[[^\]]*\]|♪")  # [Music], [Applause]: sounds, not speech


def _seconds(match: re.Match) -> float:
    hours, minutes, seconds, fraction = match.groups()
    return int(hours or 0) * 3600 + int(minutes) * 60 + int(seconds) + int(fraction.ljust(3, "0")) / 1000


def _parse_timing(line: str, time_pattern: re.Pattern, name: str, line_no: int, example: str) -> tuple[float, float]:
    """A cue timing line's (start, end) seconds; `example` is what the format's timing line looks like."""
    timing = _TIMING.match(line)
    if not timing:
        raise TranscriptError(f"{name}:{line_no}: expected a cue timing line like '{example}'")
    times = []
    for which, stamp, example_stamp in zip(("start", "end"), timing.groups()[:2], example.split(" --> ")):
        match = time_pattern.match(stamp)
        if not match:
            raise TranscriptError(f"{name}:{line_no}: bad {which} timestamp, expected one like '{example_stamp}'")
        times.append(_seconds(match))
    if times[1] < times[0]:
        raise TranscriptError(f"{name}:{line_no}: cue ends before it starts")
    return times[0], times[1]


def _clean(text: str) -> str:
    return " ".join(_ANNOTATION.sub(" ", html.unescape(_TAG.sub("", text))).split())


def _spread(text: str, start_s: float, end_s: float) -> list[Word]:
    """A span's words, each given a share of the span in proportion to its length (spaces counted)."""
    tokens = _clean(text).split()
    total = len(" ".join(tokens))
    words, position = [], 0
    for token in tokens:
        word_start = start_s + (end_s - start_s) * position / total
        position += len(token)
        word_end = start_s + (end_s - start_s) * position / total
        position += 1
        words.append(Word(text=" " + token, start_s=round(word_start, 3), end_s=round(word_end, 3), prob=None))
    return words


def _cue_words(lines: list[str], start_s: float, end_s: float) -> list[Word]:
    """Words of one cue's text lines, using inline timestamps where present."""
    text = " ".join(lines)
    pieces = _INLINE_TIME.split(text)  # [text, time, text, time, text, ...]
    times = [start_s] + [_seconds(_VTT_TIME.match(stamp)) for stamp in pieces[1::2]] + [end_s]
    words = []
    for i, piece in enumerate(pieces[0::2]):
        piece_start = min(max(times[i], start_s), end_s)
        piece_end = min(max(times[i + 1], piece_start), end_s)
        words += _spread(piece, piece_start, piece_end)
    return words


Cue = tuple[float, float, list[str]]  # start_s, end_s, its text lines


def _in_time_order(cues: list[tuple]) -> list[tuple]:
    """Cues (start_s, end_s, text) sorted by (start, end). Files are not always in time order (edited or merged
    captions), and sentence splitting, align and `pipeline validate` take times that never go backwards. The sort is
    stable: cues with equal times keep the file's order."""
    return sorted(cues, key=lambda cue: (cue[0], cue[1]))


def _drop_rolling_repeats(cues: list[Cue]) -> list[Cue]:
    """Rolling auto-captions repeat the line shown before at the top of each cue: keep each line once.
    "Before" is in time, so this runs on cues already in time order (for a file in order, the same)."""
    kept, last_line = [], None
    for start_s, end_s, lines in cues:
        fresh = []
        for line in lines:
            plain = _clean(_INLINE_TIME.sub("", line))
            if plain and plain != last_line:
                fresh.append(line)
                last_line = plain
        kept.append((start_s, end_s, fresh))
    return kept


def _words(cues: list[Cue]) -> list[Word]:
    return [word for start_s, end_s, lines in cues for word in _cue_words(lines, start_s, end_s)]


def _blocks(text: str, whitespace_is_blank: bool) -> list[tuple[int, list[str]]]:
    """Blank-line separated blocks as (first line number, lines). WebVTT separates cues by empty lines
    only: auto-captions put lines of one space inside a cue."""
    blocks, current, first = [], [], 0
    for line_no, line in enumerate(text.splitlines(), start=1):
        if line.strip() if whitespace_is_blank else line:
            if not current:
                first = line_no
            current.append(line)
        elif current:
            blocks.append((first, current))
            current = []
    if current:
        blocks.append((first, current))
    return blocks


def parse_vtt(text: str, name: str) -> Transcript:
    text = text.lstrip("\ufeff")
    blocks = _blocks(text, whitespace_is_blank=False)
    if not blocks or not re.match(r"^WEBVTT(?:[ \t].*)?$", blocks[0][1][0]):
        raise TranscriptError(f"{name}:1: a WebVTT file starts with 'WEBVTT'")
    language = None
    for line in blocks[0][1][1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == "language" and value.strip():
            language = value.strip()
    cues: list[Cue] = []
    for first_line_no, lines in blocks[1:]:
        if lines[0].startswith(("NOTE", "STYLE", "REGION")):
            continue
        timing_index = 0 if "-->" in lines[0] else 1  # an optional cue identifier comes first
        if timing_index >= len(lines):
            raise TranscriptError(f"{name}:{first_line_no}: expected a cue timing line like '{_VTT_EXAMPLE}'")
        start_s, end_s = _parse_timing(lines[timing_index], _VTT_TIME, name, first_line_no + timing_index, _VTT_EXAMPLE)
        cues.append((start_s, end_s, lines[timing_index + 1 :]))
    cues = _in_time_order(cues)
    if _INLINE_TIME.search(text):  # inline word times: YouTube's rolling auto-captions
        cues = _drop_rolling_repeats(cues)
    return Transcript(words=_words(cues), format="vtt", language=language)


def parse_srt(text: str, name: str) -> Transcript:
    cues: list[Cue] = []
    for first_line_no, lines in _blocks(text.lstrip("\ufeff"), whitespace_is_blank=True):
        timing_index = 1 if lines[0].strip().isdigit() else 0  # the cue number is optional in practice
        if timing_index >= len(lines):
            raise TranscriptError(
                f"{name}:{first_line_no}: a cue number without a timing line like '{_SRT_EXAMPLE}' after it"
            )
        start_s, end_s = _parse_timing(lines[timing_index], _SRT_TIME, name, first_line_no + timing_index, _SRT_EXAMPLE)
        cues.append((start_s, end_s, lines[timing_index + 1 :]))
    return Transcript(words=_words(_in_time_order(cues)), format="srt", language=None)


def _json_type(value) -> str:
    """A JSON value's kind, for messages that must not quote the value itself."""
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), "a value")


def _segment_problem(item) -> str | None:
    """What is wrong with one JSON segment, naming keys and kinds but no values; None when it is fine."""
    if not isinstance(item, dict):
        return f"got {_json_type(item)}"
    if not isinstance(item.get("text"), str):
        return f"'text' is {_json_type(item.get('text')) if 'text' in item else 'missing'}"
    for key in ("start", "end"):
        value = item.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return f"'{key}' is {_json_type(value) if key in item else 'missing'}"
        if not math.isfinite(value):  # NaN, Infinity and 1e999 parse; no time is any of them
            return f"'{key}' is not a finite number"
    return None


def parse_json(text: str, name: str) -> Transcript:
    """A list of {text, start, end} (seconds), or {"language": ..., "segments": [that list]}."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise TranscriptError(f"{name}:{error.lineno}: invalid JSON: {error.msg}") from None
    except RecursionError:  # lists in lists thousands deep: no transcript, and the parser's stack ends
        raise TranscriptError(f"{name}: invalid JSON: nested too deeply") from None
    language = None
    if isinstance(data, dict):
        language = data.get("language")
        if language is not None and not isinstance(language, str):
            raise TranscriptError(f"{name}: 'language' must be a language code string, got {_json_type(language)}")
        data = data.get("segments")
    if not isinstance(data, list):
        raise TranscriptError(f"{name}: expected a list of {{text, start, end}} or an object with 'segments'")
    segments: list[tuple[float, float, str]] = []
    for index, item in enumerate(data):
        problem = _segment_problem(item)
        if problem:
            raise TranscriptError(
                f"{name}: segment {index}: expected {{text: string, start: seconds, end: seconds}}; {problem}"
            )
        if item["end"] < item["start"] or item["start"] < 0:
            raise TranscriptError(f"{name}: segment {index}: start must be >= 0 and end >= start")
        segments.append((float(item["start"]), float(item["end"]), item["text"]))
    words = [word for start_s, end_s, text in _in_time_order(segments) for word in _spread(text, start_s, end_s)]
    return Transcript(words=words, format="json", language=language)


def local_path(uri: str) -> str:
    """A transcript URI as a path open() takes (plain paths, file: URIs, fsspec's local protocols and
    caches over them: inputs.local_path), or a URL on object storage as it is (read through fsspec)."""
    path = open_target(uri)
    if "://" in path and not is_object_storage(path):
        raise ValueError(f"{uri}: a transcript is a local path, a file:// URI or a URL on object storage")
    return path


PARSERS = {"vtt": parse_vtt, "srt": parse_srt, "json": parse_json}


# a 15-minute video's captions are tens of KB; far larger is not a transcript (or not a file at all)
DEFAULT_MAX_BYTES = 16 * 1024 * 1024

_FILE_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _require_regular(name: str, mode: int) -> None:
    """Pipes and devices are refused before they are read: one can block forever (a FIFO nobody writes)
    or never end (/dev/zero)."""
    if not stat.S_ISREG(mode):
        kind = next((kind for test, kind in _FILE_KINDS if test(mode)), "not a regular file")
        raise TranscriptError(f"{name}: is {kind}; a transcript must be a regular file")


def _too_large(name: str, max_bytes: int) -> TranscriptError:
    return TranscriptError(
        f"{name}: larger than the {max_bytes:,}-byte limit for a transcript (asr.max_transcript_bytes)"
    )


def read_capped(path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES, name: str | None = None) -> bytes:
    """A regular file's bytes, at most max_bytes of them, else TranscriptError naming `name` (default: the path).

    The size is checked with stat before anything is opened, and the read stops at max_bytes + 1 anyway:
    a file can grow after the stat, and some report no size at all (/proc). The file is opened
    non-blocking and checked again, in case it was swapped for a pipe between the stat and the open.
    A URL on object storage (an object: never a pipe or a device) is read the same capped way; every local
    spelling (`local://`, `simplecache::file://`) is read as the local file it names."""
    name = name or str(path)
    if is_object_storage(str(path)):
        backing = local_file(str(path))  # zip://member::file:///x.zip reads a local archive: stat'ed first
        if backing is not None:
            _require_regular(name, os.stat(backing).st_mode)
        with location(str(path)).open("rb") as handle:
            data = handle.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise _too_large(name, max_bytes)
        return data
    info = os.stat(path)
    _require_regular(name, info.st_mode)
    if info.st_size > max_bytes:
        raise _too_large(name, max_bytes)
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(descriptor, "rb") as handle:
        _require_regular(name, os.fstat(handle.fileno()).st_mode)
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise _too_large(name, max_bytes)
    return data


def read_transcript(path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES, name: str | None = None) -> Transcript:
    """Parse a .vtt, .srt or .json transcript (other names: the format is sniffed from the content) of at
    most max_bytes. `name` (default: the path) is the file as the user named it, e.g. a symlink whose
    target `path` is: messages and the format go by it."""
    name = name or str(path)
    try:
        text = read_capped(path, max_bytes, name).decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise TranscriptError(f"{name}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    fmt = Path(name).suffix.lower().lstrip(".")
    if fmt not in PARSERS:
        stripped = text.lstrip()
        fmt = "vtt" if stripped.startswith("WEBVTT") else "json" if stripped[:1] in "[{" else "srt"
    return PARSERS[fmt](text, name)
