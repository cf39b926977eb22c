"""Pre-training on a seeded subset of the videos (`train.subset_videos`, `train.subset_seed`): the paper's
table of zero-shot accuracy against the amount of pre-training data.

The subset is the first N of a seeded permutation of the align shards' video ids (sorted), so with one seed
every smaller subset lies inside every larger one. Its segments are written to DIR/train/subset/ (the align
shards' names, rows of the chosen videos only, their provenance kept; shards left empty are not written)
with DIR/train/subset/videos.json naming the videos; training streams those shards instead. Both keys are
part of the train config, so a run's lineage records them and a resume with another subset is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import storage
from pipeline.config import Config
from pipeline.engine.workdir import WorkDir


def choose_videos(video_ids: list[str], count: int, seed: int) -> list[str]:
    """The first `count` of a seeded permutation of the sorted ids, in id order."""
    ids = sorted(set(video_ids))
    if count > len(ids):
        raise ValueError(f"train.subset_videos {count} exceeds the {len(ids)} videos of the align shards")
    order = np.random.default_rng(seed).permutation(len(ids))[:count]
    return sorted(ids[i] for i in order)


def subset_shards(cfg: Config, work_dir, shards: list[Path], *, write: bool = True) -> list[Path]:
    """The shards to train on: `shards` themselves without train.subset_videos, else the subset's shards
    (written when `write`: on one rank only, the others wait and read)."""
    count = cfg.train.subset_videos
    if not count:
        return shards
    chosen = choose_videos(shard_video_ids(shards), count, cfg.train.subset_seed)
    return write_video_rows(
        shards,
        WorkDir(work_dir).train_folder / "subset",
        chosen,
        keep=True,
        source_key="subset_of",
        write=write,
        extra={"subset_videos": str(count), "subset_seed": str(cfg.train.subset_seed)},
        summary={"subset_videos": count, "subset_seed": cfg.train.subset_seed, "videos": chosen},
    )


def shard_video_ids(shards: list[Path]) -> list[str]:
    """Every row's video id of `shards`, in order."""
    return [v for path in shards for v in storage.read_table(path, columns=["video_id"])["video_id"].to_pylist()]


def write_video_rows(
    shards: list[Path],
    folder: Path,
    videos: list[str],
    *,
    keep: bool,
    source_key: str,
    extra: dict[str, str],
    summary: dict,
    write: bool,
) -> list[Path]:
    """The rows of `shards` whose video is (`keep`) or is not (not `keep`) one of `videos`, as shards of the
    same names in `folder`: their provenance kept, with `extra` and `source_key` naming the shard they came
    from. Shards left empty are not written; when `write` (one rank only) stale shards are removed and
    folder/videos.json holds `summary` and the shards' names. Returns the shards' paths."""
    value_set = pa.array(videos, type=pa.string())
    kept_paths = []
    for path in shards:
        table = storage.read_table(path)
        member = pc.is_in(table["video_id"], value_set=value_set)
        kept = table.filter(member if keep else pc.invert(member))
        if kept.num_rows == 0:
            continue
        target = folder / path.name
        if write:
            provenance = storage.read_metadata(path)
            storage.write_parquet(
                target,
                kept,
                provenance.merged(
                    extra=dict(
                        provenance.extra, **{source_key: str(getattr(shards, "origin", {}).get(path, path))}, **extra
                    )
                ),
            )
        kept_paths.append(target)
    if write and kept_paths:
        for stale in set(folder.glob("part-*.parquet")) - set(kept_paths):
            stale.unlink()
        storage.atomic_write_json(folder / "videos.json", {**summary, "shards": [p.name for p in kept_paths]})
    return kept_paths


def subset_videos(work_dir) -> list[str] | None:
    """The videos of the last subset written, or None."""
    path = WorkDir(work_dir).train_folder / "subset" / "videos.json"
    return json.loads(path.read_text())["videos"] if path.exists() else None
