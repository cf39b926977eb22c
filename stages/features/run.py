"""features: one 1024-d S3D vector per clip (torchvision `s3d`, the pooled activation before its
classifier), float16 in Parquet; and, from the same read of each video, the decode stage's clip index,
thumbnails and per-video rows (written as the decode stage's outputs, with its completion record).

The stage is a `pipeline.engine.split.Split`: a producer decodes videos into batches of uint8 clips (CPU
decode worker processes with PyAV, or torchcodec on a GPU with `decode.backend: torchcodec`,
`decode.device: cuda`), and an encoder holds S3D on its device (s3d/: the network and its
weights, the encoder). Executors run the two parts where they fit. A part whose float16 values are
mostly zero or subnormal is refused, whatever the weights."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pyarrow as pa
import torch

import schemas
from pipeline import storage
from pipeline.config import Config
from pipeline.contract import ShardContext, ShardResult
from pipeline.engine.split import Split, concatenate
from schemas.metadata import Provenance
from stages.decode import clip_grid
from stages.decode import run as decode
from stages.features.s3d.encoder import S3DEncoder, encoder_for
from stages.features.s3d.model import KINETICS_MEAN, KINETICS_STD, weights_identity

# the automatic sizes (features.batch_size: 0, features.decode_workers: null)
CPU_BATCH, GPU_BATCH = 8, 128

# a part with more than this share of float16 values that are zero or subnormal is refused
MAX_VANISHING_SHARE = 0.5


class VanishingFeatures(ValueError):
    """A part whose values are mostly zero or subnormal in float16: not features."""


def identities(cfg: Config, videos: list[dict]) -> dict[str, str]:
    """What shapes the features besides the config: the S3D weights, by content, and the clip grid's shot
    boundaries where decode.clip_policy is shots (lineage)."""
    return {"S3D weights": weights_identity(cfg), **clip_grid(cfg, videos)}


def feature_provenance(cfg: Config) -> dict:
    """Everything that decides what a feature vector means; tokens from different provenances don't mix."""
    d = cfg.decode
    return {
        "model": "torchvision.s3d",
        "weights": weights_identity(cfg),
        "fps": d.fps,
        "clip_frames": d.clip_frames,
        "min_clip_frames": d.min_clip_frames,
        "resize": d.resize,
        "crop": d.crop,
        "mean": KINETICS_MEAN,
        "std": KINETICS_STD,
        "dim": schemas.FEATURE_DIM,
    }


def provenance_hash(provenance: dict) -> str:
    return storage.text_sha256(json.dumps(provenance, sort_keys=True))[:16]


def gpu_decoding(cfg: Config) -> bool:
    return cfg.decode.backend == "torchcodec" and cfg.decode.device.startswith("cuda")


