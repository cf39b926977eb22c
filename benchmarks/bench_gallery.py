"""The gallery's scan of the features, measured side by side in one run.

    .venv/bin/python benchmarks/bench_gallery.py [--shards 4] [--clips-per-shard 15000]

On one synthetic work dir (float16 1024-d features drawn around a random depth-4, k-12 tree; a 96x96 JPEG
thumbnail per clip), the time per clip of:
1. read: the features column read from Parquet and converted to float32 (the floor: I/O and decoding);
2. read + descent: schemas.codebook.descend with the path, as the gallery calls it;
3. scan: reports.nearest.nearest_clips for the level-1 view (12 nodes and their 144 children, 12 clips
   each), i.e. 2 plus the distances and the bounded nearest-clip lists;
4. gallery: write_gallery end to end (3, the thumbnails read from decode, the pages and the contact sheet).
Then the peak resident memory of the scan in a fresh process, on 1 shard and on all of them: it keeps one
batch and the nearest clips, so it should not grow with the number of shards."""

from __future__ import annotations

import argparse
import io
import multiprocessing
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import clip_keys, features_table, machine, manifest_rows, write_manifest_rows, write_part  # noqa: E402

import schemas  # noqa: E402
import schemas.codebook as codebook_format  # noqa: E402
from pipeline import visual_words  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.engine import lineage
from pipeline.engine.lineage import Lineage  # noqa: E402
from pipeline.engine.workdir import WorkDir  # noqa: E402
from reports.gallery import write_gallery  # noqa: E402
from reports.nearest import READ_BATCH_ROWS, nearest_clips  # noqa: E402

K, DEPTH, DIM = 12, 4, schemas.FEATURE_DIM
PROVENANCE_HASH = "bench000bench000"


def random_tree(rng) -> codebook_format.Codebook:
    centroids, parents = [], np.zeros((1, DIM), dtype=np.float32)
    for level in range(DEPTH):
        children = np.repeat(parents, K, axis=0) + rng.normal(0, 2.0 / 2**level, (len(parents) * K, DIM))
        centroids.append(children.astype(np.float32))
        parents = centroids[-1]
    return codebook_format.Codebook(
        depth=DEPTH,
        k=K,
        centroids=centroids,
        counts=[np.full(K ** (level + 1), 10, dtype=np.int64) for level in range(DEPTH)],
        info={"feature_provenance_hash": PROVENANCE_HASH, "sample_size": 0},
    )


def make_work_dir(work: Path, shards: int, clips_per_shard: int) -> None:
    rng = np.random.default_rng(0)
    codebook = random_tree(rng)
    visual_words.save(codebook, WorkDir(work).kmeans_folder)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (96, 96, 3), dtype=np.uint8)).save(buffer, format="JPEG", quality=80)
    thumbnail = buffer.getvalue()
    for shard in range(shards):
        leaves = rng.integers(0, K**DEPTH, clips_per_shard)
        vectors = codebook.centroids[-1][leaves] + rng.normal(0, 0.2, (clips_per_shard, DIM)).astype(np.float32)
        keys = clip_keys(shard, clips_per_shard)
        write_part(
            work,
            "features",
            shard,
            features_table(keys, vectors),
            schemas.FEATURES,
            MADE_BY,
            feature_provenance_hash=PROVENANCE_HASH,
        )
        decode = pa.table(
            dict(
                keys,
                n_real_frames=pa.array(np.full(clips_per_shard, 30), pa.int32()),
                padded=np.zeros(clips_per_shard, bool),
                thumbnail_jpeg=pa.array([thumbnail] * clips_per_shard, pa.binary()),
            )
        )
        write_part(work, "decode", shard, decode, schemas.DECODE_CLIPS, MADE_BY)
    write_manifest_rows(work, manifest_rows(shards, clips_per_shard), MADE_BY)


MADE_BY = "benchmarks.bench_gallery"


