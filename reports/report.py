"""The run report: one self-contained HTML page (DIR/report.html, plots as inline SVG, thumbnails as data:
URIs, no script and no network fetch) saying what each stage produced, and DIR/report.json with every
number it shows.

- stages: shards done, videos, clips, errors, seconds and throughput (per worker and over the wall-clock
  span of the stage), the decode status of the videos, errors by stage and type with examples;
- visual words: token frequency by rank (log-log), the codebook's node-size histogram per level, empty
  leaves and leaves no clip of this run reached;
- text: ASR status and languages, the share of each video's clips inside a text segment, words per ASR
  sentence and WordPiece tokens per text segment;
- a few text segments shown as their sentence next to the thumbnails of the clips giving its visual tokens;
- warnings: data that cannot teach (the codebook sidecar's, the training log's start record's);
- one row per video: decode status and clips, ASR language and its probability, kept and rejected
  sentences, segments of each kind, error rows (a too-short or broken video is named here);
- training, when DIR/train/log.jsonl exists: the total loss and, per objective (mlm_text, mlm_video,
  mlm_text_video, alignment), the losses and accuracies of the training windows beside those of the
  `validation` records on held-out videos (nothing drawn for them when the log has none);
- the zero-shot table (DIR/eval/zero_shot.json: every row in every ranking, with the S3D linear probe of
  DIR/eval/linear_probe.json beside the closed-set rows) and the predicted visual words
  (DIR/eval/predict_video.parquet): per sentence, each predicted leaf shown by the clips nearest its centroid.

Every input is read part by part, one column at a time: memory grows with the number of videos (coverage
per video) and of leaves, never with the number of clips or sentences."""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from pipeline import storage, visual_words
from pipeline.config import Config
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir
from pipeline.progress import format_number, format_rate
from pipeline.registry import SHARD_STAGES
from reports import summary
from reports.evaluation import (predicted_video, predicted_video_html, read_json, zero_shot_html,
                                zero_shot_predictions)
from reports.forecast import forecast_data, forecast_html, forecast_thumbnails
from reports.gallery import html_page, jpeg_data_uri, read_thumbnails, s3d_weights
from reports.gallery import html_table as _table
from reports.svg import axis_top as svg_axis_top
from reports.svg import fmt_number, svg_bars, svg_line, svg_lines, svg_share_bars

EXAMPLE_SEGMENTS = 4           # text segments shown with their thumbnails, each from another video
ERROR_EXAMPLES = 20
MAX_VIDEO_BARS = 50            # more videos than this: coverage is shown as a histogram
MAX_VIDEO_ROWS = 300           # videos listed in the per-video table (those to look at first)
MAX_SENTENCE_WORDS = 60        # longer sentences are counted in the last bin
RANK_POINTS = 400              # points drawn on the rank-frequency curve (log-spaced ranks)

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


def _size_bins(counts: np.ndarray) -> tuple[list[str], list[int]]:
    """Node sizes in powers of two: 0 (empty), 1, 2-3, 4-7, ...; (labels, number of nodes per bin)."""
    top = int(counts.max()) if len(counts) else 0
    labels, values = ["0"], [int((counts == 0).sum())]
    low = 1
    while low <= top:
        high = low * 2 - 1
        labels.append(f"{fmt_number(low)}" if low == high else f"{fmt_number(low)}-{fmt_number(high)}")
        values.append(int(((counts >= low) & (counts <= high)).sum()))
        low *= 2
    return labels, values


def _grouped(counts: list[int], max_bars: int = 32) -> tuple[list[str], list[int]]:
    """Counts per value 0..n-1 (the last one meaning "n-1 or more") grouped into at most `max_bars` bars
    from the smallest to the largest value seen."""
    seen = [value for value, count in enumerate(counts) if count]
    first, last = seen[0], seen[-1]
    width = max(1, math.ceil((last - first + 1) / max_bars))
    labels, values = [], []
    for low in range(first, last + 1, width):
        high = min(low + width - 1, last)
        label = str(low) if low == high else f"{low}-{high}"
        labels.append(label + ("+" if high == len(counts) - 1 else ""))
        values.append(sum(counts[low:high + 1]))
    return labels, values


# ---------------------------------------------------------------- the numbers

