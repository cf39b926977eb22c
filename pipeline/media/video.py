"""Video decoding into fixed-length clips, shared by the decode and features stages so both see the
same clips. PyAV (FFmpeg's libraries) with frame-threaded decoding and one FFmpeg filter graph that
rotates, resamples to the target frame rate by timestamp, resizes, crops and converts to RGB: no per-frame
Python image work. Frames stream through one clip window at a time: memory never grows with the video.

Time base: seconds from the container's start time, so that clip times and ASR times (measured the same
way) share one clock even when a stream starts late."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np

from pipeline.media.clips import Clip, FrameWatcher, ShotBoundaries, cut_clips
from pipeline.media.inputs import InputError, input_timeout, open_input, open_target
from stages.decode import DecodeConfig


class VideoDecodeError(Exception):
    """The video cannot be decoded at all (no such file, not a video, no video stream, too large), or, as
    a ClipReader's `error` after some clips, not beyond some point."""


class EmptyFile(VideoDecodeError):
    pass


class NoVideoStream(VideoDecodeError):
    pass


class VideoTooLarge(VideoDecodeError):
    pass


class StreamTruncated(Exception):
    """The stream decoded cleanly but ends well before the duration its header states: a cut-off file."""


class TimestampDiscontinuity(VideoDecodeError):
    """The stream's timestamps jump back, or forward over more than decode.max_gap_s: decoding stops there."""


class FramesPastDuration(TimestampDiscontinuity):
    """Frames whose timestamps lie past the duration the header declares: decoding stops at the first."""


# a stream's data may end, or run on, this much off the duration its header declares (streams end a little
# early, and a last frame's duration is not always counted); further off, the header and the data disagree
DURATION_TOLERANCE_S = 1.0
DURATION_TOLERANCE_SHARE = 0.05

# a frame further than this behind the latest one is a reset of the clock (two files joined byte-wise, an
# encoder restart); a frame less far behind is jitter (rounding, a muxer's reordering glitch), dropped as it
# always was: a frame with an earlier time than the one on screen is never shown
BACKWARD_JITTER_S = 0.5


def duration_tolerance(declared_s: float) -> float:
    return max(DURATION_TOLERANCE_S, DURATION_TOLERANCE_SHARE * declared_s)


def is_truncated(data_end_s: float, declared_s: float) -> bool:
    """A stream whose data ends this far before the duration its header declares is a cut-off file."""
    return declared_s - data_end_s > duration_tolerance(declared_s)


def truncation(first_frame_s: float, n_frames: int, fps: float, declared_s: float | None) -> StreamTruncated | None:
    """The error of a video stream whose `n_frames` frames (at `fps`, from `first_frame_s` on the container
    clock) end well before the duration its header declares; None when they do not, or nothing is known."""
    if not (n_frames and declared_s):
        return None
    ends_s = first_frame_s + n_frames / fps
    if not is_truncated(ends_s, declared_s):
        return None
    return StreamTruncated(
        f"the stream ends at {ends_s:.2f} s of the {declared_s:.2f} s its header states: the file is truncated"
    )


# codecs of pictures, not of motion: a one-frame stream of these is a cover or a thumbnail
IMAGE_CODECS = {"mjpeg", "png", "bmp", "gif", "webp", "tiff", "jpeg2000", "jpegls", "ljpeg", "targa", "qoi"}
_NOT_MOTION = ("attached_pic", "still_image", "timed_thumbnails")


