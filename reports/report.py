"""The run report: one self-contained HTML page (DIR/report.html, plots as inline SVG, thumbnails as data:
URIs, no script and no network fetch) saying what each stage produced, and DIR/report.json with every
number it shows. This module is the page's frame; each section gathers its numbers and draws them in its
own module, in the page's order:

- warnings: data that cannot teach (the codebook sidecar's, the training log's start record's);
- stages (reports/stage_table.py): shards done, videos, clips, errors, seconds and throughput, the decode
  status of the videos, errors by stage and type with examples;
- curation (reports/curation.py): shot boundaries, quality flags by reason with an example clip of each,
  the near-duplicate groups;
- one row per video (reports/videos.py): decode status and clips, ASR language, kept and rejected
  sentences, segments of each kind, error rows;
- visual words (reports/codebook.py): token frequency by rank, the codebook's node sizes per level;
- text and example segments (reports/text.py): ASR status and languages, text coverage per video, sentence
  and segment lengths; a few sentences beside the thumbnails of their clips;
- training (reports/training.py): the losses and accuracies per objective, training beside validation;
- the zero-shot table and the predicted visual words (reports/evaluation.py), forecasts (reports/forecast.py).

Every input is read part by part, one column at a time: memory grows with the number of videos (coverage
per video) and of leaves, never with the number of clips or sentences."""

from __future__ import annotations

import html
from pathlib import Path

from pipeline import storage
from pipeline.config import Config
from pipeline.engine.workdir import WorkDir
from reports import summary
from reports.cells import counted
from reports.codebook import visual_word_stats, visual_words_html
from reports.curation import curation_html, wanted_thumbnails
from reports.evaluation import predicted_video, predicted_video_html, read_json, zero_shot_html, zero_shot_predictions
from reports.forecast import forecast_data, forecast_html, forecast_thumbnails
from reports.nearest import read_thumbnails
from reports.page import html_page
from reports.stage_table import error_examples, stage_runs, stages_html
from reports.text import example_segments, examples_html, text_html, text_stats
from reports.training import train_html, training_header, training_log, uniform_losses, validation_log
from reports.videos import video_table, videos_html

REPORT_STYLE = """
.plots { display: flex; flex-wrap: wrap; gap: 16px; }
svg { background: #fcfcfc; border: 1px solid #eee; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
.example { margin: 10px 0; padding: 6px 0; border-top: 1px solid #eee; }
.example p { margin: 2px 0 6px; }
.predicted figure img + img { margin-top: 2px; }
td.text { text-align: left; } td.num { text-align: right; }
table.videos td { white-space: nowrap; }
table.videos td:first-child, table.predictions td { white-space: normal; overflow-wrap: anywhere; }
table.videos td:last-child { white-space: normal; overflow-wrap: anywhere; min-width: 16em; max-width: 36em; }
td.text { overflow-wrap: anywhere; } td details summary { cursor: pointer; }
span.held-out { color: #555; font-size: 90%; }
table.videos th, table.predictions th { text-align: left; }
table.videos tr.flagged td { background: #fff4e5; }
ul.warnings li { margin: 4px 0; }
"""


def collect(cfg: Config, work_dir: Path) -> dict:
    """Every number the report shows (the content of DIR/report.json)."""
    work_dir = WorkDir(work_dir).root
    evaluation = WorkDir(work_dir).eval_folder
    zero_shot = read_json(evaluation / "zero_shot.json")
    log = summary.log_records(work_dir)  # the training log, read once
    return {
        "summary": summary.collect(work_dir),
        "stages": stage_runs(work_dir),
        "error_examples": error_examples(work_dir),
        "visual_words": visual_word_stats(work_dir),
        "text": text_stats(cfg, work_dir),
        "examples": example_segments(work_dir),
        "videos": video_table(work_dir),
        "train": training_log(log),
        "validation": validation_log(log),
        "train_header": training_header(log),
        "zero_shot": zero_shot,
        "zero_shot_predictions": zero_shot_predictions(work_dir, zero_shot),
        "linear_probe": read_json(evaluation / "linear_probe.json"),
        "predicted_video": predicted_video(work_dir),
        "forecast": forecast_data(work_dir),
        "uniform_loss": uniform_losses(cfg, work_dir) if log else None,
    }


def _warnings_html(warnings: list[dict]) -> str:
    if not warnings:
        return ""
    return (
        '<h2>Warnings</h2><ul class="warnings">'
        + "".join(
            f'<li><span class="warning">{html.escape(w["stage"])}</span>: {html.escape(w["message"])}</li>'
            for w in warnings
        )
        + "</ul>"
    )


def render(data: dict, thumbnails: dict, work_dir: Path) -> str:
    run = data["summary"]
    body = [
        "<h1>VideoBERT pipeline run report</h1>",
        f'<p class="provenance">work dir {html.escape(run["work_dir"])}: {counted(run["videos_in"], "video")} '
        f"in {counted(run['shards'], 'shard')}. Every number here is in report.json.</p>",
    ]
    if (WorkDir(work_dir).gallery / "index.html").exists():
        body.append('<p><a href="gallery/index.html">the visual words as pictures (gallery)</a></p>')
    body += [
        _warnings_html(run.get("warnings") or []),
        stages_html(data),
        curation_html(run.get("curation") or {}, thumbnails),
        videos_html(data["videos"], (data.get("train_header") or {}).get("validation_videos")),
        visual_words_html(data["visual_words"]),
        text_html(data["text"]),
        examples_html(data["examples"], thumbnails),
        train_html(data["train"], data.get("validation"), data.get("train_header"), data.get("uniform_loss")),
        zero_shot_html(data.get("zero_shot"), data.get("linear_probe"), data.get("zero_shot_predictions")),
        predicted_video_html(data.get("predicted_video") or [], thumbnails),
        forecast_html(data.get("forecast"), thumbnails),
    ]
    return html_page("VideoBERT run report", "\n".join(body)).replace("</style>", REPORT_STYLE + "</style>", 1)


def write_report(cfg: Config, work_dir: Path) -> Path:
    """Write DIR/report.html and DIR/report.json; returns the HTML's path."""
    work = WorkDir(work_dir)
    if not work.manifest.exists():
        raise FileNotFoundError(f"{work.manifest} not found: nothing has run in {work.root} yet")
    data = collect(cfg, work_dir)
    wanted = [
        (clip["shard"], example["video_id"], clip["clip_index"])
        for example in data["examples"]
        for clip in example["clips"]
    ]
    wanted += [
        (clip["shard"], clip["video_id"], clip["clip_index"])
        for sentence in data["predicted_video"]
        for token in sentence["tokens"]
        for clip in token["nearest"]
    ]
    wanted += forecast_thumbnails(data.get("forecast"))
    wanted += wanted_thumbnails(data["summary"].get("curation") or {})
    thumbnails = read_thumbnails(work_dir, wanted) if wanted else {}
    page = work.report
    storage.atomic_write_json(work.report_data, data)
    storage.atomic_write_bytes(page, render(data, thumbnails, work_dir).encode())
    return page