def stage_runs(work_dir: Path) -> dict[str, dict]:
    """Per stage, from its completion records: shards, videos, clips, errors, seconds and throughput."""
    stages = {}
    for stage in SHARD_STAGES:
        records = list(Lineage(work_dir).current_records(stage).values())
        if not records:
            continue
        seconds = sum(record.get("seconds", 0.0) for record in records)
        if summary.made_in(records):   # made in another stage's pass (decode in features'): its time is that one's
            stages[stage] = {"shards": len(records), "seconds": 0.0, "wall_seconds": None,
                             "made_in": summary.made_in(records),
                             **{key: sum(record.get(key, 0) for record in records) for key in ("videos", "clips", "errors")
                                if any(key in record for record in records)}}
            continue
        ends = [record["finished_at"] for record in records if "finished_at" in record]
        starts = [record["finished_at"] - record.get("seconds", 0.0) for record in records if "finished_at" in record]
        entry = {"shards": len(records), "seconds": round(seconds, 3),
                 "wall_seconds": round(max(ends) - min(starts), 3) if ends else None}
        for key in ("videos", "clips", "errors", "audio_s", "segments", "sentences"):
            if any(key in record for record in records):
                entry[key] = sum(record.get(key, 0) for record in records)
        work = entry.get("clips", entry.get("videos", 0))
        entry["clips_per_s" if "clips" in entry else "videos_per_s"] = round(work / seconds, 3) if seconds else None
        if entry["wall_seconds"]:
            entry["wall_rate"] = round(work / entry["wall_seconds"], 3)
        if "audio_s" in entry and seconds:
            entry["realtime_factor"] = round(entry["audio_s"] / seconds, 2)
        stages[stage] = entry
    return stages


def error_examples(work_dir: Path, limit: int = ERROR_EXAMPLES) -> list[dict]:
    examples = []
    for stage in SHARD_STAGES:
        for shard in Lineage(work_dir).current_records(stage):
            path = WorkDir(work_dir).errors(stage, shard)
            if not path.exists():
                continue   # parts made outside the stages have no error table
            for row in storage.read_table(path, columns=["stage", "video_id", "error_type", "message"]).to_pylist():
                if len(examples) == limit:
                    return _one_per_failure(examples)
                examples.append(dict(row, shard=shard))
    return _one_per_failure(examples)


def _one_per_failure(rows: list[dict]) -> list[dict]:
    """One read failure recorded by several stages is one example (its `stages` listed)."""
    from reports.status import distinct_failures
    return [{key: value for key, value in row.items() if key != "shard"} for row in distinct_failures(rows)]


def visual_word_stats(work_dir: Path) -> dict | None:
    """Token counts from quantize and the codebook's node sizes; None before the codebook exists."""
    try:
        codebook = visual_words.load(WorkDir(work_dir).codebook)
    except FileNotFoundError:
        return None
    token_counts = summary.token_counts(work_dir, codebook.num_leaves)[:codebook.num_leaves]
    by_rank = np.sort(token_counts[token_counts > 0])[::-1]
    total = int(token_counts.sum())
    probabilities = by_rank / max(total, 1)
    leaf_counts = codebook.counts[-1]
    return {
        "depth": codebook.depth, "k": codebook.k, "leaves": codebook.num_leaves,
        "codebook_sha256": codebook.info.get("sha256"), "sample_size": codebook.info.get("sample_size"),
        "weights": s3d_weights(codebook),
        "levels": [{"level": level, "nodes": int(len(counts)), "empty": int((counts == 0).sum()),
                    "size_bins": dict(zip(*_size_bins(counts)))}
                   for level, counts in enumerate(codebook.counts, start=1)],
        "empty_leaves": int((leaf_counts == 0).sum()),
        "clips_quantized": total,
        "distinct_tokens": int(len(by_rank)),
        "unreached_nonempty_leaves": int(((leaf_counts > 0) & (token_counts == 0)).sum()) if total else None,
        "perplexity": round(float(np.exp(-(probabilities * np.log(probabilities)).sum())), 2) if total else None,
        "top_token_share": round(float(probabilities[0]), 4) if total else None,
        "frequency_by_rank": by_rank.tolist(),
    }


def text_stats(cfg: Config, work_dir: Path) -> dict:
    """ASR status and languages, words per sentence kept as speech and the sentences the not-speech filter
    rejected by reason, coverage per video and WordPiece segment lengths."""
    asr_status: dict[str, int] = {}
    languages: dict[str, int] = {}
    rejected: dict[str, int] = {}
    words = [0] * (MAX_SENTENCE_WORDS + 1)
    for _, path in Lineage(work_dir).current_parts("asr"):
        table = storage.read_table(path, columns=["status", "language", "sentences"])
        for status in table["status"].to_pylist():
            asr_status[status] = asr_status.get(status, 0) + 1
        for language in table["language"].to_pylist():
            languages[language or "unknown"] = languages.get(language or "unknown", 0) + 1
        sentences = pc.list_flatten(table["sentences"])
        reasons = (pc.struct_field(sentences, "rejected").to_pylist()
                   if "rejected" in {f.name for f in sentences.type} else [None] * len(sentences))
        for text, reason in zip(pc.struct_field(sentences, "text").to_pylist(), reasons):
            if reason is None:
                words[min(len((text or "").split()), MAX_SENTENCE_WORDS)] += 1
            else:
                rejected[reason] = rejected.get(reason, 0) + 1
    coverage: dict[str, list[int]] = {}
    token_cap = cfg.train.max_len
    wordpieces = [0] * (token_cap + 1)
    segments = {"text_video": 0, "video_only": 0}
    for _, path in Lineage(work_dir).current_parts("align"):
        table = storage.read_table(path, columns=["video_id", "kind", "text_ids", "visual_ids"])
        clips = pc.list_value_length(table["visual_ids"]).to_pylist()
        text_lengths = pc.list_value_length(table["text_ids"]).to_pylist()
        for video_id, kind, n_clips, n_text in zip(table["video_id"].to_pylist(), table["kind"].to_pylist(),
                                                   clips, text_lengths):
            entry = coverage.setdefault(video_id, [0, 0])
            entry[1] += n_clips
            segments[kind] = segments.get(kind, 0) + 1
            if kind == "text_video":
                entry[0] += n_clips
                wordpieces[min(n_text, token_cap)] += 1
    return {"asr_status": dict(sorted(asr_status.items())), "languages": dict(sorted(languages.items())),
            "text_languages": cfg.align.text_languages, "words_per_sentence": words,
            "sentences_rejected": dict(sorted(rejected.items())),
            "segments": segments, "wordpieces_per_text_segment": wordpieces, "wordpiece_cap": token_cap,
            "coverage": {video: round(text / total, 4) if total else 0.0
                         for video, (text, total) in sorted(coverage.items())}}


