"""quantize: each clip's visual word, the leaf of the k-means tree its feature descends to.

Per shard: read the features, refuse them when their provenance (S3D weights, fps, clip length) differs
from the codebook's (tokens from mixed feature spaces are silently wrong), descend the tree
(schemas.codebook.descend: the nearest non-empty centroid at each level), and write one token per clip."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from threadpoolctl import threadpool_limits

import schemas.codebook as codebook_format
from pipeline import visual_words
from pipeline.contract import ShardContext, ShardResult
from pipeline.file_cache import FileCache
from schemas import metadata
from schemas.metadata import Provenance

_CODEBOOKS: FileCache[codebook_format.Codebook] = FileCache(max_entries=1)


def load_codebook(ctx: ShardContext) -> codebook_format.Codebook:
    """The codebook, checked against its record and loaded once per process while its file is unchanged
    (a worker runs many shards)."""
    path = ctx.work.codebook

    def load() -> codebook_format.Codebook:
        ctx.lineage.verified("kmeans", None, path)
        return visual_words.load(path)

    return _CODEBOOKS.get(path, load)


def run_shard(ctx: ShardContext) -> ShardResult:
    codebook = load_codebook(ctx)
    features = ctx.read_input("features")
    codebook_hash = codebook.info.get("feature_provenance_hash")
    if features.num_rows:
        codebook_format.check_feature_provenance(
            codebook,
            ctx.shard_index,
            metadata.read(features.schema).feature_provenance_hash,
            "refit the codebook (kmeans --force) or recompute these features with the codebook's S3D weights "
            "and decode settings",
        )
    dim = features.schema.field("feature").type.list_size
    if features.num_rows and dim != codebook.dim:
        raise ValueError(f"features part {ctx.shard_index} has {dim}-d features, the codebook {codebook.dim}-d")

    features = features.sort_by([("video_id", "ascending"), ("clip_index", "ascending")])
    vectors = features["feature"].combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
    # descent multiplies by k-column blocks: BLAS threads cost more in synchronisation than they add
    # there (benchmarks/bench_kmeans.py measures both), and the executor already runs a shard per core
    with threadpool_limits(limits=1, user_api="blas"):
        tokens = (
            visual_words.descend(codebook, vectors).astype(np.int32) if len(vectors) else np.empty(0, dtype=np.int32)
        )
    table = pa.table(
        {
            "video_id": features["video_id"],
            "clip_index": features["clip_index"],
            "start_s": features["start_s"],
            "end_s": features["end_s"],
            "token": pa.array(tokens, type=pa.int32()),
        }
    )
    return ShardResult(
        tables={"": table},
        stats={
            "clips": features.num_rows,
            "videos_with_clips": len(set(features["video_id"].to_pylist())),
            "distinct_tokens": int(len(np.unique(tokens))),
        },
        provenance=Provenance(
            codebook_sha256=codebook.info.get("sha256"),
            feature_provenance_hash=codebook_hash,
            codebook_depth=codebook.depth,
            codebook_k=codebook.k,
            visual_vocab_size=codebook.num_leaves,
        ),
    )
