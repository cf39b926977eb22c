"""`python -m pipeline validate DIR`: the whole chain of a run, file by file, and the invariants across files.

- integrity: every recorded file has the sha256 its completion record gives it, every value of every
  Parquet part is read with its page checksums verified, the codebook matches the sha256 in its sidecar;
- lineage: every record is consistent with the upstream outputs that exist now (with a config, also
  with its values: `validate DIR --config FILE`); stale, corrupt and unrecorded files are named;
- schemas: every part against its schema and version;
- invariants: every clip of the features tokenised once, tokens and ids inside their vocabularies, times
  in order, every tokenised clip in exactly one training segment: the checks each stage's registry record
  names per table (`checks`, the functions below taking a `Part`).

Returns the problems, each naming its file; an empty list means valid."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

import schemas
import schemas.codebook as codebook_format
from pipeline import registry, storage, visual_words
from pipeline.engine.lineage import CorruptFile, InputNotReady, Lineage, explain, read_json, relative
from pipeline.engine.manifest import shard_digests
from pipeline.engine.workdir import WorkDir
from schemas import metadata


class Invalid(Exception):
    pass


def _check_schema(path: Path, schema: schemas.Schema) -> None:
    try:
        found = storage.parquet_file(path).schema_arrow
    except (OSError, pa.ArrowException) as error:
        raise Invalid(f"cannot read {path}: {storage.one_line(error)}") from None
    if not found.remove_metadata().equals(schema.arrow, check_metadata=False):
        expected = {f.name: str(f.type) for f in schema.arrow}
        actual = {f.name: str(f.type) for f in found}
        differences = sorted(set(expected.items()) ^ set(actual.items()))
        raise Invalid(f"{path}: schema differs from {schema.tag}: {differences[:4]}")
    tag = metadata.read(found).schema
    if tag is not None and tag != schema.tag:
        raise Invalid(f"{path}: written as {tag}, this code reads {schema.tag}")


def _finite_times(path: Path, row_number: int, item: dict, what: str, keys=("start_s", "end_s")) -> None:
    """A NaN time passes every order comparison (they are all false): checked first, by name."""
    for key in keys:
        if item.get(key) is not None and not math.isfinite(item[key]):
            raise Invalid(f"{path}: row {row_number}: {what} {key} is {item[key]}, not a finite time")


def _times_in_order(path: Path, rows: list[dict], key: str) -> None:
    previous: dict[str, float] = {}
    for row_number, row in enumerate(rows):
        _finite_times(path, row_number, row, key)
        if row["start_s"] > row["end_s"] + 1e-9:
            raise Invalid(f"{path}: row {row_number}: start_s {row['start_s']} > end_s {row['end_s']}")
        video = row["video_id"]
        if video in previous and row["start_s"] < previous[video] - 1e-9:
            raise Invalid(f"{path}: row {row_number}: {key} times go backwards in video {video}")
        previous[video] = row["start_s"]


def _visual_vocab_size(work: WorkDir) -> int | None:
    try:
        info = read_json(work.codebook_sidecar)
    except CorruptFile:
        return None
    return int(info["k"]) ** int(info["depth"]) if info else None


@dataclass(frozen=True)
class Part:
    """One current part, as the per-table checks a stage's registry record names (`checks`) see it."""
    work: WorkDir
    path: Path
    shard_name: str                  # "00003.parquet": the same shard's part in another folder
    visual_vocab: int | None         # the codebook's leaves, when there is one

    def sibling(self, stage: str, table: str = "") -> Path:
        """The same shard's part of another stage's table."""
        return self.work.data_folder(stage, table) / f"part-{self.shard_name}"


def clips_in_order(part: Part) -> None:
    """Clip rows (decode, features, quantize): times in order within each video, each clip once."""
    rows = storage.read_table(part.path, columns=["video_id", "clip_index", "start_s", "end_s"]).to_pylist()
    _times_in_order(part.path, rows, "clip")
    keys = [(r["video_id"], r["clip_index"]) for r in rows]
    if len(set(keys)) != len(keys):
        duplicate = next(k for k, n in Counter(keys).items() if n > 1)
        raise Invalid(f"{part.path}: row {keys.index(duplicate)}: clip {duplicate} appears twice")