def _segment_clips(clips: list[dict], segment: dict) -> list[dict]:
    """The clips whose tokens a segment holds: in time order, those overlapping the segment's span whose
    tokens match its visual ids in turn (each clip is in exactly one segment, in clip order)."""
    matched, wanted = [], segment["visual_ids"]
    for clip in clips:
        if len(matched) == len(wanted):
            break
        if clip["end_s"] > segment["start_s"] and clip["start_s"] < segment["end_s"] \
                and clip["token"] == wanted[len(matched)]:
            matched.append(clip)
    return matched


def example_segments(work_dir: Path, limit: int = EXAMPLE_SEGMENTS) -> list[dict]:
    """The first text segment of each of the first `limit` videos that have one, with their clips."""
    examples = []
    for shard, path in Lineage(work_dir).current_parts("align"):
        if len(examples) == limit:
            break
        table = storage.read_table(path, filters=[("kind", "=", "text_video")],
                                   columns=["video_id", "segment_index", "start_s", "end_s", "text", "visual_ids"])
        seen = {example["video_id"] for example in examples}
        for row in table.to_pylist():
            if len(examples) == limit:
                break
            if row["video_id"] in seen or not row["visual_ids"]:
                continue
            seen.add(row["video_id"])
            quantize_path = WorkDir(work_dir).part("quantize", shard)
            clips = storage.read_table(quantize_path, filters=[("video_id", "=", row["video_id"])],
                                       columns=["clip_index", "start_s", "end_s", "token"]).to_pylist() \
                if quantize_path.exists() else []
            row["clips"] = [dict(clip, shard=shard) for clip in
                            _segment_clips(sorted(clips, key=lambda c: c["clip_index"]), row)]
            examples.append(row)
    return examples


def training_log(records: list[dict]) -> list[dict]:
    return [record for record in records if record.get("event") == "train"]


def validation_log(records: list[dict]) -> list[dict]:
    """The `validation` records (the objectives on held-out videos every train.validation_every steps)."""
    return [record for record in records if record.get("event") == "validation"]


def training_header(records: list[dict]) -> dict | None:
    """The latest start or resume record: notes, warnings, the held-out videos."""
    last = summary.train_header(records)
    if last is None:
        return None
    return {key: last.get(key) for key in ("event", "step", "notes", "warnings", "validation_videos")}


def _rows(path: Path | None, columns: list[str]) -> list[dict]:
    return storage.read_table(path, columns=columns).to_pylist() if path is not None else []


