"""kmeans: the visual-word codebook, a k-means tree fit top-down on a seeded sample of clip features.

A global stage (one output for the whole collection, not one per shard):
1. sample at most `kmeans.max_fit_vectors` features evenly across the features shards (every manifest
   shard current, each part checked against its sha256), never a clip the quality stage excludes (black,
   frozen, ...: `quality.exclude`), streamed into a float16 .npy under DIR/kmeans that the fit reads
   memory-mapped (memory stays bounded whatever the sample size);
2. split the sample into k clusters with faiss (k-means++ initialisation), then each cluster's members
   into k again, down to `kmeans.depth` levels: k**depth leaves, the visual words;
3. write DIR/kmeans/codebook.safetensors and its JSON sidecar (schemas/codebook.py is the format), then
   the completion record naming the features parts it was fit on; a later run refits when they or the
   kmeans config change.

The tree is fit in tree.py. The subtrees below level 1 are independent: each is one `executor.map` task
reading the sample file from the work dir. Each node's seed comes from (seed, level, row), so the tree is
the same for any number of workers. A node with fewer members than k cannot be split k ways: each member
becomes one child and the other children stay empty (count 0, never chosen during descent); descendants of
an empty node are empty."""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import time
from pathlib import Path

import numpy as np

import schemas.codebook as codebook_format
from pipeline import storage, visual_words
from pipeline.config import Config
from pipeline.contract import CollectionResult, CollectionRun
from pipeline.engine import lineage
from pipeline.engine.workdir import WorkDir
from schemas import metadata
from stages.kmeans.tree import fit_tree, threads_per_task

SAMPLE_NAME = "fit-sample.npy"
READ_BATCH_ROWS = 8_192
# a codebook is too large for its data when more than half its leaves cannot get a member; the suggested
# size leaves this many fit clips per leaf
SUGGESTED_CLIPS_PER_LEAF = 2
SUGGESTED_MIN_K = 4

log = logging.getLogger("pipeline.kmeans")


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


def usable_rows(features: Path, quality: Path | None) -> np.ndarray | None:
    """The row numbers of a features part whose clips the quality stage did not exclude (None: every row).
    The two parts hold the same clips in the same order (video, clip): checked, not assumed."""
    if quality is None:
        return None
    keys = storage.read_table(features, columns=["video_id", "clip_index"])
    judged = storage.read_table(quality, columns=["video_id", "clip_index", "excluded"])
    if keys["video_id"] != judged["video_id"] or keys["clip_index"] != judged["clip_index"]:
        raise ValueError(f"{quality} does not judge the clips of {features}: run the quality stage again")
    return np.flatnonzero(~judged["excluded"].to_numpy(zero_copy_only=False))


def write_fit_sample(
    shards: list[tuple[int, Path]],
    max_vectors: int,
    seed: int,
    destination: Path,
    *,
    quiet: bool = False,
    quality: dict[int, Path] | None = None,
) -> dict:
    """Stream a seeded, shard-proportional sample of features into a float16 .npy at `destination`.
    Non-finite rows are dropped (counted); the file's first `sample_size` rows are the sample. With
    `quality` (shard -> its quality part), the clips it excludes are never drawn (counted).

    The file is written with plain sequential writes, never through a writable memory map: on a full disk
    a write fails with ENOSPC (a one-line error), where a store into a mapped page would kill the process
    with SIGBUS and no message."""
    from pipeline.progress import Progress

    row_counts = [storage.parquet_file(path).metadata.num_rows for _, path in shards]
    # the rows each shard may give (one shard's list at a time: memory stays bounded by a shard)
    quality = quality or {}
    usable_counts = [
        rows if shard not in quality else len(usable_rows(path, quality[shard]))
        for (shard, path), rows in zip(shards, row_counts)
    ]
    if not sum(usable_counts) and sum(row_counts):
        raise ValueError(
            f"the quality stage excludes every one of the {sum(row_counts):,} clips (quality.exclude): nothing is "
            f"left to fit the codebook on; keep some with --set 'quality.exclude=[]' (or fewer reasons)"
        )
    quotas = sample_quotas(usable_counts, max_vectors)
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
            usable = usable_rows(path, quality[shard_index]) if shard_index in quality else None
            drawn = np.random.default_rng([seed, shard_index]).choice(
                rows if usable is None else len(usable), quota, replace=False
            )
            chosen = np.sort(drawn if usable is None else usable[drawn])
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
        "quality_excluded": sum(row_counts) - sum(usable_counts),
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
        quality = {shard: checker.verified("quality", shard, work.part("quality", shard)) for shard, _ in shards}
        sample_stats = write_fit_sample(
            shards, kcfg.max_fit_vectors, kcfg.seed, sample_path, quiet=quiet, quality=quality
        )
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
        "quality_excluded": sample_stats["quality_excluded"],
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
