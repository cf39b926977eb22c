"""YouCook II (Zhou et al., 2018) as pre-training sees it: its annotations file read and checked, and the
videos of its evaluation subsets (`train.youcook2_excluded_subsets`) kept apart from the training shards, so
that zero-shot, the probe and captioning (videobert/eval/) score videos the model was never trained on.

The official `youcookii_annotations_trainval.json`:
    {"database": {"<YouTube id>": {"subset": "training" | "validation", "recipe_type": "113",
                                   "duration": 241.62, "annotations": [{"id": 0, "segment": [90, 102],
                                   "sentence": "spread margarine on two slices of white bread"}, ...]}, ...}}"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline import storage
from pipeline.config import Config
from pipeline.engine.manifest import ManifestError
from pipeline.engine.workdir import WorkDir

SUBSETS = ("training", "validation", "testing")


@dataclass(frozen=True)
class Annotation:
    index: int  # the annotation's id within its video (its segment_index)
    start_s: float
    end_s: float
    sentence: str


@dataclass(frozen=True)
class AnnotatedVideo:
    video_id: str
    subset: str
    recipe_type: str
    duration: float | None
    annotations: tuple[Annotation, ...]


def read_annotations(path: str | Path) -> dict[str, AnnotatedVideo]:
    """YouTube id -> the video's annotations, checked; a mistake names the video and the field."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ManifestError(f"cannot read the YouCook II annotations {path}: {error}") from None
    database = data.get("database") if isinstance(data, dict) else None
    if not isinstance(database, dict):
        raise ManifestError(f'{path}: a YouCook II annotations file holds {{"database": {{YouTube id: ...}}}}')
    videos = {}
    for video_id, entry in sorted(database.items()):
        where = f"{path}: video {video_id!r}"
        if not video_id or not all(c.isalnum() or c in "-_" for c in video_id):
            raise ManifestError(f"{where}: a YouTube id holds only letters, digits, - and _")
        if not isinstance(entry, dict) or not isinstance(entry.get("annotations"), list):
            raise ManifestError(f"{where}: needs an 'annotations' list")
        subset = entry.get("subset")
        if subset not in SUBSETS:
            raise ManifestError(f"{where}: subset must be one of {', '.join(SUBSETS)} (got {subset!r})")
        annotations = []
        for position, item in enumerate(entry["annotations"]):
            segment = item.get("segment") if isinstance(item, dict) else None
            if not (
                isinstance(segment, list)
                and len(segment) == 2
                and all(isinstance(t, (int, float)) for t in segment)
                and 0 <= segment[0] <= segment[1]
            ):
                raise ManifestError(f"{where}: annotation {position} needs 'segment': [start, end] in seconds")
            annotations.append(
                Annotation(
                    int(item.get("id", position)),
                    float(segment[0]),
                    float(segment[1]),
                    str(item.get("sentence", "")).strip(),
                )
            )
        if len({a.index for a in annotations}) != len(annotations):
            raise ManifestError(f"{where}: two annotations share an id")
        duration = entry.get("duration")
        videos[video_id] = AnnotatedVideo(
            video_id,
            subset,
            str(entry.get("recipe_type", "")),
            float(duration) if isinstance(duration, (int, float)) else None,
            tuple(annotations),
        )
    return videos


# ---------------------------------------------------------------- kept apart from pre-training

KEPT_APART_FOLDER = "youcook2_kept_apart"


def kept_apart_annotations(cfg: Config, work_dir) -> str | None:
    """The annotations file whose train.youcook2_excluded_subsets never reach pre-training:
    train.youcook2_annotations, else the manifest's when youcook2-manifest made it, else None."""
    if cfg.train.youcook2_annotations:
        return cfg.train.youcook2_annotations
    manifest = WorkDir(work_dir).manifest
    if not manifest.exists():
        return None
    extra = storage.read_metadata(manifest).extra or {}
    return extra.get("annotations") if extra.get("annotations_sha256") else None


def kept_apart_videos(cfg: Config, work_dir) -> tuple[str | None, list[str]]:
    """(the annotations file, its videos of train.youcook2_excluded_subsets, sorted)."""
    source = kept_apart_annotations(cfg, work_dir)
    if source is None:
        return None, []
    excluded = set(cfg.train.youcook2_excluded_subsets)
    return source, sorted(v.video_id for v in read_annotations(source).values() if v.subset in excluded)


def keep_apart(
    cfg: Config, work_dir, shards: list[Path], *, write: bool = True, quiet: bool = True
) -> tuple[list[Path], list[str]]:
    """(the shards to pre-train on, the YouCook II videos kept out of them). Without such videos in `shards`
    the shards themselves; else their rows of the other videos, written to DIR/train/youcook2_kept_apart/
    (on one rank only when `write`) with videos.json naming the videos left out and the annotations file."""
    from videobert.copies import Copies, say_moved
    from videobert.subset import shard_video_ids, write_video_rows

    source, videos = kept_apart_videos(cfg, work_dir)
    in_shards = set(shard_video_ids(shards)) if videos else set()
    present = sorted(set(videos) & in_shards) if videos else []
    if not present:
        return shards, []
    # their near-duplicates (the dedup stage's groups) stay apart with them
    present, moved = Copies.read(work_dir).with_copies(present, in_shards)
    if write and not quiet:
        say_moved("out of pre-training (YouCook II's kept-apart videos)", moved)
    kept = write_video_rows(
        shards,
        WorkDir(work_dir).train_folder / KEPT_APART_FOLDER,
        present,
        keep=False,
        source_key="kept_apart_of",
        write=write,
        extra={"youcook2_excluded_subsets": ",".join(cfg.train.youcook2_excluded_subsets)},
        summary={
            "annotations": str(source),
            "annotations_sha256": storage.file_sha256(Path(source)),
            "excluded_subsets": cfg.train.youcook2_excluded_subsets,
            "videos_left_out": present,
        },
    )
    if not kept:
        raise ValueError(
            f"every video of the align shards is in {', '.join(cfg.train.youcook2_excluded_subsets)} "
            f"of {source}: nothing is left to pre-train on (train.youcook2_excluded_subsets)"
        )
    if write and not quiet:
        print(
            f"[train] YouCook II kept apart: the {len(present)} {'/'.join(cfg.train.youcook2_excluded_subsets)} "
            f"video(s) of {source} are not trained on",
            file=sys.stderr,
        )
    return kept, present