def video_table(work_dir: Path, limit: int = MAX_VIDEO_ROWS) -> dict:
    """One row per manifest video: decode status and clips, ASR language, kept and rejected sentences (a
    sentence whose `rejected` is set; asr parts without that field keep every sentence), segments of each
    kind, error rows. Read one shard at a time. Past `limit` videos, those with something to see (a status
    other than ok, an error, no text segment) come first and the rest are only counted."""
    work = WorkDir(work_dir)
    checker = Lineage(work_dir)
    parts = {stage: dict(checker.current_parts(stage, table)) for stage, table in
             (("decode", "videos"), ("asr", ""), ("align", ""))}
    error_stages = {stage: set(checker.current_records(stage)) for stage in SHARD_STAGES}
    rows, total = [], 0
    for shard in checker.manifest_shards():
        videos = {row["video_id"]: {"video_id": row["video_id"], "shard": shard, "status": None, "clips": None,
                                    "duration_s": None, "asr_status": None, "language": None,
                                    "language_prob": None, "sentences_kept": None, "sentences_rejected": None,
                                    "rejected_by_reason": {}, "text_segments": None, "video_only_segments": None,
                                    "errors": []}
                  for row in checker.shard_videos(shard)}
        for row in _rows(parts["decode"].get(shard), ["video_id", "status", "n_clips", "duration_s"]):
            if row["video_id"] in videos:
                videos[row["video_id"]].update(status=row["status"], clips=row["n_clips"],
                                               duration_s=row["duration_s"])
        asr_path = parts["asr"].get(shard)
        if asr_path is not None:
            table = storage.read_table(asr_path, columns=["video_id", "status", "language", "language_prob",
                                                          "sentences"])
            has_rejected = "rejected" in {field.name for field in table.schema.field("sentences").type.value_type}
            for index, video_id in enumerate(table["video_id"].to_pylist()):
                if video_id not in videos:
                    continue
                sentences = table["sentences"][index].values
                count = 0 if sentences is None else len(sentences)
                reasons = (pc.struct_field(sentences, "rejected").to_pylist() if has_rejected and count
                           else [None] * count)
                by_reason: dict[str, int] = {}
                for reason in reasons:
                    if reason is not None:
                        by_reason[reason] = by_reason.get(reason, 0) + 1
                probability = table["language_prob"][index].as_py()
                videos[video_id].update(asr_status=table["status"][index].as_py(),
                                        language=table["language"][index].as_py(),
                                        language_prob=None if probability is None else round(probability, 4),
                                        sentences_kept=sum(reason is None for reason in reasons),
                                        sentences_rejected=sum(by_reason.values()),
                                        rejected_by_reason=dict(sorted(by_reason.items())))
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
        if len(rows) > 2 * limit:      # memory stays bounded: keep the ones to show first
            rows = sorted(rows, key=_video_order)[:limit]
    if total > limit:
        rows = sorted(rows, key=_video_order)[:limit]
    return {"videos": total, "rows": rows, "not_listed": total - len(rows)}


def _needs_a_look(row: dict) -> bool:
    return (row["status"] not in ("ok", None) or bool(row["errors"]) or row["text_segments"] == 0
            or bool(row["sentences_rejected"]))


def _video_order(row: dict) -> tuple:
    return (not _needs_a_look(row), row["shard"], row["video_id"])


def collect(cfg: Config, work_dir: Path) -> dict:
    """Every number the report shows (the content of DIR/report.json)."""
    work_dir = WorkDir(work_dir).root
    evaluation = WorkDir(work_dir).eval_folder
    zero_shot = read_json(evaluation / "zero_shot.json")
    log = summary.log_records(work_dir)        # the training log, read once
    return {"summary": summary.collect(work_dir), "stages": stage_runs(work_dir),
            "error_examples": error_examples(work_dir), "visual_words": visual_word_stats(work_dir),
            "text": text_stats(cfg, work_dir), "examples": example_segments(work_dir),
            "videos": video_table(work_dir),
            "train": training_log(log), "validation": validation_log(log),
            "train_header": training_header(log), "zero_shot": zero_shot,
            "zero_shot_predictions": zero_shot_predictions(work_dir, zero_shot),
            "linear_probe": read_json(evaluation / "linear_probe.json"), "predicted_video": predicted_video(work_dir),
            "forecast": forecast_data(work_dir), "uniform_loss": uniform_losses(cfg, work_dir) if log else None}


# ---------------------------------------------------------------- the page

def _number(value) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else format_number(value)


def _stages_html(data: dict) -> str:
    run, stages = data["summary"], data["stages"]
    rows = []
    for stage in SHARD_STAGES:
        counted = run["stages"].get(stage)
        entry = stages.get(stage)
        if not counted or not entry:
            rows.append([stage, f"0/{run['shards']}", "-", "-", "-", "-", "-", "-", "not run"])
            continue
        unit = "clips" if "clips_per_s" in entry else "videos"
        done = entry.get(unit, 0)
        extra = f"{entry['realtime_factor']}x real time" if "realtime_factor" in entry else ""
        if entry.get("made_in"):
            rows.append([stage, f"{counted['shards_complete']}/{counted['shards_total']}", _number(entry.get("videos")),
                         _number(counted["rows"]), _number(entry.get("errors", 0)), f"in {entry['made_in']}", "-", "-",
                         f"made in the {entry['made_in']} stage's pass (one read of each video): its time is counted there"])
            continue
        rows.append([stage, f"{counted['shards_complete']}/{counted['shards_total']}", _number(entry.get("videos")),
                     _number(counted["rows"]), _number(entry.get("errors", 0)), _number(entry["seconds"]),
                     format_rate(done, entry["seconds"], unit), format_rate(done, entry["wall_seconds"] or 0, unit),
                     extra])
    parts = ["<h2>Stages</h2>",
             _table(["stage", "shards", "videos", "rows out", "error rows", "shard-seconds",
                     "per worker", "over the run", "note"], rows),
             '<p class="note">per worker: output per second of shard work; over the run: output per second '
             'between the first shard\'s start and the last shard\'s end (all workers together).</p>']
    if "videos_by_status" in run:
        parts.append("<p>videos by decode status: " + html.escape(", ".join(
            f"{status} {count}" for status, count in run["videos_by_status"].items())) + "</p>")
    if run["errors"]:
        parts.append(f"<p>{html.escape(str(run.get('failed_videos', '?')))} failed video(s)</p>")
        parts.append(_table(["error type", "videos", "recorded by"],
                            [[error_type, entry["videos"], ", ".join(entry["stages"])]
                             for error_type, entry in run.get("failures_by_type", {}).items()]))
        parts.append(_table(["stages", "video", "error type", "message"],
                            [[", ".join(row.get("stages", [row["stage"]])), row["video_id"], row["error_type"],
                              _shortened(row["message"])] for row in data["error_examples"]]))
        if any(_shortened(row["message"]) != row["message"] for row in data["error_examples"]):
            parts.append(f'<p class="note">messages longer than {SHOWN_MESSAGE} characters are cut short here; '
                         f'report.json and `videobert errors` have them in full.</p>')
    else:
        parts.append("<p>errors: none</p>")
    return "\n".join(parts)


