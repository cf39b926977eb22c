"""features: one 1024-d S3D vector per clip (torchvision `s3d`, the pooled activation before its
classifier), float16 in Parquet; and, from the same read of each video, the decode stage's clip index,
thumbnails and per-video rows (written as the decode stage's outputs, with its completion record).

The stage is a `pipeline.engine.split.Split`: a producer decodes videos into batches of uint8 clips (CPU
decode worker processes with PyAV, or torchcodec on a GPU with `decode.backend: torchcodec`,
`decode.device: cuda`), and an encoder holds S3D on its device. Frames travel as uint8 (pinned memory
on the way to a GPU, copied without blocking) and are normalised on the model's device; the model runs
in bf16 autocast with channels_last_3d. Executors run the two parts where they fit.

`features.weights: random` is a seeded S3D whose BatchNorm statistics are calibrated on a fixed set of
clips cut from samples/ (a raw random S3D gives activations of about 1e-7, zeros in float16): the same
network in every process and run, and recorded as NOT pretrained in every output. A part whose float16
values are mostly zero or subnormal is refused, whatever the weights."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from torchvision.models.video import S3D_Weights

import schemas
from pipeline import devices, storage
from pipeline.engine import split
from pipeline.config import Config, DecodeConfig
from pipeline.file_cache import FileCache
from pipeline.media.video import ClipReader
from pipeline.engine.runner import ShardContext, ShardResult
from schemas.metadata import Provenance
from stages import decode

# the normalisation the Kinetics weights were trained with, as torchvision's weights carry it
_KINETICS_TRANSFORM = S3D_Weights.KINETICS400_V1.transforms()
KINETICS_MEAN = tuple(_KINETICS_TRANSFORM.mean)
KINETICS_STD = tuple(_KINETICS_TRANSFORM.std)

# the automatic sizes (features.batch_size: 0, features.decode_workers: null)
CPU_BATCH, GPU_BATCH = 8, 128

# a part with more than this share of float16 values that are zero or subnormal is refused
MAX_VANISHING_SHARE = 0.5

# random weights: BatchNorm statistics from these clips (index of the clip in each sample video, decoded
# with the default decode settings whatever the run's): 10 whole clips in one batch, train mode, float32
# on the CPU. One batch, not several: each layer's statistics are then those of what the layers before it
# give in eval mode (averaging per-batch statistics made deep activations grow to ~45 on these clips)
SAMPLES = Path(__file__).resolve().parent.parent / "samples"
CALIBRATION_CLIPS = (2, 6)
CALIBRATION_RECIPE = "bn-one-batch-v1"

log = logging.getLogger("pipeline.features")


class VanishingFeatures(ValueError):
    """A part whose values are mostly zero or subnormal in float16: not features."""


# ------------------------------------------------------------------ weights

def calibration_videos() -> list[Path]:
    videos = sorted(SAMPLES.glob("*.mp4"))
    if not videos:
        raise FileNotFoundError(f"features.weights=random calibrates S3D on the sample videos in {SAMPLES}, "
                                f"which are missing: run from the project's folder (or give real weights)")
    return videos


def calibration_digest() -> str:
    """The identity of the calibration set: the sample files' contents (each hashed once per process while
    unchanged) and the recipe."""
    digest = hashlib.sha256(CALIBRATION_RECIPE.encode())
    for path in calibration_videos():
        digest.update(path.name.encode() + _file_sha256(str(path)).encode())
    return digest.hexdigest()[:16]


def calibration_clips() -> torch.Tensor:
    """(N, 30, 224, 224, 3) uint8: clips CALIBRATION_CLIPS of every sample video."""
    clips = []
    for path in calibration_videos():
        with ClipReader(str(path), DecodeConfig()) as reader:
            for clip in reader.clips():
                if clip.clip_index in CALIBRATION_CLIPS:
                    clips.append(torch.from_numpy(clip.frames))
                if clip.clip_index >= max(CALIBRATION_CLIPS):
                    break
    return torch.stack(clips)


def weights_identity(cfg: Config) -> str:
    """What the weights are, recorded in every output: nobody mistakes random features for real ones."""
    weights = cfg.features.weights
    if weights == "random":
        return (f"random(seed={cfg.seed}, BatchNorm calibrated on sample clips {calibration_digest()}) "
                f"- NOT pretrained, for tests and offline demos only")
    if weights == "kinetics400":
        from torchvision.models.video import S3D_Weights
        return f"kinetics400:{S3D_Weights.KINETICS400_V1.url}"
    return f"file:sha256={_file_sha256(weights)}"


_WEIGHTS_SHA256: FileCache[str] = FileCache(max_entries=8)


def _file_sha256(path: str) -> str:
    """A weights file's sha256, hashed once per process while the file is unchanged."""
    try:
        return _WEIGHTS_SHA256.get(path, lambda: storage.file_sha256(path))
    except FileNotFoundError:
        raise FileNotFoundError(f"features.weights: {path} not found") from None


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


