"""The evaluation parts of the run report (reports/report.py): the zero-shot table of DIR/eval/zero_shot.json
(every row in every ranking; the S3D linear probe of DIR/eval/linear_probe.json beside the closed-set rows),
a sample of its per-segment top-5 predictions (DIR/eval/zero_shot_predictions.parquet, labels or not) with
a note wherever VideoBERT's answers are exactly the text-only prior's (the video changed nothing), and the
predicted visual words of DIR/eval/predict_video.parquet, each shown by the clips of this run nearest its leaf
centroid (reports/nearest.py), like the paper's figure of video predicted from text."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import numpy as np

from pipeline import storage, visual_words
from pipeline.engine.workdir import WorkDir
from reports.nearest import nearest_clips
from reports.page import html_table, jpeg_data_uri

PREDICTED_THUMBNAILS = 3  # clips shown per predicted visual word (the nearest to its leaf centroid)
MAX_PREDICTED_SENTENCES = 20
PREDICTION_SAMPLE = 12  # zero-shot segments shown with their top-5 words, evenly spread over the file
PARTS = ("verb", "noun")
ZERO_SHOT_ROWS = (
    ("videobert", "VideoBERT (video + text)"),
    ("text_only_prior", "VideoBERT text-only prior"),
    ("initial_bert_prior", "initial BERT prior"),
    ("s3d_linear_probe", "S3D linear probe (supervised)"),
    ("chance", "chance (random ranking)"),
)


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def predicted_video(work_dir: Path, per_leaf: int = PREDICTED_THUMBNAILS) -> list[dict]:
    """The sentences of DIR/eval/predict_video.parquet with, for each predicted visual word, the clips of this
    run nearest its leaf centroid (none when the features or the codebook are gone)."""
    path = WorkDir(work_dir).eval_folder / "predict_video.parquet"
    if not path.exists():
        return []
    rows = storage.read_table(path).to_pylist()[:MAX_PREDICTED_SENTENCES]
    leaves = sorted({leaf for row in rows for leaf in row["visual_ids"]})
    nearest: dict[int, list[dict]] = {}
    empty: set[int] = set()
    try:
        codebook = visual_words.load(WorkDir(work_dir).codebook)
        empty = {leaf for leaf in leaves if codebook.counts[-1][leaf] == 0}
        found = nearest_clips(
            work_dir, codebook, {codebook.depth: [leaf for leaf in leaves if leaf not in empty]}, per_leaf, quiet=True
        )
        nearest = {
            node: [
                {
                    "shard": clip.shard,
                    "video_id": clip.video_id,
                    "clip_index": clip.clip_index,
                    "start_s": clip.start_s,
                    "distance": clip.distance,
                }
                for clip in entry.nearest
            ]
            for (_, node), entry in found.items()
        }
    except FileNotFoundError:
        pass
    return [
        {
            "sentence": row["sentence"],
            "tokens": [
                {"leaf": leaf, "prob": prob, "empty": leaf in empty, "nearest": nearest.get(leaf, [])}
                for leaf, prob in zip(row["visual_ids"], row["probs"])
            ],
        }
        for row in rows
    ]


def _segment_texts(work_dir: Path, wanted: set[tuple[str, int]]) -> dict[tuple[str, int], str | None]:
    """The text of the align segments `wanted` ((video_id, segment_index)), one part at a time."""
    from pipeline.engine.lineage import Lineage

    found: dict[tuple[str, int], str | None] = {}
    videos = {video for video, _ in wanted}
    for _, path in Lineage(work_dir).current_parts("align"):
        table = storage.read_table(
            path, columns=["video_id", "segment_index", "text"], filters=[("video_id", "in", sorted(videos))]
        )
        for row in table.to_pylist():
            key = (row["video_id"], row["segment_index"])
            if key in wanted:
                found[key] = row["text"]
    return found


def zero_shot_predictions(work_dir: Path, report: dict | None, sample: int = PREDICTION_SAMPLE) -> dict | None:
    """From DIR/eval/zero_shot_predictions.parquet (written with or without eval.labels): how many segments'
    top-5 words are exactly the text-only prior's, per ranking and slot, and `sample` segments (evenly
    spread) with their top-5 words and probabilities, their labels, and their text (align segments)."""
    path = WorkDir(work_dir).eval_folder / "zero_shot_predictions.parquet"
    if report is None or not path.exists():
        return None
    table = storage.read_table(path)
    modes = [mode for mode in report.get("rankings") or [] if f"verb_top5_{mode}" in table.column_names]
    prior = (report.get("prior_top5") or {}).get("text_only_prior") or {}
    same = {}
    for mode in modes:
        if mode not in prior:
            continue
        same[mode] = {
            part: sum(words == prior[mode][part] for words in table[f"{part}_top5_{mode}"].to_pylist())
            for part in PARTS
        }
    rows = (
        sorted(set(np.linspace(0, table.num_rows - 1, min(sample, table.num_rows)).round().astype(int).tolist()))
        if table.num_rows
        else []
    )
    picked = table.take(rows).to_pylist() if rows else []
    texts = (
        _segment_texts(work_dir, {(row["video_id"], row["segment_index"]) for row in picked})
        if picked and report.get("segment_source", "align") == "align"
        else {}
    )
    shown = []
    for row in picked:
        entry = {
            "video_id": row["video_id"],
            "segment_index": row["segment_index"],
            "start_s": row["start_s"],
            "end_s": row["end_s"],
            "text": texts.get((row["video_id"], row["segment_index"])),
            "verbs": row["verbs"],
            "nouns": row["nouns"],
        }
        for mode in modes:
            for part in PARTS:
                entry[f"{part}_top5_{mode}"] = [
                    [word, round(math.exp(score), 4)]
                    for word, score in zip(row[f"{part}_top5_{mode}"], row[f"{part}_scores_{mode}"])
                ]
        shown.append(entry)
    return {
        "segments": table.num_rows,
        "rankings": modes,
        "same_as_text_only_prior": same,
        "text_only_prior": {mode: prior[mode] for mode in modes if mode in prior},
        "sample": shown,
    }


def equal_to_prior_notes(report: dict | None, predictions: dict | None) -> list[str]:
    """Where VideoBERT's answers are exactly the text-only prior's: its accuracy row (labels), or every
    segment's top-5 words (any run): the visual tokens changed nothing there."""
    notes = []
    for mode, rows in ((report or {}).get("results") or {}).items():
        if "videobert" in rows and rows["videobert"] == rows.get("text_only_prior"):
            notes.append(
                f"{_mode_title(mode)}: the VideoBERT row equals the text-only prior row exactly: on these "
                f"segments the video did not change a single accuracy"
            )
    if predictions:
        for mode, parts in predictions["same_as_text_only_prior"].items():
            same = [part for part in PARTS if predictions["segments"] and parts[part] == predictions["segments"]]
            if same:
                notes.append(
                    f"{_mode_title(mode)}: every one of the {predictions['segments']:,} segments' top-5 "
                    f"{' and '.join(f'{part}s' for part in same)} are exactly the text-only prior's: "
                    f"VideoBERT's answer does not depend on the video"
                )
    return notes


