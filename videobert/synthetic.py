"""Synthetic align shards and codebook in which the video predicts the text, for the trainer's tests and
benchmark: each verb and each noun owns a visual word, and a segment's visual tokens are mostly the words
of its sentence's verb and noun. A model that learns from video beats the text-only prior.

Written as the pipeline writes them: `DIR/align/part-NNNNN.parquet` (schemas.ALIGN), `DIR/kmeans/`
(schemas.codebook) and a manifest of the synthetic videos, with completion records that say they were made
here (no upstream stages, so no lineage beyond their own bytes); plus `DIR/synthetic/` with verbs.txt, nouns.txt
and labels.csv (video_id, segment_index, verb, noun) for `eval zero-shot`."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pyarrow as pa

import schemas
import schemas.codebook as codebook_format
from pipeline import storage, visual_words
from pipeline.engine import lineage
from pipeline.engine.manifest import write_manifest_table
from pipeline.engine.workdir import WorkDir
from pipeline.tokenizer import encode
from schemas.metadata import Provenance

VERBS = ("cut", "mix", "pour", "fry")
NOUNS = ("onion", "egg", "rice", "sauce")
SENTENCE = "now let me show you how to {verb} the {noun}"
# the benchmark's wordings (bench_learning.py): training videos say one of TRAIN_WORDINGS, validation and
# test videos one of HELD_OUT_WORDINGS, so that no held-out sentence is a copy of a trained one (and none is
# the paper's zero-shot template)
TRAIN_WORDINGS = (
    "now {verb} the {noun}",
    "next we {verb} the {noun}",
    "we are going to {verb} the {noun}",
    "{verb} the {noun} like this",
    "and then you {verb} the {noun}",
    "let me {verb} the {noun} for you",
)
HELD_OUT_WORDINGS = (
    "time to {verb} the {noun}",
    "go ahead and {verb} the {noun}",
    "first you {verb} the {noun}",
    "we will {verb} the {noun} here",
)
# (verb, noun) pairs only validation and test videos show: each word is trained on, never this combination
HELD_OUT_PAIRS = ((0, 0), (1, 1), (2, 2), (3, 3))
DEPTH, K = 2, 5  # 25 leaves: 4 verb words, 4 noun words, the 17 left over are empty
MADE_BY = "videobert.synthetic"


def write_synthetic(
    work_dir: Path,
    tokenizer,
    *,
    videos: int = 24,
    segments_per_video: int = 6,
    videos_per_shard: int = 6,
    tokens_per_segment: int = 8,
    video_only_share: float = 0.2,
    noise: float = 0.1,
    seed: int = 0,
    split_shares: tuple[float, float] | None = None,
    wordings: tuple[str, ...] = (SENTENCE,),
    held_out_wordings: tuple[str, ...] | None = None,
    held_out_pairs: tuple[tuple[int, int], ...] = (),
) -> dict:
    """Write the shards, the codebook and the label files; returns their paths and counts. Verb v owns
    visual word v and noun n word len(VERBS) + n; a segment's visual tokens alternate its verb's and its
    noun's word, each replaced by a random used word with probability `noise`. A sentence is one of
    `wordings`, drawn per segment. With `split_shares` (validation, test), DIR/synthetic/splits.csv gives each
    video's split (`train.splits`); their videos say `held_out_wordings` (default: `wordings`), and only they
    show `held_out_pairs` (verb index, noun index)."""
    work_dir = WorkDir(work_dir).root
    rng = np.random.default_rng(seed)
    splits = split_of_videos(videos, split_shares, seed) if split_shares else ["train"] * videos
    used_words = len(VERBS) + len(NOUNS)
    counts = np.zeros(K**DEPTH, dtype=np.int64)
    counts[:used_words] = 10
    centroids = [
        rng.standard_normal((K**level, schemas.FEATURE_DIM)).astype(np.float32) for level in range(1, DEPTH + 1)
    ]
    level_counts = [counts.reshape(K, K).sum(axis=1), counts]
    work = WorkDir(work_dir)
    _, codebook_sha = visual_words.save(
        codebook_format.Codebook(DEPTH, K, centroids, level_counts, {"synthetic": True}), work.kmeans_folder
    )
    lineage.write_record(
        work,
        "kmeans",
        None,
        lineage.external_lineage(MADE_BY),
        {**lineage.output_entry(work, work.codebook), **lineage.output_entry(work, work.codebook_sidecar)},
        {"sha256": codebook_sha},
    )

    record_no_copies(work, MADE_BY)

    rows, labels = [], []
    for video in range(videos):
        video_id = f"synthetic{video:04d}"
        held_out = splits[video] != "train"
        for segment_index in range(segments_per_video):
            verb, noun = int(rng.integers(len(VERBS))), int(rng.integers(len(NOUNS)))
            while not held_out and (verb, noun) in held_out_pairs:
                verb, noun = int(rng.integers(len(VERBS))), int(rng.integers(len(NOUNS)))
            visual_ids = np.full(tokens_per_segment, verb, dtype=np.int32)
            visual_ids[1::2] = len(VERBS) + noun
            noisy = rng.random(tokens_per_segment) < noise
            visual_ids[noisy] = rng.integers(used_words, size=int(noisy.sum()))
            start_s = segment_index * 1.5 * tokens_per_segment
            row = {
                "video_id": video_id,
                "segment_index": segment_index,
                "start_s": start_s,
                "end_s": start_s + 1.5 * tokens_per_segment,
                "visual_ids": visual_ids.tolist(),
                "language": "en",
            }
            if rng.random() < video_only_share:
                rows.append(dict(row, kind="video_only", text=None, text_ids=[]))
                continue
            said = held_out_wordings if held_out and held_out_wordings else wordings
            text = (
                said[int(rng.integers(len(said)))].format(verb=VERBS[verb], noun=NOUNS[noun])
                if len(said) > 1
                else said[0].format(verb=VERBS[verb], noun=NOUNS[noun])
            )
            rows.append(dict(row, kind="text_video", text=text, text_ids=encode(tokenizer, text)))
            labels.append(
                {"video_id": video_id, "segment_index": segment_index, "verb": VERBS[verb], "noun": NOUNS[noun]}
            )

    shards = 0
    manifest_rows = []
    for shard_index, first in enumerate(range(0, videos * segments_per_video, videos_per_shard * segments_per_video)):
        part = rows[first : first + videos_per_shard * segments_per_video]
        table = schemas.conform(pa.Table.from_pylist(part), schemas.ALIGN)
        storage.write_parquet(
            work.part("align", shard_index),
            table,
            Provenance(
                stage="align",
                schema=schemas.ALIGN.tag,
                codebook_sha256=codebook_sha,
                visual_vocab_size=K**DEPTH,
                extra={"synthetic": "true"},
            ),
        )
        lineage.record_external(work, "align", shard_index, MADE_BY, {"rows": len(part)})
        manifest_rows += [
            {
                "video_id": video_id,
                "uri": f"synthetic://{video_id}",
                "bytes": None,
                "transcript_uri": None,
                "shard": shard_index,
            }
            for video_id in sorted({row["video_id"] for row in part})
        ]
        shards += 1
    write_manifest_table(
        work,
        pa.Table.from_pylist(manifest_rows, schema=schemas.MANIFEST.arrow),
        lineage.external_lineage(MADE_BY),
        Provenance(stage="manifest", schema=schemas.MANIFEST.tag),
    )

    folder = work.root / "synthetic"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "verbs.txt").write_text("\n".join(VERBS) + "\n")
    (folder / "nouns.txt").write_text("\n".join(NOUNS) + "\n")
    with open(folder / "labels.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["video_id", "segment_index", "verb", "noun"])
        writer.writeheader()
        writer.writerows(labels)
    result = {}
    if split_shares:
        with open(folder / "splits.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["video_id", "split"])
            writer.writerows((f"synthetic{video:04d}", split) for video, split in enumerate(splits))
        result["splits"] = str(folder / "splits.csv")
    return {
        **result,
        "shards": shards,
        "segments": len(rows),
        "labelled": len(labels),
        "verbs": str(folder / "verbs.txt"),
        "nouns": str(folder / "nouns.txt"),
        "labels": str(folder / "labels.csv"),
    }


def split_of_videos(count: int, shares: tuple[float, float], seed: int) -> list[str]:
    """Each video's split: a seeded permutation's first share[0] of the videos are validation, the next
    share[1] test (at least one each), the rest train."""
    order = np.random.default_rng([seed, 11]).permutation(count)
    splits = ["train"] * count
    first = 0
    for name, share in zip(("validation", "test"), shares):
        size = max(1, round(share * count))
        for index in order[first : first + size]:
            splits[index] = name
        first += size
    return splits


def record_no_copies(work_dir, made_by: str) -> None:
    """An empty near-duplicate group table with its record, for shards made outside the stages: training
    reads the dedup stage's groups, and these videos have no copies."""
    work = WorkDir(work_dir)
    written = storage.write_parquet(
        work.dedup_groups,
        schemas.empty(schemas.DEDUP_GROUPS),
        Provenance(stage="dedup", schema=schemas.DEDUP_GROUPS.tag),
    )
    lineage.write_record(
        work,
        "dedup",
        None,
        lineage.external_lineage(made_by),
        lineage.output_entry(work, work.dedup_groups, 0, written),
        {"groups": 0, "copies": 0},
    )