def stream_length_s(stream) -> float | None:
    """A stream's own length: its header's duration, else Matroska's DURATION tag, else frames / rate."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    tag = (stream.metadata or {}).get("DURATION") or (stream.metadata or {}).get("duration")
    if tag:
        try:
            hours, minutes, seconds = str(tag).split(":")
            return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
        except ValueError:
            pass
    rate = getattr(stream, "average_rate", None) or getattr(stream, "guessed_rate", None)  # video streams only
    return stream.frames / float(rate) if stream.frames and rate else None


def _has_disposition(stream, name: str) -> bool:
    flag = getattr(av.stream.Disposition, name, None)
    return flag is not None and bool(stream.disposition & flag)


def is_still(stream) -> bool:
    """An attached picture (a cover), a still image or thumbnails, or a one-frame picture-codec stream."""
    if any(_has_disposition(stream, name) for name in _NOT_MOTION):
        return True
    if stream.codec_context.name not in IMAGE_CODECS:
        return False
    rate = stream.average_rate or stream.guessed_rate
    length = stream_length_s(stream)
    return stream.frames == 1 or (length is not None and rate is not None and length * float(rate) <= 1.5)


def choose_stream(streams, *, motion: bool):
    """(the stream to decode, how many could have been): among the real streams (for video: no cover or
    still image), those marked default, else all; of them the longest, the first on a tie. None when no
    stream qualifies. Decoding the first stream alone took a 2 s side stream, or a cover picture, for the
    video."""
    candidates = [stream for stream in streams if not (motion and is_still(stream))]
    if not candidates:
        return None, 0
    marked = [stream for stream in candidates if _has_disposition(stream, "default")] or candidates
    chosen = max(marked, key=lambda stream: (stream_length_s(stream) or 0.0, -stream.index))
    return chosen, len(candidates)


@dataclass
class VideoInfo:
    duration_s: float | None
    source_fps: float | None
    width: int
    height: int
    codec: str
    has_audio: bool
    start_s: float  # the container's start time, the zero of every time we write
    stream_index: int = 0  # the video stream decoded (choose_stream)
    video_streams: int = 1  # the real video streams the file holds


def _rotation_filters(rotation_deg: int) -> list[tuple[str, str]]:
    """FFmpeg's own autorotate: the display matrix angle is counter-clockwise; undo it."""
    theta = (-rotation_deg) % 360
    if abs(theta - 90) < 1:
        return [("transpose", "clock")]
    if abs(theta - 180) < 1:
        return [("hflip", ""), ("vflip", "")]
    if abs(theta - 270) < 1:
        return [("transpose", "cclock")]
    return []