def _mode_title(mode: str) -> str:
    return "open vocabulary" if mode == "open" else "closed set"


def _percent(prob: float) -> str:
    """A probability as a percentage a reader can compare: whole percents from 10%, two digits below."""
    return f"{100 * prob:.0f}%" if prob >= 0.1 else f"{100 * prob:.2g}%"


def _words(ranked: list, labels: list[str]) -> str:
    """Top-5 words with probabilities; a word among the segment's labels is bold."""
    return ", ".join(
        (f"<b>{html.escape(word)}</b>" if word in labels else html.escape(word)) + f" {_percent(prob)}"
        for word, prob in ranked
    )


def zero_shot_predictions_html(predictions: dict | None) -> str:
    """One table per ranking: a sample of segments with their text, labels and top-5 verbs and nouns."""
    if not predictions or not predictions["sample"]:
        return ""
    parts = [
        '<p class="note">top-5 verbs and nouns with their probabilities (a word of several WordPiece '
        "pieces: the product of its pieces'); a word among the segment's labels is bold. Every segment is "
        "in zero_shot_predictions.parquet.</p>"
    ]
    labelled = any(row["verbs"] or row["nouns"] for row in predictions["sample"])
    for mode in predictions["rankings"]:
        parts.append(
            f"<h3>Predictions for {len(predictions['sample'])} of {predictions['segments']:,} segments "
            f"({html.escape(_mode_title(mode))})</h3>"
        )
        prior, same = predictions["text_only_prior"].get(mode), predictions["same_as_text_only_prior"].get(mode)
        if prior:
            parts.append(
                "<p>text-only prior (the same for every segment): verbs "
                f"{html.escape(', '.join(prior['verb']))}; nouns {html.escape(', '.join(prior['noun']))}."
                + (
                    f" Segments whose top-5 equals it: verbs {same['verb']:,}, nouns {same['noun']:,} of "
                    f"{predictions['segments']:,}."
                    if same
                    else ""
                )
                + "</p>"
            )
        head = ["segment", "text"] + (["labels"] if labelled else []) + ["verb top-5", "noun top-5"]
        body = []
        for row in predictions["sample"]:
            span = f"{row['video_id']} #{row['segment_index']} {row['start_s']:.1f}-{row['end_s']:.1f} s"
            cells = [html.escape(span), html.escape(row["text"] or "-")]
            if labelled:
                labels = f"verbs {', '.join(row['verbs']) or '-'}; nouns {', '.join(row['nouns']) or '-'}"
                cells.append(html.escape(labels))
            cells += [_words(row[f"verb_top5_{mode}"], row["verbs"]), _words(row[f"noun_top5_{mode}"], row["nouns"])]
            body.append("<tr>" + "".join(f'<td class="text">{cell}</td>' for cell in cells) + "</tr>")
        head_html = "".join(f"<th>{html.escape(name)}</th>" for name in head)
        parts.append(f'<table class="predictions"><tr>{head_html}</tr>{"".join(body)}</table>')
    return "\n".join(parts)


