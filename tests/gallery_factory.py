"""A small finished work dir, written directly (no pipeline run), for the gallery and report tests.

Tree: depth 2, k 3 (9 leaves); leaf 8 is empty. Each clip's feature is its leaf's centroid plus a little
noise, and each level-1 node has one clip placed exactly on its centroid (its nearest clip, distance 0).
Thumbnails are solid JPEGs, one colour per leaf, so a picture says which leaf its clip fell in.

Videos: shard 0 holds v0 (12 clips, English speech, two sentences) and v1 (10 clips, no audio); shard 1
holds v2 (9 clips, Spanish speech: no text segments) and v3 (could not be decoded: an error row)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
from PIL import Image
from work_factory import MADE_BY, clip_measures, write_manifest_rows, write_part

import schemas
import schemas.codebook as codebook_format
from pipeline import storage, visual_words
from pipeline.engine import lineage
from pipeline.engine.workdir import WorkDir
from schemas.metadata import Provenance

K, DEPTH = 3, 2
EMPTY_LEAF = 8
PROVENANCE_HASH = "feedfacecafebeef"
THUMBNAIL_SIZE = 48
CLIPS = {"v0": 12, "v1": 10, "v2": 9, "v3": 0}
SHARD_OF = {"v0": 0, "v1": 0, "v2": 1, "v3": 1}
SENTENCES = {
    "v0": [("cut the onions into thin slices.", 0.0, 6.0), ("fry them in oil.", 6.0, 12.0)],
    "v2": [("corta la cebolla.", 0.0, 4.5)],
}
# the clip of each level-1 node that lies exactly on its centroid: (video, clip_index)
EXACT_CLIP = {0: ("v0", 0), 1: ("v1", 1), 2: ("v2", 2)}


def leaf_colour(leaf: int) -> tuple[int, int, int]:
    return (40 + 25 * leaf, 200 - 20 * leaf, (97 * leaf) % 256)


def _jpeg(colour: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (THUMBNAIL_SIZE, THUMBNAIL_SIZE), colour).save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def _leaf_of(video_id: str, clip_index: int, alone: str | None = None) -> int:
    """`alone`: the video whose clips fill its level-1 node (that of its EXACT_CLIP) by themselves."""
    for node, key in EXACT_CLIP.items():
        if key == (video_id, clip_index):
            return node * K  # its first child; the feature sits on the parent's centroid
    own = {video: node for node, (video, _) in EXACT_CLIP.items()}.get(alone)
    nodes = [node for node in range(K) if alone is None or (node == own) == (video_id == alone)]
    used_leaves = [leaf for node in nodes for leaf in range(node * K, node * K + K) if leaf != EMPTY_LEAF]
    return used_leaves[(sorted(CLIPS).index(video_id) * 5 + clip_index) % len(used_leaves)]


def make_codebook(seed: int = 0, alone: str | None = None) -> codebook_format.Codebook:
    rng = np.random.default_rng(seed)
    dim = schemas.FEATURE_DIM
    # float16-representable centroids: a clip can then lie exactly on one
    level1 = rng.normal(0, 3.0, (K, dim)).astype(np.float16).astype(np.float32)
    level2 = (np.repeat(level1, K, axis=0) + rng.normal(0, 0.3, (K * K, dim))).astype(np.float16).astype(np.float32)
    leaves = [_leaf_of(video, clip, alone) for video, n in CLIPS.items() for clip in range(n)]
    leaf_counts = np.bincount(leaves, minlength=K * K).astype(np.int64)
    level2[EMPTY_LEAF] = level1[EMPTY_LEAF // K]  # an empty node keeps its parent's centroid
    info = {
        "sample_size": len(leaves),
        "feature_provenance_hash": PROVENANCE_HASH,
        "feature_provenance": {"weights": "random(seed=0) - NOT pretrained"},
        "empty_nodes": [0, int((leaf_counts == 0).sum())],
        "empty_leaves": int((leaf_counts == 0).sum()),
    }
    return codebook_format.Codebook(
        depth=DEPTH,
        k=K,
        centroids=[level1, level2],
        counts=[leaf_counts.reshape(K, K).sum(axis=1), leaf_counts],
        info=info,
    )


def _feature(codebook, video_id: str, clip_index: int, rng, alone: str | None = None) -> np.ndarray:
    for node, key in EXACT_CLIP.items():
        if key == (video_id, clip_index):
            return codebook.centroids[0][node]
    leaf = _leaf_of(video_id, clip_index, alone)
    return codebook.centroids[1][leaf] + rng.normal(0, 0.01, codebook.dim)


def _done(work_dir: Path, stage: str, shard: int, seconds: float, **stats) -> None:
    lineage.record_external(
        work_dir, stage, shard, MADE_BY, {"seconds": seconds, "finished_at": 1000.0 + shard * seconds, **stats}
    )


def make_work_dir(
    work_dir: Path,
    *,
    stages: tuple[str, ...] = ("decode", "features", "kmeans", "quantize", "asr", "align"),
    v3_too_short: bool = False,
    codebook_warnings: list[str] | None = None,
    alone: str | None = None,
) -> Path:
    """Write the outputs of `stages` (each needs the ones before it) and return the work dir. `v3_too_short`:
    v3 is too short for a clip (status too_short, no error row) instead of undecodable; `codebook_warnings`:
    the codebook sidecar's `warnings`; `alone`: a video whose clips alone fill a level-1 node, decoded only in
    part (status partial), as a broken video's test pattern does."""
    work_dir = Path(work_dir)
    rng = np.random.default_rng(1)
    codebook = make_codebook(alone=alone)
    write_manifest_rows(
        work_dir,
        [
            {
                "video_id": video,
                "uri": f"/videos/{video}.mp4",
                "bytes": 1000,
                "transcript_uri": None,
                "shard": SHARD_OF[video],
            }
            for video in sorted(CLIPS)
        ],
    )
    for shard in (0, 1):
        videos = [video for video in sorted(CLIPS) if SHARD_OF[video] == shard]
        clips = [
            {"video_id": video, "clip_index": clip, "start_s": clip * 1.5, "end_s": clip * 1.5 + 1.5}
            for video in videos
            for clip in range(CLIPS[video])
        ]
        if "decode" in stages:
            rows = [
                dict(
                    clip,
                    n_real_frames=30,
                    padded=False,
                    thumbnail_jpeg=_jpeg(leaf_colour(_leaf_of(clip["video_id"], clip["clip_index"], alone))),
                    **clip_measures(clip["video_id"], clip["clip_index"]),
                )
                for clip in clips
            ]
            write_part(
                work_dir,
                "decode",
                shard,
                pa.Table.from_pylist(rows, schema=schemas.DECODE_CLIPS.arrow),
                schemas.DECODE_CLIPS,
            )
            failed = "too_short" if v3_too_short else "error"
            video_rows = [
                {
                    "video_id": video,
                    "uri": f"/videos/{video}.mp4",
                    "status": "partial" if video == alone else "ok" if CLIPS[video] else failed,
                    "n_clips": CLIPS[video],
                }
                for video in videos
            ]
            write_part(
                work_dir,
                "decode",
                shard,
                pa.Table.from_pylist(video_rows, schema=schemas.DECODE_VIDEOS.arrow),
                schemas.DECODE_VIDEOS,
                table_name="videos",
            )
            errors = (
                [
                    {
                        "video_id": "v3",
                        "stage": "decode",
                        "error_type": "VideoDecodeError",
                        "message": "/videos/v3.mp4: Invalid data found when processing input",
                    }
                ]
                if shard == 1 and not v3_too_short
                else []
            )
            storage.write_parquet(
                WorkDir(work_dir).errors("decode", shard),
                pa.Table.from_pylist(errors, schema=schemas.ERRORS.arrow),
                Provenance(stage="decode"),
            )
            _done(work_dir, "decode", shard, 2.0, videos=len(videos), clips=len(clips), errors=len(errors))
        if "features" in stages:
            vectors = np.stack([_feature(codebook, c["video_id"], c["clip_index"], rng, alone) for c in clips])
            flat = pa.array(vectors.astype(np.float16).reshape(-1), type=pa.float16())
            table = pa.Table.from_pylist(clips).append_column(
                "feature", pa.FixedSizeListArray.from_arrays(flat, schemas.FEATURE_DIM)
            )
            write_part(work_dir, "features", shard, table, schemas.FEATURES, feature_provenance_hash=PROVENANCE_HASH)
            _done(work_dir, "features", shard, 8.0, videos=len(videos), clips=len(clips))
        if "quantize" in stages:
            tokens = visual_words.descend(codebook, vectors.astype(np.float16))
            table = pa.Table.from_pylist(clips).append_column("token", pa.array(tokens, pa.int32()))
            write_part(work_dir, "quantize", shard, table, schemas.QUANTIZE)
            _done(work_dir, "quantize", shard, 0.5, videos=len(videos), clips=len(clips))
        if "asr" in stages:
            rows = []
            for video in videos:
                sentences = [
                    {"text": text, "start_s": start, "end_s": end} for text, start, end in SENTENCES.get(video, [])
                ]
                rows.append(
                    {
                        "video_id": video,
                        "status": "no_audio" if video in ("v1", "v3") else "ok",
                        "source": "tiny.en",
                        "language": "es" if video == "v2" else "en",
                        "language_prob": 0.9,
                        "audio_s": CLIPS[video] * 1.5,
                        "sentences": sentences,
                        "words": [],
                    }
                )
            write_part(work_dir, "asr", shard, pa.Table.from_pylist(rows, schema=schemas.ASR.arrow), schemas.ASR)
            _done(work_dir, "asr", shard, 3.0, videos=len(videos), audio_s=sum(r["audio_s"] for r in rows))
        if "align" in stages:
            token_of = {(c["video_id"], c["clip_index"]): int(t) for c, t in zip(clips, tokens)}
            rows = []
            for video in videos:
                # v0: two sentences of four clips each, then four clips without text; others: no text
                spans = (
                    [(0, 4, SENTENCES["v0"][0][0]), (4, 8, SENTENCES["v0"][1][0]), (8, 12, None)]
                    if video == "v0"
                    else [(0, CLIPS[video], None)]
                    if CLIPS[video]
                    else []
                )
                for index, (first, last, text) in enumerate(spans):
                    rows.append(
                        {
                            "video_id": video,
                            "segment_index": index,
                            "start_s": first * 1.5,
                            "end_s": last * 1.5,
                            "kind": "text_video" if text else "video_only",
                            "text": text,
                            "text_ids": list(range(100, 100 + len(text.split()))) if text else [],
                            "visual_ids": [token_of[(video, clip)] for clip in range(first, last)],
                            "language": "es" if video == "v2" else "en",
                        }
                    )
            write_part(work_dir, "align", shard, pa.Table.from_pylist(rows, schema=schemas.ALIGN.arrow), schemas.ALIGN)
            _done(work_dir, "align", shard, 1.0, videos=len(videos), clips=len(clips), segments=len(rows))
    if "kmeans" in stages:
        work = WorkDir(work_dir)
        if codebook_warnings is not None:
            codebook.info["warnings"] = list(codebook_warnings)
        visual_words.save(codebook, work.kmeans_folder)
        lineage.write_record(
            work,
            "kmeans",
            None,
            lineage.external_lineage(MADE_BY),
            {**lineage.output_entry(work, work.codebook), **lineage.output_entry(work, work.codebook_sidecar)},
            {},
        )
    return work_dir


def expected_text_coverage() -> dict[str, float]:
    """Share of each video's clips that lie inside a text segment."""
    return {"v0": 8 / 12, "v1": 0.0, "v2": 0.0}
