"""quantize: each clip's visual word, the codebook leaf its feature descends to (run.py). Its settings are
the kmeans section's: the codebook it descends."""

from __future__ import annotations

from collections import Counter

import schemas
from pipeline.contract import Invalid, Part, Stage


def features_tokenised_once(part: Part) -> None:
    """quantize: every clip of the features tokenised once, each token a leaf of the codebook."""
    from pipeline import storage

    rows = storage.read_table(part.path, columns=["video_id", "clip_index", "token"]).to_pylist()
    features = part.sibling("features")
    if features.exists():
        feature_rows = storage.read_table(features, columns=["video_id", "clip_index"]).to_pylist()
        if Counter((r["video_id"], r["clip_index"]) for r in feature_rows) != Counter(
            (r["video_id"], r["clip_index"]) for r in rows
        ):
            raise Invalid(f"{part.path}: its clips differ from {features} (every feature clip must be tokenised once)")
    for row_number, row in enumerate(rows):
        if row["token"] < 0 or (part.visual_vocab is not None and row["token"] >= part.visual_vocab):
            raise Invalid(f"{part.path}: row {row_number}: token {row['token']} outside [0, {part.visual_vocab})")


STAGE = Stage(
    "quantize",
    "each clip's visual word (the codebook leaf its feature descends to)",
    reads=("features", "kmeans"),
    config_sections=("kmeans",),
    per_shard=True,
    writes="quantize/part-*.parquet",
    tables={"": schemas.QUANTIZE},
    run="stages.quantize.run:run_shard",
    ray_roles={"quantize": {"num_cpus": 1}},
    checks={"": ("pipeline.table_checks:clips_in_order", "stages.quantize:features_tokenised_once")},
    card_configs={"": "quantize"},
)
