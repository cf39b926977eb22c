"""decode: the clip index of every video (20 fps, 30-frame clips), a JPEG thumbnail per clip, and
per-video metadata. Frames never touch the disk; the features stage decodes again, the same way."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
from PIL import Image

import schemas
from pipeline import media
from pipeline.runner import ShardContext, ShardResult, error_row


def thumbnail_jpeg(frame: np.ndarray, size: int, quality: int) -> bytes:
    image = Image.fromarray(frame).resize((size, size), Image.BILINEAR)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality, optimize=False)
    return buffer.getvalue()


def _video_row(video: dict, status: str, reader: media.ClipReader | None, n_clips: int) -> dict:
    info = reader.info if reader else None
    return {
        "video_id": video["video_id"], "uri": video["uri"], "status": status,
        "duration_s": info.duration_s if info else None,
        "decoded_s": (reader.n_frames / reader.cfg.fps) if reader else None,
        "source_fps": info.source_fps if info else None,
        "width": info.width if info else None, "height": info.height if info else None,
        "codec": info.codec if info else None, "has_audio": info.has_audio if info else None,
        "rotation": reader.rotation if reader else None,
        "n_frames": reader.n_frames if reader else None, "n_clips": n_clips,
    }


def decode_video(video: dict, cfg) -> tuple[list[dict], dict, list[dict]]:
    """(clip rows, video row, error rows) for one manifest row."""
    video_id = video["video_id"]
    try:
        reader = media.ClipReader(video["uri"], cfg.decode)
    except media.VideoDecodeError as error:
        return [], _video_row(video, "error", None, 0), [error_row(video_id, error)]
    clips, errors = [], []
    with reader:
        try:
            for clip in reader.clips(with_frames=False):
                middle = clip.frames[0]
                clips.append({"video_id": video_id, "clip_index": clip.clip_index, "start_s": clip.start_s,
                              "end_s": clip.end_s, "n_real_frames": clip.n_real_frames, "padded": clip.padded,
                              "thumbnail_jpeg": thumbnail_jpeg(middle, cfg.decode.thumbnail_size,
                                                               cfg.decode.thumbnail_quality)})
        except media.VideoDecodeError as error:
            return [], _video_row(video, "error", reader, 0), [error_row(video_id, error)]
    if reader.error is not None:
        status = "partial"
        errors.append(error_row(video_id, *reader.stop_reason()))
    elif not clips:
        status = "too_short"
    else:
        status = "ok"
    if status == "partial" and not clips and reader.n_frames == 0:
        status = "error"
    return clips, _video_row(video, status, reader, len(clips)), errors


def run_shard(ctx: ShardContext) -> ShardResult:
    clip_rows, video_rows, errors = [], [], []
    with ctx.progress(total=len(ctx.videos)) as progress:
        for video in ctx.videos:
            clips, video_row, video_errors = decode_video(video, ctx.cfg)
            clip_rows += clips
            video_rows.append(video_row)
            errors += video_errors
            progress.update(1, clips=len(clips))
    clip_rows.sort(key=lambda row: (row["video_id"], row["clip_index"]))
    statuses = [row["status"] for row in video_rows]
    return ShardResult(
        tables={"": pa.Table.from_pylist(clip_rows, schema=schemas.DECODE_CLIPS.arrow),
                "videos": pa.Table.from_pylist(video_rows, schema=schemas.DECODE_VIDEOS.arrow)},
        errors=errors,
        stats={"clips": len(clip_rows), **{f"videos_{s}": statuses.count(s) for s in schemas.VIDEO_STATUSES}},
    )
