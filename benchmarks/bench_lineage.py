"""What lineage and integrity cost, measured side by side in one run on quantize (the cheapest stage per byte,
so the worst case for the overhead): making a shard, skipping it when it is current (its record against its
inputs, its files' sha256), verifying its input before use, and `validate` over the whole chain.

    python benchmarks/bench_lineage.py [--shards 4] [--clips-per-shard 20000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import schemas  # noqa: E402
from pipeline import lineage, runner, storage  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.executors import LocalExecutor  # noqa: E402
from pipeline.lineage import Lineage  # noqa: E402
from pipeline.manifest import write_manifest_table  # noqa: E402
from pipeline.workdir import WorkDir  # noqa: E402
from reports.validate import validate_work_dir  # noqa: E402
from schemas.metadata import Provenance  # noqa: E402
from stages import kmeans  # noqa: E402

MADE_BY = "benchmarks.bench_lineage"
SETTINGS = ["kmeans.depth=2", "kmeans.k=8", "kmeans.niter=5", "kmeans.max_fit_vectors=20000", "executor.workers=1",
            "kmeans.workers=1"]


def make_work_dir(work: Path, shards: int, clips: int) -> None:
    """Features parts of random vectors (600 clips per video) with their records and a manifest."""
    rng = np.random.default_rng(0)
    rows = []
    for shard in range(shards):
        vectors = rng.normal(0, 1, (clips, schemas.FEATURE_DIM)).astype(np.float16)
        clip_index = np.arange(clips) % 600
        videos = [f"s{shard}v{i // 600:04d}" for i in range(clips)]
        table = pa.table({"video_id": videos, "clip_index": pa.array(clip_index, pa.int32()),
                          "start_s": clip_index * 1.5, "end_s": clip_index * 1.5 + 1.5,
                          "feature": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)),
                                                                        schemas.FEATURE_DIM)})
        storage.write_parquet(WorkDir(work).part("features", shard), schemas.conform(table, schemas.FEATURES),
                              Provenance(stage="features", schema=schemas.FEATURES.tag,
                                         feature_provenance_hash="bench", feature_provenance="{}"))
        lineage.record_external(work, "features", shard, MADE_BY)
        rows += [{"video_id": video, "uri": f"/videos/{video}.mp4", "bytes": 1, "transcript_uri": None,
                  "shard": shard} for video in sorted(set(videos))]
    write_manifest_table(work, pa.Table.from_pylist(rows, schema=schemas.MANIFEST.arrow),
                         lineage.external_lineage(MADE_BY), Provenance(schema=schemas.MANIFEST.tag))


def per_shard(fn, shards: int) -> float:
    started = time.perf_counter()
    for shard in range(shards):
        fn(shard)
    return (time.perf_counter() - started) / shards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--clips-per-shard", type=int, default=20_000)
    args = parser.parse_args()
    print(machine())
    cfg = load_config(None, SETTINGS)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        make_work_dir(work, args.shards, args.clips_per_shard)
        kmeans.run(cfg, work, LocalExecutor(cfg, workers=1), quiet=True)
        part_bytes = storage.location(WorkDir(work).part("features", 0)).stat().st_size
        make = per_shard(lambda s: runner.run_one_shard(cfg, work, "quantize", s, force=True, quiet=True), args.shards)
        skip = per_shard(lambda s: runner.run_one_shard(cfg, work, "quantize", s, quiet=True), args.shards)
        checker = Lineage(work, cfg)
        verify_input = per_shard(lambda s: checker.verified("features", s, WorkDir(work).part("features", s)),
                                 args.shards)
        started = time.perf_counter()
        problems = validate_work_dir(work, cfg)
        validate_s = time.perf_counter() - started
        data_bytes = sum(path.stat().st_size for path in work.rglob("*.parquet"))
    assert not problems, problems[:3]
    print(f"\n{args.shards} shards x {args.clips_per_shard:,} clips; a features part is {part_bytes / 2**20:.1f} MiB")
    print(f"  {'per quantize shard':<48}{'ms':>9}{'x make':>8}")
    for name, seconds in (("make (read input, descend, write, record)", make),
                          ("skip when current (lineage + sha256 of outputs)", skip),
                          ("verify the input's sha256 before reading it", verify_input)):
        print(f"  {name:<48}{seconds * 1000:>9.1f}{seconds / make:>8.3f}")
    print(f"  validate, whole chain: {validate_s:.2f} s for {data_bytes / 2**20:.0f} MiB of Parquet "
          f"({data_bytes / 2**20 / validate_s:.0f} MiB/s)")


if __name__ == "__main__":
    main()
