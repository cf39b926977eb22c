"""What the validate checks of several stages share (pipeline/contract.py's `Part` and `Invalid`): times
that are finite and in order, and the clip rows' own check (decode, features, quantize)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from pipeline import storage
from pipeline.contract import Invalid, Part


def finite_times(path: Path, row_number: int, item: dict, what: str, keys=("start_s", "end_s")) -> None:
    """A NaN time passes every order comparison (they are all false): checked first, by name."""
    for key in keys:
        if item.get(key) is not None and not math.isfinite(item[key]):
            raise Invalid(f"{path}: row {row_number}: {what} {key} is {item[key]}, not a finite time")


def times_in_order(path: Path, rows: list[dict], key: str) -> None:
    previous: dict[str, float] = {}
    for row_number, row in enumerate(rows):
        finite_times(path, row_number, row, key)
        if row["start_s"] > row["end_s"] + 1e-9:
            raise Invalid(f"{path}: row {row_number}: start_s {row['start_s']} > end_s {row['end_s']}")
        video = row["video_id"]
        if video in previous and row["start_s"] < previous[video] - 1e-9:
            raise Invalid(f"{path}: row {row_number}: {key} times go backwards in video {video}")
        previous[video] = row["start_s"]


def clips_in_order(part: Part) -> None:
    """Clip rows (decode, features, quantize): times in order within each video, each clip once."""
    rows = storage.read_table(part.path, columns=["video_id", "clip_index", "start_s", "end_s"]).to_pylist()
    times_in_order(part.path, rows, "clip")
    keys = [(r["video_id"], r["clip_index"]) for r in rows]
    if len(set(keys)) != len(keys):
        duplicate = next(k for k, n in Counter(keys).items() if n > 1)
        raise Invalid(f"{part.path}: row {keys.index(duplicate)}: clip {duplicate} appears twice")
