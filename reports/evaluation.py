"""The evaluation parts of the run report (reports/report.py): the zero-shot table of DIR/eval/zero_shot.json
(every row in every ranking; the S3D linear probe of DIR/eval/linear_probe.json beside the closed-set rows)
and the predicted visual words of DIR/eval/predict_video.parquet, each shown by the clips of this run nearest
its leaf centroid (reports/gallery.py's search), like the paper's figure of video predicted from text."""

from __future__ import annotations

import html
import json
from pathlib import Path

from pipeline import storage, visual_words
from pipeline.workdir import WorkDir
from reports.gallery import html_table, jpeg_data_uri, nearest_clips

PREDICTED_THUMBNAILS = 3       # clips shown per predicted visual word (the nearest to its leaf centroid)
MAX_PREDICTED_SENTENCES = 20
ZERO_SHOT_ROWS = (("videobert", "VideoBERT (video + text)"), ("text_only_prior", "VideoBERT text-only prior"),
                  ("initial_bert_prior", "initial BERT prior"), ("s3d_linear_probe", "S3D linear probe (supervised)"),
                  ("chance", "chance (random ranking)"))


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
        found = nearest_clips(work_dir, codebook, {codebook.depth: [leaf for leaf in leaves if leaf not in empty]},
                              per_leaf, quiet=True)
        nearest = {node: [{"shard": clip.shard, "video_id": clip.video_id, "clip_index": clip.clip_index,
                           "start_s": clip.start_s, "distance": clip.distance} for clip in entry.nearest]
                   for (_, node), entry in found.items()}
    except FileNotFoundError:
        pass
    return [{"sentence": row["sentence"],
             "tokens": [{"leaf": leaf, "prob": prob, "empty": leaf in empty, "nearest": nearest.get(leaf, [])}
                        for leaf, prob in zip(row["visual_ids"], row["probs"])]} for row in rows]


def _share(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def zero_shot_html(report: dict | None, probe: dict | None) -> str:
    if report is None and probe is None:
        return ""
    parts = ["<h2>Zero-shot verb and noun classification</h2>"]
    if report is not None:
        parts.append(f"<p>checkpoint step {report['step']}, {report['segments']:,} segments "
                     f"({html.escape(str(report.get('segment_source', 'align')))}), {report['verbs']} verbs and "
                     f"{report['nouns']} nouns, template &ldquo;{html.escape(report['template'])}&rdquo;, logits in "
                     f"{report['precision']}. A prediction is right when it is any of the segment's labels.</p>")
    results = dict((report or {}).get("results") or {})
    if probe is not None:
        results.setdefault("closed", {})
        results["closed"] = dict(results["closed"], **probe["results"])
    if report is not None and not report.get("results"):
        parts.append("<p>no labels (eval.labels): predictions only.</p>")
    for mode in (report or {}).get("rankings") or ["closed"]:
        rows = results.get(mode)
        if not rows:
            continue
        sizes = (report or {}).get("candidates", {}).get(mode)
        title = "open vocabulary" if mode == "open" else "closed set (the label lists)"
        if sizes:
            title += f": {sizes['verb']:,} verb and {sizes['noun']:,} noun candidates"
        parts.append(f"<h3>{html.escape(title)}</h3>")
        parts.append(html_table(["", "verb top-1", "verb top-5", "noun top-1", "noun top-5", "segments (verb/noun)"],
                            [[name, *(_share(rows[key][part][top]) for part in ("verb", "noun") for top in ("top1", "top5")),
                              f"{rows[key]['verb']['n']}/{rows[key]['noun']['n']}"]
                             for key, name in ZERO_SHOT_ROWS if key in rows]))
    if probe is not None:
        parts.append(f'<p class="note">S3D linear probe: {html.escape(probe["classifier"])} on the '
                     f'{html.escape(probe["feature"])}; {probe["segments"]["train"]} training and '
                     f'{probe["segments"]["test"]} test segments ({html.escape(probe["split"])}).</p>')
    notes = ((report or {}).get("notes") or []) + ((probe or {}).get("notes") or [])
    parts += [f'<p class="note">{html.escape(note)}</p>' for note in notes]
    return "\n".join(parts)


def predicted_video_html(sentences: list[dict], thumbnails: dict) -> str:
    if not sentences:
        return ""
    parts = ["<h2>Predicted visual words</h2>",
             f'<p class="note">eval predict-video: the visual words VideoBERT fills in after each sentence, each shown '
             f'by the {PREDICTED_THUMBNAILS} clips of this run nearest its leaf centroid, with its probability.</p>']
    for sentence in sentences:
        figures = []
        for token in sentence["tokens"]:
            images = []
            for clip in token["nearest"]:
                jpeg = thumbnails.get((clip["shard"], clip["video_id"], clip["clip_index"]))
                if jpeg is not None:
                    title = html.escape(f"leaf {token['leaf']}: {clip['video_id']} clip {clip['clip_index']} at "
                                        f"{clip['start_s']:.1f}s", quote=True)
                    images.append(f'<img src="{jpeg_data_uri(jpeg)}" alt="{title}" title="{title}">')
            caption = f"v{token['leaf']} {token['prob']:.2f}" + (" (empty leaf)" if token["empty"] else "")
            figures.append(f'<figure>{"".join(images) or "<span>no clip</span>"}'
                           f'<figcaption>{html.escape(caption)}</figcaption></figure>')
        parts.append(f'<div class="example predicted"><p>&ldquo;{html.escape(sentence["sentence"])}&rdquo;</p>'
                     f'<div class="thumbs">{"".join(figures)}</div></div>')
    return "\n".join(parts)
