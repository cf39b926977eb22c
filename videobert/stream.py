"""The stream of example plans: align shards read into videos, units and, through a shuffle buffer, plans
(what one example is made of). Per (rank, DataLoader worker) stream:
  1. shards: every epoch the complete shards are permuted (seeded by epoch, the same on all ranks) and
     stream g of G = world_size * workers takes shards g, g+G, ...: no shard is read twice in an epoch;
  2. rows are read one record batch at a time (pyarrow `iter_batches`), never a whole shard, and grouped
     into videos (a video's rows are contiguous, in time order): one video is held while its units are made.
     Shards read whole are kept, decoded, while they fit in `shuffle_buffer` rows in all (the buffer's own
     bound), and read from memory in later epochs: data smaller than the buffer is otherwise opened again and
     again to fill it (with 10,000 units over 6 segments, 1,700 opens, each several requests on object
     storage); the videos are the same either way, so plans and resumes do not change;
  3. neighbouring segments of one video are joined into a unit with probability `concat_prob`
     (2..`max_concat` segments; text with text, video with video, so the pair stays aligned);
  4. a shuffle buffer of `shuffle_buffer` units (bounded memory) picks the next unit at random;
  5. the unit's regime (`train.regime_mix`, see PlanStream._regime) and, for a text-video negative, its
     visual tokens of another time are drawn (see PlanStream._negative).
All of it uses one seeded generator per stream. `PlanStream.state()` is the stream's position: the
generator, epoch, shard and row, the units of the video in hand and the shuffle buffer (so at most
`shuffle_buffer` units and one video's); a stream made from it continues exactly, reading on from that row."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np
import pyarrow.parquet as pq
import torch

from pipeline import storage

if TYPE_CHECKING:
    from videobert.vocab import VocabLayout

REGIMES = ("text", "video", "text_video")
TEXT, VIDEO, TEXT_VIDEO = range(3)
IGNORE = -100          # label of a position or example without a target (torch's cross-entropy default)
# alignment labels follow BERT's next-sentence convention (0 = continues), so a checkpoint's NSP head
# starts as a sensible alignment head
ALIGNED, NOT_ALIGNED = 0, 1
EMPTY = np.zeros(0, dtype=np.int64)
_READ_BATCH_ROWS = 1024


# ---------------------------------------------------------------- what shapes the examples

@dataclass(frozen=True)
class DataParams:
    max_len: int
    mask_prob: float
    regime_weights: tuple[float, float, float]    # in REGIMES order
    regime_mix: str             # exact | natural (see PlanStream._regime)
    negative_prob: float
    negative_same_video_share: float
    negative_min_gap: int       # clips between a same-video negative's window and the text's own span
    concat_prob: float
    max_concat: int
    max_subsample_step: int
    shuffle_buffer: int

    @property
    def min_tokens(self) -> int:
        """Tokens a text-only or video-only example needs so that masking predicts at least one of them."""
        return math.ceil(1 / self.mask_prob - 1e-9)

    @classmethod
    def from_config(cls, train_cfg) -> "DataParams":
        t = train_cfg
        return cls(max_len=t.max_len, mask_prob=t.mask_prob,
                   regime_weights=tuple(float(t.regime_weights[name]) for name in REGIMES), regime_mix=t.regime_mix,
                   negative_prob=t.negative_prob, negative_same_video_share=t.negative_same_video_share,
                   negative_min_gap=t.negative_min_gap, concat_prob=t.concat_prob, max_concat=t.max_concat,
                   max_subsample_step=t.max_subsample_step, shuffle_buffer=t.shuffle_buffer)


# ---------------------------------------------------------------- reading shards

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
        super().__init__(f"{path} was rewritten while training read it (is align running?): train again when "
                         f"it is done")


def remote_identity(details: dict) -> tuple:
    """A stored object's size and version from one `info()` (or an open file's details): the ETag or
    version id where the store gives one, else its modification time."""
    version = next((details[key] for key in ("VersionId", "version_id", "ETag", "etag", "generation", "md5Hash")
                    if details.get(key)), None)
    if version is None:
        version = next((str(details[key]) for key in ("LastModified", "mtime", "updated", "last_modified")
                        if details.get(key)), None)
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
    for old in (pins.glob(f"{storage.TEMPORARY_PREFIX}*") if pins.is_dir() else []):
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
        except OSError:   # a file system without hard links (some network mounts): a private copy
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
        if (now.st_ino, now.st_dev, now.st_size) != (held.st_ino, held.st_dev, held.st_size) and \
                storage.file_sha256(pin) != checksums.get(path.name):
            raise ValueError(f"{path} was rewritten while training started (is align running?): train again "
                             f"when it is done")
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
    values = column.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]].astype(np.int64)
    return values, offsets - offsets[0]


def _check_ids(path: Path, video_ids: list[str], values: np.ndarray, offsets: np.ndarray, limit: int,
               what: str) -> None:
    if values.size and (values.min() < 0 or values.max() >= limit):
        bad = int(np.flatnonzero((values < 0) | (values >= limit))[0])
        row = int(np.searchsorted(offsets, bad, side="right")) - 1
        raise ValueError(f"{path}: video {video_ids[row]!r} has {what} id {int(values[bad])} outside "
                         f"[0, {limit}): the shard was made with another codebook or tokenizer")


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


def read_segments(path: Path, layout: VocabLayout, columns: tuple[str, ...] = (),
                  start_row: int = 0, shards: list[Path] | None = None) -> Iterator[tuple[Segment, dict]]:
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
    for batch in file.iter_batches(batch_size=_READ_BATCH_ROWS, row_groups=groups,
                                   columns=["video_id", "kind", "text_ids", "visual_ids", *columns]):
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
            text = (text_values[text_offsets[row]:text_offsets[row + 1]]
                    if kinds[row] == "text_video" else EMPTY)
            visual = visual_values[visual_offsets[row]:visual_offsets[row + 1]]
            yield Segment(video_id, text, visual), {name: values[row] for name, values in extra.items()}


class Video:
    """One video's segments in time order: its visual tokens (one per clip) and text ids, each concatenated,
    with every segment's bounds in both (segment i: clips[clip_bounds[i]:clip_bounds[i+1]])."""
    __slots__ = ("video_id", "clips", "text", "clip_bounds", "text_bounds")

    def __init__(self, video_id: str, clips: np.ndarray, text: np.ndarray, clip_bounds: np.ndarray,
                 text_bounds: np.ndarray):
        self.video_id, self.clips, self.text = video_id, clips, text
        self.clip_bounds, self.text_bounds = clip_bounds, text_bounds

    @classmethod
    def of(cls, video_id: str, segments: list[Segment]) -> "Video":
        def joined(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
            bounds = np.zeros(len(parts) + 1, dtype=np.int64)
            np.cumsum([len(part) for part in parts], out=bounds[1:])
            return (np.concatenate(parts) if parts else EMPTY), bounds
        clips, clip_bounds = joined([s.visual_ids for s in segments])
        text, text_bounds = joined([s.text_ids for s in segments])
        return cls(video_id, clips, text, clip_bounds, text_bounds)

    @property
    def segments(self) -> int:
        return len(self.clip_bounds) - 1


class Unit:
    """Segments first..last-1 of a video: one segment, or a run of neighbours joined."""
    __slots__ = ("video", "first", "last")

    def __init__(self, video: Video, first: int, last: int):
        self.video, self.first, self.last = video, first, last

    @property
    def span(self) -> tuple[int, int]:
        """Where its visual tokens lie in the video's clips."""
        return int(self.video.clip_bounds[self.first]), int(self.video.clip_bounds[self.last])

    @property
    def visual_ids(self) -> np.ndarray:
        start, end = self.span
        return self.video.clips[start:end]

    @property
    def text_ids(self) -> np.ndarray:
        return self.video.text[self.video.text_bounds[self.first]:self.video.text_bounds[self.last]]


def read_videos(path: Path, layout: VocabLayout, start_row: int = 0,
                shards: list[Path] | None = None) -> Iterator[tuple[int, Video]]:
    """(the row after it, video) for each video of a shard from row `start_row` on (the align stage writes a
    video's rows together, in time order). Memory: one video's segments."""
    segments: list[Segment] = []
    row = start_row
    options = {} if shards is None else {"shards": shards}
    for segment, _ in read_segments(path, layout, start_row=start_row, **options):
        if segments and segment.video_id != segments[0].video_id:
            yield row, Video.of(segments[0].video_id, segments)
            segments = []
        segments.append(segment)
        row += 1
    if segments:
        yield row, Video.of(segments[0].video_id, segments)


def _encode_units(units: list[Unit]) -> dict:
    """Units as tensors: each of their videos once, then (video, first, last). A video is keyed by its id, not
    its object: after a resume, the units restored and those read afresh hold the same video in two objects,
    and the saved state must be the one an uninterrupted run saves."""
    index: dict[str, int] = {}
    videos: list[Video] = []
    for unit in units:
        if index.setdefault(unit.video.video_id, len(videos)) == len(videos):
            videos.append(unit.video)

    def joined(name: str, dtype) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([EMPTY] + [getattr(video, name) for video in videos]).astype(dtype))

    return {"video_ids": [video.video_id for video in videos],
            "segments": torch.tensor([video.segments for video in videos], dtype=torch.int64),
            "clips": joined("clips", np.int32), "text": joined("text", np.int32),
            "clip_bounds": joined("clip_bounds", np.int64), "text_bounds": joined("text_bounds", np.int64),
            "units": torch.tensor([(index[u.video.video_id], u.first, u.last) for u in units], dtype=torch.int64).view(-1, 3)}


