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
import numpy as np  # noqa: E402
from common import clip_keys, features_table, machine, manifest_rows, write_manifest_rows, write_part  # noqa: E402

import schemas  # noqa: E402
from pipeline import storage  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.engine import runner
from pipeline.engine.lineage import Lineage  # noqa: E402
from pipeline.engine.workdir import WorkDir  # noqa: E402
from pipeline.executors.local import LocalExecutor  # noqa: E402
from reports.validate import validate_work_dir  # noqa: E402
from stages.kmeans import run as kmeans  # noqa: E402

MADE_BY = "benchmarks.bench_lineage"
SETTINGS = [
    "kmeans.depth=2",
    "kmeans.k=8",
    "kmeans.niter=5",
    "kmeans.max_fit_vectors=20000",
    "executor.workers=1",
    "kmeans.workers=1",
]


def make_work_dir(work: Path, shards: int, clips: int) -> None:
    """Features parts of random vectors (600 clips per video) with their records and a manifest."""
    rng = np.random.default_rng(0)
    for shard in range(shards):
        vectors = rng.normal(0, 1, (clips, schemas.FEATURE_DIM)).astype(np.float16)
        write_part(
            work,
            "features",
            shard,
            features_table(clip_keys(shard, clips), vectors),
            schemas.FEATURES,
            MADE_BY,
            feature_provenance_hash="bench",
            feature_provenance="{}",
        )
    write_manifest_rows(work, manifest_rows(shards, clips), MADE_BY)


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
        verify_input = per_shard(
            lambda s: checker.verified("features", s, WorkDir(work).part("features", s)), args.shards
        )
        started = time.perf_counter()
        problems = validate_work_dir(work, cfg)
        validate_s = time.perf_counter() - started
        data_bytes = sum(path.stat().st_size for path in work.rglob("*.parquet"))
    assert not problems, problems[:3]
    print(f"\n{args.shards} shards x {args.clips_per_shard:,} clips; a features part is {part_bytes / 2**20:.1f} MiB")
    print(f"  {'per quantize shard':<48}{'ms':>9}{'x make':>8}")
    for name, seconds in (
        ("make (read input, descend, write, record)", make),
        ("skip when current (lineage + sha256 of outputs)", skip),
        ("verify the input's sha256 before reading it", verify_input),
    ):
        print(f"  {name:<48}{seconds * 1000:>9.1f}{seconds / make:>8.3f}")
    print(
        f"  validate, whole chain: {validate_s:.2f} s for {data_bytes / 2**20:.0f} MiB of Parquet "
        f"({data_bytes / 2**20 / validate_s:.0f} MiB/s)"
    )


if __name__ == "__main__":
    main()
