"""features: one 1024-d S3D vector per clip (torchvision `s3d`, the pooled activation before its
classifier), float16 in Parquet. Decode runs in DataLoader worker processes that feed the model batches,
so decoding the next clips overlaps the forward pass of the current ones."""

from __future__ import annotations

import functools
import json
import logging
import os

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import schemas
from pipeline import media, storage
from pipeline.config import Config
from pipeline.runner import ShardContext, ShardResult, error_row
from schemas.metadata import Provenance

# torchvision S3D_Weights.KINETICS400_V1 normalisation
KINETICS_MEAN = (0.43216, 0.394666, 0.37645)
KINETICS_STD = (0.22803, 0.22145, 0.216989)

log = logging.getLogger("pipeline.features")


def weights_identity(cfg: Config) -> str:
    """What the weights are, recorded in every output: nobody mistakes random features for real ones."""
    weights = cfg.features.weights
    if weights == "random":
        return f"random(seed={cfg.seed}) - NOT pretrained, for tests and offline demos only"
    if weights == "kinetics400":
        from torchvision.models.video import S3D_Weights
        return f"kinetics400:{S3D_Weights.KINETICS400_V1.url}"
    return f"file:sha256={_file_sha256(weights)}"


@functools.lru_cache(maxsize=8)
def _cached_sha256(path: str, size: int, modified_ns: int) -> str:
    return storage.file_sha256(path)


def _file_sha256(path: str) -> str:
    """A weights file's sha256, hashed once per process while the file is unchanged."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"features.weights: {path} not found") from None
    return _cached_sha256(os.path.abspath(path), stat.st_size, stat.st_mtime_ns)


def identities(cfg: Config, videos: list[dict]) -> dict[str, str]:
    """What shapes the features besides the config: the S3D weights, by content (lineage)."""
    return {"S3D weights": weights_identity(cfg)}


def feature_provenance(cfg: Config) -> dict:
    """Everything that decides what a feature vector means; tokens from different provenances don't mix."""
    d = cfg.decode
    return {"model": "torchvision.s3d", "weights": weights_identity(cfg), "fps": d.fps,
            "clip_frames": d.clip_frames, "min_clip_frames": d.min_clip_frames, "resize": d.resize,
            "crop": d.crop, "mean": KINETICS_MEAN, "std": KINETICS_STD, "dim": schemas.FEATURE_DIM}


def provenance_hash(provenance: dict) -> str:
    return storage.text_sha256(json.dumps(provenance, sort_keys=True))[:16]


def load_s3d(cfg: Config) -> torch.nn.Module:
    from torchvision.models.video import S3D_Weights, s3d
    weights = cfg.features.weights
    if weights == "kinetics400":
        model = s3d(weights=S3D_Weights.KINETICS400_V1)
    elif weights == "random":
        log.warning("features.weights=random: these features are NOT pretrained (recorded in the output)")
        torch.manual_seed(cfg.seed)
        model = s3d(weights=None)
    else:
        model = s3d(weights=None)
        try:
            state = torch.load(weights, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise FileNotFoundError(f"features.weights: {weights} not found") from None
        model.load_state_dict(state.get("state_dict", state) if isinstance(state, dict) else state)
    return model.eval()


def clip_embedding(model: torch.nn.Module, clips: torch.Tensor) -> torch.Tensor:
    """(B, 3, T, H, W) normalised clips -> (B, 1024): S3D's output before `classifier`, averaged over
    time and space (the classifier is a 1x1x1 conv, so this is exactly its input, pooled)."""
    x = model.features(clips)
    x = model.avgpool(x)
    return x.mean(dim=(2, 3, 4))


def normalise(frames_uint8: torch.Tensor) -> torch.Tensor:
    """(B, T, H, W, 3) uint8 -> (B, 3, T, H, W) float32 normalised as the Kinetics weights expect."""
    x = frames_uint8.permute(0, 4, 1, 2, 3).float().div_(255.0)
    mean = torch.tensor(KINETICS_MEAN).view(1, 3, 1, 1, 1)
    std = torch.tensor(KINETICS_STD).view(1, 3, 1, 1, 1)
    return (x - mean) / std


class ClipStream(IterableDataset):
    """Each DataLoader worker decodes whole videos (every n-th of the shard) and yields their clips."""

    def __init__(self, videos: list[dict], cfg: Config):
        self.videos, self.cfg = videos, cfg

    def __iter__(self):
        worker = get_worker_info()
        videos = self.videos if worker is None else self.videos[worker.id::worker.num_workers]
        for video in videos:
            video_id = video["video_id"]
            try:
                with media.ClipReader(video["uri"], self.cfg.decode) as reader:
                    for clip in reader.clips():
                        yield {"video_id": video_id, "clip_index": clip.clip_index, "start_s": clip.start_s,
                               "end_s": clip.end_s, "frames": torch.from_numpy(clip.frames)}
                    if reader.error is not None:
                        yield {"error": error_row(video_id, *reader.stop_reason())}
            except media.VideoDecodeError as error:
                yield {"error": error_row(video_id, error)}
            yield {"video_done": video_id}


def collate_clips(items: list[dict]) -> dict:
    clips = [item for item in items if "frames" in item]
    return {
        "clips": [{key: item[key] for key in ("video_id", "clip_index", "start_s", "end_s")} for item in clips],
        "frames": torch.stack([item["frames"] for item in clips]) if clips else None,
        "errors": [item["error"] for item in items if "error" in item],
        "videos_done": sum(1 for item in items if "video_done" in item),
    }


def resolve_device(cfg: Config) -> torch.device:
    if cfg.features.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.features.device)