def _decode_units(encoded: dict) -> list[Unit]:
    videos, bound, clip, text = [], 0, 0, 0
    for video_id, segments in zip(encoded["video_ids"], encoded["segments"].tolist()):
        clip_bounds = encoded["clip_bounds"][bound:bound + segments + 1].numpy().copy()
        text_bounds = encoded["text_bounds"][bound:bound + segments + 1].numpy().copy()
        clips = encoded["clips"][clip:clip + clip_bounds[-1]].numpy().astype(np.int64)
        words = encoded["text"][text:text + text_bounds[-1]].numpy().astype(np.int64)
        videos.append(Video(video_id, clips, words, clip_bounds, text_bounds))
        bound, clip, text = bound + segments + 1, clip + int(clip_bounds[-1]), text + int(text_bounds[-1])
    return [Unit(videos[video], first, last) for video, first, last in encoded["units"].tolist()]


class Plan:
    """What one example is made of, before subsampling, truncation and masking; `unit` is where its text (or
    its own visual tokens) came from, `same_video` whether a negative's visual tokens are of that video too."""
    __slots__ = ("regime", "text_ids", "visual_ids", "alignment_label", "same_video", "unit")

    def __init__(self, regime: int, text_ids: np.ndarray, visual_ids: np.ndarray, alignment_label: int,
                 same_video: bool = False, unit: "Unit | None" = None):
        self.regime, self.text_ids, self.visual_ids = regime, text_ids, visual_ids
        self.alignment_label, self.same_video, self.unit = alignment_label, same_video, unit


