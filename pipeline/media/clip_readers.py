"""The clip reader of `decode.backend`, above both readers: PyAV's (pipeline/media/video.py) and
torchcodec's (pipeline/media/torchcodec_reader.py), which opens each container with PyAV's first."""

from __future__ import annotations

import numpy as np

from pipeline.media.video import ClipReader
from stages.decode import DecodeConfig


def open_clip_reader(uri: str, cfg: DecodeConfig):
    """PyAV's ClipReader, or torchcodec's, which falls back to PyAV for a video it cannot decode. Both raise
    VideoDecodeError for an input that cannot be opened at all and give the same clips (frames within a
    small pixel difference)."""
    if cfg.backend == "torchcodec":
        # imported here: it loads torch, which the PyAV path does without
        from pipeline.media.torchcodec_reader import open_torchcodec_reader

        return open_torchcodec_reader(uri, cfg)
    return ClipReader(uri, cfg)


def to_numpy(frame) -> np.ndarray:
    """A frame as a NumPy array on the CPU (the torchcodec reader's frames are tensors, maybe on a GPU)."""
    return frame if isinstance(frame, np.ndarray) else frame.cpu().numpy()