def _visual_words_html(words: dict | None) -> str:
    if words is None:
        return "<h2>Visual words</h2><p>no codebook yet: run the kmeans stage.</p>"
    parts = ["<h2>Visual words</h2>",
             f"<p>codebook: depth {words['depth']}, k {words['k']}: {words['leaves']:,} leaves; fit on "
             f"{_number(words['sample_size'])} clips; sha256 {html.escape(str(words['codebook_sha256'])[:16])}; "
             f"S3D weights {html.escape(words['weights'])}. Empty leaves (no training member): "
             f"{words['empty_leaves']:,}.</p>"]
    if words["weights"].startswith("random"):
        parts.append('<p class="warning">features from random S3D weights: the visual words are not semantic</p>')
    if words["clips_quantized"]:
        parts.append(f"<p>{words['clips_quantized']:,} clips quantized into {words['distinct_tokens']:,} distinct "
                     f"tokens; perplexity {words['perplexity']:,} (the number of equally likely tokens with the "
                     f"same entropy); the most frequent token holds {words['top_token_share']:.1%} of the clips; "
                     f"{words['unreached_nonempty_leaves']:,} non-empty leaves reached by no clip of this run.</p>")
    else:
        parts.append("<p>no quantized clips yet: run the quantize stage.</p>")
    by_rank = words["frequency_by_rank"]
    ranks = sorted(set(np.geomspace(1, len(by_rank), RANK_POINTS).astype(int).tolist())) if by_rank else []
    plots = [svg_line(ranks, [by_rank[rank - 1] for rank in ranks], title="visual-token frequency by rank",
                      x_label="rank", y_label="clips", log=True)]
    for level in words["levels"]:
        labels, values = list(level["size_bins"]), list(level["size_bins"].values())
        plots.append(svg_bars(labels, values, title=f"level {level['level']}: {level['nodes']:,} nodes, "
                                                    f"{level['empty']:,} empty",
                              x_label="training members per node", y_label="nodes"))
    return "\n".join(parts) + '<div class="plots">' + "".join(plots) + "</div>"


def _text_html(text: dict) -> str:
    parts = ["<h2>Text</h2>"]
    if text["asr_status"]:
        parts.append("<p>ASR videos by status: " + html.escape(", ".join(
            f"{key} {value}" for key, value in text["asr_status"].items())) + "; by language: " + html.escape(
            ", ".join(f"{key} {value}" for key, value in text["languages"].items()))
            + f"; text kept for {html.escape(', '.join(text['text_languages']))}.</p>")
        if text.get("sentences_rejected"):
            parts.append("<p>sentences rejected as not speech (kept as video only): " + html.escape(", ".join(
                f"{key} {value}" for key, value in text["sentences_rejected"].items())) + ".</p>")
    else:
        parts.append("<p>no ASR output yet: run the asr stage.</p>")
    plots = []
    coverage = text["coverage"]
    if coverage:
        segments = text["segments"]
        parts.append(f"<p>segments: {segments.get('text_video', 0):,} with text, "
                     f"{segments.get('video_only', 0):,} video only.</p>")
        if len(coverage) <= MAX_VIDEO_BARS:
            plots.append(svg_share_bars(list(coverage), list(coverage.values()),
                                        title="share of each video's clips inside a text segment"))
        else:
            bins = [0] * 11
            for share in coverage.values():
                bins[min(int(share * 10), 10)] += 1
            plots.append(svg_bars(["0"] + [f"{10 * i}-{10 * i + 10}%" for i in range(10)],
                                  [sum(1 for s in coverage.values() if s == 0)] + bins[:9] + [bins[9] + bins[10]],
                                  title="videos by share of clips inside a text segment",
                                  x_label="share of clips (0 = none)", y_label="videos"))
    elif text["asr_status"]:
        parts.append("<p>no aligned segments yet: run the align stage.</p>")
    if any(text["words_per_sentence"]):
        labels, values = _grouped(text["words_per_sentence"])
        # the caption names the open-ended bin only when the axis shows it
        capped = f" ({MAX_SENTENCE_WORDS}+ = {MAX_SENTENCE_WORDS} or more)" if labels[-1].endswith("+") else ""
        plots.append(svg_bars(labels, values, title="words per ASR sentence", x_label=f"words{capped}",
                              y_label="sentences"))
    if any(text["wordpieces_per_text_segment"]):
        labels, values = _grouped(text["wordpieces_per_text_segment"])
        capped = f" ({text['wordpiece_cap']}+ = train.max_len or more)" if labels[-1].endswith("+") else ""
        plots.append(svg_bars(labels, values, title="WordPiece tokens per text segment", x_label=f"tokens{capped}",
                              y_label="segments"))
    return "\n".join(parts) + '<div class="plots">' + "".join(plots) + "</div>"