def runs(segments: int, rng: np.random.Generator, concat_prob: float, max_concat: int) -> list[tuple[int, int]]:
    """(first, last) runs of neighbouring segments covering 0..segments-1: one segment, or 2..max_concat
    joined with probability `concat_prob` (cut short at the video's end)."""
    found, first = [], 0
    while first < segments:
        length = 1 if max_concat < 2 or rng.random() >= concat_prob else int(rng.integers(2, max_concat + 1))
        found.append((first, min(first + length, segments)))
        first += length
    return found


def stream_shards(shards: list[Path], seed: int, epoch: int, stream: int, num_streams: int) -> list[Path]:
    """The shards stream `stream` of `num_streams` reads in `epoch`: a permutation seeded by epoch (the
    same in every rank and worker), dealt round-robin, so the streams never share a shard."""
    order = np.random.default_rng([seed, 2, epoch]).permutation(len(shards))
    return [shards[i] for i in order[stream::num_streams]]


class PlanStream:
    """The endless, seeded sequence of example plans (`next(stream)`) of stream `stream` of `num_streams`."""

    def __init__(self, shards: list[Path], layout: VocabLayout, params: DataParams, seed: int, stream: int,
                 num_streams: int, state: dict | None = None):
        if len(shards) < num_streams:
            raise ValueError(f"{len(shards)} shards cannot feed {num_streams} streams")
        self.shards, self.layout, self.params = shards, layout, params
        self.seed, self.stream, self.num_streams = seed, stream, num_streams
        self.rng = np.random.default_rng([seed, 1, stream])
        self.epoch = self.shard = self.row = 0   # where the next video starts: epoch, shard of the epoch, row
        self.epoch_units = 0                     # units read this epoch
        self.pending: list[Unit] = []            # units of the video read last, the next one at the end
        self.buffer: list[Unit] = []
        self.kinds = [0, 0]                      # buffered units with text and video, with video only
        self.rows_read = 0                       # rows this object made units of (none replayed on resume)
        self._videos: Iterator[tuple[int, Video]] | None = None      # the open shard
        self._kept: dict[Path, list[tuple[int, Video]]] = {}          # shards held decoded (module doc, 2.)
        self._kept_rows = 0
        if state is not None:
            self.rng.bit_generator.state = state["rng"]
            self.epoch, self.shard, self.row, self.epoch_units = (state[key] for key in ("epoch", "shard", "row",
                                                                                         "epoch_units"))
            units = _decode_units(state["units"])
            self.buffer, self.pending = units[:state["buffered"]], units[state["buffered"]:]
            for unit in self.buffer:
                self._count(unit, 1)

    def state(self) -> dict:
        """Where the stream is, in tensors, lists and numbers (a checkpoint loads it with weights_only):
        the rows before `row` are not read again, and no example is made twice."""
        return {"rng": self.rng.bit_generator.state, "epoch": self.epoch, "shard": self.shard, "row": self.row,
                "epoch_units": self.epoch_units, "buffered": len(self.buffer),
                "units": _encode_units(self.buffer + self.pending)}

    def __iter__(self) -> "PlanStream":
        return self

    def __next__(self) -> Plan:
        while True:
            plan = self._plan(*self._next_unit())
            if plan is not None:
                return plan

    def _mine(self) -> list[Path]:
        return stream_shards(self.shards, self.seed, self.epoch, self.stream, self.num_streams)

    def _read_unit(self) -> Unit:
        while not self.pending:
            mine = self._mine()
            if self._videos is None:
                self._videos = self._open(mine[self.shard], self.row)
            found = next(self._videos, None)
            if found is None:                    # the shard is done: the next one, or the next epoch
                self._videos, self.row, self.shard = None, 0, self.shard + 1
                if self.shard == len(mine):
                    if self.epoch_units == 0:
                        raise ValueError(f"shards {[str(p) for p in mine]} hold no segments")
                    self.epoch, self.shard, self.epoch_units = self.epoch + 1, 0, 0
                continue
            self.row, video = found
            self.rows_read += video.segments
            made = runs(video.segments, self.rng, self.params.concat_prob, self.params.max_concat)
            self.pending = [Unit(video, first, last) for first, last in reversed(made)]
            self.epoch_units += len(made)
        return self.pending.pop()

    def _open(self, path: Path, start_row: int) -> Iterator[tuple[int, Video]]:
        """(the row after it, video) of each video of `path` from `start_row` on: from memory if the shard is
        kept, else read (and kept if it was read whole and fits)."""
        kept = self._kept.get(path)
        if kept is not None:
            return iter([(end, video) for end, video in kept if end - video.segments >= start_row])
        return self._read_and_keep(path, start_row)

    def _read_and_keep(self, path: Path, start_row: int) -> Iterator[tuple[int, Video]]:
        videos: list[tuple[int, Video]] | None = [] if start_row == 0 else None
        try:
            yield from self._read_into(path, start_row, videos)
        except OSError:   # rewritten while open? (s3fs reads with If-Match: the store refuses the old ETag)
            check_identity(self.shards, path)
            raise

    def _read_into(self, path: Path, start_row: int, videos) -> Iterator[tuple[int, Video]]:
        # shards on object storage are read in place: checked at each open against their start (`_open_shard`)
        options = {"shards": self.shards} if getattr(self.shards, "identity", None) else {}
        for end, video in read_videos(path, self.layout, start_row, **options):
            if videos is not None:
                videos.append((end, video))
                if self._kept_rows + end > self.params.shuffle_buffer:
                    videos = None
            yield end, video
        if videos is not None:
            self._kept[path] = videos
            self._kept_rows += videos[-1][0] if videos else 0

    def _count(self, unit: Unit, change: int) -> None:
        if unit.visual_ids.size:
            self.kinds[0 if unit.text_ids.size else 1] += change

    def _next_unit(self) -> tuple[Unit, float]:
        """(the unit the shuffle buffer gives up for the next read one, the share of units with text among
        the buffered units with video it was drawn from)."""
        while len(self.buffer) < self.params.shuffle_buffer:
            self.buffer.append(self._read_unit())
            self._count(self.buffer[-1], 1)
        share = self.kinds[0] / max(1, sum(self.kinds))
        index = int(self.rng.integers(len(self.buffer)))
        unit, self.buffer[index] = self.buffer[index], self._read_unit()
        self._count(unit, -1)
        self._count(self.buffer[index], 1)
        return unit, share

    def _regime(self, has_text: bool, has_video: bool, share: float) -> int | None:
        """The regime of a unit drawn from a buffer in which `share` of the units with video have text too;
        None: the unit is skipped.

        natural: the regimes the unit can make, by their weights (a unit without text makes video examples
        only, so with 40% of the videos in English 1:1:1 weights give about 21/58/21%).
        exact: each example's regime follows the weights: a unit with text makes text or text-video examples
        (and video ones only when units with text are plentiful: share >= the text and text-video weights),
        a unit without text makes a video example with the probability that keeps the video share, else it
        is skipped (this epoch). The buffer needs a unit with text for this: without one, natural."""
        weights = np.asarray(self.params.regime_weights) / sum(self.params.regime_weights)
        draw, textual = self.rng.random(), weights[TEXT] + weights[TEXT_VIDEO]
        if self.params.regime_mix == "natural" or not has_video or share <= 0:
            # a regime the unit cannot make (no text, say) is left out and the others renormalised
            usable = weights * [has_text, has_video, has_text and has_video]
            if usable.sum() <= 0:
                return None
            return min(2, int(np.searchsorted(np.cumsum(usable), draw * usable.sum(), side="right")))
        if has_text:
            scale = max(share, textual)
            return TEXT if draw * scale < weights[TEXT] else TEXT_VIDEO if draw * scale < textual else VIDEO
        return VIDEO if share >= textual or draw * (1 - share) * textual < share * weights[VIDEO] else None

    def _plan(self, unit: Unit, share: float) -> Plan | None:
        text, visual = unit.text_ids, unit.visual_ids
        regime = self._regime(text.size > 0, visual.size > 0, share)
        if regime is None:
            return None
        if regime == TEXT:
            return Plan(TEXT, text, EMPTY, IGNORE, unit=unit)
        if regime == VIDEO:
            return Plan(VIDEO, EMPTY, visual, IGNORE, unit=unit)
        if self.rng.random() < self.params.negative_prob:
            window, same_video = self._negative(unit)
            if window is not None:
                return Plan(TEXT_VIDEO, text, window, NOT_ALIGNED, same_video, unit)
        return Plan(TEXT_VIDEO, text, visual, ALIGNED, unit=unit)

    def _negative(self, unit: Unit) -> tuple[np.ndarray | None, bool]:
        return negative_window(unit, self.rng, self.params, self.buffer)


