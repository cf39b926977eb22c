"""make bench-features: the features stage's clips/s (decode workers feeding S3D) over the model alone
on pre-decoded tensors, same batch size and precision, side by side in one run. Goal on CPU: >= 0.8."""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from common import machine, realdata_video, synthetic_video

import torch

from pipeline.config import load_config
from pipeline.manifest import write_manifest
from pipeline.runner import run_one_shard
from stages import features


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--decode-workers", type=int, default=1)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--copies", type=int, default=4, help="copies of the input video (more clips)")
    parser.add_argument("--model-batches", type=int, default=4)
    args = parser.parse_args()
    overrides = ["features.weights=random", f"features.device={args.device}",
                 f"features.batch_size={args.batch_size}", f"features.decode_workers={args.decode_workers}",
                 f"features.precision={args.precision}", f"shards.videos_per_shard={10 ** 6}"]
    cfg = load_config(None, overrides)
    work = Path(tempfile.mkdtemp())
    source = realdata_video("tears_of_steel_10s_640x360_noaudio.mp4") or synthetic_video(work / "s.mp4", 10, 640, 360)
    videos = work / "videos"
    videos.mkdir()
    for copy in range(args.copies):
        shutil.copy(source, videos / f"copy{copy}{source.suffix}")
    write_manifest(cfg, videos, work / "run")

    started = time.perf_counter()
    encoder = features.encoder_for(cfg)      # the stage below reuses it: loaded once per process
    load_s = time.perf_counter() - started
    batch = torch.randint(0, 256, (args.batch_size, cfg.decode.clip_frames, cfg.decode.crop, cfg.decode.crop, 3),
                          dtype=torch.uint8)
    encoder(batch)   # warm-up (kernels, allocator)
    if encoder.device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(args.model_batches):
        encoder(batch)
    if encoder.device.type == "cuda":
        torch.cuda.synchronize()
    model_rate = args.model_batches * args.batch_size / (time.perf_counter() - started)

    started = time.perf_counter()
    stats = run_one_shard(cfg, work / "run", "features", 0, force=True, quiet=True)
    stage_s = time.perf_counter() - started
    steady_rate = stats["clips"] / stage_s
    stage_rate = stats["clips"] / (stage_s + load_s)

    print(f"machine: {machine()}")
    print(f"device {encoder.device}, precision {encoder.dtype or 'float32'}, batch {args.batch_size}, "
          f"decode workers {args.decode_workers}, {stats['clips']} clips from {args.copies} x {source.name}")
    print(f"  model only, pre-decoded tensors: {model_rate:8.2f} clips/s")
    print(f"  features stage (decode + model): {stage_rate:8.2f} clips/s with the model load "
          f"({load_s:.1f} s, once per process), {steady_rate:.2f} clips/s without")
    print(f"ratio stage / model-only: {steady_rate / model_rate:.2f} without the model load, "
          f"{stage_rate / model_rate:.2f} with it  (goal on CPU >= 0.8)")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
