"""Near-duplicate videos as training sees them: the dedup stage's groups (DIR/dedup/groups.parquet, checked
against its record). A group stays whole on one side of every split: YouCook II's kept-apart videos, the
held-out validation and test videos (`train.splits`, `train.validation_videos`) each take their copies with
them, and each move is said. Of the rest, training keeps each group's representative only, unless
`train.keep_duplicates`."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from pipeline import storage
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir

SIDES = ("train", "validation", "test")  # a group with members on several goes to the last of them


@dataclass
class Copies:
    group_of: dict[str, int] = field(default_factory=dict)
    members: dict[int, list[str]] = field(default_factory=dict)
    representative: dict[int, str] = field(default_factory=dict)

    @classmethod
    def read(cls, work_dir) -> Copies:
        """The groups of a work dir whose dedup stage ran (its file verified); none where it has no record
        (shards made outside the stages)."""
        work = WorkDir(work_dir)
        checker = Lineage(work)
        if checker.record("dedup") is None:
            return cls()
        rows = storage.read_table(checker.verified("dedup", None, work.dedup_groups)).to_pylist()
        copies = cls()
        for row in rows:
            copies.group_of[row["video_id"]] = row["group_id"]
            copies.members.setdefault(row["group_id"], []).append(row["video_id"])
            copies.representative[row["group_id"]] = row["representative"]
        return copies

    def with_copies(self, videos: list[str], present: set[str]) -> tuple[list[str], dict[str, str]]:
        """(`videos` and every copy of theirs in `present`, sorted; each added copy -> the video it came with)."""
        chosen = set(videos)
        moved = {}
        for video in sorted(videos):
            group = self.group_of.get(video)
            for other in self.members.get(group, []) if group is not None else []:
                if other in present and other not in chosen:
                    chosen.add(other)
                    moved[other] = video
        return sorted(chosen), moved

    def sides(self, side_of: dict[str, str], present: set[str]) -> tuple[dict[str, str], dict[str, str]]:
        """(each present video's side, each moved video -> its side): a group's members all go to the most
        held-out side any of them is given (`side_of`: video -> train | validation | test; unnamed: train)."""
        sides, moved = {}, {}
        for video in sorted(present):
            group = self.group_of.get(video)
            own = side_of.get(video, "train")
            if group is None:
                sides[video] = own
                continue
            group_side = max(
                (side_of.get(other, "train") for other in self.members[group] if other in present), key=SIDES.index
            )
            sides[video] = group_side
            if group_side != own:
                moved[video] = group_side
        return sides, moved

    def not_kept(self, present: set[str]) -> list[str]:
        """The present members of each group other than its representative, sorted; a group whose
        representative is absent keeps its first present member instead."""
        dropped = []
        for group, names in self.members.items():
            here = sorted(name for name in names if name in present)
            keep = self.representative[group] if self.representative[group] in here else (here[0] if here else None)
            dropped += [name for name in here if name != keep]
        return sorted(dropped)


def say_moved(what: str, moved: dict[str, str], quiet: bool = False) -> None:
    if moved and not quiet:
        shown = ", ".join(f"{video} ({where})" for video, where in sorted(moved.items())[:5])
        more = f" and {len(moved) - 5} more" if len(moved) > 5 else ""
        print(f"[train] dedup: {len(moved)} video(s) moved {what} with their copies: {shown}{more}", file=sys.stderr)
