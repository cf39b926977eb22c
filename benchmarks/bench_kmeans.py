"""The k-means tree, measured side by side in one run (`make bench-kmeans`).

1. Fit time of the depth-d, k-way tree on N x dim vectors: faiss (stages/kmeans/tree.py fit_tree, in one process
   and through the local executor's process pool) against the same top-down tree built with
   scikit-learn's MiniBatchKMeans (same k-means++ seeding, iterations, per-node cap and small-node rule).
2. Quantize throughput: tree descent (schemas.codebook.descend) against an exhaustive search over every
   leaf centroid (faiss IndexFlatL2), on the tree fit in 1.

The vectors are a synthetic hierarchy (nested Gaussian offsets, float16 like real features), written to a
temporary .npy that the fit memory-maps, as the kmeans stage does with its sample.

    .venv/bin/python benchmarks/bench_kmeans.py [--vectors 200000] [--depth 4] [--k 12] [--dim 1024]
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from common import machine
from threadpoolctl import threadpool_limits

import schemas.codebook as codebook_format
from pipeline import visual_words
from pipeline.config import load_config
from pipeline.executors.local import LocalExecutor
from stages.kmeans import KmeansConfig
from stages.kmeans import tree as kmeans_tree


def synthetic_features(path: Path, vectors: int, dim: int, k: int, depth: int, seed: int = 0) -> None:
    """A k-ary hierarchy of Gaussian offsets (scale halving per level) plus noise, streamed to `path`."""
    rng = np.random.default_rng(seed)
    offsets = [rng.normal(0, 4.0 / 2**level, (k ** (level + 1), dim)).astype(np.float32) for level in range(depth)]
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(vectors, dim))
    for start in range(0, vectors, 50_000):
        rows = min(50_000, vectors - start)
        leaf = rng.integers(0, k**depth, rows)
        block = rng.normal(0, 0.5, (rows, dim)).astype(np.float32)
        for level in range(depth):
            block += offsets[level][leaf // k ** (depth - 1 - level)]
        out[start : start + rows] = block
    out.flush()


def sklearn_tree(sample: np.ndarray, kcfg: KmeansConfig) -> float:
    """The same top-down tree with MiniBatchKMeans, in this process; returns seconds."""
    from sklearn.cluster import MiniBatchKMeans

    started = time.perf_counter()
    nodes = [(0, 0, np.arange(len(sample)))]  # (level, row, members)
    while nodes:
        level, row, members = nodes.pop()
        if level == kcfg.depth or len(members) == 0:
            continue
        if len(members) < kcfg.k:  # the small-node rule: members become children
            nodes += [(level + 1, row * kcfg.k + child, members[child : child + 1]) for child in range(len(members))]
            continue
        rng = np.random.default_rng([kcfg.seed, level, row])
        fit_rows = (
            members
            if len(members) <= kcfg.max_points_per_node
            else np.sort(rng.choice(members, kcfg.max_points_per_node, replace=False))
        )
        model = MiniBatchKMeans(
            n_clusters=kcfg.k,
            init="k-means++",
            n_init=1,
            max_iter=kcfg.niter,
            batch_size=4096,
            random_state=kmeans_tree.node_seed(kcfg.seed, level, row),
        )
        vectors = np.asarray(sample[fit_rows], dtype=np.float32)
        # the faiss tree's thread rule: small nodes on one thread (OpenMP barriers outweigh their work)
        with threadpool_limits(limits=1 if vectors.size < kmeans_tree.SINGLE_THREAD_FIT_VALUES else None):
            model.fit(vectors)
            chunk = kmeans_tree.ASSIGN_CHUNK_ROWS
            nearest = np.concatenate(
                [
                    model.predict(np.asarray(sample[members[start : start + chunk]], dtype=np.float32))
                    for start in range(0, len(members), chunk)
                ]
            )
        nodes += [(level + 1, row * kcfg.k + child, members[nearest == child]) for child in range(kcfg.k)]
    return time.perf_counter() - started


_FORKED: dict = {}  # what the forked descent workers inherit


def _descend_rows(bounds: tuple[int, int]) -> np.ndarray:
    sample = np.load(_FORKED["sample_path"], mmap_mode="r")
    with threadpool_limits(limits=1, user_api="blas"):
        return visual_words.descend(_FORKED["codebook"], sample[bounds[0] : bounds[1]])


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:>12,.0f} vectors/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vectors", type=int, default=200_000, help="vectors to fit the tree on")
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--k", type=int, default=12)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=2, help="processes for the executor fit (0: skip it)")
    parser.add_argument(
        "--flat-vectors",
        type=int,
        default=20_000,
        help="vectors for the exhaustive search (it is ~50x slower than descent)",
    )
    parser.add_argument("--skip-sklearn", action="store_true")
    args = parser.parse_args()

    kcfg = KmeansConfig(depth=args.depth, k=args.k)
    print(f"machine: {machine()}")
    print(
        f"k-means tree benchmark: {args.vectors:,} x {args.dim} float16 vectors, depth {args.depth}, "
        f"k {args.k} ({args.k**args.depth:,} leaves), niter {kcfg.niter}, per-node cap "
        f"{kcfg.max_points_per_node:,}; {os.cpu_count()} CPUs, load average "
        f"{', '.join(f'{value:.1f}' for value in os.getloadavg())}"
    )
    with tempfile.TemporaryDirectory() as folder:
        sample_path = Path(folder) / "sample.npy"
        synthetic_features(sample_path, args.vectors, args.dim, args.k, args.depth)
        sample = np.load(sample_path, mmap_mode="r")

        print("\n== fit")
        started = time.perf_counter()
        tree = kmeans_tree.fit_tree(sample_path, kcfg)
        faiss_seconds = time.perf_counter() - started
        print(f"  faiss tree, 1 process           {faiss_seconds:8.1f} s")
        if args.workers:
            cfg = load_config(None, [f"kmeans.depth={args.depth}", f"kmeans.k={args.k}"])
            executor = LocalExecutor(cfg, workers=args.workers)
            started = time.perf_counter()
            parallel = kmeans_tree.fit_tree(
                sample_path, kcfg, executor.map, threads_per_task=kmeans_tree.threads_per_task(args.workers, args.k)
            )
            pool_seconds = time.perf_counter() - started
            same = all(np.array_equal(a, b) for a, b in zip(tree.centroids, parallel.centroids))
            print(
                f"  faiss tree, {args.workers} processes         {pool_seconds:8.1f} s   "
                f"(x{faiss_seconds / pool_seconds:.2f}; same tree: {same})"
            )
        if not args.skip_sklearn:
            sklearn_seconds = sklearn_tree(sample, kcfg)
            print(f"  sklearn MiniBatchKMeans tree    {sklearn_seconds:8.1f} s")
            print(f"  ratio sklearn / faiss (1 process): {sklearn_seconds / faiss_seconds:.2f}")

        print("\n== quantize")
        codebook = codebook_format.Codebook(depth=args.depth, k=args.k, centroids=tree.centroids, counts=tree.counts)
        visual_words.descend(codebook, sample[:1000])  # warm-up
        started = time.perf_counter()
        leaves = visual_words.descend(codebook, sample)
        threaded_seconds = time.perf_counter() - started
        with threadpool_limits(limits=1, user_api="blas"):  # as the quantize stage runs it
            started = time.perf_counter()
            single = visual_words.descend(codebook, sample)
            descent_seconds = time.perf_counter() - started
        # the quantize stage runs one shard per process, a process per core: each descends its own rows
        cores = os.cpu_count() or 1
        _FORKED.update(codebook=codebook, sample_path=sample_path)
        with ProcessPoolExecutor(cores, mp_context=multiprocessing.get_context("fork")) as pool:
            list(pool.map(_descend_rows, [(0, 1000)] * cores))  # start and warm the workers
            bounds = np.linspace(0, args.vectors, cores + 1).astype(int)
            started = time.perf_counter()
            per_core = list(pool.map(_descend_rows, itertools.pairwise(bounds)))
            all_cores_seconds = time.perf_counter() - started
        assert np.array_equal(leaves, single) and np.array_equal(np.concatenate(per_core), single)
        descent_rate = args.vectors / descent_seconds

        import faiss

        flat = faiss.IndexFlatL2(args.dim)
        flat.add(np.ascontiguousarray(tree.centroids[-1]))
        queries = np.asarray(sample[: args.flat_vectors], dtype=np.float32)
        started = time.perf_counter()
        _, nearest_leaf = flat.search(queries, 1)
        flat_seconds = time.perf_counter() - started
        flat_rate = len(queries) / flat_seconds
        agreement = float((nearest_leaf[:, 0] == leaves[: len(queries)]).mean())
        print(f"  tree descent, 1 BLAS thread ({args.vectors:,} vectors)      {rate(args.vectors, descent_seconds)}")
        print(f"  tree descent, default BLAS threads ({args.vectors:,})  {rate(args.vectors, threaded_seconds)}")
        print(
            f"  tree descent, {cores} processes x 1 BLAS thread ({args.vectors:,})"
            f"{rate(args.vectors, all_cores_seconds)}"
        )
        print(
            f"  flat search over {args.k**args.depth:,} leaves ({len(queries):,} vectors)   "
            f"{rate(len(queries), flat_seconds)}"
        )
        print(
            f"  ratio descent (1 thread) / flat: {descent_rate / flat_rate:.1f}; 1 thread / default threads: "
            f"{threaded_seconds / descent_seconds:.2f}; {cores} processes / 1: "
            f"{descent_seconds / all_cores_seconds:.2f}"
            "   (goal: descent >= 250,000 vectors/s)"
        )
        print(f"  same leaf as the flat search for {agreement:.1%} of vectors")
        empty = int((tree.counts[-1] == 0).sum())
        print(
            f"\n  tree: {empty:,} empty leaves of {args.k**args.depth:,}; mean squared distance per level "
            + ", ".join(f"{value / args.vectors:.1f}" for value in tree.inertia)
        )
    print(
        f"  load average at the end: {', '.join(f'{value:.1f}' for value in os.getloadavg())} "
        f"(other work on the machine slows every timing above)"
    )


if __name__ == "__main__":
    main()