def negative_window(unit: Unit, rng: np.random.Generator, params: DataParams,
                    others: list[Unit]) -> tuple[np.ndarray | None, bool]:
    """(visual tokens of another time, whether of the same video), exactly as many as the unit's own: a
    window of the same video at least `negative_min_gap` clips away (with `negative_same_video_share`, when
    the video is long enough), else of the video of one of `others` (training: the shuffle buffer's units;
    None if a few draws find none)."""
    length = len(unit.visual_ids)
    if rng.random() < params.negative_same_video_share:
        start, end = unit.span
        gap, clips = params.negative_min_gap, unit.video.clips
        before = max(0, start - gap - length + 1)         # windows ending at start - gap or earlier
        after = max(0, len(clips) - length - end - gap + 1)   # windows starting at end + gap or later
        if before + after:
            at = int(rng.integers(before + after))
            at = at if at < before else end + gap + at - before
            return clips[at:at + length], True
    other = None
    for _ in range(16):
        candidate = others[int(rng.integers(len(others)))].video
        if candidate.video_id != unit.video.video_id and candidate.clips.size and (
                other is None or len(candidate.clips) > len(other.clips)):
            other = candidate
            if len(other.clips) >= length:
                break
    if other is None:
        return None, False
    at = int(rng.integers(max(1, len(other.clips) - length + 1)))
    # a video shorter than the span (rare: the buffer's videos are long) is repeated to its length
    return np.resize(other.clips[at:at + length], length), False
