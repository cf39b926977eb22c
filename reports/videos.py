"""The run report's per-video table: one row per manifest video with its decode status and clips, ASR
language and its probability, kept and rejected sentences, segments of each kind and error rows (a
too-short or broken video is named here); past a limit, those to look at first."""

from __future__ import annotations

import html
from pathlib import Path

import pyarrow.compute as pc

from pipeline import storage
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir
from pipeline.registry import SHARD_STAGES
from reports.cells import folded, number

MAX_VIDEO_ROWS = 300  # videos listed in the per-video table (those to look at first)


def _rows(path: Path | None, columns: list[str]) -> list[dict]:
    return storage.read_table(path, columns=columns).to_pylist() if path is not None else []


def video_table(work_dir: Path, limit: int = MAX_VIDEO_ROWS) -> dict:
    """One row per manifest video: decode status and clips, ASR language, kept and rejected sentences (a
    sentence whose `rejected` is set; asr parts without that field keep every sentence), segments of each
    kind, error rows. Read one shard at a time. Past `limit` videos, those with something to see (a status
    other than ok, an error, no text segment) come first and the rest are only counted."""
    work = WorkDir(work_dir)
    checker = Lineage(work_dir)
    parts = {
        stage: dict(checker.current_parts(stage, table))
        for stage, table in (("decode", "videos"), ("asr", ""), ("align", ""))
    }
    error_stages = {stage: set(checker.current_records(stage)) for stage in SHARD_STAGES}
    rows, total = [], 0
    for shard in checker.manifest_shards():
        videos = {
            row["video_id"]: {
                "video_id": row["video_id"],
                "shard": shard,
                "status": None,
                "clips": None,
                "duration_s": None,
                "asr_status": None,
                "language": None,
                "language_prob": None,
                "sentences_kept": None,
                "sentences_rejected": None,
                "rejected_by_reason": {},
                "text_segments": None,
                "video_only_segments": None,
                "errors": [],
            }
            for row in checker.shard_videos(shard)
        }
        for row in _rows(parts["decode"].get(shard), ["video_id", "status", "n_clips", "duration_s"]):
            if row["video_id"] in videos:
                videos[row["video_id"]].update(status=row["status"], clips=row["n_clips"], duration_s=row["duration_s"])
        asr_path = parts["asr"].get(shard)
        if asr_path is not None:
            table = storage.read_table(
                asr_path, columns=["video_id", "status", "language", "language_prob", "sentences"]
            )
            has_rejected = "rejected" in {field.name for field in table.schema.field("sentences").type.value_type}
            for index, video_id in enumerate(table["video_id"].to_pylist()):
                if video_id not in videos:
                    continue
                sentences = table["sentences"][index].values
                count = 0 if sentences is None else len(sentences)
                reasons = (
                    pc.struct_field(sentences, "rejected").to_pylist() if has_rejected and count else [None] * count
                )
                by_reason: dict[str, int] = {}
                for reason in reasons:
                    if reason is not None:
                        by_reason[reason] = by_reason.get(reason, 0) + 1
                probability = table["language_prob"][index].as_py()
                videos[video_id].update(
                    asr_status=table["status"][index].as_py(),
                    language=table["language"][index].as_py(),
                    language_prob=None if probability is None else round(probability, 4),
                    sentences_kept=sum(reason is None for reason in reasons),
                    sentences_rejected=sum(by_reason.values()),
                    rejected_by_reason=dict(sorted(by_reason.items())),
                )
        align_path = parts["align"].get(shard)
        if align_path is not None:
            for row in _rows(align_path, ["video_id", "kind"]):
                entry = videos.get(row["video_id"])
                if entry is None:
                    continue
                key = "text_segments" if row["kind"] == "text_video" else "video_only_segments"
                entry["text_segments"] = entry["text_segments"] or 0
                entry["video_only_segments"] = entry["video_only_segments"] or 0
                entry[key] += 1
            for entry in videos.values():
                if entry["text_segments"] is None:
                    entry["text_segments"] = entry["video_only_segments"] = 0
        for stage, shards in error_stages.items():
            if shard in shards and work.errors(stage, shard).exists():
                errors = storage.read_table(work.errors(stage, shard), columns=["video_id", "error_type"])
                for row in errors.to_pylist():
                    if row["video_id"] in videos:
                        videos[row["video_id"]]["errors"].append(f"{stage}: {row['error_type']}")
        total += len(videos)
        rows += videos.values()
        if len(rows) > 2 * limit:  # memory stays bounded: keep the ones to show first
            rows = sorted(rows, key=_video_order)[:limit]
    if total > limit:
        rows = sorted(rows, key=_video_order)[:limit]
    return {"videos": total, "rows": rows, "not_listed": total - len(rows)}


