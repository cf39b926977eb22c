"""decode: the clip index of every video (20 fps, 30-frame clips), a JPEG thumbnail per clip with its
perceptual hash, each clip's figures for the quality stage (stages/quality/measure.py), per-video metadata;
and, from the same frames, the shots stage's boundaries (stages/shots/detect.py), with which
`decode.clip_policy: shots` starts the grid again at every shot.

In a run of the pipeline these tables come out of the features stage's pass (stages/features/run.py): each
video is read and decoded once, for its clips' pixels, the clip index, the thumbnails and the per-video
row, and the features run writes them as this stage's outputs with this stage's completion record. Run
alone (`python -m pipeline decode`), the stage makes exactly the same files on CPUs without S3D: the
clip index of a collection whose features are not wanted (yet). Both go through `VideoPass`, so the
clips and thumbnails are the same whichever made them."""

from __future__ import annotations

import io
from collections.abc import Iterator

import imagehash
import numpy as np
import pyarrow as pa
from PIL import Image

import schemas
from pipeline.contract import ShardContext, ShardResult, error_row
from pipeline.media.clip_readers import open_clip_reader, to_numpy
from pipeline.media.clips import Clip
from pipeline.media.inputs import InputError
from pipeline.media.video import VideoDecodeError
from stages.quality.measure import ClipMeasure
from stages.shots import detect as shots


def thumbnail_jpeg(frame: np.ndarray, size: int, quality: int) -> bytes:
    image = Image.fromarray(frame).resize((size, size), Image.BILINEAR)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality, optimize=False)
    return buffer.getvalue()


def perceptual_hash(frame: np.ndarray) -> int:
    """The frame's 64-bit perceptual hash (imagehash.phash: the sign of the low frequencies of its 32 x 32
    DCT against their median), as a signed int64."""
    bits = int(str(imagehash.phash(Image.fromarray(frame))), 16)
    return bits - (1 << 64) if bits >= 1 << 63 else bits


def _video_row(video: dict, status: str, reader, n_clips: int) -> dict:
    info = reader.info if reader else None
    return {
        "video_id": video["video_id"],
        "uri": video["uri"],
        "status": status,
        "duration_s": info.duration_s if info else None,
        "decoded_s": (reader.n_frames / reader.cfg.fps) if reader else None,
        "source_fps": info.source_fps if info else None,
        "width": info.width if info else None,
        "height": info.height if info else None,
        "codec": info.codec if info else None,
        "has_audio": info.has_audio if info else None,
        "rotation": reader.rotation if reader else None,
        "n_frames": reader.n_frames if reader else None,
        "n_clips": n_clips,
        "video_stream": info.stream_index if info else None,
        "video_streams": info.video_streams if info else None,
    }