def _examples_html(examples: list[dict], thumbnails: dict) -> str:
    if not examples:
        return ""
    parts = ["<h2>Example segments</h2>",
             '<p class="note">a sentence and the clips inside its span, each with its visual token.</p>']
    for example in examples:
        figures = []
        for clip in example["clips"]:
            jpeg = thumbnails.get((clip["shard"], example["video_id"], clip["clip_index"]))
            if jpeg is None:
                continue
            title = html.escape(f"clip {clip['clip_index']} at {clip['start_s']:.1f}s, token {clip['token']}")
            figures.append(f'<figure><img src="{jpeg_data_uri(jpeg)}" alt="{title}" title="{title}">'
                           f'<figcaption>v{clip["token"]}</figcaption></figure>')
        parts.append(f'<div class="example"><p><b>{html.escape(example["video_id"])}</b> '
                     f'{example["start_s"]:.1f}-{example["end_s"]:.1f} s, segment {example["segment_index"]}: '
                     f'&ldquo;{html.escape(example["text"] or "")}&rdquo;</p>'
                     f'<div class="thumbs">{"".join(figures)}</div></div>')
    return "\n".join(parts)


OBJECTIVES = ("mlm_text", "mlm_video", "mlm_text_video", "alignment")


def _objective_charts(records: list[dict], what: str, loss_top: float | None,
                      steps_range: tuple[int, int]) -> tuple[str, str]:
    """(loss chart, accuracy chart) of the four objectives over `records` (train or validation), on the
    loss axis ending at `loss_top` and the step axis `steps_range`."""
    steps = [record["step"] for record in records]
    losses = [(name, steps, [record.get(f"{name}_loss") for record in records]) for name in OBJECTIVES]
    accuracies = [(name, steps, [record.get(f"{name}_acc") for record in records]) for name in OBJECTIVES]
    if any(record.get("alignment_auc") is not None for record in records):
        accuracies.append(("alignment AUC", steps, [record.get("alignment_auc") for record in records]))
    return (svg_lines(losses, title=f"{what} loss by objective", x_label="step", y_label="loss", y_max=loss_top,
                      x_range=steps_range),
            svg_lines(accuracies, title=f"{what} accuracy by objective", x_label="step", y_label="accuracy",
                      y_max=1.0, x_range=steps_range))


def _loss_top(records: list[dict]) -> float | None:
    values = [record.get(f"{name}_loss") for record in records for name in OBJECTIVES]
    values = [value for value in values if value is not None and math.isfinite(value)]
    if not values:
        return None
    return svg_axis_top(max(values))


def _validation_protocol_html(record: dict) -> str:
    """How the validation figures were made (the clean protocol; the run's noise beside it) and what the
    held-out videos could not measure: a regime without examples is null for that reason, said so."""
    parts = []
    if record.get("protocol") == "clean":
        parts.append("<p>validation figures: the clean protocol (no joining, no subsampling), comparable across "
                     "runs")
        noisy = record.get("noisy") or {}
        if noisy.get("alignment_acc") is not None:
            parts.append(f"; with this run's own noise, alignment accuracy {noisy['alignment_acc']:.3f}"
                         + (f", AUC {noisy['alignment_auc']:.3f}" if noisy.get("alignment_auc") is not None else ""))
        parts.append(".</p>")
    if record.get("missing"):
        parts.append('<p class="note">the held-out videos give nothing to measure for: '
                     f"{html.escape(', '.join(record['missing']))} (those figures are empty, not zero).</p>")
    return "".join(parts)


