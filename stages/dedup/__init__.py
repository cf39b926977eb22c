"""dedup: groups of videos that are the same footage (re-encoded, rescaled, cropped, trimmed, with other
audio), from what the visual pass already computed: each clip's 64-bit perceptual hash (the decode stage's
clip index) and its quality flags. A whole-collection stage (run.py); its group table is what training's
splits read, so that no group spans two of them, and training keeps one video of each group.

The default settings, and why (measured on ../shared/realdata's videos and their copies re-encoded at another
bitrate, rescaled to half, cropped by 10% and trimmed by 2 s, and on the bundled recipes, which share still
pictures of their steps; docs/curation.md has the figures):
- hashed frames every half second (three a clip): with one hash a clip, a copy trimmed by a time that is
  not a whole number of clips is hashed at other moments than its original, and a copy of moving footage
  matched only 0.63 of its clips; every half second, 0.95 or more;
- `max_hash_distance` 18 of 64 bits and `min_matched_share` 0.8: at that distance every copy matched 0.95
  to 1.0 of the shorter video's hashed frames at one offset; different realdata videos 0.43 at most, and
  recipes that share steps (the same still pictures, in other orders) 0.58 at most;
- `ignore_flags` black: the hash of a uniform dark picture says nothing of what it shows, so such clips match
  every other one; dark pictures with something on them (the subtitles of jfk_subtitled_speech.mp4, whose
  every clip is dark) and stills keep theirs."""

from __future__ import annotations

from dataclasses import dataclass

import schemas
from pipeline.config_fields import count, setting
from pipeline.contract import Option, Stage


@dataclass
class DedupConfig:
    # two hashed frames match when their hashes differ in at most this many of their 64 bits
    max_hash_distance: int = setting(18, ge=0, le=64)
    # two videos are copies when this share of the shorter one's hashed frames (three a clip, of its usable
    # clips) match the other's at one time offset, and at least min_matched_frames of them
    min_matched_share: float = setting(0.8, gt=0, le=1)
    min_matched_frames: int = setting(6, ge=1)  # two clips' worth
    # the videos each video is compared with: its nearest by the mean of its clips' hash bits (faiss HNSW)
    neighbours: int = setting(10, ge=1, le=1000)
    # clips with these quality flags are not compared (their hash carries no picture)
    ignore_flags: list[str] = setting(factory=lambda: ["black"], each=True, choices=schemas.CLIP_FLAGS)
    workers: int = count()  # processes comparing candidate videos; 0 = the task's CPUs


STAGE = Stage(
    "dedup",
    "groups of near-duplicate videos (re-encoded, rescaled, cropped, trimmed copies) from the clips' hashes",
    reads=("decode", "quality"),
    config_sections=("dedup",),
    operational_keys=("dedup.workers",),
    per_shard=False,
    writes="dedup/groups.parquet",
    section="dedup",
    section_type="stages.dedup:DedupConfig",
    ray_roles={"dedup": {"num_cpus": 1}},
    run="stages.dedup.run:run_collection",
    status_line="stages.dedup.checks:status_line",
    validate="stages.dedup.checks:validate",
    options=(Option("--force", "group again even when the groups are current"),),
    workers="processes comparing candidate videos (default: dedup.workers)",
)
