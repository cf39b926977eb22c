"""make bench-curation: what curation costs beside decoding, and how dedup grows with the collection.

1. The visual pass on the same files, side by side (alternating rounds, the best of each; one thread):
   decoding into the clip grid with thumbnails (what the decode stage did before curation), then the same
   with each thing curation adds to the pass: the quality measures, the frame hashes, each shot detector
   (adaptive, content, transnetv2), and all of the default ones together (the decode stage as it is).
   Each addition's cost is printed as a ratio to decoding's. The quality stage itself (flags from the
   measures) is timed on the decode parts of those files.
2. dedup at 1x, 4x and 16x collections of hand-made videos (random frame hashes, a tenth of them copies:
   trimmed, bits flipped): seconds, candidate pairs per video, copies found and false groups, and the
   growth against n (linear) and n log n.

    python benchmarks/bench_curation.py [--rounds 3] [--videos 500] [--skip-transnetv2]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from common import REPO, machine, realdata_video, synthetic_video, write_manifest_rows, write_part
from threadpoolctl import threadpool_limits

import schemas
from pipeline import storage
from pipeline.config import load_config
from pipeline.engine import lineage
from pipeline.engine.workdir import WorkDir
from pipeline.executors.local import LocalExecutor
from pipeline.media.clip_readers import open_clip_reader, to_numpy
from schemas.metadata import Provenance
from stages.decode.run import decode_video, perceptual_hash, thumbnail_jpeg
from stages.dedup import run as dedup
from stages.quality.measure import ClipMeasure
from stages.shots.detect import detector_for

MADE_BY = "benchmarks.bench_curation"
FILES = ("big_buck_bunny_0_30.webm", "tears_of_steel_10s_640x360_noaudio.mp4", "intel_car-detection.mp4")
SAMPLES = ("cooking_pasta.mp4", "recipes/recipe_03.mp4")


def visual_pass(path: Path, cfg, *, measure=False, hashes=False, detector: str | None = None) -> int:
    """One read of `path` into clips with thumbnails, with the additions asked for; returns the frames."""
    d = cfg.decode
    watchers = []
    if measure:
        watchers.append(ClipMeasure())
    if detector:
        shots_cfg = load_config(None, [f"shots.detector={detector}"]).shots
        watchers.append(detector_for(shots_cfg, d.fps))
    frames = 0
    with open_clip_reader(str(path), d) as reader:
        for clip in reader.clips(with_frames=False, watchers=watchers, samples_at=schemas.HASHED_AT if hashes else ()):
            thumbnail_jpeg(to_numpy(clip.frames[0]), d.thumbnail_size, d.thumbnail_quality)
            if measure:
                watchers[0].clip(clip.first_frame, clip.n_real_frames)
            if hashes:
                [perceptual_hash(to_numpy(frame)) for _, frame in clip.samples]
            frames += clip.n_real_frames
    return frames


def pass_costs(files: list[Path], rounds: int, transnetv2: bool) -> None:
    cfg = load_config(None, [])
    variants = {
        "decode (clips + thumbnails)": {},
        "+ quality measures": {"measure": True},
        "+ frame hashes (3 a clip)": {"hashes": True},
        "+ shots, adaptive": {"detector": "adaptive"},
        "+ shots, content": {"detector": "content"},
    }
    if transnetv2:
        variants["+ shots, transnetv2"] = {"detector": "transnetv2"}
    best: dict[str, float] = {}
    frames: dict[str, int] = {}
    rows = {path: {"video_id": path.stem, "uri": str(path)} for path in files}
    import torch

    torch.set_num_threads(1)
    with threadpool_limits(1):
        for _ in range(rounds):
            for name, how in variants.items():
                started = time.process_time()
                frames[name] = sum(visual_pass(path, cfg, **how) for path in files)
                best[name] = min(best.get(name, math.inf), time.process_time() - started)
            started = time.process_time()
            frames["decode stage (all of the default)"] = sum(
                sum(c["n_real_frames"] for c in decode_video(row, cfg)[0]) for row in rows.values()
            )
            name = "decode stage (all of the default)"
            best[name] = min(best.get(name, math.inf), time.process_time() - started)
    base = best["decode (clips + thumbnails)"]
    print(
        f"\nthe visual pass on {len(files)} file(s), {frames['decode (clips + thumbnails)']} frames at 20 fps; "
        f"{rounds} alternating rounds, the best of each, CPU seconds on one thread"
    )
    print(f"  {'':<36} {'CPU s':>7} {'ms/frame':>9} {'added / decode':>15}")
    for name, seconds in best.items():
        added = "" if name.startswith("decode (") else f"{(seconds - base) / base:>14.2f}x"
        print(f"  {name:<36} {seconds:7.2f} {1000 * seconds / frames[name]:9.2f} {added:>15}")
    print("  (decode stage = decode + quality measures + frame hashes + the adaptive shot detector)")


def quality_cost(files: list[Path]) -> None:
    """The quality stage on the decode parts of `files`: its seconds beside the decode stage's."""
    from pipeline import cli

    with tempfile.TemporaryDirectory() as folder:
        videos = Path(folder) / "videos"
        videos.mkdir()
        for path in files:
            (videos / path.name).symlink_to(path)
        work = Path(folder) / "work"
        cli.main(
            ["manifest", "--work-dir", str(work), "--input", str(videos), "--quiet", "--set", "executor.workers=1"]
        )
        started = time.process_time()
        cli.main(["decode", "--work-dir", str(work), "--quiet", "--workers", "1"])
        decoded = time.process_time() - started
        started = time.process_time()
        cli.main(["quality", "--work-dir", str(work), "--quiet", "--workers", "1"])
        judged = time.process_time() - started
    print(
        f"\nquality stage on their decode parts: {judged:.2f} CPU s beside the decode stage's {decoded:.2f} "
        f"(ratio {judged / decoded:.3f}; both through the CLI in this process)"
    )


