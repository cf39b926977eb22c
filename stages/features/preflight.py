"""The features stage's preflight: the S3D weights are cached, a local file that loads, or downloadable from
here (random ones: their calibration videos are there). Apart from the record (__init__.py) because it loads
S3D."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import probing
from pipeline.contract import PreflightError

if TYPE_CHECKING:
    from pipeline.config import Config


def check_features(cfg: Config, work_dir=None) -> None:
    weights = cfg.features.weights
    if weights == "random":
        from stages.features.s3d.model import calibration_videos

        try:
            calibration_videos()
        except FileNotFoundError as error:
            raise PreflightError(str(error)) from None
        return
    if weights == "kinetics400":
        import torch
        from torchvision.models.video import S3D_Weights

        url = S3D_Weights.KINETICS400_V1.url
        cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(url).name
        if cached.is_file():
            return
        why = probing.unreachable(url)
        if why:
            raise PreflightError(
                f"features.weights: kinetics400 is downloaded from {url}, which cannot be reached from here ({why}), "
                f"and is not in the cache ({cached}): copy the file there, give a local weights file "
                f"(--set features.weights=/path/to/s3d.pth), or --set features.weights=random (features NOT "
                f"pretrained, recorded as such)"
            )
        return
    path = Path(weights)  # as the features stage opens it
    if not path.is_file():
        raise PreflightError(
            f"features.weights: {weights} not found: give an S3D state dict file, kinetics400 (downloaded) or random"
        )
    from stages.features.s3d.model import load_s3d

    try:
        load_s3d(cfg)
    except Exception as error:  # noqa: BLE001 - any failure to load is the one line
        first = " ".join(str(error).split())[:300]
        raise PreflightError(
            f"features.weights: {weights} does not load as torchvision's S3D state dict "
            f"({type(error).__name__}: {first}): give an S3D state dict file, kinetics400 or "
            f"random"
        ) from None