def _needs_a_look(row: dict) -> bool:
    return (
        row["status"] not in ("ok", None)
        or bool(row["errors"])
        or row["text_segments"] == 0
        or bool(row["sentences_rejected"])
    )


def _video_order(row: dict) -> tuple:
    return (not _needs_a_look(row), row["shard"], row["video_id"])


def _rejected(row: dict) -> str:
    if row["sentences_rejected"] is None:
        return "-"
    reasons = ", ".join(f"{reason} {count}" for reason, count in row["rejected_by_reason"].items())
    return f"{row['sentences_rejected']}" + (f" ({reasons})" if reasons else "")


def videos_html(videos: dict, held_out: list[str] | None = None) -> str:
    """`held_out`: the videos training kept for validation (marked: never trained on)."""
    if not videos["rows"]:
        return ""
    held_out = set(held_out or ())
    head = [
        "video",
        "shard",
        "decode status",
        "duration",
        "clips",
        "ASR",
        "language",
        "sentences kept",
        "rejected",
        "text segments",
        "video-only segments",
        "errors",
    ]
    body = []
    for row in videos["rows"]:
        language = (
            "-"
            if row["language"] is None
            else (row["language"] + ("" if row["language_prob"] is None else f" {row['language_prob']:.2f}"))
        )
        cells = [
            ("video", row["video_id"]),
            ("num", row["shard"]),
            ("text", row["status"] or "not decoded"),
            ("num", "-" if row["duration_s"] is None else f"{row['duration_s']:.1f} s"),
            ("num", number(row["clips"])),
            ("text", row["asr_status"] or "-"),
            ("text", language),
            ("num", number(row["sentences_kept"])),
            ("text", _rejected(row)),
            ("num", number(row["text_segments"])),
            ("num", number(row["video_only_segments"])),
            ("errors", "; ".join(row["errors"]) or "-"),
        ]
        flagged = ' class="flagged"' if _needs_a_look(row) else ""

        def shown(kind: str, value) -> str:
            if kind == "errors":
                return folded(str(value))
            if kind == "video" and value in held_out:
                return f'{html.escape(str(value))} <span class="held-out">(held out)</span>'
            return html.escape(str(value))

        body.append(
            f"<tr{flagged}>"
            + "".join(
                f'<td class="{"text" if kind in ("video", "errors") else kind}">{shown(kind, value)}</td>'
                for kind, value in cells
            )
            + "</tr>"
        )
    listed = len(videos["rows"])
    note = (
        f'<p class="note">{listed:,} of {videos["videos"]:,} videos listed, those to look at first; the '
        f"other {videos['not_listed']:,} decoded, have text and no error.</p>"
        if videos["not_listed"]
        else ""
    )
    return (
        "<h2>Videos</h2>"
        '<p class="note">one row per video of the manifest; highlighted: a decode status other than ok, '
        "an error, rejected sentences, or no text segment."
        + (
            f" <i>(held out)</i>: one of the {len(held_out):,} video{'' if len(held_out) == 1 else 's'} training "
            f"keeps for validation (train.validation_videos), never trained on."
            if held_out
            else ""
        )
        + "</p>"
        + note
        + '<table class="videos"><tr>'
        + "".join(f"<th>{html.escape(name)}</th>" for name in head)
        + "</tr>"
        + "".join(body)
        + "</table>"
    )