def autocast_dtype(cfg: Config, device: torch.device) -> torch.dtype | None:
    precision = cfg.features.precision
    if precision == "auto":
        return torch.bfloat16   # cosine to float32 >= 0.9999 (tested); 3-4x faster on CPUs with bf16
    return {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}[precision]


class S3DEncoder:
    """The model on its device, in the configured precision: `encoder(frames_uint8) -> (B, 1024) float32`."""

    def __init__(self, cfg: Config, device: torch.device | None = None):
        self.device = device or resolve_device(cfg)
        self.dtype = autocast_dtype(cfg, self.device)
        self.model = load_s3d(cfg).to(self.device)
        if self.dtype is not None:
            self.model = self.model.to(memory_format=torch.channels_last_3d)

    @torch.inference_mode()
    def __call__(self, frames_uint8: torch.Tensor) -> torch.Tensor:
        x = normalise(frames_uint8).to(self.device, non_blocking=True)
        if self.dtype is None:
            return clip_embedding(self.model, x).float().cpu()
        x = x.contiguous(memory_format=torch.channels_last_3d)
        with torch.autocast(device_type=self.device.type, dtype=self.dtype):
            return clip_embedding(self.model, x).float().cpu()


def feature_table(rows: list[dict], vectors: np.ndarray) -> pa.Table:
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["video_id"], rows[i]["clip_index"]))
    rows = [rows[i] for i in order]
    flat = pa.array(vectors[order].astype(np.float16).reshape(-1), type=pa.float16())
    return pa.table({
        "video_id": pa.array([r["video_id"] for r in rows], pa.string()),
        "clip_index": pa.array([r["clip_index"] for r in rows], pa.int32()),
        "start_s": pa.array([r["start_s"] for r in rows], pa.float64()),
        "end_s": pa.array([r["end_s"] for r in rows], pa.float64()),
        "feature": pa.FixedSizeListArray.from_arrays(flat, schemas.FEATURE_DIM),
    })


_ENCODERS: dict[str, S3DEncoder] = {}


def encoder_for(cfg: Config) -> S3DEncoder:
    """One model per process and config: a worker that runs many shards loads the weights once."""
    key = f"{cfg.seed}:{cfg.section_json('features')}"
    if key not in _ENCODERS:
        _ENCODERS.clear()
        _ENCODERS[key] = S3DEncoder(cfg)
    return _ENCODERS[key]


def run_shard(ctx: ShardContext) -> ShardResult:
    cfg = ctx.cfg
    if cfg.features.num_threads:
        torch.set_num_threads(cfg.features.num_threads)
    encoder = encoder_for(cfg)
    loader = DataLoader(ClipStream(ctx.videos, cfg), batch_size=cfg.features.batch_size,
                        num_workers=min(cfg.features.decode_workers, len(ctx.videos)),
                        collate_fn=collate_clips, prefetch_factor=2 if cfg.features.decode_workers else None,
                        persistent_workers=False)
    rows, vectors, errors = [], [], []
    with ctx.progress(total=len(ctx.videos)) as progress:
        for batch in loader:
            errors += batch["errors"]
            if batch["frames"] is not None:
                vectors.append(encoder(batch["frames"]).numpy())
                rows += batch["clips"]
            progress.update(batch["videos_done"], clips=len(batch["clips"]))
    return shard_result(cfg, rows, vectors, errors, {"device": str(encoder.device),
                                                     "precision": str(encoder.dtype or "float32")})


def shard_result(cfg: Config, rows: list[dict], vectors: list[np.ndarray], errors: list[dict],
                 stats: dict) -> ShardResult:
    """The stage's result from the clip keys and their vectors (batch by batch, in the same order),
    however they were computed: here, or by an executor's model actors."""
    matrix = np.concatenate(vectors) if vectors else np.zeros((0, schemas.FEATURE_DIM), np.float32)
    provenance = feature_provenance(cfg)
    return ShardResult(
        tables={"": feature_table(rows, matrix)}, errors=sorted(errors, key=lambda row: row["video_id"]),
        stats={"clips": len(rows), **stats},
        provenance=Provenance(feature_provenance=json.dumps(provenance, sort_keys=True),
                              feature_provenance_hash=provenance_hash(provenance), weights=provenance["weights"]))
