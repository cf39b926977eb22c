"""S3D (torchvision `s3d`), the network the features stage encodes clips with: its weights (Kinetics-400,
a local file, or `random`: seeded, with BatchNorm statistics calibrated on sample clips), what they are
(recorded in every output), and the normalisation and pooling that give one 1024-d vector per clip.

`features.weights: random` is a seeded S3D whose BatchNorm statistics are calibrated on a fixed set of
clips cut from samples/ (a raw random S3D gives activations of about 1e-7, zeros in float16): the same
network in every process and run, and recorded as NOT pretrained in every output."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path

import torch
from torchvision.models.video import S3D_Weights

from pipeline import storage
from pipeline.config import Config
from pipeline.file_cache import FileCache
from pipeline.media.video import ClipReader
from stages.decode import DecodeConfig

# the normalisation the Kinetics weights were trained with, as torchvision's weights carry it
_KINETICS_TRANSFORM = S3D_Weights.KINETICS400_V1.transforms()
KINETICS_MEAN = tuple(_KINETICS_TRANSFORM.mean)
KINETICS_STD = tuple(_KINETICS_TRANSFORM.std)

# random weights: BatchNorm statistics from these clips (index of the clip in each sample video, decoded
# with the default decode settings whatever the run's): 10 whole clips in one batch, train mode, float32
# on the CPU. One batch, not several: each layer's statistics are then those of what the layers before it
# give in eval mode (averaging per-batch statistics made deep activations grow to ~45 on these clips)
SAMPLES = Path(__file__).resolve().parents[3] / "samples"
CALIBRATION_CLIPS = (2, 6)
CALIBRATION_RECIPE = "bn-one-batch-v1"

log = logging.getLogger("pipeline.features")


# ------------------------------------------------------------------ the network


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


# ------------------------------------------------------------------ weights


def calibration_videos() -> list[Path]:
    videos = sorted(SAMPLES.glob("*.mp4"))
    if not videos:
        raise FileNotFoundError(
            f"features.weights=random calibrates S3D on the sample videos in {SAMPLES}, "
            f"which are missing: run from the project's folder (or give real weights)"
        )
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
        return (
            f"random(seed={cfg.seed}, BatchNorm calibrated on sample clips {calibration_digest()}) "
            f"- NOT pretrained, for tests and offline demos only"
        )
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

    hooks = [
        module.register_forward_pre_hook(measure)
        for module in model.modules()
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
    ]
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
