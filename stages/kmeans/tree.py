"""The k-means tree of the kmeans stage: the root split into k with faiss (k-means++ initialisation), then
each level-1 node's subtree fit down to `kmeans.depth` levels as one `executor.map` task that reads the
fit sample memory-mapped. Each node's seed comes from (seed, level, row), so the tree is the same for any
number of workers; a node with fewer members than k makes each member one child and leaves the others
empty (count 0)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline import threads
from stages.kmeans import KmeansConfig

ASSIGN_CHUNK_ROWS = 65_536  # sample rows converted to float32 at a time when assigning members
# faiss's k-means++ runs k short OpenMP regions: on a small node their barriers cost more than the
# work (hundreds of ms per fit on a busy machine), so nodes below this many values fit on one thread
SINGLE_THREAD_FIT_VALUES = 1 << 22


@dataclass
class TreeFit:
    centroids: list[np.ndarray]  # level L-1 -> (k**L, dim) float32
    counts: list[np.ndarray]  # level L-1 -> (k**L,) int64 training members
    inertia: list[float]  # level L-1 -> sum of squared distances of the sample to its level-L node


def threads_per_task(workers: int | None, k: int) -> int:
    """Threads for each node fit in a local pool of `workers` processes: the cores shared among the
    processes instead of oversubscribed (at most k subtrees run at once); 0 elsewhere: a Ray task's own
    share (pipeline/threads.py)."""
    return max(1, threads.allocated_cpus()[0] // min(workers, k)) if workers else 0


def node_seed(seed: int, level: int, row: int) -> int:
    """The seed of the node at (level, row); level 0 is the root. Independent of the order of work."""
    return int(np.random.SeedSequence([seed, level, row]).generate_state(1)[0] & 0x7FFFFFFF)


def _assign(
    sample: np.ndarray, members: np.ndarray, centroids: np.ndarray, preloaded: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Nearest centroid (L2) of each member and its squared distance, in chunks of float32 rows."""
    import faiss

    index = faiss.IndexFlatL2(centroids.shape[1])
    index.add(centroids)
    nearest = np.empty(len(members), dtype=np.int64)
    squared = np.empty(len(members), dtype=np.float64)
    for start in range(0, len(members), ASSIGN_CHUNK_ROWS):
        stop = start + ASSIGN_CHUNK_ROWS
        rows = (
            preloaded[start:stop]
            if preloaded is not None
            else np.asarray(sample[members[start:stop]], dtype=np.float32)
        )
        distances, labels = index.search(rows, 1)
        nearest[start : start + len(rows)] = labels[:, 0]
        # ||x||^2 + ||c||^2 - 2x.c can come out a hair below zero
        squared[start : start + len(rows)] = np.maximum(distances[:, 0], 0.0)
    return nearest, squared


