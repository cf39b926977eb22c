"""A work dir of many shards made as the stages make them, without media: each shard's parts are small tables
of each stage's schema (one video of a few clips), and each completion record holds the lineage the stage's
inputs and config give (Lineage.expected), so that `status`, `validate`, `summary` and `report` check it as
they check a real run's. What the growth benchmark and the memory test (tests/test_growth.py) scale to 16x:
the cost of the work dir itself, apart from decoding and models.

    python benchmarks/metadata_collection.py ROOT --shards 1600
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from common import REPO  # noqa: E402, F401  (puts the repository on the path)

import schemas  # noqa: E402
import schemas.codebook as codebook_format  # noqa: E402
from pipeline import registry, storage, visual_words  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.engine import lineage  # noqa: E402
from pipeline.engine.manifest import write_manifest_table  # noqa: E402
from pipeline.engine.runner import output_provenance  # noqa: E402
from pipeline.engine.workdir import WorkDir  # noqa: E402
from schemas.metadata import Provenance  # noqa: E402

CLIPS = 4
SETTINGS = ["kmeans.depth=1", "kmeans.k=2", "features.weights=random", "shards.videos_per_shard=1"]
# the same settings as a command's options: what the commands run on a made work dir are given
SET_OPTIONS = [item for setting in SETTINGS for item in ("--set", setting)]


def config():
    return load_config(None, SETTINGS)


def _clips(video: str) -> list[dict]:
    return [{"video_id": video, "clip_index": i, "start_s": 1.5 * i, "end_s": 1.5 * i + 1.5} for i in range(CLIPS)]


def tables(stage: str, video: str, shard: int, rng) -> dict[str, list[dict]]:
    """One video's rows of each table of `stage`."""
    clips = _clips(video)
    if stage == "decode":
        measures = {"luma_mean": 120.0, "luma_contrast": 40.0, "motion_mean": 5.0, "motion_max": 9.0}
        return {
            "": [
                {
                    **c,
                    "n_real_frames": 30,
                    "padded": False,
                    "thumbnail_jpeg": b"jpeg",
                    **measures,
                    "phashes": [int(v) for v in rng.integers(-(2**62), 2**62, 3)],
                }
                for c in clips
            ],
            "videos": [
                {
                    "video_id": video,
                    "uri": f"/v/{video}.mp4",
                    "status": "ok",
                    "duration_s": 6.0,
                    "decoded_s": 6.0,
                    "n_frames": 120,
                    "n_clips": CLIPS,
                    "width": 256,
                    "height": 256,
                }
            ],
        }
    if stage == "features":
        return {
            "": [{**c, "feature": rng.standard_normal(schemas.FEATURE_DIM).astype(np.float16).tolist()} for c in clips]
        }
    if stage == "shots":
        return {"": [{"video_id": video, "boundary_index": 0, "frame": 60, "time_s": 3.0, "kind": "cut", "score": 0.5}]}
    if stage == "quality":
        return {
            "": [{**c, "flags": [], "excluded": False} for c in clips],
            "quality_videos": [{"video_id": video, "clips": CLIPS, "flagged_clips": 0, "flags": []}],
        }
    if stage == "quantize":
        return {"": [{**c, "token": int(i % 2)} for i, c in enumerate(clips)]}
    if stage == "asr":
        sentence = {"text": "Chop the onion.", "start_s": 0.0, "end_s": 3.0, "avg_word_prob": 0.9, "rejected": None}
        return {
            "": [
                {
                    "video_id": video,
                    "status": "ok",
                    "source": "test",
                    "language": "en",
                    "language_prob": 0.99,
                    "audio_s": 6.0,
                    "sentences": [sentence],
                    "words": [],
                }
            ]
        }
    if stage == "align":
        return {
            "": [
                {
                    "video_id": video,
                    "segment_index": 0,
                    "start_s": 0.0,
                    "end_s": 3.0,
                    "kind": "text_video",
                    "text": "Chop the onion.",
                    "text_ids": [1, 2, 3],
                    "visual_ids": [0, 1],
                    "language": "en",
                },
                {
                    "video_id": video,
                    "segment_index": 1,
                    "start_s": 3.0,
                    "end_s": 6.0,
                    "kind": "video_only",
                    "text": None,
                    "text_ids": [],
                    "visual_ids": [0, 1],
                    "language": "en",
                },
            ]
        }
    raise ValueError(stage)