def _train_html(records: list[dict], validation: list[dict] | None = None, header: dict | None = None,
                uniform: dict | None = None) -> str:
    if not records:
        return ""
    validation = validation or []
    header = header or {}
    last = records[-1]
    steps, losses = [r["step"] for r in records], [r["loss"] for r in records]

    def baseline(name: str) -> list[str]:
        if not uniform:
            return []
        return [_number(uniform["alignment" if name == "alignment" else "mlm"])]

    metrics = [[name, *baseline(name), _number(last.get(f"{name}_loss")), _number(last.get(f"{name}_acc"))]
               + ([_number(validation[-1].get(f"{name}_loss")), _number(validation[-1].get(f"{name}_acc"))]
                  if validation else [])
               for name in OBJECTIVES if f"{name}_loss" in last]
    held_out = header.get("validation_videos")
    parts = ["<h2>Training</h2>",
             f"<p>step {last['step']:,}, loss {last['loss']:.4g}, {_number(last.get('tokens_per_s'))} tokens/s</p>",
             _table(["objective"] + (["uniform baseline"] if uniform else []) + ["loss", "accuracy"]
                    + ([f"validation loss (step {validation[-1]['step']:,})", "validation accuracy"]
                       if validation else []), metrics)]
    if uniform:
        parts.append(
            f'<p class="note">uniform baseline: the loss of a model that finds every token equally likely, ln V = '
            f'{uniform["mlm"]:.2f} for the masked-token objectives (each predicts over the whole vocabulary, '
            f'V = {uniform["vocabulary"]:,}: {uniform["text_vocabulary"]:,} word pieces, '
            f'{uniform["visual_words"]:,} visual words and [&gt;]) and ln 2 = {uniform["alignment"]:.2f} for '
            f'alignment. A loss below it has learnt something; a loss above it is confidently wrong, not merely '
            f'uninformed: usual early in training, and on held-out videos whose visual words training rarely '
            f'saw.</p>')
    if validation:
        videos = validation[-1].get("videos")
        parts.append(f"<p>validation: the objectives on {_number(videos)} held-out video{'' if videos == 1 else 's'}"
                     + (f" ({html.escape(', '.join(held_out[:10]))}{', ...' if len(held_out) > 10 else ''})"
                        if held_out else "")
                     + f" at {len(validation)} step(s); the training curves are each logging window's mean.</p>")
        if validation[-1].get("alignment_auc") is not None:
            parts.append(f"<p>validation alignment AUC {validation[-1]['alignment_auc']:.3f} (0.5 = chance).</p>")
        parts.append(_validation_protocol_html(validation[-1]))
    elif held_out is not None:
        parts.append("<p>no validation records yet (train.validation_every).</p>")
    else:
        parts.append('<p class="note">no held-out videos (train.validation_videos): the curves are training '
                     'loss only, which says nothing of what generalises.</p>')
    charts = [svg_line(steps, losses, title="training loss", x_label="step", y_label="loss", integer_x=True)]
    if any(f"{name}_loss" in record for record in records for name in OBJECTIVES):
        top = _loss_top(records + validation)       # one loss axis and one step axis for training and validation
        every_step = [record["step"] for record in records + validation]
        steps_range = (min(every_step), max(every_step))
        train_loss, train_acc = _objective_charts(records, "training", top, steps_range)
        rows = [charts + [train_loss, train_acc]]
        if validation:                              # each training chart beside its validation chart
            validation_loss, validation_acc = _objective_charts(validation, "validation", top, steps_range)
            rows = [charts, [train_loss, validation_loss], [train_acc, validation_acc]]
        parts += ['<div class="plots">' + "".join(row) + "</div>" for row in rows]
    else:
        parts.append('<div class="plots">' + "".join(charts) + "</div>")
    return "\n".join(parts)


def _warnings_html(warnings: list[dict]) -> str:
    if not warnings:
        return ""
    return ('<h2>Warnings</h2><ul class="warnings">'
            + "".join(f'<li><span class="warning">{html.escape(w["stage"])}</span>: {html.escape(w["message"])}</li>'
                      for w in warnings) + "</ul>")


def _rejected(row: dict) -> str:
    if row["sentences_rejected"] is None:
        return "-"
    reasons = ", ".join(f"{reason} {count}" for reason, count in row["rejected_by_reason"].items())
    return f"{row['sentences_rejected']}" + (f" ({reasons})" if reasons else "")


def _videos_html(videos: dict, held_out: list[str] | None = None) -> str:
    """`held_out`: the videos training kept for validation (marked: never trained on)."""
    if not videos["rows"]:
        return ""
    held_out = set(held_out or ())
    head = ["video", "shard", "decode status", "duration", "clips", "ASR", "language", "sentences kept",
            "rejected", "text segments", "video-only segments", "errors"]
    body = []
    for row in videos["rows"]:
        language = "-" if row["language"] is None else (
            row["language"] + ("" if row["language_prob"] is None else f" {row['language_prob']:.2f}"))
        cells = [("video", row["video_id"]), ("num", row["shard"]),
                 ("text", row["status"] or "not decoded"),
                 ("num", "-" if row["duration_s"] is None else f"{row['duration_s']:.1f} s"),
                 ("num", _number(row["clips"])), ("text", row["asr_status"] or "-"), ("text", language),
                 ("num", _number(row["sentences_kept"])), ("text", _rejected(row)),
                 ("num", _number(row["text_segments"])), ("num", _number(row["video_only_segments"])),
                 ("errors", "; ".join(row["errors"]) or "-")]
        flagged = ' class="flagged"' if _needs_a_look(row) else ""

        def shown(kind: str, value) -> str:
            if kind == "errors":
                return _folded(str(value))
            if kind == "video" and value in held_out:
                return f'{html.escape(str(value))} <span class="held-out">(held out)</span>'
            return html.escape(str(value))

        body.append(f"<tr{flagged}>" + "".join(
            f'<td class="{"text" if kind in ("video", "errors") else kind}">{shown(kind, value)}</td>'
            for kind, value in cells) + "</tr>")
    listed = len(videos["rows"])
    note = (f'<p class="note">{listed:,} of {videos["videos"]:,} videos listed, those to look at first; the '
            f'other {videos["not_listed"]:,} decoded, have text and no error.</p>' if videos["not_listed"] else "")
    return ("<h2>Videos</h2>"
            '<p class="note">one row per video of the manifest; highlighted: a decode status other than ok, '
            'an error, rejected sentences, or no text segment.'
            + (f' <i>(held out)</i>: one of the {len(held_out):,} video{"" if len(held_out) == 1 else "s"} training '
               f'keeps for validation (train.validation_videos), never trained on.' if held_out else "")
            + '</p>' + note
            + '<table class="videos"><tr>' + "".join(f"<th>{html.escape(name)}</th>" for name in head) + "</tr>"
            + "".join(body) + "</table>")