def features_tokenised_once(part: Part) -> None:
    """quantize: every clip of the features tokenised once, each token a leaf of the codebook."""
    rows = storage.read_table(part.path, columns=["video_id", "clip_index", "token"]).to_pylist()
    features = part.sibling("features")
    if features.exists():
        feature_rows = storage.read_table(features, columns=["video_id", "clip_index"]).to_pylist()
        if Counter((r["video_id"], r["clip_index"]) for r in feature_rows) != \
                Counter((r["video_id"], r["clip_index"]) for r in rows):
            raise Invalid(f"{part.path}: its clips differ from {features} (every feature clip must be tokenised once)")
    for row_number, row in enumerate(rows):
        if row["token"] < 0 or (part.visual_vocab is not None and row["token"] >= part.visual_vocab):
            raise Invalid(f"{part.path}: row {row_number}: token {row['token']} outside [0, {part.visual_vocab})")


def speech_in_order(part: Part) -> None:
    """asr: finite times, sentences and words in order, rejections and probabilities in their ranges."""
    path = part.path
    for row_number, row in enumerate(storage.read_table(path, columns=["video_id", "audio_s", "sentences", "words"]).to_pylist()):
        _finite_times(path, row_number, row, "its", keys=("audio_s",))
        for kind in ("sentences", "words"):
            last = -1.0
            for item in row[kind]:
                _finite_times(path, row_number, item, f"a {kind[:-1]} of {row['video_id']}:")
                if item["start_s"] > item["end_s"] + 1e-6 or item["start_s"] < last - 1e-6:
                    raise Invalid(f"{path}: row {row_number}: {kind} times out of order in {row['video_id']}")
                last = item["start_s"]
        for sentence in row["sentences"]:
            if sentence.get("rejected") not in (None,) + schemas.REJECTIONS:
                raise Invalid(f"{path}: row {row_number}: sentence rejected as {sentence['rejected']!r} in "
                              f"{row['video_id']} (expected null or one of {', '.join(schemas.REJECTIONS)})")
            for key in ("avg_word_prob", "min_word_prob", "no_speech_prob"):
                if sentence.get(key) is not None and not 0 <= sentence[key] <= 1 + 1e-6:
                    raise Invalid(f"{path}: row {row_number}: sentence {key} {sentence[key]} outside [0, 1] "
                                  f"in {row['video_id']}")


def segments(part: Part) -> None:
    """align: segments in order, kinds that match their text, ids inside their vocabularies, and every
    tokenised clip in exactly one segment."""
    path, visual_vocab = part.path, part.visual_vocab
    table = storage.read_table(path)
    text_vocab = metadata.read(table.schema).tokenizer_vocab_size
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
    tokens = part.sibling("quantize")
    if tokens.exists():
        tokenised = Counter(storage.read_table(tokens, columns=["video_id"])["video_id"].to_pylist())
        if tokenised != clips_per_video:
            video = next(v for v in set(tokenised) | set(clips_per_video) if tokenised[v] != clips_per_video[v])
            raise Invalid(f"{path}: video {video} has {clips_per_video[video]} clips in segments but "
                          f"{tokenised[video]} tokenised clips (each must land in exactly one segment)")


def _check_manifest(work: WorkDir, checker: Lineage) -> list[str]:
    if not work.manifest.exists():
        return [f"{work.manifest} not found: nothing to validate (run the manifest stage)"]
    try:
        record = checker.manifest_record()
    except (InputNotReady, CorruptFile) as error:
        return [str(error)]
    state = checker.state("manifest", verify=True)
    if not state.current:
        return [f"{work.manifest}: {state.status}: {state.reason}"]
    try:
        _check_schema(work.manifest, schemas.MANIFEST)
        table = storage.read_table(work.manifest)
    except (Invalid, storage.UnreadableFile) as problem:
        return [str(problem)]
    problems = []
    ids = table["video_id"].to_pylist()
    if len(set(ids)) != len(ids):
        problems.append(f"{work.manifest}: duplicate video_id")
    if shard_digests(table) != record.get("shards"):
        problems.append(f"{work.manifest}: its rows do not match the shard digests of {work.record('manifest')}")
    return problems