class VideoPass:
    """One read of one video: iterate `clips()` for its clips (with their frames, or with only the middle
    frame when `with_frames` is False); afterwards `clip_rows` (the clip index with thumbnails), `video_row`
    and `errors` hold what the decode stage writes of it."""

    def __init__(self, video: dict, cfg, *, with_frames: bool = True):
        self.video, self.cfg, self.with_frames = video, cfg, with_frames
        self.clip_rows: list[dict] = []
        self.shot_rows: list[dict] = []  # the shots stage's boundaries of this video
        self.video_row: dict | None = None
        self.errors: list[dict] = []

    def clips(self) -> Iterator[Clip]:
        video, decode = self.video, self.cfg.decode
        video_id = video["video_id"]
        try:
            reader = open_clip_reader(video["uri"], decode)
        except (VideoDecodeError, InputError) as error:
            self.video_row, self.errors = _video_row(video, "error", None, 0), [error_row(video_id, error)]
            return
        measure = ClipMeasure()
        detector = shots.detector_for(self.cfg.shots, decode.fps)
        with reader:
            try:
                for clip in reader.clips(
                    with_frames=self.with_frames,
                    watchers=(measure, detector),
                    shots=detector if decode.clip_policy == "shots" else None,
                    samples_at=schemas.HASHED_AT,
                ):
                    middle = clip.frames[(clip.n_real_frames - 1) // 2] if self.with_frames else clip.frames[0]
                    jpeg = thumbnail_jpeg(to_numpy(middle), decode.thumbnail_size, decode.thumbnail_quality)
                    self.clip_rows.append(
                        {
                            "video_id": video_id,
                            "clip_index": clip.clip_index,
                            "start_s": clip.start_s,
                            "end_s": clip.end_s,
                            "n_real_frames": clip.n_real_frames,
                            "padded": clip.padded,
                            "thumbnail_jpeg": jpeg,
                            **measure.clip(clip.first_frame, clip.n_real_frames),
                            "phashes": [perceptual_hash(to_numpy(frame)) for _, frame in clip.samples],
                        }
                    )
                    yield clip
            except (VideoDecodeError, InputError) as error:  # before the first clip (a first frame too large)
                self.clip_rows = []
                self.video_row, self.errors = _video_row(video, "error", reader, 0), [error_row(video_id, error)]
                return
        self.shot_rows = shots.boundary_rows(video_id, detector.boundaries, reader.first_frame_s, decode.fps)
        if reader.error is not None:
            status = "partial"
            self.errors.append(error_row(video_id, *reader.stop_reason()))
        elif not self.clip_rows:
            status = "too_short"
        else:
            status = "ok"
        if status == "partial" and not self.clip_rows and reader.n_frames == 0:
            status = "error"
        self.video_row = _video_row(video, status, reader, len(self.clip_rows))


def read_through(video: dict, cfg) -> VideoPass:
    """One manifest row read through, without keeping the clips' frames: its rows on the pass."""
    one = VideoPass(video, cfg, with_frames=False)
    for _ in one.clips():
        pass
    return one


def decode_video(video: dict, cfg) -> tuple[list[dict], dict, list[dict]]:
    """(clip rows, video row, error rows) for one manifest row."""
    one = read_through(video, cfg)
    return one.clip_rows, one.video_row, one.errors


def shard_result(
    clip_rows: list[dict],
    video_rows: list[dict],
    errors: list[dict],
    stats: dict | None = None,
    shot_rows: list[dict] | None = None,
) -> ShardResult:
    """The stage's result from its rows, in any order (sorted here, so that every way of making them,
    this stage alone or the features pass in parallel streams, gives the same files); with `shot_rows`, the
    shots stage's result of the same pass (`also`)."""
    clip_rows = sorted(clip_rows, key=lambda row: (row["video_id"], row["clip_index"]))
    video_rows = sorted(video_rows, key=lambda row: row["video_id"])
    statuses = [row["status"] for row in video_rows]
    return ShardResult(
        tables={
            "": pa.Table.from_pylist(clip_rows, schema=schemas.DECODE_CLIPS.arrow),
            "videos": pa.Table.from_pylist(video_rows, schema=schemas.DECODE_VIDEOS.arrow),
        },
        errors=sorted(errors, key=lambda row: row["video_id"]),
        stats={
            "clips": len(clip_rows),
            **{f"videos_{s}": statuses.count(s) for s in schemas.VIDEO_STATUSES},
            # the summary names them: the stream decoded was a choice (video_stream says which)
            "several_streams": [row["video_id"] for row in video_rows if (row.get("video_streams") or 0) > 1],
            **(stats or {}),
        },
        also={} if shot_rows is None else {"shots": shots.shard_result(shot_rows)},
    )


def read_videos(ctx: ShardContext) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    """(clip rows, video rows, error rows, shot rows) of the shard's videos, each read once without S3D."""
    clip_rows, video_rows, errors, shot_rows = [], [], [], []
    with ctx.progress(total=len(ctx.videos)) as progress:
        for video in ctx.videos:
            one = read_through(video, ctx.cfg)
            clip_rows += one.clip_rows
            video_rows.append(one.video_row)
            errors += one.errors
            shot_rows += one.shot_rows
            progress.update(1, clips=len(one.clip_rows))
    return clip_rows, video_rows, errors, shot_rows


def run_shard(ctx: ShardContext) -> ShardResult:
    clip_rows, video_rows, errors, shot_rows = read_videos(ctx)
    return shard_result(clip_rows, video_rows, errors, shot_rows=shot_rows)