@functools.lru_cache(maxsize=2)
def calibrated_random_state(seed: int, digest: str) -> dict:
    """The state of a seeded random S3D whose BatchNorm running statistics are those of the calibration
    clips. Computed on one thread (float32 sums depend on how threads split them), then kept in the user's
    cache folder, so that every process of a machine (or of machines sharing that folder) loads the same
    network; a lock makes processes that start together wait for the first one."""
    import fcntl

    folder = storage.user_cache("s3d")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"s3d-random-seed{seed}-{digest}-torch{torch.__version__.split('+')[0]}.pt"
    with open(folder / f"{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            try:
                return torch.load(path, map_location="cpu", weights_only=True)
            except Exception as error:  # noqa: BLE001 - a damaged cache file is computed again
                log.warning("%s cannot be read (%s): calibrating again", path, error)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            state = _calibrate(seed)
        finally:
            torch.set_num_threads(threads)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        torch.save(state, temporary)
        temporary.replace(path)
    return state


def _calibrate(seed: int) -> dict:
    """A seeded random S3D, its BatchNorm statistics measured on the calibration clips in one batch: each
    BatchNorm takes the mean and variance of its input over the batch before it normalises with them, as
    in train mode; deeper layers thus see what the layers before them give in eval mode."""
    from torchvision.models.video import s3d
    torch.manual_seed(seed)
    model = s3d(weights=None).eval()
    clips = calibration_clips()

    def measure(module, inputs):
        x = inputs[0]
        dims = [0] + list(range(2, x.dim()))
        module.running_mean.copy_(x.mean(dim=dims))
        module.running_var.copy_(x.var(dim=dims, unbiased=False))
        module.num_batches_tracked.fill_(1)

    hooks = [module.register_forward_pre_hook(measure) for module in model.modules()
             if isinstance(module, torch.nn.modules.batchnorm._BatchNorm)]
    with torch.no_grad():
        model.features(normalise(clips))
    for hook in hooks:
        hook.remove()
    log.info("features.weights=random: S3D BatchNorm calibrated on %d sample clips", len(clips))
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def load_s3d(cfg: Config) -> torch.nn.Module:
    from torchvision.models.video import S3D_Weights, s3d
    weights = cfg.features.weights
    if weights == "kinetics400":
        model = s3d(weights=S3D_Weights.KINETICS400_V1)
    elif weights == "random":
        log.warning("features.weights=random: these features are NOT pretrained (recorded in the output)")
        model = s3d(weights=None)
        model.load_state_dict(calibrated_random_state(cfg.seed, calibration_digest()))
    else:
        model = s3d(weights=None)
        try:
            state = torch.load(weights, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise FileNotFoundError(f"features.weights: {weights} not found") from None
        model.load_state_dict(state.get("state_dict", state) if isinstance(state, dict) else state)
    return model.eval()


# ------------------------------------------------------------------ the encoder

def clip_embedding(model: torch.nn.Module, clips: torch.Tensor) -> torch.Tensor:
    """(B, 3, T, H, W) normalised clips -> (B, 1024): S3D's output before `classifier`, averaged over
    time and space (the classifier is a 1x1x1 conv, so this is exactly its input, pooled)."""
    x = model.features(clips)
    x = model.avgpool(x)
    return x.mean(dim=(2, 3, 4))


@functools.lru_cache(maxsize=8)
def _affine(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    mean = torch.tensor(KINETICS_MEAN, dtype=torch.float64)
    std = torch.tensor(KINETICS_STD, dtype=torch.float64)
    scale, shift = (1 / (255 * std)).float(), (-mean / std).float()
    return scale.view(1, 3, 1, 1, 1).to(device), shift.view(1, 3, 1, 1, 1).to(device)


def normalise(frames_uint8: torch.Tensor) -> torch.Tensor:
    """(B, T, H, W, 3) uint8 -> (B, 3, T, H, W) float32 normalised as the Kinetics weights expect, on the
    device the frames are on. The result is a view of the frames' layout: channels_last_3d, no copy."""
    scale, shift = _affine(frames_uint8.device)
    return torch.addcmul(shift, frames_uint8.permute(0, 4, 1, 2, 3).float(), scale)


def resolve_device(cfg: Config) -> torch.device:
    return devices.resolve(cfg.features.device)


def autocast_dtype(cfg: Config, device: torch.device) -> torch.dtype | None:
    """bf16 autocast by default on every device: on CPUs too, 3-4x faster, features within cosine 0.995
    of float32 (tested; pipeline/devices.py)."""
    return devices.autocast_dtype(cfg.features.precision, device, cpu_auto="bfloat16")


class _Done:
    def __init__(self, array: np.ndarray):
        self.array = array

    def result(self) -> np.ndarray:
        return self.array


class _OnDevice:
    """A batch queued on a GPU: its vectors are copied back without blocking, `result` waits for them."""

    def __init__(self, vectors: torch.Tensor):
        self.host = torch.empty(vectors.shape, dtype=torch.float32, pin_memory=True)
        self.host.copy_(vectors, non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record()

    def result(self) -> np.ndarray:
        self.event.synchronize()
        return self.host.numpy()


class S3DEncoder(split.Encoder):
    """The model on its device, in the configured precision. `encoder(frames_uint8) -> (B, 1024) float32`
    on the CPU; `submit(frames_uint8)` queues a batch (see pipeline.engine.split.Encoder). Frames reach the device
    as uint8 and are normalised there."""

    def __init__(self, cfg: Config, device: torch.device | None = None):
        self.device = device or resolve_device(cfg)
        self.dtype = autocast_dtype(cfg, self.device)
        self.model = load_s3d(cfg).to(self.device)
        if self.dtype is not None:
            self.model = self.model.to(memory_format=torch.channels_last_3d)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True    # one clip shape: the fastest kernels, chosen once

    def to_device(self, frames_uint8: torch.Tensor) -> torch.Tensor:
        """The batch on the model's device, still uint8: a quarter of float32's bytes over PCIe (from
        pinned memory the copy does not block)."""
        if frames_uint8.dtype != torch.uint8:
            raise TypeError(f"the encoder takes uint8 frames (got {frames_uint8.dtype})")
        return frames_uint8.to(self.device, non_blocking=True)

    @torch.inference_mode()
    def forward(self, frames_uint8: torch.Tensor) -> torch.Tensor:
        """(B, 1024) float32 vectors on the device."""
        x = normalise(self.to_device(frames_uint8))
        if self.dtype is None:
            return clip_embedding(self.model, x).float()
        x = x.contiguous(memory_format=torch.channels_last_3d)    # already is: a permuted NDHWC batch
        with torch.autocast(device_type=self.device.type, dtype=self.dtype):
            return clip_embedding(self.model, x).float()

    def __call__(self, frames_uint8: torch.Tensor) -> torch.Tensor:
        return self.forward(frames_uint8).cpu()

    def submit(self, payload: torch.Tensor):
        if self.device.type == "cuda":
            with torch.inference_mode():
                return _OnDevice(self.forward(payload))
        return _Done(self.forward(payload).cpu().numpy())

    def describe(self) -> dict:
        return {"device": str(self.device), "precision": str(self.dtype or "float32")}


_ENCODERS: dict[str, S3DEncoder] = {}


def encoder_for(cfg: Config) -> S3DEncoder:
    """One model per process and config: a worker that runs many shards loads the weights once."""
    if cfg.features.num_threads:
        torch.set_num_threads(cfg.features.num_threads)
    key = f"{cfg.seed}:{cfg.features.weights}:{cfg.features.precision}:{resolve_device(cfg)}"
    if key not in _ENCODERS:
        _ENCODERS.clear()
        _ENCODERS[key] = S3DEncoder(cfg)
    return _ENCODERS[key]


# ------------------------------------------------------------------ the producer

def gpu_decoding(cfg: Config) -> bool:
    return cfg.decode.backend == "torchcodec" and cfg.decode.device.startswith("cuda")


def settle(cfg: Config, device: torch.device) -> Config:
    """The automatic sizes for an encoder on `device`: a GPU takes batches of 128 clips and every core
    but one decoding for it; a CPU batches of 8 and one decode worker."""
    import dataclasses
    f = cfg.features
    gpu = device.type == "cuda"
    batch = f.batch_size or (GPU_BATCH if gpu else CPU_BATCH)
    workers = f.decode_workers if f.decode_workers is not None else (max(1, (os.cpu_count() or 2) - 1) if gpu else 1)
    return dataclasses.replace(cfg, features=dataclasses.replace(f, batch_size=batch, decode_workers=workers))


def streams(cfg: Config) -> int:
    """Decode worker processes for a shard: none when the GPU decodes (frames stay on the device)."""
    return 0 if gpu_decoding(cfg) else cfg.features.decode_workers or 0


def actors(cfg: Config) -> int:
    return 0 if gpu_decoding(cfg) else cfg.executor.ray_feature_models


def start_method(cfg: Config) -> str | None:
    """torchcodec's decode workers start afresh ("spawn") with PyAV's FFmpeg on LD_LIBRARY_PATH
    (pipeline/media/ffmpeg_libs.py), which the dynamic linker reads at process start."""
    if cfg.decode.backend != "torchcodec":
        return None
    from pipeline.media import ffmpeg_libs
    ffmpeg_libs.prepare_children()
    return "spawn"


def produce(cfg: Config, videos: list[dict]):
    """Batches of `features.batch_size` clips from these videos, each video read once: the payload is the
    clips' uint8 frames (B, T, H, W, 3); the meta holds the clip keys, and as each video ends its decode
    rows (clip index with thumbnails, per-video row) and error rows."""
    size = cfg.features.batch_size or CPU_BATCH
    keys, frames = [], []
    meta = _empty_meta()
    for video in videos:
        one = decode.VideoPass(video, cfg)
        for clip in one.clips():
            keys.append({"video_id": video["video_id"], "clip_index": clip.clip_index,
                         "start_s": clip.start_s, "end_s": clip.end_s})
            frames.append(clip.frames)
            if len(frames) == size:
                yield _batch(meta, keys, frames)
                keys, frames, meta = [], [], _empty_meta()
        meta["decode_clips"] += one.clip_rows
        meta["decode_videos"].append(one.video_row)
        meta["errors"] += one.errors
        meta["videos_done"] += 1
    if frames or meta["videos_done"]:
        yield _batch(meta, keys, frames)


def _empty_meta() -> dict:
    return {"clips": [], "items": 0, "errors": [], "videos_done": 0, "decode_clips": [], "decode_videos": []}


def _batch(meta: dict, keys: list[dict], frames: list) -> dict:
    payload = None
    if frames:
        payload = torch.stack(frames) if isinstance(frames[0], torch.Tensor) else torch.from_numpy(np.stack(frames))
    return {"meta": {**meta, "clips": keys, "items": len(keys)}, "payload": payload}


# ------------------------------------------------------------------ the result

def check_values(vectors16: np.ndarray, label: str) -> None:
    """Refuse vectors that are not features: mostly zero or subnormal in float16 (S3D's activations
    vanish: uncalibrated random weights, or a broken checkpoint), or not finite."""
    if not vectors16.size:
        return
    if not np.isfinite(vectors16).all():
        raise VanishingFeatures(f"{label}: {int((~np.isfinite(vectors16)).sum())} feature values are NaN or "
                                f"infinite: the S3D weights or the precision are broken; the part is not written")
    share = float((np.abs(vectors16) < np.finfo(np.float16).tiny).mean())
    if share > MAX_VANISHING_SHARE:
        raise VanishingFeatures(
            f"{label}: {share:.0%} of its float16 feature values are zero or subnormal (|x| < 6.1e-05), so "
            f"the vectors carry no information: S3D's activations vanish (an uncalibrated random network or a "
            f"broken checkpoint in features.weights?); the part is not written")


def feature_table(rows: list[dict], vectors: np.ndarray) -> pa.Table:
    """The part's table, in (video, clip) order; `vectors` are float16 already."""
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["video_id"], rows[i]["clip_index"]))
    rows = [rows[i] for i in order]
    flat = pa.array(vectors[order].reshape(-1), type=pa.float16())
    return pa.table({
        "video_id": pa.array([r["video_id"] for r in rows], pa.string()),
        "clip_index": pa.array([r["clip_index"] for r in rows], pa.int32()),
        "start_s": pa.array([r["start_s"] for r in rows], pa.float64()),
        "end_s": pa.array([r["end_s"] for r in rows], pa.float64()),
        "feature": pa.FixedSizeListArray.from_arrays(flat, schemas.FEATURE_DIM),
    })


def finish(ctx: ShardContext, cfg: Config, metas: list[dict], arrays: list, stats: dict) -> ShardResult:
    """The shard's features and, from the same pass, the decode stage's tables."""
    rows = [key for meta in metas for key in meta["clips"]]
    matrix = split.concatenate(arrays, schemas.FEATURE_DIM).astype(np.float16)
    check_values(matrix, f"features part {ctx.shard_index:05d}")
    provenance = feature_provenance(cfg)
    made = decode.shard_result([row for meta in metas for row in meta["decode_clips"]],
                               [row for meta in metas for row in meta["decode_videos"]],
                               [row for meta in metas for row in meta["errors"]], {"made_by": "features"})
    return ShardResult(
        tables={"": feature_table(rows, matrix)}, errors=made.errors,
        stats={"clips": len(rows), **stats},
        provenance=Provenance(feature_provenance=json.dumps(provenance, sort_keys=True),
                              feature_provenance_hash=provenance_hash(provenance), weights=provenance["weights"]),
        also={"decode": made})


SPLIT = split.Split(settle=settle, streams=streams, produce=produce, encoder=encoder_for, finish=finish,
                    actors=actors, roles=("features_decode", "features_model"),
                    start_method=start_method)


def run_shard(ctx: ShardContext) -> ShardResult:
    return split.run_local(ctx, SPLIT)
