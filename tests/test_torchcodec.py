"""decode.backend: torchcodec (the way to decode on a GPU): on the samples its clips are PyAV's (equal counts
and times) and its frames agree within a pixel mean absolute difference of MAX_MAE (of 255). torchcodec
loads FFmpeg's libraries by their standard names: the checks run in processes started with PyAV's FFmpeg on
LD_LIBRARY_PATH (pipeline/media/ffmpeg_libs.py), as the features stage starts its decode workers."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from media_factory import make_video

from pipeline.config import load_config
from pipeline.engine.manifest import write_manifest
from pipeline.engine.runner import run_one_shard
from pipeline.engine.workdir import WorkDir
from pipeline.media import ffmpeg_libs

pytestmark = pytest.mark.slow

pytest.importorskip("torchcodec")

REPO = Path(__file__).resolve().parent.parent
SAMPLES = sorted((REPO / "samples").glob("*.mp4"))
MAX_MAE = 2.5  # measured 1.3 to 1.8 on the samples (0.98 to 1.2 on real 360p to 720p footage)

COMPARE = """
import json, sys
import numpy as np
from pipeline.config import load_config
from pipeline.media.clip_readers import open_clip_reader, to_numpy
from pipeline.media.video import ClipReader
device = sys.argv[1]
torchcodec = load_config(None, ["decode.backend=torchcodec", f"decode.device={device}"]).decode
pyav = load_config(None).decode
out = {}
for path in sys.argv[2:]:
    with open_clip_reader(path, torchcodec) as reader:
        kind = type(reader).__name__
        a = [(c.start_s, c.end_s, c.n_real_frames, c.padded, to_numpy(c.frames)) for c in reader.clips()]
    with open_clip_reader(path, torchcodec) as reader:   # the decode stage's pass: middle frames only
        middles = [to_numpy(c.frames) for c in reader.clips(with_frames=False)]
    with ClipReader(path, pyav) as reader:
        b = [(c.start_s, c.end_s, c.n_real_frames, c.padded, c.frames) for c in reader.clips()]
    out[path] = {"reader": kind, "clips": [len(a), len(b)], "keys_equal": [x[:4] for x in a] == [y[:4] for y in b],
                 "middles_equal": len(middles) == len(a) and all(
                     m.shape[0] == 1 and np.array_equal(m[0], x[4][(x[2] - 1) // 2]) for m, x in zip(middles, a)),
                 "mae": float(np.mean([np.abs(x[4].astype(int) - y[4].astype(int)).mean() for x, y in zip(a, b)]))}
print(json.dumps(out))
"""


def _compare(device: str, paths: list[Path]) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", COMPARE, device, *map(str, paths)],
        cwd=REPO,
        env=ffmpeg_libs.environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_torchcodec_on_the_cpu_gives_pyavs_clips_on_the_samples():
    found = _compare("cpu", SAMPLES)
    assert len(found) == len(SAMPLES) == 5
    for path, one in found.items():
        assert one["reader"] == "TorchcodecClipReader", path  # torchcodec decoded it, no fallback
        assert one["clips"][0] == one["clips"][1] > 10 and one["keys_equal"], (path, one)
        assert one["mae"] <= MAX_MAE, (path, one)
        assert one["middles_equal"], path  # a pass without frames keeps each clip's middle frame, as is


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (NVDEC)")
def test_torchcodec_on_the_gpu_gives_pyavs_clips_on_the_samples():
    for path, one in _compare("cuda", SAMPLES).items():
        assert one["clips"][0] == one["clips"][1] and one["keys_equal"], (path, one)
        assert one["mae"] <= MAX_MAE, (path, one)
        assert one["middles_equal"], path  # a pass without frames keeps each clip's middle frame, as is


def test_a_process_without_ffmpeg_libraries_is_told_how_to_start(tmp_path):
    if ffmpeg_libs.torchcodec_error() is None:
        pytest.skip("torchcodec loads in this process (FFmpeg's libraries are installed or on LD_LIBRARY_PATH)")
    from pipeline.media.clip_readers import open_clip_reader
    from pipeline.media.torchcodec_reader import TorchcodecUnavailable

    with pytest.raises(TorchcodecUnavailable, match="LD_LIBRARY_PATH"):
        open_clip_reader(str(SAMPLES[0]), load_config(None, ["decode.backend=torchcodec"]).decode)


def test_the_features_stage_decodes_with_torchcodec_in_its_worker_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "")  # prepare_children sets it for the workers; restored after
    videos = tmp_path / "videos"
    videos.mkdir()
    make_video(videos / "a.mp4", duration_s=0.8, fps=25, width=160, height=120)
    settings = [
        "features.weights=random",
        "decode.clip_frames=14",
        "decode.min_clip_frames=7",
        "features.decode_workers=1",
    ]
    reference, work = tmp_path / "pyav", tmp_path / "torchcodec"
    for folder, backend in ((reference, "pyav"), (work, "torchcodec")):
        cfg = load_config(None, settings + [f"decode.backend={backend}"])
        write_manifest(cfg, videos, folder)
        assert not run_one_shard(cfg, folder, "features", 0).get("failed")
    # what comes from the pixels (the thumbnail, the measures, the hashes) differs by torchcodec's scaling
    pixels = ["thumbnail_jpeg", "luma_mean", "luma_contrast", "motion_mean", "motion_max", "phashes"]
    ours, theirs = (pq.read_table(WorkDir(folder).part("decode", 0)) for folder in (work, reference))
    assert ours.drop(pixels).equals(theirs.drop(pixels)) and ours.num_rows == 1
    assert abs(ours["luma_mean"][0].as_py() - theirs["luma_mean"][0].as_py()) < 2
    assert "torchcodec" in WorkDir(work).record("features", 0).read_text()  # in its lineage (config)
