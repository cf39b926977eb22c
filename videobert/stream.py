"""The stream of example plans: align shards read into videos, units and, through a shuffle buffer, plans
(what one example is made of). Per (rank, DataLoader worker) stream:
  1. shards: every epoch the complete shards are permuted (seeded by epoch, the same on all ranks) and
     stream g of G = world_size * workers takes shards g, g+G, ...: no shard is read twice in an epoch;
  2. rows are read one record batch at a time (videobert/shards.py), never a whole shard, and grouped
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from videobert.shards import EMPTY, Segment, check_identity, read_segments
from videobert.vocab import common_word_ids, sentence_end_ids

if TYPE_CHECKING:
    from videobert.vocab import VocabLayout

REGIMES = ("text", "video", "text_video")
TEXT, VIDEO, TEXT_VIDEO = range(3)
IGNORE = -100  # label of a position or example without a target (torch's cross-entropy default)
# alignment labels follow BERT's next-sentence convention (0 = continues), so a checkpoint's NSP head
# starts as a sensible alignment head
ALIGNED, NOT_ALIGNED = 0, 1


# ---------------------------------------------------------------- what shapes the examples


@dataclass(frozen=True)
class DataParams:
    max_len: int
    mask_prob: float
    regime_weights: tuple[float, float, float]  # in REGIMES order
    regime_mix: str  # exact | natural (see PlanStream._regime)
    negative_prob: float
    negative_same_video_share: float
    negative_min_gap: int  # clips between a same-video negative's window and the text's own span
    concat_prob: float
    max_concat: int
    max_subsample_step: int
    text_span_mask_prob: float  # text-video examples whose text targets are TEXT_SPAN pieces together (data.py)
    text_insert_prob: float  # up to two random word pieces in a text-video example's text (data.insert_word_pieces)
    text_context_noise_prob: float  # text-video examples whose untargeted text is half random pieces (data.py)
    text_end_drop_prob: float  # text-video examples whose text loses its final sentence-end piece (data.py)
    visual_crop_prob: float  # text-video examples whose visual tokens are a random run of theirs (data.py)
    shuffle_buffer: int
    sentence_end_ids: tuple[int, ...] = ()  # the tokenizer's pieces that end a sentence (vocab.sentence_end_ids)
    # the pool of the edge pieces' and the noisy context's random pieces (vocab.common_word_ids); None: every one
    noise_text_ids: np.ndarray | None = field(default=None, compare=False)
    negative_mlm: bool = True  # a negative's masked tokens are targets too (data.build_example)

    @property
    def min_tokens(self) -> int:
        """Tokens a text-only or video-only example needs so that masking predicts at least one of them."""
        return math.ceil(1 / self.mask_prob - 1e-9)

    @classmethod
    def from_config(cls, train_cfg, tokenizer=None) -> DataParams:
        """The train section's data settings; `tokenizer` is needed for text_end_drop_prob and text_noise_words."""
        t = train_cfg
        if t.text_end_drop_prob and tokenizer is None:
            raise ValueError("train.text_end_drop_prob needs the tokenizer, to know which pieces end a sentence")
        if t.text_noise_words and tokenizer is None:
            raise ValueError("train.text_noise_words needs the tokenizer, to know its words")
        return cls(
            max_len=t.max_len,
            mask_prob=t.mask_prob,
            regime_weights=tuple(float(t.regime_weights[name]) for name in REGIMES),
            regime_mix=t.regime_mix,
            negative_prob=t.negative_prob,
            negative_same_video_share=t.negative_same_video_share,
            negative_min_gap=t.negative_min_gap,
            concat_prob=t.concat_prob,
            max_concat=t.max_concat,
            max_subsample_step=t.max_subsample_step,
            text_insert_prob=t.text_insert_prob,
            text_span_mask_prob=t.text_span_mask_prob,
            text_context_noise_prob=t.text_context_noise_prob,
            text_end_drop_prob=t.text_end_drop_prob,
            visual_crop_prob=t.visual_crop_prob,
            shuffle_buffer=t.shuffle_buffer,
            sentence_end_ids=sentence_end_ids(tokenizer) if tokenizer is not None else (),
            noise_text_ids=common_word_ids(tokenizer, t.text_noise_words) if t.text_noise_words else None,
            negative_mlm=t.negative_mlm,
        )


class Video:
    """One video's segments in time order: its visual tokens (one per clip) and text ids, each concatenated,
    with every segment's bounds in both (segment i: clips[clip_bounds[i]:clip_bounds[i+1]])."""

    __slots__ = ("video_id", "clips", "text", "clip_bounds", "text_bounds")

    def __init__(
        self, video_id: str, clips: np.ndarray, text: np.ndarray, clip_bounds: np.ndarray, text_bounds: np.ndarray
    ):
        self.video_id, self.clips, self.text = video_id, clips, text
        self.clip_bounds, self.text_bounds = clip_bounds, text_bounds

    @classmethod
    def of(cls, video_id: str, segments: list[Segment]) -> Video:
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
        return self.video.text[self.video.text_bounds[self.first] : self.video.text_bounds[self.last]]


def read_videos(
    path: Path, layout: VocabLayout, start_row: int = 0, shards: list[Path] | None = None
) -> Iterator[tuple[int, Video]]:
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

    return {
        "video_ids": [video.video_id for video in videos],
        "segments": torch.tensor([video.segments for video in videos], dtype=torch.int64),
        "clips": joined("clips", np.int32),
        "text": joined("text", np.int32),
        "clip_bounds": joined("clip_bounds", np.int64),
        "text_bounds": joined("text_bounds", np.int64),
        "units": torch.tensor([(index[u.video.video_id], u.first, u.last) for u in units], dtype=torch.int64).view(
            -1, 3
        ),
    }


