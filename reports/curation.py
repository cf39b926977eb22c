"""Curation in the run report, the summary and the dataset card: the shot boundaries found (cuts, gradual
transitions), the quality flags (clips and videos by reason, what was left out, an example clip of each
reason with its measured value), and the near-duplicate groups. Read from the stages' completion records
and, part by part, the quality table's flags column: memory grows with the reasons and the groups, never
with the clips."""

from __future__ import annotations

import html
from collections import Counter
from pathlib import Path

from pipeline import storage
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir
from reports.cells import counted
from reports.page import html_table, jpeg_data_uri

SHOWN_GROUPS = 10


def curation_stats(work_dir: Path) -> dict:
    """{"shots", "quality", "dedup"}: what each curation stage's current outputs hold (absent: not run)."""
    work = WorkDir(work_dir)
    checker = Lineage(work)
    found: dict = {}
    shots = list(checker.current_records("shots").values())
    if shots:
        found["shots"] = {
            key: sum(record.get(key, 0) for record in shots)
            for key in ("boundaries", "cuts", "gradual", "videos_with_boundaries")
        }
    parts = checker.current_parts("quality")
    if parts:
        clips, excluded, examples = Counter(), 0, {}
        total = 0
        for shard, path in parts:
            table = storage.read_table(path, columns=["video_id", "clip_index", "flags", "excluded"])
            total += table.num_rows
            for video_id, clip_index, flags, out in zip(*(table[name].to_pylist() for name in table.column_names)):
                excluded += out
                for flag in flags:
                    clips[flag["reason"]] += 1
                    examples.setdefault(
                        flag["reason"], {**flag, "shard": shard, "video_id": video_id, "clip_index": clip_index}
                    )
        videos = Counter()
        for _, path in checker.current_parts("quality", "quality_videos"):
            for flags in storage.read_table(path, columns=["flags"])["flags"].to_pylist():
                videos.update(flag["reason"] for flag in flags)
        found["quality"] = {
            "clips": total,
            "clips_excluded": excluded,
            "clips_by_reason": dict(sorted(clips.items())),
            "videos_by_reason": dict(sorted(videos.items())),
            "examples": [examples[reason] for reason in sorted(examples)],
        }
    if checker.current("dedup") and work.dedup_groups.exists():
        record = checker.record("dedup")
        rows = storage.read_table(work.dedup_groups).to_pylist()
        by_group: dict[int, list[dict]] = {}
        for row in rows:
            by_group.setdefault(row["group_id"], []).append(row)
        found["dedup"] = {
            "videos": record.get("videos", 0),
            "groups": len(by_group),
            "copies": len(rows) - len(by_group),
            "largest": [
                {
                    "representative": members[0]["representative"],
                    "copies": [
                        {key: row[key] for key in ("video_id", "matched_to", "matched_share", "offset_s")}
                        for row in members
                        if row["matched_to"] is not None
                    ],
                }
                for members in sorted(by_group.values(), key=lambda m: (-len(m), m[0]["representative"]))[:SHOWN_GROUPS]
            ],
        }
    return found


def curation_lines(curation: dict) -> list[str]:
    """The summary's lines."""
    lines = []
    shots = curation.get("shots")
    if shots:
        lines.append(
            f"  shot boundaries: {shots['boundaries']} ({shots['cuts']} cuts, {shots['gradual']} gradual) "
            f"in {shots['videos_with_boundaries']} video(s)"
        )
    quality = curation.get("quality")
    if quality:
        flagged = ", ".join(f"{reason} {count}" for reason, count in quality["clips_by_reason"].items()) or "none"
        videos = ", ".join(f"{reason} {count}" for reason, count in quality["videos_by_reason"].items()) or "none"
        lines.append(
            f"  quality: {quality['clips_excluded']} of {quality['clips']} clips left out of the fit and the shards; "
            f"clips flagged {flagged}; videos flagged {videos}"
        )
    dedup = curation.get("dedup")
    if dedup:
        lines.append(
            f"  near-duplicates: {dedup['groups']} group(s), {dedup['copies']} copies among {dedup['videos']} videos"
        )
    return lines


def wanted_thumbnails(curation: dict) -> list[tuple[int, str, int]]:
    return [(e["shard"], e["video_id"], e["clip_index"]) for e in (curation.get("quality") or {}).get("examples", [])]


def curation_html(curation: dict, thumbnails: dict) -> str:
    parts = ["<h2>Curation</h2>"]
    if not curation:
        return parts[0] + "<p>no curation stage has run yet: run shots, quality and dedup (videobert run does).</p>"
    shots = curation.get("shots")
    if shots:
        parts.append(
            f"<p>Shot boundaries: {counted(shots['boundaries'], 'boundary', 'boundaries')} "
            f"({shots['cuts']} cuts, {shots['gradual']} gradual) in "
            f"{counted(shots['videos_with_boundaries'], 'video')}.</p>"
        )
    quality = curation.get("quality")
    if quality:
        reasons = sorted(set(quality["clips_by_reason"]) | set(quality["videos_by_reason"]))
        parts.append(
            f"<p>Quality: {quality['clips_excluded']} of {counted(quality['clips'], 'clip')} left out of the "
            f"k-means fit and the training shards (quality.exclude).</p>"
        )
        if reasons:
            parts.append(
                html_table(
                    ["reason", "clips", "videos"],
                    [[r, quality["clips_by_reason"].get(r, 0), quality["videos_by_reason"].get(r, 0)] for r in reasons],
                )
            )
        figures = []
        for example in quality["examples"]:
            jpeg = thumbnails.get((example["shard"], example["video_id"], example["clip_index"]))
            if jpeg is None:
                continue
            caption = f"{example['reason']}: {example['value']:g} (under {example['threshold']:g})"
            title = html.escape(f"{example['video_id']} clip {example['clip_index']}")
            figures.append(
                f'<figure><img src="{jpeg_data_uri(jpeg)}" alt="{title}" title="{title}">'
                f"<figcaption>{html.escape(caption)}</figcaption></figure>"
            )
        if figures:
            parts.append(f'<div class="thumbs">{"".join(figures)}</div>')
    dedup = curation.get("dedup")
    if dedup:
        parts.append(
            f"<p>Near-duplicates: {counted(dedup['groups'], 'group')}, {counted(dedup['copies'], 'copy', 'copies')} "
            f"among {counted(dedup['videos'], 'video')}; each group stays on one side of the splits, and training "
            f"keeps its representative.</p>"
        )
        rows = [
            [group["representative"], copy["video_id"], f"{copy['matched_share']:.2f}", f"{copy['offset_s']:+.2f} s"]
            for group in dedup["largest"]
            for copy in group["copies"]
        ]
        if rows:
            parts.append(html_table(["representative", "copy", "frames matched", "offset"], rows))
    return "\n".join(parts)