def _share(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def zero_shot_html(report: dict | None, probe: dict | None, predictions: dict | None = None) -> str:
    if report is None and probe is None:
        return ""
    parts = ["<h2>Zero-shot verb and noun classification</h2>"]
    if report is not None:
        parts.append(
            f"<p>checkpoint step {report['step']}, {report['segments']:,} segments "
            f"({html.escape(str(report.get('segment_source', 'align')))}), {report['verbs']} verbs and "
            f"{report['nouns']} nouns, template &ldquo;{html.escape(report['template'])}&rdquo;, logits in "
            f"{report['precision']}. A prediction is right when it is any of the segment's labels.</p>"
        )
    results = dict((report or {}).get("results") or {})
    if probe is not None:
        results.setdefault("closed", {})
        results["closed"] = dict(results["closed"], **probe["results"])
    if report is not None and not report.get("results"):
        parts.append("<p>no labels (eval.labels): no accuracies, only the predictions below.</p>")
    for mode in (report or {}).get("rankings") or ["closed"]:
        rows = results.get(mode)
        if not rows:
            continue
        sizes = (report or {}).get("candidates", {}).get(mode)
        title = "open vocabulary" if mode == "open" else "closed set (the label lists)"
        if sizes:
            title += f": {sizes['verb']:,} verb and {sizes['noun']:,} noun candidates"
        parts.append(f"<h3>{html.escape(title)}</h3>")
        parts.append(
            html_table(
                ["", "verb top-1", "verb top-5", "noun top-1", "noun top-5", "segments (verb/noun)"],
                [
                    [
                        name,
                        *(_share(rows[key][part][top]) for part in ("verb", "noun") for top in ("top1", "top5")),
                        f"{rows[key]['verb']['n']}/{rows[key]['noun']['n']}",
                    ]
                    for key, name in ZERO_SHOT_ROWS
                    if key in rows
                ],
            )
        )
    if probe is not None:
        parts.append(
            f'<p class="note">S3D linear probe: {html.escape(probe["classifier"])} on the '
            f"{html.escape(probe['feature'])}; {probe['segments']['train']} training and "
            f"{probe['segments']['test']} test segments ({html.escape(probe['split'])}).</p>"
        )
    parts += [f'<p class="warning">{html.escape(note)}</p>' for note in equal_to_prior_notes(report, predictions)]
    notes = ((report or {}).get("notes") or []) + ((probe or {}).get("notes") or [])
    parts += [f'<p class="note">{html.escape(note)}</p>' for note in notes]
    parts.append(zero_shot_predictions_html(predictions))
    return "\n".join(parts)


def predicted_video_html(sentences: list[dict], thumbnails: dict) -> str:
    if not sentences:
        return ""
    parts = [
        "<h2>Predicted visual words</h2>",
        f'<p class="note">eval predict-video: the visual words VideoBERT fills in after each sentence, each shown '
        f"by the {PREDICTED_THUMBNAILS} clips of this run nearest its leaf centroid, with its probability.</p>",
    ]
    for sentence in sentences:
        figures = []
        for token in sentence["tokens"]:
            images = []
            for clip in token["nearest"]:
                jpeg = thumbnails.get((clip["shard"], clip["video_id"], clip["clip_index"]))
                if jpeg is not None:
                    title = html.escape(
                        f"leaf {token['leaf']}: {clip['video_id']} clip {clip['clip_index']} at {clip['start_s']:.1f}s",
                        quote=True,
                    )
                    images.append(f'<img src="{jpeg_data_uri(jpeg)}" alt="{title}" title="{title}">')
            caption = f"v{token['leaf']} {token['prob']:.2f}" + (" (empty leaf)" if token["empty"] else "")
            figures.append(
                f"<figure>{''.join(images) or '<span>no clip</span>'}"
                f"<figcaption>{html.escape(caption)}</figcaption></figure>"
            )
        parts.append(
            f'<div class="example predicted"><p>&ldquo;{html.escape(sentence["sentence"])}&rdquo;</p>'
            f'<div class="thumbs">{"".join(figures)}</div></div>'
        )
    return "\n".join(parts)