def _check_stage_parts(work: WorkDir, checker: Lineage, stage: registry.Stage, visual_vocab: int | None) -> list[str]:
    """Every manifest shard of a per-shard stage: lineage and sha256, then schema, values and invariants of
    the current ones; and files no record accounts for."""
    problems = []
    shards = checker.manifest_shards()
    for shard in shards:
        state = checker.state(stage.name, shard, verify=True)
        if state.status in ("stale", "corrupt"):
            problems.append(f"{work.record(stage.name, shard)}: {stage.name} part {shard:05d} is {state.status}: "
                            f"{state.reason}")
        if not state.current:
            continue
        for table, schema in list(stage.tables.items()) + [("errors", schemas.ERRORS)]:
            path = work.errors(stage.name, shard) if table == "errors" else work.part(stage.name, shard, table)
            if table == "errors" and not path.exists():
                continue   # parts made outside the stages have no error table
            try:
                _check_schema(path, schema)
                storage.read_table(path)      # every value, with the page checksums verified
                part = Part(work, path, path.name.split("part-")[-1], visual_vocab)
                for check in stage.checks.get(table, ()):
                    registry.resolve(check)(part)
            except (Invalid, storage.UnreadableFile) as problem:
                problems.append(str(problem))
    recorded = set()
    for shard in shards:
        try:
            recorded |= set((checker.record(stage.name, shard) or {}).get("outputs", {}))
        except CorruptFile:
            pass
    for table in stage.tables:
        for path in sorted(work.data_folder(stage.name, table).glob("part-*.parquet")):
            if relative(work, path) not in recorded:
                problems.append(f"{path}: no completion record accounts for this file (a killed run's output, or "
                                f"a shard no longer in the manifest); a rerun of {stage.name} redoes or removes it")
    return problems


def _check_codebook(work: WorkDir, checker: Lineage) -> list[str]:
    state = checker.state("kmeans", verify=True)
    if state.status == "missing":
        return []
    if not state.current:
        return [f"{work.codebook}: the codebook is {state.status}: {state.reason}"]
    try:
        visual_words.load(work.codebook)
    except codebook_format.CorruptCodebook as problem:
        return [str(problem)]
    return []


def _check_training(work: WorkDir, checker: Lineage) -> list[str]:
    """The newest checkpoint against the align shards and codebook it names."""
    checkpoints = sorted(work.checkpoints.glob("step-*")) if work.checkpoints.exists() else []
    if not checkpoints:
        return []
    latest = checkpoints[-1]
    from videobert.checkpoints import problem_of    # its files against their recorded sha256 first
    damaged = problem_of(latest)
    if damaged:
        return [f"{latest}: {damaged}"]
    try:
        info = read_json(latest / "model.json") or {}
    except CorruptFile as problem:
        return [str(problem)]
    recorded = info.get("lineage")
    if not recorded:
        return [f"{latest}: trained by an earlier version (no lineage): its inputs cannot be checked"]
    try:
        now = checker.expected("train", record={"lineage": recorded})
    except (InputNotReady, CorruptFile) as problem:
        return [f"{latest}: its inputs are not current: {problem}"]
    if recorded != now:
        return [f"{latest}: trained on other inputs than the current ones ({explain(recorded, now)})"]
    return []


def validate_work_dir(work_dir, cfg=None) -> list[str]:
    """Problems of the run in `work_dir`, each naming its file; with `cfg`, outputs made with other config
    values than `cfg`'s are stale too."""
    work = WorkDir(work_dir)
    if not work.root.is_dir():
        return [f"{work.root} is not a folder"]
    checker = Lineage(work, cfg)
    problems = _check_manifest(work, checker)
    if problems and not work.manifest.exists():
        return problems
    try:
        checker.manifest_record()
    except (InputNotReady, CorruptFile):   # named by _check_manifest; no shard can be checked without it
        return problems
    visual_vocab = _visual_vocab_size(work)
    for stage in registry.STAGES:
        if stage.per_shard:
            problems += _check_stage_parts(work, checker, stage, visual_vocab)
    problems += _check_codebook(work, checker)
    problems += _check_training(work, checker)
    return problems