def split_node(
    sample: np.ndarray, members: np.ndarray, level: int, row: int, kcfg: KmeansConfig, parent_centroid: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split the node at (level, row), whose training rows are `sample[members]` (members sorted,
    non-empty), into k children. Returns (centroids (k, dim) float32, child of each member, squared
    distance of each member to its child)."""
    import faiss

    k = kcfg.k
    if len(members) < k:
        # too few to split k ways: each member is a child; the unused children keep the parent's centroid
        centroids = np.repeat(parent_centroid[None, :].astype(np.float32), k, axis=0)
        vectors = np.asarray(sample[members], dtype=np.float32)
        centroids[: len(members)] = vectors
        # duplicates go to the first of their equal children; the others stay empty
        squared_all = ((vectors[:, None, :] - vectors[None, :, :]) ** 2).sum(axis=2, dtype=np.float64)
        nearest = squared_all.argmin(axis=1)
        return centroids, nearest, squared_all[np.arange(len(members)), nearest]
    rng = np.random.default_rng([kcfg.seed, level, row])
    capped = len(members) > kcfg.max_points_per_node
    fit_rows = np.sort(rng.choice(members, kcfg.max_points_per_node, replace=False)) if capped else members
    vectors = np.asarray(sample[fit_rows], dtype=np.float32)
    kmeans = faiss.Kmeans(
        vectors.shape[1],
        k,
        niter=kcfg.niter,
        nredo=kcfg.nredo,
        seed=node_seed(kcfg.seed, level, row),
        init_method=faiss.ClusteringInitMethod_KMEANS_PLUS_PLUS,
        # faiss would otherwise fit on 256 points per centroid and warn below 39
        max_points_per_centroid=len(vectors),
        min_points_per_centroid=1,
    )
    threads = faiss.omp_get_max_threads()
    if vectors.size < SINGLE_THREAD_FIT_VALUES:
        faiss.omp_set_num_threads(1)
    try:
        kmeans.train(vectors)
        centroids = np.ascontiguousarray(kmeans.centroids, dtype=np.float32)
        nearest, squared = _assign(sample, members, centroids, preloaded=None if capped else vectors)
    finally:
        faiss.omp_set_num_threads(threads)
    return centroids, nearest, squared


def fit_subtree(task: dict) -> dict:
    """Fit levels 2..depth below one level-1 node: an `executor.map` task (top level, picklable).
    `task`: sample_path, sample_size, row (the level-1 row), members, centroid, kcfg, threads."""
    import faiss

    faiss.omp_set_num_threads(task["threads"] or threads.threads())
    kcfg: KmeansConfig = task["kcfg"]
    k, root = kcfg.k, task["row"]
    sample = np.load(task["sample_path"], mmap_mode="r")[: task["sample_size"]]
    nodes = [(root, task["members"], task["centroid"])]
    centroids, counts, inertia = [], [], []
    for level in range(1, kcfg.depth):  # split the level-`level` nodes into level + 1
        first_child = root * k**level
        level_centroids = np.empty((k**level, sample.shape[1]), dtype=np.float32)
        level_counts = np.zeros(k**level, dtype=np.int64)
        level_inertia = 0.0
        children = []
        for row, members, centroid in nodes:
            local = row * k - first_child
            if len(members) == 0:
                level_centroids[local : local + k] = centroid
                children += [(row * k + child, members, centroid) for child in range(k)]
                continue
            child_centroids, nearest, squared = split_node(sample, members, level, row, kcfg, centroid)
            level_centroids[local : local + k] = child_centroids
            level_counts[local : local + k] = np.bincount(nearest, minlength=k)
            level_inertia += float(squared.sum())
            children += [(row * k + child, members[nearest == child], child_centroids[child]) for child in range(k)]
        centroids.append(level_centroids)
        counts.append(level_counts)
        inertia.append(level_inertia)
        nodes = children
    return {"row": root, "centroids": centroids, "counts": counts, "inertia": inertia}


def fit_tree(
    sample_path: Path, kcfg: KmeansConfig, map_fn=map, *, sample_size: int | None = None, threads_per_task: int = 0
) -> TreeFit:
    """Fit the k-means tree on the first `sample_size` rows of the .npy at `sample_path` (all rows by
    default). `map_fn(fn, items)` runs the level-1 subtrees (e.g. an executor's `map`)."""
    sample = np.load(sample_path, mmap_mode="r")
    sample_size = len(sample) if sample_size is None else sample_size
    sample = sample[:sample_size]
    if sample_size < kcfg.k:
        raise ValueError(
            f"the k-means tree needs at least kmeans.k={kcfg.k} feature vectors to split, "
            f"got {sample_size}: run the features stage on more videos or lower kmeans.k"
        )
    members = np.arange(sample_size, dtype=np.int64)
    root_centroid = np.zeros(sample.shape[1], dtype=np.float32)  # unused: the root always has >= k members
    import faiss

    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads.threads())  # the task's CPUs, not faiss's one per core of the machine
    try:
        centroids, nearest, squared = split_node(sample, members, 0, 0, kcfg, root_centroid)
    finally:
        faiss.omp_set_num_threads(previous)
    fit = TreeFit(
        centroids=[centroids],
        counts=[np.bincount(nearest, minlength=kcfg.k).astype(np.int64)],
        inertia=[float(squared.sum())],
    )
    if kcfg.depth == 1:
        return fit
    # absolute: a Ray worker may start in another folder (the work dir is shared, the cwd is not)
    tasks = [
        {
            "sample_path": str(Path(sample_path).resolve()),
            "sample_size": sample_size,
            "row": child,
            "members": members[nearest == child],
            "centroid": centroids[child],
            "kcfg": kcfg,
            "threads": threads_per_task,
        }
        for child in range(kcfg.k)
    ]
    subtrees = list(map_fn(fit_subtree, tasks))
    for depth_index in range(kcfg.depth - 1):
        fit.centroids.append(np.concatenate([tree["centroids"][depth_index] for tree in subtrees]))
        fit.counts.append(np.concatenate([tree["counts"][depth_index] for tree in subtrees]))
        fit.inertia.append(sum(tree["inertia"][depth_index] for tree in subtrees))
    return fit
