"""kmeans: the visual-word codebook, a k-means tree fit top-down on a seeded sample of clip features.

A global stage (one output for the whole collection, not one per shard):
1. sample at most `kmeans.max_fit_vectors` features evenly across the features shards (every manifest
   shard current, each part checked against its sha256), streamed into a float16 .npy under DIR/kmeans
   that the fit reads memory-mapped (memory stays bounded whatever the sample size);
2. split the sample into k clusters with faiss (k-means++ initialisation), then each cluster's members
   into k again, down to `kmeans.depth` levels: k**depth leaves, the visual words;
3. write DIR/kmeans/codebook.safetensors and its JSON sidecar (schemas/codebook.py is the format), then
   the completion record naming the features parts it was fit on; a later run refits when they or the
   kmeans config change.

The subtrees below level 1 are independent: each is one `executor.map` task reading the sample file from
the work dir. Each node's seed comes from (seed, level, row), so the tree is the same for any number of
workers. A node with fewer members than k cannot be split k ways: each member becomes one child and the
other children stay empty (count 0, never chosen during descent); descendants of an empty node are empty."""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import schemas.codebook as codebook_format
from pipeline import storage, threads, visual_words
from pipeline.config import Config
from pipeline.contract import CollectionResult, CollectionRun
from pipeline.engine import lineage
from pipeline.engine.workdir import WorkDir
from schemas import metadata
from stages.kmeans import KmeansConfig

SAMPLE_NAME = "fit-sample.npy"
ASSIGN_CHUNK_ROWS = 65_536  # sample rows converted to float32 at a time when assigning members
# faiss's k-means++ runs k short OpenMP regions: on a small node their barriers cost more than the
# work (hundreds of ms per fit on a busy machine), so nodes below this many values fit on one thread
SINGLE_THREAD_FIT_VALUES = 1 << 22
READ_BATCH_ROWS = 8_192
# a codebook is too large for its data when more than half its leaves cannot get a member; the suggested
# size leaves this many fit clips per leaf
SUGGESTED_CLIPS_PER_LEAF = 2
SUGGESTED_MIN_K = 4

log = logging.getLogger("pipeline.kmeans")


@dataclass
class TreeFit:
    centroids: list[np.ndarray]  # level L-1 -> (k**L, dim) float32
    counts: list[np.ndarray]  # level L-1 -> (k**L,) int64 training members
    inertia: list[float]  # level L-1 -> sum of squared distances of the sample to its level-L node


# ---------------------------------------------------------------- the fit sample


def feature_provenance(shards: list[tuple[int, Path]]) -> tuple[str, str]:
    """The (hash, JSON) provenance that every non-empty features shard carries; disagreement is an error:
    features from two S3D checkpoints or frame rates cannot share one codebook."""
    seen: dict[str, tuple[int, str]] = {}
    for shard_index, path in shards:
        footer = storage.parquet_file(path).metadata  # one read gives the row count and the provenance
        if footer.num_rows == 0:
            continue
        provenance = metadata.read(footer.schema.to_arrow_schema())
        if provenance.feature_provenance_hash is None:
            raise ValueError(
                f"{path} has no feature_provenance_hash in its metadata: "
                f"rerun the features stage for shard {shard_index}"
            )
        seen.setdefault(provenance.feature_provenance_hash, (shard_index, provenance.feature_provenance or "{}"))
    if len(seen) > 1:
        (hash_a, (shard_a, _)), (hash_b, (shard_b, _)) = list(seen.items())[:2]
        raise ValueError(
            f"features shards disagree on feature provenance: part {shard_a} has {hash_a}, "
            f"part {shard_b} has {hash_b}; rerun the features stage with one config"
        )
    if not seen:
        raise ValueError("every completed features shard is empty: no clip features to fit the codebook on")
    provenance_hash, (_, provenance) = next(iter(seen.items()))
    return provenance_hash, provenance


