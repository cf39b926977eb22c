"""The forecasting part of the run report (reports/report.py): DIR/eval/forecast.json (eval forecast) as
pictures, like the paper's figure: each visual word, then its top-3 forecasts at every horizon, each leaf
shown by the clip of this run nearest its centroid (reports/nearest.py)."""

from __future__ import annotations

import html
from pathlib import Path

from pipeline import visual_words
from pipeline.engine.workdir import WorkDir
from reports.evaluation import read_json
from reports.nearest import nearest_clips
from reports.page import jpeg_data_uri

THUMBNAILS = 1  # clips shown per leaf


def forecast_data(work_dir: Path) -> dict | None:
    """forecast.json with, per leaf it names, the clips nearest the leaf's centroid (none without features)."""
    report = read_json(WorkDir(work_dir).eval_folder / "forecast.json")
    if report is None:
        return None
    leaves = sorted(
        {w["leaf"] for w in report["words"]}
        | {f["leaf"] for w in report["words"] for found in w["forecasts"].values() for f in found}
    )
    nearest: dict[int, list[dict]] = {}
    try:
        codebook = visual_words.load(WorkDir(work_dir).codebook)
        found = nearest_clips(work_dir, codebook, {codebook.depth: leaves}, THUMBNAILS, quiet=True)
        nearest = {
            node: [
                {"shard": c.shard, "video_id": c.video_id, "clip_index": c.clip_index, "start_s": c.start_s}
                for c in entry.nearest
            ]
            for (_, node), entry in found.items()
        }
    except FileNotFoundError:
        pass
    return dict(report, nearest={str(leaf): nearest.get(leaf, []) for leaf in leaves})


def forecast_thumbnails(data: dict | None) -> list[tuple[int, str, int]]:
    """(shard, video_id, clip_index) of every thumbnail the section shows."""
    if not data:
        return []
    return [(c["shard"], c["video_id"], c["clip_index"]) for clips in data["nearest"].values() for c in clips]


def _figure(data: dict, leaf: int, caption: str, thumbnails: dict) -> str:
    images = []
    for clip in data["nearest"].get(str(leaf), []):
        jpeg = thumbnails.get((clip["shard"], clip["video_id"], clip["clip_index"]))
        if jpeg is not None:
            title = html.escape(
                f"leaf {leaf}: {clip['video_id']} clip {clip['clip_index']} at {clip['start_s']:.1f}s", quote=True
            )
            images.append(f'<img src="{jpeg_data_uri(jpeg)}" alt="{title}" title="{title}">')
    return (
        f"<figure>{''.join(images) or '<span>no clip</span>'}<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def forecast_html(data: dict | None, thumbnails: dict) -> str:
    if not data:
        return ""
    parts = [
        "<h2>Forecasting</h2>",
        f'<p class="note">eval forecast: for each visual word (left), the three visual words VideoBERT finds '
        f"most likely {', '.join(str(s) for s in data['steps'])} "
        f"position{'' if len(data['steps']) == 1 else 's'} later (video-only input, "
        f"[CLS] v [MASK]&hellip; [SEP]), each shown by the clip of this run nearest its leaf centroid. "
        f"{html.escape('One position = ' + data['position'] + '.' if data.get('position') else '')}</p>",
    ]
    parts += _accuracy_html(data)
    for word in data["words"]:
        figures = [_figure(data, word["leaf"], f"v{word['leaf']} (given)", thumbnails)]
        for step, found in word["forecasts"].items():
            label = (data.get("horizons") or {}).get(step, {}).get("label", f"+{step}")
            figures += [_figure(data, f["leaf"], f"{label}: v{f['leaf']} {f['prob']:.2f}", thumbnails) for f in found]
        parts.append(f'<div class="example predicted"><div class="thumbs">{"".join(figures)}</div></div>')
    return "\n".join(parts)


def _accuracy_html(data: dict) -> list[str]:
    """The held-out accuracy table beside its priors, and the notes (a forecast that ignores its context)."""
    rows = data.get("accuracy") or {}
    parts = [f'<p class="note">{html.escape(note)}</p>' for note in data.get("notes") or []]
    if not rows:
        return parts
    head = ("positions", "step", "seconds", "contexts", "top-1", "top-5", "prior top-1", "prior top-5", "repeat last")
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{cell}</td>"
            for cell in (
                row["positions"],
                row["subsample_step"],
                f"{row['seconds']:g}",
                row["contexts"],
                f"{row['top1']:.3f}",
                f"{row['top5']:.3f}",
                f"{row['frequency_prior_top1']:.3f}",
                f"{row['frequency_prior_top5']:.3f}",
                f"{row['repeat_last_top1']:.3f}",
            )
        )
        + "</tr>"
        for row in rows.values()
    )
    table = (
        "<table><caption>next visual word on held-out videos</caption><tr>"
        + "".join(f"<th>{h}</th>" for h in head)
        + f"</tr>{body}</table>"
    )
    return [table, *parts]
