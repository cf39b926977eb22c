"""`python -m pipeline validate DIR`: every output file against its schema, and the invariants across
files (every clip of the features tokenised once, tokens and ids inside their vocabularies, times in
order, every tokenised clip in exactly one training segment). Returns problems, first bad file first."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

import schemas
import schemas.codebook as codebook_format
from pipeline import io

# folder -> (file prefix, schema)
OUTPUTS = [
    ("decode", "part-", schemas.DECODE_CLIPS), ("decode", "videos-part-", schemas.DECODE_VIDEOS),
    ("features", "part-", schemas.FEATURES), ("quantize", "part-", schemas.QUANTIZE),
    ("asr", "part-", schemas.ASR), ("align", "part-", schemas.ALIGN), ("errors", "", schemas.ERRORS),
]


class Invalid(Exception):
    pass


def _check_schema(path: Path, schema: schemas.Schema) -> None:
    found = pq.read_schema(path)
    if not found.remove_metadata().equals(schema.arrow, check_metadata=False):
        expected = {f.name: str(f.type) for f in schema.arrow}
        actual = {f.name: str(f.type) for f in found}
        differences = sorted(set(expected.items()) ^ set(actual.items()))
        raise Invalid(f"{path}: schema differs from {schema.tag}: {differences[:4]}")
    tag = io.schema_metadata(found).get("schema")
    if tag is not None and tag != schema.tag:
        raise Invalid(f"{path}: written as {tag}, this code reads {schema.tag}")


def _times_in_order(path: Path, rows: list[dict], key: str) -> None:
    previous: dict[str, float] = {}
    for row_number, row in enumerate(rows):
        if row["start_s"] > row["end_s"] + 1e-9:
            raise Invalid(f"{path}: row {row_number}: start_s {row['start_s']} > end_s {row['end_s']}")
        video = row["video_id"]
        if video in previous and row["start_s"] < previous[video] - 1e-9:
            raise Invalid(f"{path}: row {row_number}: {key} times go backwards in video {video}")
        previous[video] = row["start_s"]


def _visual_vocab_size(work_dir: Path) -> int | None:
    sidecar = codebook_format.codebook_dir(work_dir) / codebook_format.SIDECAR_NAME
    if not sidecar.exists():
        return None
    info = json.loads(sidecar.read_text())
    return int(info["k"]) ** int(info["depth"])


def _check_part(work_dir: Path, folder: str, path: Path, visual_vocab: int | None) -> None:
    shard_name = path.name.split("part-")[-1]
    if folder in ("decode", "features", "quantize") and not path.name.startswith("videos-"):
        columns = ["video_id", "clip_index", "start_s", "end_s"] + (["token"] if folder == "quantize" else [])
        rows = pq.read_table(path, columns=columns).to_pylist()
        _times_in_order(path, rows, "clip")
        keys = [(r["video_id"], r["clip_index"]) for r in rows]
        if len(set(keys)) != len(keys):
            duplicate = next(k for k, n in Counter(keys).items() if n > 1)
            raise Invalid(f"{path}: row {keys.index(duplicate)}: clip {duplicate} appears twice")
    if folder == "quantize":
        features = work_dir / "features" / f"part-{shard_name}"
        if features.exists():
            feature_rows = pq.read_table(features, columns=["video_id", "clip_index"]).to_pylist()
            if Counter((r["video_id"], r["clip_index"]) for r in feature_rows) != Counter(keys):
                raise Invalid(f"{path}: its clips differ from {features} (every feature clip must be tokenised once)")
        for row_number, row in enumerate(rows):
            if row["token"] < 0 or (visual_vocab is not None and row["token"] >= visual_vocab):
                raise Invalid(f"{path}: row {row_number}: token {row['token']} outside [0, {visual_vocab})")
    if folder == "asr":
        for row_number, row in enumerate(pq.read_table(path, columns=["video_id", "audio_s", "sentences", "words"]).to_pylist()):
            for kind in ("sentences", "words"):
                last = -1.0
                for item in row[kind]:
                    if item["start_s"] > item["end_s"] + 1e-6 or item["start_s"] < last - 1e-6:
                        raise Invalid(f"{path}: row {row_number}: {kind} times out of order in {row['video_id']}")
                    last = item["start_s"]
    if folder == "align":
        _check_align(work_dir, path, shard_name, visual_vocab)


def _check_align(work_dir: Path, path: Path, shard_name: str, visual_vocab: int | None) -> None:
    table = pq.read_table(path)
    metadata = io.schema_metadata(table.schema)
    text_vocab = int(metadata["tokenizer_vocab_size"]) if metadata.get("tokenizer_vocab_size") else None
    rows = table.to_pylist()
    _times_in_order(path, rows, "segment")
    expected_index: dict[str, int] = {}
    clips_per_video: Counter = Counter()
    for row_number, row in enumerate(rows):
        video = row["video_id"]
        if row["segment_index"] != expected_index.get(video, 0):
            raise Invalid(f"{path}: row {row_number}: segment_index {row['segment_index']} out of order in {video}")
        expected_index[video] = row["segment_index"] + 1
        if row["kind"] not in schemas.SEGMENT_KINDS:
            raise Invalid(f"{path}: row {row_number}: kind {row['kind']!r}")
        if (row["kind"] == "video_only") != (row["text"] is None) or (row["text"] is None) != (not row["text_ids"]):
            raise Invalid(f"{path}: row {row_number}: kind {row['kind']} does not match its text")
        if not row["visual_ids"]:
            raise Invalid(f"{path}: row {row_number}: a segment without visual tokens")
        for token in row["visual_ids"]:
            if token < 0 or (visual_vocab is not None and token >= visual_vocab):
                raise Invalid(f"{path}: row {row_number}: visual id {token} outside [0, {visual_vocab})")
        for token in row["text_ids"]:
            if token < 0 or (text_vocab is not None and token >= text_vocab):
                raise Invalid(f"{path}: row {row_number}: text id {token} outside [0, {text_vocab})")
        clips_per_video[video] += len(row["visual_ids"])
    tokens = work_dir / "quantize" / f"part-{shard_name}"
    if tokens.exists():
        tokenised = Counter(pq.read_table(tokens, columns=["video_id"])["video_id"].to_pylist())
        if tokenised != clips_per_video:
            video = next(v for v in set(tokenised) | set(clips_per_video) if tokenised[v] != clips_per_video[v])
            raise Invalid(f"{path}: video {video} has {clips_per_video[video]} clips in segments but "
                          f"{tokenised[video]} tokenised clips (each must land in exactly one segment)")


def validate_work_dir(work_dir: Path) -> list[str]:
    work_dir = Path(work_dir)
    if not work_dir.is_dir():
        return [f"{work_dir} is not a folder"]
    problems = []
    manifest = work_dir / "manifest" / "manifest.parquet"
    if manifest.exists():
        try:
            _check_schema(manifest, schemas.MANIFEST)
            ids = pq.read_table(manifest, columns=["video_id"])["video_id"].to_pylist()
            if len(set(ids)) != len(ids):
                problems.append(f"{manifest}: duplicate video_id")
        except Invalid as problem:
            problems.append(str(problem))
    visual_vocab = _visual_vocab_size(work_dir)
    for folder, prefix, schema in OUTPUTS:
        for path in sorted((work_dir / folder).glob(f"{prefix}*.parquet")):
            try:
                _check_schema(path, schema)
                _check_part(work_dir, folder, path, visual_vocab)
            except Invalid as problem:
                problems.append(str(problem))
    return problems