def make(root: Path, shards: int, seed: int = 0) -> Path:
    """ROOT: a work dir of `shards` shards of one video each, every stage through align current."""
    cfg, work = config(), WorkDir(root)
    rng = np.random.default_rng(seed)
    videos = [f"v{shard:06d}" for shard in range(shards)]
    manifest = pa.Table.from_pylist(
        [
            {
                "video_id": v,
                "uri": f"/v/{v}.mp4",
                "bytes": 1000,
                "content_tag": "mtime:1",
                "transcript_uri": None,
                "shard": shard,
            }
            for shard, v in enumerate(videos)
        ],
        schema=schemas.MANIFEST.arrow,
    )
    write_manifest_table(
        work,
        manifest,
        {"version": lineage.VERSION, "config": __import__("json").loads(cfg.section_json("shards")), "input": "/v"},
        Provenance(stage="manifest", schema=schemas.MANIFEST.tag),
        row_group_size=16,
    )
    checker = lineage.Lineage(work, cfg)

    def per_shard(stage: str) -> None:
        spec = registry.stage(stage)
        for shard, video in enumerate(videos):
            outputs = {}
            for name, rows in tables(stage, video, shard, rng).items():
                schema = spec.tables[name]
                path = work.part(stage, shard, name)
                written = storage.write_parquet(
                    path,
                    pa.Table.from_pylist(rows, schema=schema.arrow),
                    output_provenance(
                        cfg,
                        spec,
                        schema,
                        Provenance(
                            codebook_sha256=codebook_sha,
                            visual_vocab_size=2,
                            codebook_k=2,
                            codebook_depth=1,
                            tokenizer_vocab_size=30522,
                            feature_provenance_hash="f",
                        ),
                    ),
                )
                outputs.update(lineage.output_entry(work, path, len(rows), written))
            errors = work.errors(stage, shard)
            written = storage.write_parquet(errors, schemas.empty(schemas.ERRORS), Provenance(stage=stage))
            outputs.update(lineage.output_entry(work, errors, 0, written))
            lineage.write_record(
                work,
                stage,
                shard,
                checker.expected(stage, shard),
                outputs,
                {"videos": 1, "clips": CLIPS, "seconds": 0.5, "finished_at": 1000.0 + shard},
            )

    codebook_sha = None
    for stage in ("decode", "features", "shots", "quality"):
        per_shard(stage)
    expected = checker.expected("dedup")
    written = storage.write_parquet(
        work.dedup_groups,
        schemas.empty(schemas.DEDUP_GROUPS),
        output_provenance(cfg, registry.stage("dedup"), schemas.DEDUP_GROUPS, Provenance()),
    )
    lineage.write_record(
        work,
        "dedup",
        None,
        expected,
        lineage.output_entry(work, work.dedup_groups, 0, written),
        {"videos": shards, "groups": 0, "copies": 0},
    )
    expected = checker.expected("kmeans")
    centroids = [rng.standard_normal((2, schemas.FEATURE_DIM)).astype(np.float32)]
    codebook = codebook_format.Codebook(1, 2, centroids, [np.array([shards, shards])], {"sample_size": 2 * shards})
    _, codebook_sha = visual_words.save(codebook, work.kmeans_folder)
    lineage.write_record(
        work,
        "kmeans",
        None,
        expected,
        {**lineage.output_entry(work, work.codebook), **lineage.output_entry(work, work.codebook_sidecar)},
        {"sha256": codebook_sha, "sample_size": 2 * shards},
    )
    for stage in ("quantize", "asr", "align"):
        per_shard(stage)
    return root


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--shards", type=int, default=100)
    args = parser.parse_args()
    print(make(args.root, args.shards))