def _decode_units(encoded: dict) -> list[Unit]:
    videos, bound, clip, text = [], 0, 0, 0
    for video_id, segments in zip(encoded["video_ids"], encoded["segments"].tolist()):
        clip_bounds = encoded["clip_bounds"][bound : bound + segments + 1].numpy().copy()
        text_bounds = encoded["text_bounds"][bound : bound + segments + 1].numpy().copy()
        clips = encoded["clips"][clip : clip + clip_bounds[-1]].numpy().astype(np.int64)
        words = encoded["text"][text : text + text_bounds[-1]].numpy().astype(np.int64)
        videos.append(Video(video_id, clips, words, clip_bounds, text_bounds))
        bound, clip, text = bound + segments + 1, clip + int(clip_bounds[-1]), text + int(text_bounds[-1])
    return [Unit(videos[video], first, last) for video, first, last in encoded["units"].tolist()]


class Plan:
    """What one example is made of, before subsampling, truncation and masking; `unit` is where its text (or
    its own visual tokens) came from, `same_video` whether a negative's visual tokens are of that video too."""

    __slots__ = ("regime", "text_ids", "visual_ids", "alignment_label", "same_video", "unit")

    def __init__(
        self,
        regime: int,
        text_ids: np.ndarray,
        visual_ids: np.ndarray,
        alignment_label: int,
        same_video: bool = False,
        unit: Unit | None = None,
    ):
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

    def __init__(
        self,
        shards: list[Path],
        layout: VocabLayout,
        params: DataParams,
        seed: int,
        stream: int,
        num_streams: int,
        state: dict | None = None,
    ):
        if len(shards) < num_streams:
            raise ValueError(f"{len(shards)} shards cannot feed {num_streams} streams")
        self.shards, self.layout, self.params = shards, layout, params
        self.seed, self.stream, self.num_streams = seed, stream, num_streams
        self.rng = np.random.default_rng([seed, 1, stream])
        self.epoch = self.shard = self.row = 0  # where the next video starts: epoch, shard of the epoch, row
        self.epoch_units = 0  # units read this epoch
        self.pending: list[Unit] = []  # units of the video read last, the next one at the end
        self.buffer: list[Unit] = []
        self.kinds = [0, 0]  # buffered units with text and video, with video only
        self.rows_read = 0  # rows this object made units of (none replayed on resume)
        self._videos: Iterator[tuple[int, Video]] | None = None  # the open shard
        self._kept: dict[Path, list[tuple[int, Video]]] = {}  # shards held decoded (module doc, 2.)
        self._kept_rows = 0
        if state is not None:
            self.rng.bit_generator.state = state["rng"]
            self.epoch, self.shard, self.row, self.epoch_units = (
                state[key] for key in ("epoch", "shard", "row", "epoch_units")
            )
            units = _decode_units(state["units"])
            self.buffer, self.pending = units[: state["buffered"]], units[state["buffered"] :]
            for unit in self.buffer:
                self._count(unit, 1)

    def state(self) -> dict:
        """Where the stream is, in tensors, lists and numbers (a checkpoint loads it with weights_only):
        the rows before `row` are not read again, and no example is made twice."""
        return {
            "rng": self.rng.bit_generator.state,
            "epoch": self.epoch,
            "shard": self.shard,
            "row": self.row,
            "epoch_units": self.epoch_units,
            "buffered": len(self.buffer),
            "units": _encode_units(self.buffer + self.pending),
        }

    def __iter__(self) -> PlanStream:
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
            if found is None:  # the shard is done: the next one, or the next epoch
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
        except OSError:  # rewritten while open? (s3fs reads with If-Match: the store refuses the old ETag)
            check_identity(self.shards, path)
            raise

    def _read_into(self, path: Path, start_row: int, videos) -> Iterator[tuple[int, Video]]:
        # shards on object storage are read in place: checked at each open against their start (`shards._open_shard`)
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


def negative_window(
    unit: Unit, rng: np.random.Generator, params: DataParams, others: list[Unit]
) -> tuple[np.ndarray | None, bool]:
    """(visual tokens of another time, whether of the same video), exactly as many as the unit's own: a
    window of the same video at least `negative_min_gap` clips away (with `negative_same_video_share`, when
    the video is long enough), else of the video of one of `others` (training: the shuffle buffer's units;
    None if a few draws find none)."""
    length = len(unit.visual_ids)
    if rng.random() < params.negative_same_video_share:
        start, end = unit.span
        gap, clips = params.negative_min_gap, unit.video.clips
        before = max(0, start - gap - length + 1)  # windows ending at start - gap or earlier
        after = max(0, len(clips) - length - end - gap + 1)  # windows starting at end + gap or later
        if before + after:
            at = int(rng.integers(before + after))
            at = at if at < before else end + gap + at - before
            return clips[at : at + length], True
    other = None
    for _ in range(16):
        candidate = others[int(rng.integers(len(others)))].video
        if (
            candidate.video_id != unit.video.video_id
            and candidate.clips.size
            and (other is None or len(candidate.clips) > len(other.clips))
        ):
            other = candidate
            if len(other.clips) >= length:
                break
    if other is None:
        return None, False
    at = int(rng.integers(max(1, len(other.clips) - length + 1)))
    # a video shorter than the span (rare: the buffer's videos are long) is repeated to its length
    return np.resize(other.clips[at : at + length], length), False
