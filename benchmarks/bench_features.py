"""make bench-features: the visual path, measured side by side in one run.

1. Decode cost at 720p, before and after the single pass, in CPU seconds per clip (this process's user +
   system time, FFmpeg's threads included) and bytes read per byte of the video (/proc/self/io), best of
   alternating rounds: *before*, the decode stage (clip index + thumbnails) and then the features stage
   decoding the same video again; *after*, the one pass the features stage makes now (clips with their
   frames, the clip index, thumbnails and the per-video row).
2. Throughput: S3D alone on pre-decoded uint8 tensors against the whole features stage (decode workers
   or GPU decoding feeding it), same batch size and precision. Goal: stage >= 0.8x model-only.
3. `--compare-precision`: S3D alone on the CPU in float32 against bf16 autocast, alternating, on small clips
   (16 frames: the ratio, not the rate, is the figure), and what `features.precision: auto`
   picks on this CPU (bf16 only where oneDNN computes it natively: AVX-512 BF16 or AMX).

On a GPU (`--device cuda`) add `--decode-backend torchcodec --decode-device cuda` for GPU decoding."""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path

import torch
from common import machine, realdata_video, synthetic_video

from pipeline import devices
from pipeline.config import load_config
from pipeline.engine.manifest import write_manifest
from pipeline.engine.runner import run_one_shard
from pipeline.media.clip_readers import open_clip_reader
from stages.decode import run as decode
from stages.features import run as features
from stages.features.s3d.encoder import S3DEncoder, autocast_dtype, encoder_for


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bytes_read() -> int:
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def before(row: dict, cfg) -> int:
    """The old visual path: the decode stage, then the features stage's own decode of the same video."""
    clips, _, _ = decode.decode_video(row, cfg)
    with open_clip_reader(row["uri"], cfg.decode) as reader:
        for _ in reader.clips():  # each clip's frames, as the model gets them
            pass
    return len(clips)


def after(row: dict, cfg) -> int:
    """The single pass: clips with their frames, and the decode stage's rows from the same read."""
    one = decode.VideoPass(row, cfg)
    return sum(1 for _ in one.clips())


def decode_cost(video: Path, cfg, rounds: int) -> dict:
    row = {"video_id": "bench", "uri": str(video), "bytes": video.stat().st_size}
    best = {}
    for _ in range(rounds):
        for name, run in (("before", before), ("after", after)):
            cpu, read = cpu_seconds(), bytes_read()
            clips = run(row, cfg)
            cost, ratio = (cpu_seconds() - cpu) / clips, (bytes_read() - read) / row["bytes"]
            # each the least of the rounds (rchar also counts a module a first round imports)
            previous = best.get(name, {"cpu_s_per_clip": cost, "read_ratio": ratio})
            best[name] = {
                "cpu_s_per_clip": min(cost, previous["cpu_s_per_clip"]),
                "read_ratio": min(ratio, previous["read_ratio"]),
                "clips": clips,
            }
    return best


def model_rate(encoder, cfg, batch_size: int, batches: int) -> float:
    batch = torch.randint(
        0, 256, (batch_size, cfg.decode.clip_frames, cfg.decode.crop, cfg.decode.crop, 3), dtype=torch.uint8
    )
    if encoder.device.type == "cuda":
        batch = batch.pin_memory()
    encoder.submit(batch).result()  # warm-up (kernels, cudnn's choice, allocator)
    started = time.perf_counter()
    handles = [encoder.submit(batch) for _ in range(batches)]
    for handle in handles:
        handle.result()
    return batches * batch_size / (time.perf_counter() - started)