def hand_made_collection(work: Path, videos: int, seed: int = 0) -> set[frozenset]:
    """`videos` videos of 20 clips (random frame hashes) in shards of 100; every tenth a copy of the video
    before it, 2 s trimmed with a bit flipped in each hash. Returns the planted pairs."""
    rng = np.random.default_rng(seed)
    planted, manifest = set(), []
    previous = None
    for shard in range((videos + 99) // 100):
        clips, quality, per_video = [], [], []
        for index in range(shard * 100, min(videos, (shard + 1) * 100)):
            video_id = f"v{index:06d}"
            if index % 10 == 9 and previous is not None:
                flips = np.array([1 << int(b) for b in rng.integers(0, 64, previous.size)], dtype=np.uint64)
                hashes = (previous ^ flips)[4:]  # 2 s (4 hashed frames) trimmed
                planted.add(frozenset((video_id, f"v{index - 1:06d}")))
            else:
                hashes = rng.integers(0, 2**63, 60, dtype=np.int64).view(np.uint64)
            previous = hashes
            for clip in range(len(hashes) // 3):
                key = {"video_id": video_id, "clip_index": clip, "start_s": 1.5 * clip, "end_s": 1.5 * clip + 1.5}
                measures = {"luma_mean": 120.0, "luma_contrast": 40.0, "motion_mean": 5.0, "motion_max": 9.0}
                phashes = hashes[3 * clip : 3 * clip + 3].view(np.int64).tolist()
                clips.append(
                    {**key, "n_real_frames": 30, "padded": False, "thumbnail_jpeg": b"", **measures, "phashes": phashes}
                )
                quality.append({**key, "flags": [], "excluded": False})
            per_video.append(
                {
                    "video_id": video_id,
                    "uri": f"/v/{video_id}.mp4",
                    "status": "ok",
                    "n_clips": len(hashes) // 3,
                    "width": 640,
                    "height": 360,
                }
            )
            manifest.append(
                {"video_id": video_id, "uri": f"/v/{video_id}.mp4", "bytes": 1, "transcript_uri": None, "shard": shard}
            )
        decode = WorkDir(work)
        for path, rows, schema in (
            (decode.part("decode", shard), clips, schemas.DECODE_CLIPS),
            (decode.part("decode", shard, "videos"), per_video, schemas.DECODE_VIDEOS),
        ):
            storage.write_parquet(
                path, pa.Table.from_pylist(rows, schema=schema.arrow), Provenance(stage="decode", schema=schema.tag)
            )
        lineage.record_external(work, "decode", shard, MADE_BY)
        write_part(
            work,
            "quality",
            shard,
            pa.Table.from_pylist(quality, schema=schemas.QUALITY.arrow),
            schemas.QUALITY,
            MADE_BY,
        )
    write_manifest_rows(work, manifest, MADE_BY)
    return planted


def dedup_growth(base_videos: int) -> None:
    cfg = load_config(None, ["dedup.workers=1"])
    print("\ndedup at 1x, 4x and 16x collections of hand-made videos (20 clips each, a tenth of them copies)")
    print(
        f"  {'size':>5} {'videos':>7} {'seconds':>8} {'s/video (ms)':>13} {'pairs/video':>12} {'copies found':>13} "
        f"{'false groups':>13}"
    )
    measured = []
    for factor in (1, 4, 16):
        with tempfile.TemporaryDirectory() as folder:
            work = Path(folder)
            planted = hand_made_collection(work, base_videos * factor, seed=factor)
            started = time.process_time()
            stats = dedup.run(cfg, work, LocalExecutor(cfg, workers=1), quiet=True)
            seconds = time.process_time() - started
            rows = storage.read_table(WorkDir(work).dedup_groups).to_pylist()
        by_group: dict[int, set] = {}
        for row in rows:
            by_group.setdefault(row["group_id"], set()).add(row["video_id"])
        found = sum(any(pair <= members for members in by_group.values()) for pair in planted)
        false_groups = sum(not any(frozenset(p) <= members for p in planted) for members in by_group.values())
        videos = base_videos * factor
        measured.append((factor, videos, seconds))
        print(
            f"  {factor:>4}x {videos:>7} {seconds:8.2f} {1000 * seconds / videos:13.2f} "
            f"{stats['candidate_pairs'] / videos:12.2f} {found:>6}/{len(planted):<6} {false_groups:>13}"
        )
    (_, n1, t1), (_, n16, t16) = measured[0], measured[-1]
    print(
        f"  16x / 1x: {t16 / t1:.1f}x the time for 16x the videos; linear would be 16x, "
        f"n log n {16 * math.log(n16) / math.log(n1):.1f}x, n^2 256x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--videos", type=int, default=500, help="the 1x collection of the dedup growth")
    parser.add_argument("--skip-transnetv2", action="store_true")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    files = [path for path in (realdata_video(name) for name in FILES) if path is not None]
    files += [REPO / "samples" / name for name in SAMPLES]
    if not files:
        files = [synthetic_video(Path(tempfile.mkdtemp()) / "synthetic_720p.mp4")]
    print("files: " + ", ".join(path.name for path in files))
    pass_costs(files, args.rounds, not args.skip_transnetv2)
    quality_cost(files)
    dedup_growth(args.videos)


if __name__ == "__main__":
    main()
