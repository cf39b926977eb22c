"""Shared by the benchmarks: the machine they ran on, and a test video when the real media is absent."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def machine() -> str:
    import torch
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{platform.node()}: {os.cpu_count()} CPUs ({cpu}), {gpu}, Python {platform.python_version()}, "
            f"torch {torch.__version__}")


def realdata_video(name: str) -> Path | None:
    folder = Path(os.environ.get("VIDEOBERT_REALDATA", REPO.parent / "shared" / "realdata"))
    path = folder / name
    return path if path.exists() else None


def synthetic_video(path: Path, duration_s: float = 20.0, width: int = 1280, height: int = 720,
                    fps: int = 30) -> Path:
    """A moving pattern at 30 fps in H.264 (not flat colour, so the codec has real work)."""
    import av
    import numpy as np

    y, x = np.mgrid[0:height, 0:width]
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "23"}
        for index in range(int(round(duration_s * fps))):
            image = np.stack([(x + 4 * index) % 256, (y + 2 * index) % 256, (x ^ y) % 256], -1).astype(np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode())
    return path
