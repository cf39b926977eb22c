"""quality: flags on clips and videos that carry no picture worth a visual word (black, too dark, frozen,
near-static, a video too short), each with its reason, its measured value and the threshold, from the
figures the visual pass measures on every clip (the decode stage's clip index: stages/quality/measure.py).
The flagged clips of the reasons in `quality.exclude` stay out of the k-means fit and the training shards
(kmeans and align read this stage's table); the stage itself only reads and judges (run.py), so a changed
threshold redoes it and what reads it, never the decoding.

The thresholds were measured on ../shared/realdata (docs/curation.md has every clip's figures), luma on
BT.601's 0-255 scale over the frames as the model sees them:
- black: mean luma under 16 with a spatial luma std under 8: the almost black Chrome recording
  (moviepy_no_duration.webm) is 3.3 and 1.2; the black frame with burned-in subtitles (jfk_subtitled_speech)
  is 2.8 with std 13.2 (its text), the darkest real picture (Big Buck Bunny's fade-in) 32.6 and 3.6;
- dark: mean luma under 40: Big Buck Bunny's first clip, fading in from black (32.6), and the subtitle
  frame (2.8); the darkest real footage otherwise is 66.0 (the car park);
- frozen: no frame changes from the one before by more than 0.1 of a level on average (the largest
  change): digital stills (the subtitle frame 0.01, the bundled recipes' still pictures 0.00); a static
  camera's sensor noise is 0.27 and more (the car park's empty asphalt);
- static: a mean change under 0.3 of a level between frames: the car park's empty asphalt (0.10 to 0.23)
  and Big Buck Bunny's title over a still sky (0.19); its slowest animated scenes are 0.50 to 0.60;
- too short: a video of less decoded picture than one whole clip (`min_clips` 1: 1.5 s at the paper's
  grid), which gives at most one padded clip: decord_video_90_rotated.mov (two frames); the shortest real
  footage, intel_asl_again.mkv (a 2.6 s sign), is a whole video;
- a video whose clips carry one flag in at least `video_share` (0.8) of them carries it too, and every clip
  of a flagged video counts as flagged (a black video with a moment of picture)."""

from __future__ import annotations

from dataclasses import dataclass

import schemas
from pipeline.config_fields import setting
from pipeline.contract import Invalid, Part, Stage

REASONS = tuple(dict.fromkeys(schemas.VIDEO_FLAGS + schemas.CLIP_FLAGS))


@dataclass
class QualityConfig:
    black_luma: float = setting(16.0, ge=0, le=255)  # black: mean luma under this ...
    black_contrast: float = setting(8.0, ge=0, le=255)  # ... and the frames' spatial luma std under this
    dark_luma: float = setting(40.0, ge=0, le=255)  # dark: mean luma under this
    frozen_motion: float = setting(0.1, ge=0, le=255)  # frozen: the largest change between frames under this
    static_motion: float = setting(0.3, ge=0, le=255)  # static: the mean change between frames under this
    # too short: less decoded picture than this many whole clips (decode.clip_frames frames at decode.fps)
    min_clips: float = setting(1.0, ge=0, le=1_000_000)
    video_share: float = setting(0.8, gt=0, le=1)  # a flag of this share of a video's clips is the video's
    # the reasons whose clips stay out of the k-means fit and the training shards; [] keeps every clip
    exclude: list[str] = setting(factory=lambda: list(REASONS), each=True, choices=REASONS)


def flags_consistent(part: Part) -> None:
    """quality: one row per clip of the decode stage's clip index, known reasons, `excluded` exactly where a
    flag of `quality.exclude` holds (its own or its video's)."""
    import json

    from pipeline import storage
    from schemas import metadata

    table = storage.read_table(part.path)
    rows = table.to_pylist()
    config = json.loads(metadata.read(table.schema).config or "{}").get("quality", {})
    excluded_reasons = set(config.get("exclude", REASONS))
    videos_path = part.sibling("quality", "quality_videos")
    video_flags = {}
    if videos_path.exists():
        video_flags = {
            row["video_id"]: {flag["reason"] for flag in row["flags"]}
            for row in storage.read_table(videos_path).to_pylist()
        }
    clips = part.sibling("decode")
    if clips.exists():
        keys = storage.read_table(clips, columns=["video_id", "clip_index"]).to_pylist()
        if [(r["video_id"], r["clip_index"]) for r in keys] != [(r["video_id"], r["clip_index"]) for r in rows]:
            raise Invalid(f"{part.path}: its clips differ from {clips} (every clip is judged once)")
    for row_number, row in enumerate(rows):
        reasons = {flag["reason"] for flag in row["flags"]}
        if not reasons <= set(schemas.CLIP_FLAGS):
            raise Invalid(f"{part.path}: row {row_number}: unknown flag in {sorted(reasons)}")
        expected = bool((reasons | video_flags.get(row["video_id"], set())) & excluded_reasons)
        if row["excluded"] != expected:
            raise Invalid(f"{part.path}: row {row_number}: excluded is {row['excluded']}, its flags say {expected}")


STAGE = Stage(
    "quality",
    "flags on clips and videos with no picture worth a visual word (black, dark, frozen, static, too short)",
    reads=("decode",),
    # the clip length min_clips counts in is decode's: its parts change with it
    config_sections=("quality",),
    per_shard=True,
    writes="quality/part-*.parquet (per clip), quality_videos (per video)",
    tables={"": schemas.QUALITY, "quality_videos": schemas.QUALITY_VIDEOS},
    run="stages.quality.run:run_shard",
    section="quality",
    section_type="stages.quality:QualityConfig",
    ray_roles={"quality": {"num_cpus": 1}},
    checks={"": ("pipeline.table_checks:clips_in_order", "stages.quality:flags_consistent")},
    card_configs={"": "quality", "quality_videos": "quality_videos"},
)
