"""Shared by the benchmarks: the machine they ran on, a test video when the real media is absent, and
hand-made work dirs of random features."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import schemas  # noqa: E402
from pipeline import storage  # noqa: E402
from pipeline.engine import lineage  # noqa: E402
from pipeline.engine.manifest import write_manifest_table  # noqa: E402
from pipeline.engine.workdir import WorkDir  # noqa: E402
from schemas.metadata import Provenance  # noqa: E402


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
    return (
        f"{platform.node()}: {os.cpu_count()} CPUs ({cpu}), {gpu}, Python {platform.python_version()}, "
        f"torch {torch.__version__}"
    )


def realdata_video(name: str) -> Path | None:
    folder = Path(os.environ.get("VIDEOBERT_REALDATA", REPO.parent / "shared" / "realdata"))
    path = folder / name
    return path if path.exists() else None


def synthetic_video(path: Path, duration_s: float = 20.0, width: int = 1280, height: int = 720, fps: int = 30) -> Path:
    """A moving pattern at 30 fps in H.264 (not flat colour, so the codec has real work)."""
    import av

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


def clip_video(path: Path, duration_s: float = 1.0, fps: int = 25, seed: int = 0, size: int = 64) -> Path:
    """A small H.264 video of moving noise, its own for each `seed` (videos of two seeds are no copies)."""
    import av

    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (size * 2, size * 2, 3), dtype=np.uint8)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "30"}
        for index in range(int(round(duration_s * fps))):
            shift = index % size
            image = np.ascontiguousarray(base[shift : shift + size, shift : shift + size])
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode())
    return path


# ------------------------------------------------------------- hand-made work dirs (random features, 600 clips a video)

CLIPS_PER_VIDEO = 600


def clip_keys(shard: int, clips: int) -> dict:
    """The key columns of `clips` clips of shard `shard`: videos s<shard>v0000... of CLIPS_PER_VIDEO clips."""
    clip_index = np.arange(clips) % CLIPS_PER_VIDEO
    return {
        "video_id": [f"s{shard}v{i // CLIPS_PER_VIDEO:04d}" for i in range(clips)],
        "clip_index": pa.array(clip_index, pa.int32()),
        "start_s": clip_index * 1.5,
        "end_s": clip_index * 1.5 + 1.5,
    }


def features_table(keys: dict, vectors):
    """A features part's table: `keys` and one float16 1024-d vector per clip."""
    flat = pa.array(vectors.astype(np.float16).reshape(-1), type=pa.float16())
    return pa.table(dict(keys, feature=pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1])))


def write_part(work: Path, stage: str, shard: int, table, schema, made_by: str, **provenance) -> None:
    """A hand-made part of `stage` with its completion record (it names no inputs: made by `made_by`)."""
    storage.write_parquet(
        WorkDir(work).part(stage, shard),
        schemas.conform(table, schema),
        Provenance(stage=stage, schema=schema.tag, **provenance),
    )
    lineage.record_external(work, stage, shard, made_by)


def manifest_rows(shards: int, clips_per_shard: int) -> list[dict]:
    """The manifest of the videos clip_keys names."""
    videos = (clips_per_shard + CLIPS_PER_VIDEO - 1) // CLIPS_PER_VIDEO
    return [
        {
            "video_id": f"s{shard}v{video:04d}",
            "uri": f"/videos/s{shard}v{video:04d}.mp4",
            "bytes": 1,
            "transcript_uri": None,
            "shard": shard,
        }
        for shard in range(shards)
        for video in range(videos)
    ]


def write_manifest_rows(work: Path, rows: list[dict], made_by: str) -> None:

    write_manifest_table(
        work,
        pa.Table.from_pylist(rows, schema=schemas.MANIFEST.arrow),
        lineage.external_lineage(made_by),
        Provenance(schema=schemas.MANIFEST.tag),
    )