def one_shard_copy(work: Path, destination: Path, clips_per_shard: int) -> Path:
    """Shard 0 of `work` as a run of its own (its parts linked, not copied)."""
    shutil.copytree(WorkDir(work).kmeans_folder, WorkDir(destination).kmeans_folder)
    for stage in ("features", "decode"):
        WorkDir(destination).part(stage, 0).parent.mkdir(parents=True)
        WorkDir(destination).part(stage, 0).symlink_to(WorkDir(work).part(stage, 0))
        lineage.record_external(destination, stage, 0, MADE_BY)
    write_manifest_rows(destination, manifest_rows(1, clips_per_shard), MADE_BY)
    return destination


def level_one_nodes() -> dict[int, list[int]]:
    return {1: list(range(K)), 2: list(range(K * K))}


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def read_only(work: Path) -> None:
    for _, path in Lineage(work).current_parts("features"):
        for batch in pq.ParquetFile(path).iter_batches(
            batch_size=READ_BATCH_ROWS, columns=["video_id", "clip_index", "start_s", "feature"]
        ):
            batch.column(3).flatten().to_numpy(zero_copy_only=False).reshape(batch.num_rows, -1).astype(np.float32)


def read_and_descend(work: Path, codebook) -> None:
    for _, path in Lineage(work).current_parts("features"):
        for batch in pq.ParquetFile(path).iter_batches(
            batch_size=READ_BATCH_ROWS, columns=["video_id", "clip_index", "start_s", "feature"]
        ):
            vectors = batch.column(3).flatten().to_numpy(zero_copy_only=False).reshape(batch.num_rows, -1)
            visual_words.descend(codebook, vectors.astype(np.float32), return_path=True)


def peak_rss_kib() -> int:
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over from the parent through fork + exec
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM"))
    return int(line.split()[1])


def scan_peak_rss(work: str) -> tuple[int, int]:
    """In a fresh process: the peak resident set (KiB) after loading the codebook, and after the scan."""
    codebook = visual_words.load(WorkDir(work).codebook)
    loaded = peak_rss_kib()
    nearest_clips(Path(work), codebook, level_one_nodes(), 12, quiet=True)
    return loaded, peak_rss_kib()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--clips-per-shard", type=int, default=15_000)
    args = parser.parse_args()
    print(machine())
    clips = args.shards * args.clips_per_shard
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "work"
        make_work_dir(work, args.shards, args.clips_per_shard)
        codebook = visual_words.load(WorkDir(work).codebook)
        cfg = load_config(None, [])
        read_only(work)  # warm the page cache: every variant then reads from memory
        results = {
            "read": timed(lambda: read_only(work)),
            "read + descent": timed(lambda: read_and_descend(work, codebook)),
            "scan (nearest_clips)": timed(lambda: nearest_clips(work, codebook, level_one_nodes(), 12, quiet=True)),
            "gallery (write_gallery)": timed(lambda: write_gallery(cfg, work, quiet=True)),
        }
        print(
            f"\n{args.shards} shards x {args.clips_per_shard:,} clips = {clips:,} clips; depth {DEPTH}, k {K}; "
            f"level-1 view: 12 + 144 nodes, 12 clips each"
        )
        print(f"  {'variant':<26}{'seconds':>9}{'clips/s':>11}{'x read':>8}")
        for name, seconds in results.items():
            print(f"  {name:<26}{seconds:>9.2f}{clips / seconds:>11,.0f}{seconds / results['read']:>8.2f}")
        scan, descent = results["scan (nearest_clips)"], results["read + descent"]
        print(f"  scan overhead over read + descent: {scan / descent:.2f}x")

        single = one_shard_copy(work, Path(tmp) / "one", args.clips_per_shard)
        spawn = multiprocessing.get_context("spawn")
        with spawn.Pool(1) as pool:
            one = pool.apply(scan_peak_rss, (str(single),))
        with spawn.Pool(1) as pool:
            every = pool.apply(scan_peak_rss, (str(work),))
        print(
            f"\npeak RSS in a fresh process, codebook loaded: {one[0] / 1024:.0f} MiB; after the scan of "
            f"1 shard: {one[1] / 1024:.0f} MiB, of {args.shards} shards: {every[1] / 1024:.0f} MiB "
            f"(ratio {every[1] / one[1]:.2f})"
        )


if __name__ == "__main__":
    main()