class FeaturesSplit(Split):
    """Producers decode videos into batches of clips (and the decode stage's rows); the encoder is S3D."""

    roles = ("features_decode", "features_model")

    def settle(self, cfg: Config, device: torch.device) -> Config:
        """The automatic sizes for an encoder on `device`: a GPU takes batches of 128 clips and every core
        but one decoding for it; a CPU batches of 8 and one decode worker."""
        f = cfg.features
        gpu = device.type == "cuda"
        batch = f.batch_size or (GPU_BATCH if gpu else CPU_BATCH)
        workers = f.decode_workers
        if workers is None:
            workers = max(1, (os.cpu_count() or 2) - 1) if gpu else 1
        return dataclasses.replace(cfg, features=dataclasses.replace(f, batch_size=batch, decode_workers=workers))

    def streams(self, cfg: Config) -> int:
        """Decode worker processes for a shard: none when the GPU decodes (frames stay on the device)."""
        return 0 if gpu_decoding(cfg) else cfg.features.decode_workers or 0

    def actors(self, cfg: Config) -> int:
        return 0 if gpu_decoding(cfg) else cfg.features.ray_models

    def start_method(self, cfg: Config) -> str | None:
        """torchcodec's decode workers start afresh ("spawn") with PyAV's FFmpeg on LD_LIBRARY_PATH
        (pipeline/media/ffmpeg_libs.py), which the dynamic linker reads at process start."""
        if cfg.decode.backend != "torchcodec":
            return None
        from pipeline.media import ffmpeg_libs

        ffmpeg_libs.prepare_children()
        return "spawn"

    def produce(self, cfg: Config, videos: list[dict]):
        """Batches of `features.batch_size` clips from these videos, each video read once: the payload is
        the clips' uint8 frames (B, T, H, W, 3); the meta holds the clip keys, and as each video ends its
        decode rows (clip index with thumbnails, per-video row) and error rows."""
        size = cfg.features.batch_size or CPU_BATCH
        keys, frames = [], []
        meta = _empty_meta()
        for video in videos:
            one = decode.VideoPass(video, cfg)
            for clip in one.clips():
                keys.append(
                    {
                        "video_id": video["video_id"],
                        "clip_index": clip.clip_index,
                        "start_s": clip.start_s,
                        "end_s": clip.end_s,
                    }
                )
                frames.append(clip.frames)
                if len(frames) == size:
                    yield _batch(meta, keys, frames)
                    keys, frames, meta = [], [], _empty_meta()
            meta["decode_clips"] += one.clip_rows
            meta["decode_shots"] += one.shot_rows
            meta["decode_videos"].append(one.video_row)
            meta["errors"] += one.errors
            meta["videos_done"] += 1
        if frames or meta["videos_done"]:
            yield _batch(meta, keys, frames)

    def encoder(self, cfg: Config) -> S3DEncoder:
        return encoder_for(cfg)

    def finish(self, ctx: ShardContext, cfg: Config, metas: list[dict], arrays: list, stats: dict) -> ShardResult:
        """The shard's features and, from the same pass, the decode stage's tables."""
        rows = [key for meta in metas for key in meta["clips"]]
        matrix = concatenate(arrays, schemas.FEATURE_DIM).astype(np.float16)
        check_values(matrix, f"features part {ctx.shard_index:05d}")
        provenance = feature_provenance(cfg)
        made = decode.shard_result(
            [row for meta in metas for row in meta["decode_clips"]],
            [row for meta in metas for row in meta["decode_videos"]],
            [row for meta in metas for row in meta["errors"]],
            {"made_by": "features"},
            shot_rows=[row for meta in metas for row in meta["decode_shots"]],
        )
        return ShardResult(
            tables={"": feature_table(rows, matrix)},
            errors=made.errors,
            stats={"clips": len(rows), **stats, "several_streams": made.stats["several_streams"]},
            provenance=Provenance(
                feature_provenance=json.dumps(provenance, sort_keys=True),
                feature_provenance_hash=provenance_hash(provenance),
                weights=provenance["weights"],
            ),
            also={"decode": made, **made.also},
        )


def _empty_meta() -> dict:
    return {
        "clips": [],
        "items": 0,
        "errors": [],
        "videos_done": 0,
        "decode_clips": [],
        "decode_videos": [],
        "decode_shots": [],
    }


def _batch(meta: dict, keys: list[dict], frames: list) -> dict:
    payload = None
    if frames:
        payload = torch.stack(frames) if isinstance(frames[0], torch.Tensor) else torch.from_numpy(np.stack(frames))
    return {"meta": {**meta, "clips": keys, "items": len(keys)}, "payload": payload}


def check_values(vectors16: np.ndarray, label: str) -> None:
    """Refuse vectors that are not features: mostly zero or subnormal in float16 (S3D's activations
    vanish: uncalibrated random weights, or a broken checkpoint), or not finite."""
    if not vectors16.size:
        return
    if not np.isfinite(vectors16).all():
        raise VanishingFeatures(
            f"{label}: {int((~np.isfinite(vectors16)).sum())} feature values are NaN or "
            f"infinite: the S3D weights or the precision are broken; the part is not written"
        )
    share = float((np.abs(vectors16) < np.finfo(np.float16).tiny).mean())
    if share > MAX_VANISHING_SHARE:
        raise VanishingFeatures(
            f"{label}: {share:.0%} of its float16 feature values are zero or subnormal (|x| < 6.1e-05), so "
            f"the vectors carry no information: S3D's activations vanish (an uncalibrated random network or a "
            f"broken checkpoint in features.weights?); the part is not written"
        )


def feature_table(rows: list[dict], vectors: np.ndarray) -> pa.Table:
    """The part's table, in (video, clip) order; `vectors` are float16 already."""
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["video_id"], rows[i]["clip_index"]))
    rows = [rows[i] for i in order]
    flat = pa.array(vectors[order].reshape(-1), type=pa.float16())
    return pa.table(
        {
            "video_id": pa.array([r["video_id"] for r in rows], pa.string()),
            "clip_index": pa.array([r["clip_index"] for r in rows], pa.int32()),
            "start_s": pa.array([r["start_s"] for r in rows], pa.float64()),
            "end_s": pa.array([r["end_s"] for r in rows], pa.float64()),
            "feature": pa.FixedSizeListArray.from_arrays(flat, schemas.FEATURE_DIM),
        }
    )


SPLIT = FeaturesSplit()


def run_shard(ctx: ShardContext) -> ShardResult:
    return SPLIT.run_local(ctx)
