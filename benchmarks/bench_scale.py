"""make bench-scale: the pipeline on the sample (samples/) as Ray tasks with 1 and with 2 Ray workers,
stage by stage, side by side in one run: the speed-up, and the one-worker rates per stage that
docs/scaling.md scales up to the paper's 23,186 hours.

One local Ray instance with 2 CPUs runs both: "1 worker" tasks ask for 2 CPUs (so one runs at a time),
"2 workers" tasks for 1. Each task runs on one thread (features.num_threads=1 with no decode process
beside it, asr.num_threads=1), so the speed-up measures how the executor spreads shards, not threads. The
two runs alternate stage by stage, so both see the same background load; the machine's parallel capacity
(two CPU-bound tasks at once against one after the other) is measured at the start and the end, because
on a shared machine that, not the executor, bounds the speed-up. The two runs' files must be identical."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from functools import partial
from pathlib import Path

import ray
from common import REPO, machine

from pipeline.config import load_config
from pipeline.engine.lineage import Lineage
from pipeline.engine.manifest import read_manifest, write_manifest
from pipeline.executors.ray import RayExecutor
from stages.kmeans import run as kmeans

STAGES = ("decode", "features", "kmeans", "quantize", "asr", "align")
ROLES = ("decode", "features", "quantize", "asr", "align", "kmeans")


def cpus_per_task(cpus: int) -> str:
    return "executor.ray_resources={" + ", ".join(f"{role}: {{num_cpus: {cpus}}}" for role in ROLES) + "}"


def _warm_up(cfg, _: int) -> int:
    """What a worker process does once in its life (imports, the Whisper model and the tokenizer, both
    cached per process), done before the clock starts: the benchmark measures the per-shard work."""
    import stages.features.run  # noqa: F401
    import stages.quantize.run  # noqa: F401
    from stages.align import run as align
    from stages.asr import run as asr

    asr.load_backend(cfg.asr)
    align.load_tokenizer(cfg.align.tokenizer)
    time.sleep(1.0)  # long enough that each worker takes one of the warm-up tasks
    return os.getpid()


def _spin(_: int) -> float:
    """A fixed amount of CPU-bound work (about a second on one free core)."""
    started = time.perf_counter()
    total = 0
    for value in range(12_000_000):
        total += value * value
    return time.perf_counter() - started


def parallel_capacity(serial: RayExecutor, parallel: RayExecutor) -> float:
    """How much faster two CPU-bound tasks finish side by side than one after the other (2.0 on an idle
    2-core machine)."""
    started = time.perf_counter()
    serial.map(_spin, range(2))
    one_at_a_time = time.perf_counter() - started
    started = time.perf_counter()
    parallel.map(_spin, range(2))
    return one_at_a_time / (time.perf_counter() - started)


def run_stage(executor: RayExecutor, cfg, work: Path, stage: str) -> dict:
    started = time.perf_counter()
    if stage == "kmeans":
        kmeans.run(cfg, work, executor, quiet=True)
        results = []
    else:
        results = executor.run_shards(work, stage, Lineage(work).manifest_shards(), quiet=True)
        failed = [r for r in results if r.get("failed")]
        if failed:
            raise SystemExit(f"{stage} part {failed[0]['shard']} failed: {failed[0]['error']}")
    return {
        "seconds": time.perf_counter() - started,
        "clips": sum(r.get("clips", 0) for r in results),
        "audio_s": sum(r.get("audio_s", 0.0) for r in results),
    }


def _data_files(work: Path) -> dict[str, bytes]:
    return {str(p.relative_to(work)): p.read_bytes() for p in sorted(work.rglob("*.parquet"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=str(REPO / "configs" / "demo.yaml"))
    parser.add_argument("--input", default=str(REPO / "samples"))
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, in order (from {STAGES})")
    args = parser.parse_args()
    stages = args.stages.split(",")
    overrides = [
        "shards.videos_per_shard=1",
        "features.num_threads=1",
        "features.decode_workers=0",
        "asr.num_threads=1",
    ]
    configs = {workers: load_config(args.config, overrides + [cpus_per_task(3 - workers)]) for workers in (1, 2)}
    root = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        executors = {workers: RayExecutor(cfg) for workers, cfg in configs.items()}
        executors[2].map(partial(_warm_up, configs[2]), range(2))
        capacity_before = parallel_capacity(executors[1], executors[2])
        timings: dict[int, dict[str, dict]] = {1: {}, 2: {}}
        for workers in (1, 2):
            write_manifest(configs[workers], Path(args.input), root / f"workers-{workers}")
        for position, stage in enumerate(stages):
            for workers in (1, 2) if position % 2 == 0 else (2, 1):  # alternate: drifting load cancels
                timings[workers][stage] = run_stage(
                    executors[workers], configs[workers], root / f"workers-{workers}", stage
                )
        capacity_after = parallel_capacity(executors[1], executors[2])
    finally:
        ray.shutdown()
    identical = _data_files(root / "workers-1") == _data_files(root / "workers-2")
    videos = read_manifest(root / "workers-1").num_rows

    print(f"machine: {machine()}")
    print(
        f"load average (1 min) at the end: {os.getloadavg()[0]:.1f}; parallel capacity now (2 CPU-bound "
        f"tasks side by side vs one after the other): {capacity_before:.2f}x at the start, "
        f"{capacity_after:.2f}x at the end (2.00x on an idle 2-core machine)"
    )
    print(f"input: {videos} videos from {args.input}, one per shard; config {args.config}")
    print(f"{'stage':<9} {'1 worker s':>11} {'2 workers s':>12} {'speed-up':>9}   rate with 1 worker")
    for stage in stages:
        one, two = timings[1][stage], timings[2][stage]
        rate = ""
        if stage == "asr" and one["audio_s"]:
            rate = f"{one['audio_s'] / one['seconds']:.2f} audio-s/s ({one['audio_s']:.0f} s of audio)"
        elif one["clips"]:
            rate = f"{one['clips'] / one['seconds']:.2f} clips/s ({one['clips']} clips)"
        speed_up = one["seconds"] / two["seconds"]
        print(f"{stage:<9} {one['seconds']:>11.1f} {two['seconds']:>12.1f} {speed_up:>8.2f}x   {rate}")
    total_one = sum(timings[1][s]["seconds"] for s in stages)
    total_two = sum(timings[2][s]["seconds"] for s in stages)
    print(f"{'total':<9} {total_one:>11.1f} {total_two:>12.1f} {total_one / total_two:>8.2f}x")
    print(f"outputs byte-identical between the two runs: {'yes' if identical else 'NO'}")
    shutil.rmtree(root)


if __name__ == "__main__":
    main()