SHOWN_MESSAGE = 160   # characters of an error message shown before it is cut short (or folded)


def _shortened(message: str) -> str:
    return message if len(message) <= SHOWN_MESSAGE else message[:SHOWN_MESSAGE - 1].rstrip() + "…"


def _folded(message: str) -> str:
    """A message as HTML: in full when short, else its beginning with the rest folded (a click opens it)."""
    if len(message) <= SHOWN_MESSAGE:
        return html.escape(message)
    return (f"<details><summary>{html.escape(_shortened(message))}</summary>{html.escape(message)}</details>")


def uniform_losses(cfg: Config, work_dir: Path) -> dict | None:
    """The loss of a model that finds every token equally likely: ln V for the masked-token objectives (all
    three predict over the whole vocabulary: word pieces, visual words, [>]), ln 2 for alignment."""
    try:
        from pipeline.tokenizer import load_tokenizer
        info = read_json(WorkDir(work_dir).codebook_sidecar) or {}
        visual = int(info["k"]) ** int(info["depth"])
        text = len(load_tokenizer(cfg.align.tokenizer))
    except Exception:  # noqa: BLE001 - no codebook or tokenizer here: the report goes without the baseline
        return None
    vocabulary = text + visual + 1
    return {"vocabulary": vocabulary, "text_vocabulary": text, "visual_words": visual,
            "mlm": round(math.log(vocabulary), 4), "alignment": round(math.log(2), 4)}


def render(data: dict, thumbnails: dict, work_dir: Path) -> str:
    run = data["summary"]
    body = ["<h1>VideoBERT pipeline run report</h1>",
            f'<p class="provenance">work dir {html.escape(run["work_dir"])}: {run["videos_in"]:,} videos in '
            f'{run["shards"]} shard(s). Every number here is in report.json.</p>']
    if (WorkDir(work_dir).gallery / "index.html").exists():
        body.append('<p><a href="gallery/index.html">the visual words as pictures (gallery)</a></p>')
    body += [_warnings_html(run.get("warnings") or []), _stages_html(data),
             _videos_html(data["videos"], (data.get("train_header") or {}).get("validation_videos")),
             _visual_words_html(data["visual_words"]), _text_html(data["text"]),
             _examples_html(data["examples"], thumbnails),
             _train_html(data["train"], data.get("validation"), data.get("train_header"), data.get("uniform_loss")),
             zero_shot_html(data.get("zero_shot"), data.get("linear_probe"), data.get("zero_shot_predictions")),
             predicted_video_html(data.get("predicted_video") or [], thumbnails),
             forecast_html(data.get("forecast"), thumbnails)]
    return html_page("VideoBERT run report", "\n".join(body)).replace("</style>", REPORT_STYLE + "</style>", 1)


def write_report(cfg: Config, work_dir: Path) -> Path:
    """Write DIR/report.html and DIR/report.json; returns the HTML's path."""
    work = WorkDir(work_dir)
    if not work.manifest.exists():
        raise FileNotFoundError(f"{work.manifest} not found: nothing has run in {work.root} yet")
    data = collect(cfg, work_dir)
    wanted = [(clip["shard"], example["video_id"], clip["clip_index"])
              for example in data["examples"] for clip in example["clips"]]
    wanted += [(clip["shard"], clip["video_id"], clip["clip_index"])
               for sentence in data["predicted_video"] for token in sentence["tokens"] for clip in token["nearest"]]
    wanted += forecast_thumbnails(data.get("forecast"))
    thumbnails = read_thumbnails(work_dir, wanted) if wanted else {}
    page = work.report
    storage.atomic_write_json(work.report_data, data)
    storage.atomic_write_bytes(page, render(data, thumbnails, work_dir).encode())
    return page
