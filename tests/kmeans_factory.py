"""Work dirs with hand-made features shards (for the kmeans and quantize tests), and planted hierarchies."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
from work_factory import MADE_BY, write_curation_of, write_manifest_rows, write_part

import schemas
from pipeline.engine import lineage
from pipeline.engine.workdir import WorkDir

PROVENANCE = {"weights": "kinetics400", "fps": 20.0, "clip_frames": 30}
PROVENANCE_HASH = "a1b2c3d4e5f60718"


def planted_hierarchy(
    groups: int = 12, subgroups: int = 12, per_subgroup: int = 8, dim: int = schemas.FEATURE_DIM, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectors in `groups` well-separated groups of `subgroups` separated subgroups each, shuffled.
    Returns (vectors float16, group of each row, subgroup of each row). Squared distances: between groups
    ~2*dim*9, between subgroups of a group ~2*dim*0.0025, within a subgroup ~2*dim*4e-6."""
    rng = np.random.default_rng(seed)
    group_centres = rng.normal(0, 3.0, (groups, dim))
    subgroup_offsets = rng.normal(0, 0.05, (groups, subgroups, dim))
    group = np.repeat(np.arange(groups), subgroups * per_subgroup)
    subgroup = np.tile(np.repeat(np.arange(subgroups), per_subgroup), groups)
    vectors = group_centres[group] + subgroup_offsets[group, subgroup] + rng.normal(0, 0.002, (len(group), dim))
    order = rng.permutation(len(group))
    return vectors[order].astype(np.float16), group[order], subgroup[order]


def features_table(vectors: np.ndarray, video_prefix: str, clips_per_video: int = 50) -> pa.Table:
    n, dim = vectors.shape
    clip = np.arange(n) % clips_per_video
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float16).reshape(-1), type=pa.float16())
    return schemas.conform(
        pa.table(
            {
                "video_id": [f"{video_prefix}{i // clips_per_video:03d}" for i in range(n)],
                "clip_index": pa.array(clip, type=pa.int32()),
                "start_s": clip * 1.5,
                "end_s": clip * 1.5 + 1.5,
                "feature": pa.FixedSizeListArray.from_arrays(flat, dim),
            }
        ),
        schemas.FEATURES,
    )


def write_features_shard(
    work_dir: Path,
    shard_index: int,
    vectors: np.ndarray,
    *,
    provenance_hash: str = PROVENANCE_HASH,
    clips_per_video: int = 50,
) -> pa.Table:
    """A features part with its provenance metadata and completion record."""
    table = features_table(vectors, f"s{shard_index}v", clips_per_video)
    write_part(
        work_dir,
        "features",
        shard_index,
        table,
        schemas.FEATURES,
        record={"clips": len(vectors)},
        feature_provenance=json.dumps(PROVENANCE, sort_keys=True),
        feature_provenance_hash=provenance_hash,
    )
    write_curation_of(work_dir, shard_index, table)
    return table


def write_manifest(work_dir: Path, tables: dict[int, pa.Table]) -> None:
    """The manifest of these features parts; a part without clips stands for a shard whose one video
    gave none (it failed)."""
    write_manifest_rows(
        work_dir,
        [
            {
                "video_id": video_id,
                "uri": f"/videos/{video_id}.mp4",
                "bytes": 1,
                "transcript_uri": None,
                "shard": shard_index,
            }
            for shard_index, table in tables.items()
            for video_id in sorted(set(table["video_id"].to_pylist())) or [f"s{shard_index}v_failed"]
        ],
    )


def make_work_dir(work_dir: Path, shards: list[np.ndarray], **kwargs) -> dict[int, pa.Table]:
    tables = {index: write_features_shard(work_dir, index, vectors, **kwargs) for index, vectors in enumerate(shards)}
    write_manifest(work_dir, tables)
    return tables


def pin_codebook(work_dir: Path) -> None:
    """Record the fitted codebook as made outside the stages: it stays current whatever the features
    parts become (for tests of what a reader of mismatched features does)."""
    work = WorkDir(work_dir)
    lineage.write_record(
        work,
        "kmeans",
        None,
        lineage.external_lineage(MADE_BY),
        {**lineage.output_entry(work, work.codebook), **lineage.output_entry(work, work.codebook_sidecar)},
        {},
    )


def brute_force_descent(
    centroids: list[np.ndarray], counts: list[np.ndarray], k: int, vector: np.ndarray
) -> tuple[list[int], list[float]]:
    """The tree descent written out plainly in float64: at each level, the nearest child with members.
    Returns the chosen row per level and the margin (second best minus best distance) at each level."""
    node, path, margins = 0, [], []
    vector = vector.astype(np.float64)
    for level_centroids, level_counts in zip(centroids, counts):
        candidates = [node * k + child for child in range(k) if level_counts[node * k + child] > 0]
        distances = sorted(
            (float(((level_centroids[row].astype(np.float64) - vector) ** 2).sum()), row) for row in candidates
        )
        node = distances[0][1]
        margins.append(distances[1][0] - distances[0][0] if len(distances) > 1 else float("inf"))
        path.append(node)
    return path, margins
