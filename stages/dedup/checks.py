"""What status and validate say of the near-duplicate groups: dedup's line in `status`, its problems for
`validate`."""

from __future__ import annotations

from pipeline import storage
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir


def status_line(checker: Lineage, states_of: dict) -> str:
    state = checker.state("dedup", verify="size")
    if state.status == "missing":
        return f"{'dedup':<9} {'not run':>15}"
    if not state.current:
        return f"{'dedup':<9} {state.status:>15}  {state.reason}"
    record = state.record
    return (
        f"{'dedup':<9} {'current':>15}  {record.get('groups', 0)} group(s) of near-duplicates, "
        f"{record.get('copies', 0)} copies among {record.get('videos', 0)} videos"
    )


def problems_of(rows: list[dict], known_videos: set[str] | None, where: str) -> list[str]:
    """The group table's invariants: one row per video, one representative per group (its row first, with
    no matched_to), every other member matched to a member of its own group."""
    problems = []
    by_group: dict[int, list[dict]] = {}
    seen: set[str] = set()
    for row in rows:
        if row["video_id"] in seen:
            problems.append(f"{where}: video {row['video_id']} is in two rows")
        seen.add(row["video_id"])
        by_group.setdefault(row["group_id"], []).append(row)
    for group_id, members in sorted(by_group.items()):
        names = {row["video_id"] for row in members}
        heads = [row for row in members if row["matched_to"] is None]
        if len(members) < 2 or len(heads) != 1 or heads[0]["video_id"] != heads[0]["representative"]:
            problems.append(f"{where}: group {group_id} needs two videos or more and one representative")
            continue
        for row in members:
            if row["representative"] != heads[0]["video_id"]:
                problems.append(f"{where}: {row['video_id']} names another representative than its group's")
            if row["matched_to"] is not None and row["matched_to"] not in names:
                problems.append(f"{where}: {row['video_id']} is matched to {row['matched_to']}, not of its group")
    if known_videos is not None:
        unknown = sorted(seen - known_videos)
        if unknown:
            problems.append(f"{where}: {len(unknown)} video(s) not in the manifest, e.g. {unknown[0]}")
    return problems


def validate(work: WorkDir, checker: Lineage) -> list[str]:
    state = checker.state("dedup", verify=True)
    if state.status == "missing":
        return []
    if not state.current:
        return [f"{work.dedup_groups}: the groups are {state.status}: {state.reason}"]
    rows = storage.read_table(work.dedup_groups).to_pylist()
    known = set(storage.read_table(work.manifest, columns=["video_id"])["video_id"].to_pylist())
    return problems_of(rows, known, str(work.dedup_groups))
