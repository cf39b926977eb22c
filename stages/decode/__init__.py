"""decode: the clip index (20 fps, 30-frame clips), a thumbnail per clip with its perceptual hash and the
figures the quality stage judges, per-video metadata; and, from the same frames, the shots stage's
boundaries. Made by the features stage's pass (one read of each video); run alone, the same files on CPUs
only (run.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import schemas
from pipeline.config_fields import ConfigError, count, setting
from pipeline.contract import Stage

# S3D's limits, as torchvision's S3D_Weights.KINETICS400_V1 states them (meta["min_temporal_size"], the
# transform's crop); kept here so that loading a config needs no torch, and held equal by a test
S3D_MIN_FRAMES = 14
S3D_MIN_CROP = 224


def device_of_decoder(d, prefix: str) -> None:
    if not re.fullmatch(r"cpu|cuda(:\d+)?", d.device):
        raise ConfigError(f"config error: {prefix}device must be cpu, cuda or cuda:N (got {d.device!r})")
    if d.device != "cpu" and d.backend != "torchcodec":
        raise ConfigError(
            f"config error: {prefix}device={d.device} needs {prefix}backend=torchcodec (PyAV decodes on the CPU)"
        )


def shots_need_pyav(d, prefix: str) -> None:
    if d.clip_policy == "shots" and d.backend != "pyav":
        raise ConfigError(
            f"config error: {prefix}clip_policy=shots needs {prefix}backend=pyav (torchcodec's reader cuts the "
            f"grid only; got {d.backend!r})"
        )


@dataclass
class DecodeConfig:
    # VideoBERT samples every video at 20 fps; no camera worth sampling is faster than 120, and clips per
    # second of video grow with it (1e6 fps made 100,000 clips of a 3 s video)
    fps: float = setting(20.0, gt=0, le=120)
    # 30 frames = 1.5 s per clip; S3D's temporal stride is 8 and its last pool spans 2 steps: shorter clips
    # have no output
    clip_frames: int = setting(30, ge=S3D_MIN_FRAMES, le=1024, why="for S3D")
    # a last partial clip with fewer is dropped
    min_clip_frames: int = setting(15, ge=1, le="clip_frames", why="(the clip length, decode.clip_frames)")
    # torchvision KINETICS400_V1: resize to 256x256, then centre crop 224; S3D downsamples space by 32 and
    # ends with a 7x7 pool
    resize: int = setting(256, ge="crop", le=1024, why="(decode.crop is cut from it)")
    # edge of the centre crop, in pixels: the frames S3D sees
    crop: int = setting(224, ge=S3D_MIN_CROP, le=1024, why="for S3D")
    thumbnail_size: int = setting(96, ge=16, le=512)  # JPEG thumbnail (middle frame) edge, for the gallery
    # JPEG quality of the thumbnails
    thumbnail_quality: int = setting(80, ge=1, le=100)
    # larger frames are refused (memory stays bounded per clip); FFmpeg itself refuses frames of about
    # 2**28 pixels (16384 x 16384) and more
    max_pixels: int = setting(8192 * 4320, ge=1, le=2**28)
    decode_threads: int = count()  # FFmpeg frame threads per video; 0 = its choice
    # the longest wait, in seconds, to open an input, probe its streams or read its next packet (decode,
    # features and asr's audio): a longer one makes the video an InputTimeout error row. Long enough for a
    # slow network share or HTTP server to answer; short enough that a dead one costs a minute, not a shard
    io_timeout_s: float = setting(60.0, gt=0, le=3600)
    # timestamps that jump forward by more than this between two frames are a broken clock, not a picture
    # held on screen: the video stops there (partial). Slideshows and screen recordings hold a frame for
    # seconds, up to a minute; broken clocks jump by hours. Each second of gap is 20 copies of a frame
    max_gap_s: float = setting(60.0, gt=0, le=86_400)
    # pyav (default: FFmpeg through PyAV, every check above) | torchcodec (FFmpeg through torchcodec, for
    # decoding on a GPU; a video it cannot decode falls back to PyAV). Frames agree within a pixel MAE of
    # 2 on the samples (tests/test_torchcodec.py), so a change makes decode and features stale
    backend: str = setting("pyav", choices=("pyav", "torchcodec"))
    # torchcodec only: cpu | cuda | cuda:N (NVDEC, resized on the GPU)
    device: str = setting("cpu", rule=device_of_decoder)
    # grid: the paper's, clips of clip_frames from each video's first frame on; shots: the grid starts again
    # at every shot boundary the shots stage finds (with its settings), the window before one ending there
    # as a last partial clip does (padded with min_clip_frames real frames, else dropped): no clip holds two
    # shots. The paper's grid is the default: shots changes every clip, so the features with it
    clip_policy: str = setting("grid", choices=("grid", "shots"), rule=shots_need_pyav)


def clip_grid(cfg, videos: list[dict]) -> dict[str, str]:
    """What shapes the clips besides the decode section: with clip_policy shots, the shots section (the
    boundaries the grid starts again at). Lineage of the decode stage, and of the features made with it."""
    if cfg.decode.clip_policy != "shots":
        return {}
    return {"shot boundaries": cfg.section_hash("shots")}


STAGE = Stage(
    "decode",
    "the clip index (20 fps, 30-frame clips), a thumbnail per clip, per-video metadata "
    "(the features stage makes them in its pass; alone: without S3D)",
    reads=("manifest",),
    config_sections=("decode",),
    per_shard=True,
    writes="decode/part-*.parquet (clips), videos (per video)",
    tables={"": schemas.DECODE_CLIPS, "videos": schemas.DECODE_VIDEOS},
    run="stages.decode.run:run_shard",
    identities="stages.decode:clip_grid",
    also_makes=("shots",),
    section="decode",
    section_type="stages.decode:DecodeConfig",
    device_keys=("decode.device",),
    ray_roles={"decode": {"num_cpus": 1}},
    checks={"": ("pipeline.table_checks:clips_in_order",)},
    card_configs={"": "clips", "videos": "videos"},
    version=3,
)  # 2: the video stream decoded is the default one, else the longest (not the first); 3: each clip's measures