class ClipReader:
    """Iterate a video's clips: `for clip in ClipReader(uri, cfg).clips(): ...`.

    After iteration: `n_frames` frames were produced at the target rate, `error` holds the exception
    that ended a stream that failed mid-way (the clips before it were still yielded), `rotation` the
    clockwise degrees applied to make the picture upright, `picture_sizes` the (width, height) of each
    run of frames of one size that went through the filter graph (one, unless the size changes)."""

    def __init__(self, uri: str, cfg: DecodeConfig):
        self.uri, self.cfg = uri, cfg
        target = open_target(uri)
        if "://" not in target and os.path.isfile(target) and os.path.getsize(target) == 0:
            raise EmptyFile(f"{uri} is an empty file")
        try:
            self.container = open_input(uri, cfg.io_timeout_s)
        except (av.error.FFmpegError, OSError, ValueError) as error:
            raise VideoDecodeError(f"cannot open {uri}: {error}") from error
        if not self.container.streams.video:
            self.container.close()
            raise NoVideoStream(f"{uri} has no video stream")
        self.stream, candidates = choose_stream(self.container.streams.video, motion=True)
        if self.stream is None:
            self.container.close()
            raise NoVideoStream(f"{uri} has no video stream, only a still picture (a cover image)")
        # the demuxer skips the other streams' packets instead of reading them: in a file whose audio is
        # not interleaved with its picture (the samples), reading both made FFmpeg re-read 32 KB for
        # every frame, 32x the file's bytes; skipped, each video is read about once
        for other in self.container.streams:
            if other.index != self.stream.index:
                other.discard = av.stream.Discard.all
        self.stream.thread_type = "AUTO"  # frame + slice threads: ~1.4x over PyAV's default here
        if cfg.decode_threads:
            self.stream.codec_context.thread_count = cfg.decode_threads
        context = self.stream.codec_context
        if context.width * context.height > cfg.max_pixels:
            self.container.close()
            raise VideoTooLarge(f"{uri}: {context.width}x{context.height} exceeds decode.max_pixels={cfg.max_pixels}")
        duration = None
        if self.container.duration:
            duration = self.container.duration / av.time_base
        elif self.stream.duration and self.stream.time_base:
            duration = float(self.stream.duration * self.stream.time_base)
        # the picture's own length, to tell a cut-off file; a container's duration also spans its other
        # streams (audio may run on after the picture), so it only counts for a video-only file
        self._video_duration_s = (
            float(self.stream.duration * self.stream.time_base) + self._stream_start_s()
            if self.stream.duration
            else duration
            if len(self.container.streams) == 1
            else None
        )
        # where the header says the video ends, on the container clock: no frame shows after that (plus
        # duration_tolerance), so a stream's clips are bounded by its declared length
        self._declared_end_s = duration if self.container.duration else self._video_duration_s
        self._frames_end_s = (
            self._declared_end_s + duration_tolerance(self._declared_end_s) if self._declared_end_s else None
        )
        rate = self.stream.average_rate or self.stream.guessed_rate
        self.info = VideoInfo(
            duration_s=duration,
            source_fps=float(rate) if rate else None,
            width=context.width,
            height=context.height,
            codec=context.name,
            has_audio=bool(self.container.streams.audio),
            start_s=(self.container.start_time or 0) / av.time_base,
            stream_index=self.stream.index,
            video_streams=candidates,
        )
        self.n_frames = 0
        self.error: Exception | None = None
        self.rotation = 0
        self.first_frame_s: float | None = None
        self.picture_sizes: list[tuple[int, int]] = []
        self._graph: av.filter.Graph | None = None
        self._graph_input: tuple[int, int, str] | None = None

    def close(self) -> None:
        self.container.close()

    def _stream_start_s(self) -> float:
        start = self.stream.start_time
        container_start = (self.container.start_time or 0) / av.time_base
        return float(start * self.stream.time_base) - container_start if start is not None else 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _build_graph(self, frame: av.VideoFrame) -> av.filter.Graph:
        cfg = self.cfg
        rotation = int(round(frame.rotation or 0))
        filters = _rotation_filters(rotation)
        self.rotation = (-rotation) % 360 if filters else 0
        graph = av.filter.Graph()
        context = self.stream.codec_context
        if (frame.width, frame.height, frame.format.name) == (context.width, context.height, context.format.name):
            # the stream as template also carries colour space and range: 1.7x faster scaling here
            # than a buffer given only size and pixel format
            source = graph.add_buffer(template=self.stream)
        else:
            source = graph.add_buffer(
                width=frame.width, height=frame.height, format=frame.format.name, time_base=self.stream.time_base
            )
        chain = [source]
        filters = filters + [
            # the KINETICS400_V1 transform: 256x256 (aspect not kept, as torchvision does), centre 224
            ("scale", f"{cfg.resize}:{cfg.resize}:flags=bilinear"),
            ("crop", f"{cfg.crop}:{cfg.crop}"),
            ("format", "rgb24"),
        ]
        for name, args in filters:
            chain.append(graph.add(name, args))
        chain.append(graph.add("buffersink"))
        for upstream, downstream in zip(chain, chain[1:]):
            upstream.link_to(downstream)
        graph.configure()
        return graph

    def _graph_for(self, frame: av.VideoFrame) -> av.filter.Graph:
        """The filter graph for this frame's size and pixel format. A graph is configured for one input
        size: where a stream changes size mid-way (new sequence headers), frames of the new size get a
        new graph, since a transpose or crop configured for the old size would cut them wrong."""
        key = (frame.width, frame.height, frame.format.name)
        if key != self._graph_input:
            self._graph, self._graph_input = self._build_graph(frame), key
            self.picture_sizes.append((frame.width, frame.height))
        return self._graph

    def _convert(self, frame: av.VideoFrame) -> np.ndarray:
        graph = self._graph_for(frame)
        graph.push(frame)
        return graph.pull().to_ndarray()  # owns its frame's buffer: consumers copy what they keep

    def frames(self) -> Iterator[np.ndarray]:
        """RGB frames at the target rate, after rotation, resize and crop.

        Resampling is by timestamp: output frame n is the source frame on screen at first_pts + n/fps
        (the latest one with pts <= that time), so variable frame rates and late starts come out right.
        Each source frame is converted once, and only if some output slot shows it: a 60 fps source
        costs a third of the scaling that FFmpeg's fps filter ahead of scale would spend.

        A broken clock stops the stream (`error`, the frames before it kept): timestamps that jump back
        (`BACKWARD_JITTER_S`) or forward by more than decode.max_gap_s, or run past the declared duration.
        The stream is stopped rather than renumbered on a clock of our own because clip times share the
        container's clock with asr's word times: renumbered clips would sit beside speech from elsewhere.
        A frame over decode.max_pixels stops it too, before the frame reaches the filter graph; a first
        frame over it refuses the whole video (VideoTooLarge is raised)."""
        time_base = self.stream.time_base
        slots_per_tick = time_base * Fraction(self.cfg.fps).limit_denominator(1001)  # pts -> output slots
        pending, pending_slot, first_pts, step = None, 0, None, None
        try:
            for index, frame in enumerate(self._timed_frames()):
                if first_pts is None:
                    first_pts = frame.pts
                    self.first_frame_s = self._time_s(frame)
                stop = self._oversized(frame, index, first=pending is None) or self._broken_clock(frame, index, pending)
                if stop is not None:
                    self.error = stop
                    break
                # first output slot at or after this frame's time
                slot = math.ceil((frame.pts - first_pts) * slots_per_tick)
                if pending is not None and slot <= pending_slot:
                    if frame.pts > pending.pts:
                        pending = frame  # a later frame takes over the same slot
                    continue
                if pending is not None:
                    step = frame.pts - pending.pts
                    yield from self._emit(pending, slot - pending_slot)
                pending, pending_slot = frame, slot
        except VideoTooLarge:
            raise
        except av.error.ExitError:
            self.error = input_timeout(
                self.uri, self.cfg.io_timeout_s, f"after {self.n_frames / self.cfg.fps:.2f} s of video"
            )
        except (av.error.FFmpegError, ValueError, OSError) as error:
            self.error = error
        if pending is not None:
            end_slot = self._last_frame_end_slot(pending, first_pts, step, slots_per_tick)
            try:
                yield from self._emit(pending, end_slot - pending_slot)
            except (av.error.FFmpegError, ValueError) as error:
                self.error = self.error or error
        if self.error is None:
            self.error = truncation(self.first_frame_s, self.n_frames, self.cfg.fps, self._video_duration_s)

    def _timed_frames(self) -> Iterator[av.VideoFrame]:
        """The stream's decoded frames that carry a timestamp, in presentation order."""
        for packet in self.container.demux(self.stream):
            for frame in packet.decode():
                if frame.pts is not None:
                    yield frame

    def _oversized(self, frame: av.VideoFrame, index: int, first: bool) -> VideoTooLarge | None:
        """Why the stream must stop before a frame over decode.max_pixels (checked for every frame: the size
        may grow mid-stream); raised for the first frame, which refuses the video whole."""
        if frame.width * frame.height <= self.cfg.max_pixels:
            return None
        if first:
            raise VideoTooLarge(
                f"{self.uri}: frame {frame.width}x{frame.height} exceeds decode.max_pixels={self.cfg.max_pixels}"
            )
        return VideoTooLarge(
            f"{self.uri}: source frame {index} is {frame.width}x{frame.height}, over "
            f"decode.max_pixels={self.cfg.max_pixels}; the clips before it are kept"
        )

    def _time_s(self, frame: av.VideoFrame) -> float:
        return float(frame.pts * self.stream.time_base) - self.info.start_s

    def _broken_clock(
        self, frame: av.VideoFrame, index: int, previous: av.VideoFrame | None
    ) -> TimestampDiscontinuity | None:
        """Why the stream must stop before `frame` (the index-th with a timestamp), if its time breaks the
        clock: behind the latest frame (`previous`) beyond jitter, a gap after it over decode.max_gap_s
        (slideshows hold a picture for seconds, a broken clock jumps by hours), or past the declared end."""
        now_s = self._time_s(frame)
        kept = "the clips before it are kept"
        if previous is not None:
            before_s = self._time_s(previous)
            if now_s < before_s - BACKWARD_JITTER_S:
                return TimestampDiscontinuity(
                    f"{self.uri}: timestamps jump back from {before_s:.3f} s to "
                    f"{now_s:.3f} s at source frame {index}; {kept}"
                )
            if now_s - before_s > self.cfg.max_gap_s:
                return TimestampDiscontinuity(
                    f"{self.uri}: timestamps jump forward from {before_s:.3f} s to "
                    f"{now_s:.3f} s at source frame {index}, a gap over "
                    f"decode.max_gap_s={self.cfg.max_gap_s:g} s; {kept}"
                )
        if self._frames_end_s is not None and now_s > self._frames_end_s:
            return FramesPastDuration(
                f"{self.uri}: source frame {index} at {now_s:.3f} s lies past the "
                f"{self._declared_end_s:.3f} s the header declares; {kept}"
            )
        return None

    def _last_frame_end_slot(
        self, frame: av.VideoFrame, first_pts: int, step: int | None, slots_per_tick: Fraction
    ) -> int:
        """The output slot where the last frame leaves the screen: after its own duration (else one
        nominal frame interval), and never past the declared end. At a broken clock its duration
        reached to the frame past the break, so it lasts no longer than the step between the frames
        before it."""
        nominal = (
            1 / Fraction(self.info.source_fps).limit_denominator(1001) / self.stream.time_base
            if self.info.source_fps
            else 0
        )
        duration = frame.duration or nominal
        if isinstance(self.error, TimestampDiscontinuity):
            duration = min(duration, step if step is not None else nominal)
        end_slot = math.ceil((frame.pts - first_pts + duration) * slots_per_tick)
        if self._frames_end_s is not None:
            end_slot = min(end_slot, math.ceil((self._frames_end_s - self.first_frame_s) * self.cfg.fps))
        return end_slot

    def stop_reason(self) -> tuple[str, str]:
        """(message, error type) for a stream that ended early: the clips before it are kept."""
        if isinstance(self.error, StreamTruncated):
            return str(self.error), "TruncatedStream"
        if isinstance(self.error, (VideoDecodeError, InputError)):  # ours: the message says what happened
            return str(self.error), type(self.error).__name__
        return (
            f"decoding stopped after {self.n_frames} frames ({self.n_frames / self.cfg.fps:.2f} s): {self.error}",
            "DecodeStoppedMidStream",
        )

    def _emit(self, frame: av.VideoFrame, count: int) -> Iterator[np.ndarray]:
        if count <= 0:
            return
        image = self._convert(frame)
        for _ in range(count):
            self.n_frames += 1
            yield image

    def clips(
        self,
        with_frames: bool = True,
        watchers: Sequence[FrameWatcher] = (),
        shots: ShotBoundaries | None = None,
        samples_at: Sequence[float] = (),
    ) -> Iterator[Clip]:
        """Non-overlapping clips of `clip_frames`; a last partial one with at least `min_clip_frames` real
        frames is padded with its last frame. `with_frames=False` keeps only each clip's middle real frame
        (as `frames[0]`): all the decode stage needs, without copying whole windows. `watchers` see every
        frame. With `shots` (a watcher too), the grid starts again at every shot boundary it finds: the
        window before a boundary ends there, padded or dropped as a last partial clip is, so no clip
        holds frames of two shots; frames wait up to `shots.lag` frames for the boundaries after them.
        `samples_at`: each clip's `samples` are its real frames at these shares of their count."""
        return cut_clips(self, self.frames(), with_frames, watchers, shots, samples_at)
