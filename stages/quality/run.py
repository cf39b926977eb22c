"""quality: each clip's and each video's flags, from the figures the decode stage measured on every clip in
the visual pass (stages/quality/measure.py), judged against the thresholds of the quality section."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa

import schemas
from pipeline.contract import ShardContext, ShardResult

MEASURES = ["video_id", "clip_index", "start_s", "end_s", "luma_mean", "luma_contrast", "motion_mean", "motion_max"]


def flag(reason: str, value: float, threshold: float) -> dict:
    return {"reason": reason, "value": round(float(value), 4), "threshold": float(threshold)}


def clip_flags(clip: dict, q) -> list[dict]:
    """The flags of one clip (its measures as the decode stage wrote them), in CLIP_FLAGS order."""
    found = []
    if clip["luma_mean"] < q.black_luma and clip["luma_contrast"] < q.black_contrast:
        found.append(flag("black", clip["luma_mean"], q.black_luma))
    if clip["luma_mean"] < q.dark_luma:
        found.append(flag("dark", clip["luma_mean"], q.dark_luma))
    if clip["motion_max"] < q.frozen_motion:
        found.append(flag("frozen", clip["motion_max"], q.frozen_motion))
    if clip["motion_mean"] < q.static_motion:
        found.append(flag("static", clip["motion_mean"], q.static_motion))
    return found


def video_flags(video: dict, flags_of_clips: list[list[dict]], q, clip_s: float = 1.5) -> list[dict]:
    """A video's own flags: less picture than min_clips clips of `clip_s` (its value and threshold in
    seconds), or a clip flag on at least video_share of its clips (its value is that share)."""
    found = []
    decoded_s = video.get("decoded_s")
    if decoded_s is not None and decoded_s < q.min_clips * clip_s - 1e-9:
        found.append(flag("too_short", decoded_s, q.min_clips * clip_s))
    if flags_of_clips:
        counts = Counter(one["reason"] for flags in flags_of_clips for one in flags)
        for reason in schemas.CLIP_FLAGS:
            share = counts[reason] / len(flags_of_clips)
            if counts[reason] and share >= q.video_share:
                found.append(flag(reason, share, q.video_share))
    return found


def run_shard(ctx: ShardContext) -> ShardResult:
    q = ctx.cfg.quality
    clip_s = ctx.cfg.decode.clip_frames / ctx.cfg.decode.fps
    excluded_reasons = set(q.exclude)
    clips = ctx.read_input("decode", columns=MEASURES).to_pylist()
    videos = {row["video_id"]: row for row in ctx.read_input("decode", "videos").to_pylist()}
    by_video: dict[str, list[dict]] = {}
    for clip in clips:
        by_video.setdefault(clip["video_id"], []).append(clip)
    clip_rows, video_rows = [], []
    reasons: Counter = Counter()
    for video_id in sorted(set(videos) | set(by_video)):
        own = sorted(by_video.get(video_id, []), key=lambda clip: clip["clip_index"])
        flags_of_clips = [clip_flags(clip, q) for clip in own]
        whole = video_flags(videos.get(video_id, {}), flags_of_clips, q, clip_s)
        whole_excluded = any(one["reason"] in excluded_reasons for one in whole)
        for clip, flags in zip(own, flags_of_clips):
            excluded = whole_excluded or any(one["reason"] in excluded_reasons for one in flags)
            clip_rows.append({**{key: clip[key] for key in schemas.QUALITY.arrow.names[:4]}, "flags": flags})
            clip_rows[-1]["excluded"] = excluded
            reasons.update(one["reason"] for one in flags)
        video_rows.append(
            {
                "video_id": video_id,
                "clips": len(own),
                "flagged_clips": sum(bool(flags) for flags in flags_of_clips),
                "flags": whole,
            }
        )
    video_reasons = Counter(one["reason"] for row in video_rows for one in row["flags"])
    return ShardResult(
        tables={
            "": pa.Table.from_pylist(clip_rows, schema=schemas.QUALITY.arrow),
            "quality_videos": pa.Table.from_pylist(video_rows, schema=schemas.QUALITY_VIDEOS.arrow),
        },
        stats={
            "clips": len(clip_rows),
            "clips_excluded": sum(row["excluded"] for row in clip_rows),
            "clip_flags": dict(sorted(reasons.items())),
            "videos_flagged": sum(bool(row["flags"]) for row in video_rows),
            "video_flags": dict(sorted(video_reasons.items())),
        },
    )