def precision_rates(rounds: int) -> dict:
    """Clips/s of S3D alone on the CPU per precision, the best of `rounds` alternating rounds."""
    configs = {
        name: load_config(None, ["features.weights=random", "decode.clip_frames=16", f"features.precision={name}"])
        for name in ("float32", "bfloat16", "auto")
    }
    encoders = {name: S3DEncoder(configs[name], torch.device("cpu")) for name in ("float32", "bfloat16")}
    best = {name: 0.0 for name in encoders}
    for _ in range(rounds):
        for name, encoder in encoders.items():
            best[name] = max(best[name], model_rate(encoder, configs[name], 1, 1))
    auto = autocast_dtype(configs["auto"], torch.device("cpu"))
    return {**best, "auto": str(auto or "float32"), "native_bf16": devices.cpu_computes_bf16()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=0, help="0: the stage's automatic size")
    parser.add_argument("--decode-workers", type=int, default=None, help="default: the stage's automatic count")
    parser.add_argument("--decode-backend", default="pyav", choices=("pyav", "torchcodec"))
    parser.add_argument("--decode-device", default="cpu")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--copies", type=int, default=4, help="copies of the throughput video (more clips)")
    parser.add_argument("--model-batches", type=int, default=4)
    parser.add_argument(
        "--video",
        type=Path,
        help="720p video for the decode cost (default: realdata big_buck_bunny_0_30.webm, else a synthetic 720p)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the decode cost")
    parser.add_argument("--skip-decode-cost", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--compare-precision", action="store_true", help="S3D on the CPU, float32 against bf16")
    args = parser.parse_args()
    overrides = [
        "features.weights=random",
        f"features.device={args.device}",
        f"features.batch_size={args.batch_size}",
        f"features.precision={args.precision}",
        f"decode.backend={args.decode_backend}",
        f"decode.device={args.decode_device}",
        f"shards.videos_per_shard={10**6}",
    ]
    if args.decode_workers is not None:
        overrides.append(f"features.decode_workers={args.decode_workers}")
    cfg = load_config(None, overrides)
    work = Path(tempfile.mkdtemp())
    print(f"machine: {machine()}")

    if not args.skip_decode_cost:
        video = (
            args.video
            or realdata_video("big_buck_bunny_0_30.webm")
            or synthetic_video(work / "synthetic_720p.mp4", 20, 1280, 720)
        )
        pyav = load_config(None)
        cost = decode_cost(video, pyav, args.rounds)
        b, a = cost["before"], cost["after"]
        print(
            f"visual path decode cost at 720p ({video.name}, {a['clips']} clips; PyAV, this process; best of "
            f"{args.rounds} alternating rounds):"
        )
        print(
            f"  before: decode stage + features decoding again: {b['cpu_s_per_clip']:.4f} CPU s/clip, "
            f"read {b['read_ratio']:.2f}x the file"
        )
        print(
            f"  after:  one pass (frames, clip index, thumbnails): {a['cpu_s_per_clip']:.4f} CPU s/clip, "
            f"read {a['read_ratio']:.2f}x the file"
        )
        print(
            f"ratio after / before: {a['cpu_s_per_clip'] / b['cpu_s_per_clip']:.2f} of the CPU time, "
            f"{a['read_ratio'] / max(b['read_ratio'], 1e-9):.2f} of the bytes read"
        )

    if not args.skip_throughput:
        source = realdata_video("tears_of_steel_10s_640x360_noaudio.mp4") or synthetic_video(
            work / "s.mp4", 10, 640, 360
        )
        videos = work / "videos"
        videos.mkdir()
        for copy in range(args.copies):
            shutil.copy(source, videos / f"copy{copy}{source.suffix}")
        write_manifest(cfg, videos, work / "run")
        started = time.perf_counter()
        encoder = encoder_for(cfg)  # the stage below reuses it: loaded once per process
        load_s = time.perf_counter() - started
        settled = features.SPLIT.settle(cfg, encoder.device)
        model = model_rate(encoder, cfg, settled.features.batch_size, args.model_batches)
        started = time.perf_counter()
        stats = run_one_shard(cfg, work / "run", "features", 0, force=True, quiet=True)
        stage_s = time.perf_counter() - started
        steady_rate = stats["clips"] / stage_s
        decoding = (
            f"GPU decoding ({args.decode_backend} on {args.decode_device})"
            if features.gpu_decoding(cfg)
            else f"{settled.features.decode_workers or 'no'} decode worker process(es) ({args.decode_backend})"
        )
        print(
            f"device {encoder.device}, precision {encoder.dtype or 'float32'}, batch "
            f"{settled.features.batch_size}, {decoding}, {stats['clips']} clips from {args.copies} x {source.name}"
        )
        print(f"  model only, pre-decoded uint8 tensors: {model:8.2f} clips/s")
        print(
            f"  features stage (decode + model):       {steady_rate:8.2f} clips/s (model load {load_s:.1f} s, "
            f"once per process, not counted)"
        )
        print(f"ratio stage / model-only: {steady_rate / model:.2f}  (goal >= 0.8)")

    if args.compare_precision:
        rates = precision_rates(args.rounds)
        print(
            f"S3D alone on the CPU, 16-frame clips, batch 1, best of {args.rounds} alternating rounds "
            f"(bf16 computed natively here: {rates['native_bf16']}; precision auto picks {rates['auto']}):"
        )
        print(f"  float32: {rates['float32']:8.3f} clips/s")
        print(f"  bf16:    {rates['bfloat16']:8.3f} clips/s")
        ratio = rates["bfloat16"] / rates["float32"]
        faster = "bf16" if ratio > 1 else "float32"
        print(f"ratio bf16 / float32: {ratio:.3f} ({max(ratio, 1 / ratio):.1f}x {faster} faster)")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