def sample_quotas(row_counts: list[int], max_vectors: int) -> list[int]:
    """Rows to sample per shard: all of them when they fit, else proportional to each shard's rows
    (largest remainders get the leftover rows; ties go to the earlier shard)."""
    total = sum(row_counts)
    if total <= max_vectors:
        return list(row_counts)
    quotas = [rows * max_vectors // total for rows in row_counts]
    remainders = [rows * max_vectors % total for rows in row_counts]
    leftover = max_vectors - sum(quotas)
    for index in sorted(range(len(row_counts)), key=lambda i: (-remainders[i], i))[:leftover]:
        quotas[index] += 1
    return quotas


def write_fit_sample(
    shards: list[tuple[int, Path]], max_vectors: int, seed: int, destination: Path, *, quiet: bool = False
) -> dict:
    """Stream a seeded, shard-proportional sample of features into a float16 .npy at `destination`.
    Non-finite rows are dropped (counted); the file's first `sample_size` rows are the sample.

    The file is written with plain sequential writes, never through a writable memory map: on a full disk
    a write fails with ENOSPC (a one-line error), where a store into a mapped page would kill the process
    with SIGBUS and no message."""
    from pipeline.progress import Progress

    row_counts = [storage.parquet_file(path).metadata.num_rows for _, path in shards]
    quotas = sample_quotas(row_counts, max_vectors)
    dim = storage.parquet_file(shards[0][1]).schema_arrow.field("feature").type.list_size
    written = dropped = 0
    with (
        open(destination, "wb") as sample,
        Progress(total=len(shards), unit="shards", desc="kmeans sample", quiet=quiet) as progress,
    ):
        np.lib.format.write_array_header_2_0(
            sample,
            {
                "descr": np.lib.format.dtype_to_descr(np.dtype(np.float16)),
                "fortran_order": False,
                "shape": (sum(quotas), dim),
            },
        )
        for (shard_index, path), rows, quota in zip(shards, row_counts, quotas):
            if quota == 0:
                progress.update(1)
                continue
            chosen = np.sort(np.random.default_rng([seed, shard_index]).choice(rows, quota, replace=False))
            parquet = storage.parquet_file(path)
            if parquet.schema_arrow.field("feature").type.list_size != dim:
                raise ValueError(
                    f"{path} has {parquet.schema_arrow.field('feature').type.list_size}-d "
                    f"features, {shards[0][1]} has {dim}-d"
                )
            offset = taken = 0
            for batch in parquet.iter_batches(batch_size=READ_BATCH_ROWS, columns=["feature"]):
                end = np.searchsorted(chosen, offset + batch.num_rows)
                if end > taken:
                    flat = batch.column(0).flatten().to_numpy(zero_copy_only=False)
                    vectors = flat.reshape(-1, dim)[chosen[taken:end] - offset]
                    finite = np.isfinite(vectors).all(axis=1)
                    sample.write(np.ascontiguousarray(vectors[finite], dtype=np.float16).tobytes())
                    written += int(finite.sum())
                    dropped += int((~finite).sum())
                taken = end
                offset += batch.num_rows
                if taken == len(chosen):
                    break
            progress.update(1, clips=quota)
        # the header promised sum(quotas) rows: the dropped ones are zeros past sample_size
        sample.write(bytes(dropped * dim * 2))
        sample.flush()
        os.fsync(sample.fileno())
    if dropped:
        log.warning("kmeans: dropped %d sampled features with NaN/inf values", dropped)
    return {
        "sample_size": written,
        "nonfinite_dropped": dropped,
        "features_rows": sum(row_counts),
        "features_shards": len(shards),
        "dim": dim,
    }


# ---------------------------------------------------------------- a codebook too large for its data


def suggested_shape(clips: int, depth: int, max_leaves: int | None = None) -> tuple[int, int]:
    """(depth, k) of a codebook with about SUGGESTED_CLIPS_PER_LEAF fit clips per leaf (and at most
    `max_leaves`): the configured depth when k can stay >= SUGGESTED_MIN_K there, else the deepest
    shallower tree that can (k >= 2 at depth 1)."""
    leaves = max(min(clips / SUGGESTED_CLIPS_PER_LEAF, max_leaves or math.inf), 2)
    for levels in range(depth, 0, -1):
        k = int(math.floor(leaves ** (1 / levels) + 1e-9))
        if k >= SUGGESTED_MIN_K or levels == 1:
            return levels, max(k, 2)
    raise AssertionError("unreachable")


def size_warning(
    clips: int, depth: int, k: int, empty_leaves: int | None = None, features_rows: int | None = None
) -> str | None:
    """The warning for a codebook most of whose leaves stay empty, or None: before the fit when the fit
    clips are fewer than half the k**depth leaves (each clip fills one leaf at most), after it when the
    fit left more than half of them empty (`empty_leaves`). `features_rows` above `clips`: the sample
    was capped (kmeans.max_fit_vectors), which the warning says."""
    leaves = k**depth
    capped = (
        f" (kmeans.max_fit_vectors sampled {clips:,} of the {features_rows:,})"
        if features_rows and features_rows > clips
        else ""
    )
    if empty_leaves is None:
        if 2 * clips >= leaves:
            return None
        new_depth, new_k = suggested_shape(clips, depth)
        return (
            f"codebook depth {depth}, k {k} is too large for {clips:,} fit clips: at least {leaves - clips:,} "
            f"of its {leaves:,} leaves stay empty; for this many clips use kmeans.depth={new_depth}, "
            f"kmeans.k={new_k} ({new_k**new_depth:,} leaves), or fit on at least "
            f"{SUGGESTED_CLIPS_PER_LEAF * leaves:,} clips{capped}"
        )
    if 2 * empty_leaves <= leaves:
        return None
    # enough clips, but too alike (near-duplicates) to spread over the leaves: more of them would not help
    filled = leaves - empty_leaves
    new_depth, new_k = suggested_shape(clips, depth, max_leaves=filled)
    return (
        f"codebook depth {depth}, k {k} is too large for its {clips:,} fit clips: {empty_leaves:,} of its "
        f"{leaves:,} leaves are empty (the clips are alike enough to fill only {filled:,}); for these clips "
        f"use kmeans.depth={new_depth}, kmeans.k={new_k} ({new_k**new_depth:,} leaves){capped}"
    )


# ---------------------------------------------------------------- the tree


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


# ---------------------------------------------------------------- the stage


def run(cfg: Config, work_dir, executor, *, force: bool = False, quiet: bool = False) -> dict:
    """Fit and write the codebook unless it is current: its record's lineage (the kmeans config and the
    digest of every features part) matches what they are now, and its files their sha256. A stale or
    corrupt codebook is refit automatically. `executor.map` runs the level-1 subtrees; the CLI sizes a
    local pool with `kmeans.workers`."""
    work = WorkDir(work_dir)
    checker = lineage.Lineage(work, cfg)
    expected = checker.expected("kmeans")  # every features shard current, or InputNotReady
    state = checker.state("kmeans", verify=True)
    if state.current and not force:
        return {
            "stage": "kmeans",
            "skipped": True,
            "codebook": str(work.codebook),
            "sha256": state.record.get("sha256"),
        }
    redone = None if state.status == "missing" or force else f"{state.status}: {state.reason}"
    if redone:
        log.warning("kmeans: the codebook is %s; refitting it", redone)

    started = time.time()
    kcfg = cfg.kmeans
    storage.remove_stale_temporaries(work.kmeans_folder)
    storage.remove_stale_local_temporaries()  # a killed fit's local sample (work dir on object storage)
    shards = [
        (shard, checker.verified("features", shard, work.part("features", shard)))
        for shard in checker.manifest_shards()
    ]
    provenance_hash, provenance = feature_provenance(shards)
    pool = executor
    if storage.is_remote(work.root):
        # the fit reads its sample memory-mapped from a local disk: with the work dir on object storage it
        # lives in a local temporary file, which only this machine's processes can read
        sample_path = storage.local_temporary(SAMPLE_NAME)
        if not hasattr(executor, "workers"):
            from pipeline.executors.local import LocalExecutor

            pool = LocalExecutor(cfg, cfg.kmeans.workers or None)
    else:
        sample_path = storage.atomic_path(work.kmeans_folder / SAMPLE_NAME)
    try:
        sample_stats = write_fit_sample(shards, kcfg.max_fit_vectors, kcfg.seed, sample_path, quiet=quiet)
        sampled_at = time.time()
        capped_rows = sample_stats["features_rows"] if sample_stats["features_rows"] > kcfg.max_fit_vectors else None
        # said before the fit when it is certain, so a run can be stopped before it spends the time
        warning = size_warning(sample_stats["sample_size"], kcfg.depth, kcfg.k, features_rows=capped_rows)
        if warning:
            log.warning("kmeans: %s", warning)
        fit = fit_tree(
            sample_path,
            kcfg,
            functools.partial(pool.map, role="kmeans"),
            sample_size=sample_stats["sample_size"],
            threads_per_task=threads_per_task(getattr(pool, "workers", None), kcfg.k),
        )
    finally:
        sample_path.unlink(missing_ok=True)
    fitted_at = time.time()

    import faiss

    sample_size = sample_stats["sample_size"]
    empty_nodes = [int((counts == 0).sum()) for counts in fit.counts]
    if warning is None:
        warning = size_warning(sample_size, kcfg.depth, kcfg.k, empty_leaves=empty_nodes[-1], features_rows=capped_rows)
        if warning:
            log.warning("kmeans: %s", warning)
    small_nodes = [int(((counts > 0) & (counts < kcfg.k)).sum()) for counts in fit.counts]
    info = {
        "stage": "kmeans",
        "config": json.loads(cfg.section_json("kmeans")),
        "config_hash": cfg.section_hash("kmeans"),
        "seed": kcfg.seed,
        "init": "k-means++",
        "faiss_version": faiss.__version__,
        "sample_size": sample_size,
        "features_rows": sample_stats["features_rows"],
        "features_shards": sample_stats["features_shards"],
        "nonfinite_dropped": sample_stats["nonfinite_dropped"],
        "inertia": fit.inertia,
        "mean_squared_distance": [value / sample_size for value in fit.inertia],
        "empty_nodes": empty_nodes,
        "small_nodes": small_nodes,
        "empty_leaves": empty_nodes[-1],
        "feature_provenance_hash": provenance_hash,
        "feature_provenance": json.loads(provenance),
        "warnings": [warning] if warning else [],
    }
    codebook = codebook_format.Codebook(
        depth=kcfg.depth, k=kcfg.k, centroids=fit.centroids, counts=fit.counts, info=info
    )
    work.record("kmeans").unlink(missing_ok=True)
    path, sha = visual_words.save(codebook, work.kmeans_folder)
    outputs = {**lineage.output_entry(work, work.codebook), **lineage.output_entry(work, work.codebook_sidecar)}
    stats = {
        "codebook": str(path),
        "sha256": sha,
        "sample_size": sample_size,
        "leaves": codebook.num_leaves,
        "empty_leaves": empty_nodes[-1],
        "small_nodes": sum(small_nodes),
        "sample_seconds": round(sampled_at - started, 3),
        "fit_seconds": round(fitted_at - sampled_at, 3),
    }
    lineage.write_record(work, "kmeans", None, expected, outputs, stats)
    return {"stage": "kmeans", **stats, **({"redone": redone} if redone else {})}


def codebook_info(work_dir, top: int = 10) -> str:
    """A readable summary of DIR/kmeans: levels, occupancy, empty leaves, the largest leaves."""
    work = WorkDir(work_dir)
    codebook = visual_words.load(work.codebook)
    info, k = codebook.info, codebook.k
    lines = [
        f"codebook {work.codebook}",
        f"  sha256 {info.get('sha256', '?')}",
        f"  depth {codebook.depth}, k {k}, dim {codebook.dim}: {codebook.num_leaves:,} leaves",
        f"  fit on {info.get('sample_size', 0):,} sampled clips of {info.get('features_rows', 0):,} "
        f"in {info.get('features_shards', 0)} features shards, seed {info.get('seed', '?')}",
        f"  feature provenance {info.get('feature_provenance_hash', '?')}",
        *[f"  warning: {warning}" for warning in info.get("warnings", [])],
        "",
        f"  {'level':>5} {'nodes':>7} {'non-empty':>9} {'empty':>7} {'small':>7} "
        f"{'min':>7} {'median':>7} {'max':>8} {'mean sq. dist':>14}",
    ]
    mean_squared = info.get("mean_squared_distance", [])
    for level, counts in enumerate(codebook.counts, start=1):
        occupied = counts[counts > 0]
        small = int(((counts > 0) & (counts < k)).sum())
        distance = f"{mean_squared[level - 1]:.4g}" if level - 1 < len(mean_squared) else "?"
        lines.append(
            f"  {level:>5} {len(counts):>7,} {len(occupied):>9,} {len(counts) - len(occupied):>7,} "
            f"{small:>7,} {int(occupied.min()):>7,} {int(np.median(occupied)):>7,} "
            f"{int(occupied.max()):>8,} {distance:>14}"
        )
    leaf_counts = codebook.counts[-1]
    total = max(int(leaf_counts.sum()), 1)
    lines += [
        "",
        f"  empty leaves: {int((leaf_counts == 0).sum()):,} of {codebook.num_leaves:,} "
        f"(small nodes have fewer than k={k} members)",
        "",
        f"  top {top} leaves by training members:",
        f"  {'leaf':>7} {'path':<16} {'members':>9} {'share':>7}",
    ]
    for leaf in np.argsort(-leaf_counts, kind="stable")[:top].tolist():
        path = codebook_format.path_label(k, codebook.depth, leaf)
        lines.append(f"  {leaf:>7} {path:<16} {int(leaf_counts[leaf]):>9,} {leaf_counts[leaf] / total:>7.2%}")
    return "\n".join(lines)


def run_collection(job: CollectionRun) -> CollectionResult:
    """The stage's run: the codebook fitted unless current, its subtrees on the command's executor."""
    stats = run(job.cfg, job.work_dir, job.executor, force=job.options["force"], quiet=job.quiet)
    if stats.get("skipped"):
        return CollectionResult("the codebook is current", [f"kmeans: the codebook is current ({stats['codebook']})"])
    return CollectionResult("codebook fitted", [json.dumps(stats, indent=2, default=str)])
