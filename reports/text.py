"""The run report's text sections: ASR status and languages, the share of each video's clips inside a text
segment, words per ASR sentence and WordPiece tokens per text segment; and a few text segments shown as
their sentence next to the thumbnails of the clips giving its visual tokens."""

from __future__ import annotations

import html
import math
from pathlib import Path

import pyarrow.compute as pc

from pipeline import storage
from pipeline.config import Config
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir
from reports.page import jpeg_data_uri
from reports.svg import svg_bars, svg_share_bars

EXAMPLE_SEGMENTS = 4  # text segments shown with their thumbnails, each from another video
MAX_VIDEO_BARS = 50  # more videos than this: coverage is shown as a histogram
MAX_SENTENCE_WORDS = 60  # longer sentences are counted in the last bin


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
        values.append(sum(counts[low : high + 1]))
    return labels, values


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
        reasons = (
            pc.struct_field(sentences, "rejected").to_pylist()
            if "rejected" in {f.name for f in sentences.type}
            else [None] * len(sentences)
        )
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
        for video_id, kind, n_clips, n_text in zip(
            table["video_id"].to_pylist(), table["kind"].to_pylist(), clips, text_lengths
        ):
            entry = coverage.setdefault(video_id, [0, 0])
            entry[1] += n_clips
            segments[kind] = segments.get(kind, 0) + 1
            if kind == "text_video":
                entry[0] += n_clips
                wordpieces[min(n_text, token_cap)] += 1
    return {
        "asr_status": dict(sorted(asr_status.items())),
        "languages": dict(sorted(languages.items())),
        "text_languages": cfg.align.text_languages,
        "words_per_sentence": words,
        "sentences_rejected": dict(sorted(rejected.items())),
        "segments": segments,
        "wordpieces_per_text_segment": wordpieces,
        "wordpiece_cap": token_cap,
        "coverage": {
            video: round(text / total, 4) if total else 0.0 for video, (text, total) in sorted(coverage.items())
        },
    }


def text_html(text: dict) -> str:
    parts = ["<h2>Text</h2>"]
    if text["asr_status"]:
        parts.append(
            "<p>ASR videos by status: "
            + html.escape(", ".join(f"{key} {value}" for key, value in text["asr_status"].items()))
            + "; by language: "
            + html.escape(", ".join(f"{key} {value}" for key, value in text["languages"].items()))
            + f"; text kept for {html.escape(', '.join(text['text_languages']))}.</p>"
        )
        if text.get("sentences_rejected"):
            parts.append(
                "<p>sentences rejected as not speech (kept as video only): "
                + html.escape(", ".join(f"{key} {value}" for key, value in text["sentences_rejected"].items()))
                + ".</p>"
            )
    else:
        parts.append("<p>no ASR output yet: run the asr stage.</p>")
    plots = []
    coverage = text["coverage"]
    if coverage:
        segments = text["segments"]
        parts.append(
            f"<p>segments: {segments.get('text_video', 0):,} with text, "
            f"{segments.get('video_only', 0):,} video only.</p>"
        )
        if len(coverage) <= MAX_VIDEO_BARS:
            plots.append(
                svg_share_bars(
                    list(coverage), list(coverage.values()), title="share of each video's clips inside a text segment"
                )
            )
        else:
            bins = [0] * 11
            for share in coverage.values():
                bins[min(int(share * 10), 10)] += 1
            plots.append(
                svg_bars(
                    ["0"] + [f"{10 * i}-{10 * i + 10}%" for i in range(10)],
                    [sum(1 for s in coverage.values() if s == 0)] + bins[:9] + [bins[9] + bins[10]],
                    title="videos by share of clips inside a text segment",
                    x_label="share of clips (0 = none)",
                    y_label="videos",
                )
            )
    elif text["asr_status"]:
        parts.append("<p>no aligned segments yet: run the align stage.</p>")
    if any(text["words_per_sentence"]):
        labels, values = _grouped(text["words_per_sentence"])
        # the caption names the open-ended bin only when the axis shows it
        capped = f" ({MAX_SENTENCE_WORDS}+ = {MAX_SENTENCE_WORDS} or more)" if labels[-1].endswith("+") else ""
        plots.append(
            svg_bars(labels, values, title="words per ASR sentence", x_label=f"words{capped}", y_label="sentences")
        )
    if any(text["wordpieces_per_text_segment"]):
        labels, values = _grouped(text["wordpieces_per_text_segment"])
        capped = f" ({text['wordpiece_cap']}+ = train.max_len or more)" if labels[-1].endswith("+") else ""
        plots.append(
            svg_bars(
                labels, values, title="WordPiece tokens per text segment", x_label=f"tokens{capped}", y_label="segments"
            )
        )
    return "\n".join(parts) + '<div class="plots">' + "".join(plots) + "</div>"


def _segment_clips(clips: list[dict], segment: dict) -> list[dict]:
    """The clips whose tokens a segment holds: in time order, those overlapping the segment's span whose
    tokens match its visual ids in turn (each clip is in exactly one segment, in clip order)."""
    matched, wanted = [], segment["visual_ids"]
    for clip in clips:
        if len(matched) == len(wanted):
            break
        if (
            clip["end_s"] > segment["start_s"]
            and clip["start_s"] < segment["end_s"]
            and clip["token"] == wanted[len(matched)]
        ):
            matched.append(clip)
    return matched


def example_segments(work_dir: Path, limit: int = EXAMPLE_SEGMENTS) -> list[dict]:
    """The first text segment of each of the first `limit` videos that have one, with their clips."""
    examples = []
    for shard, path in Lineage(work_dir).current_parts("align"):
        if len(examples) == limit:
            break
        table = storage.read_table(
            path,
            filters=[("kind", "=", "text_video")],
            columns=["video_id", "segment_index", "start_s", "end_s", "text", "visual_ids"],
        )
        seen = {example["video_id"] for example in examples}
        for row in table.to_pylist():
            if len(examples) == limit:
                break
            if row["video_id"] in seen or not row["visual_ids"]:
                continue
            seen.add(row["video_id"])
            quantize_path = WorkDir(work_dir).part("quantize", shard)
            clips = (
                storage.read_table(
                    quantize_path,
                    filters=[("video_id", "=", row["video_id"])],
                    columns=["clip_index", "start_s", "end_s", "token"],
                ).to_pylist()
                if quantize_path.exists()
                else []
            )
            row["clips"] = [
                dict(clip, shard=shard) for clip in _segment_clips(sorted(clips, key=lambda c: c["clip_index"]), row)
            ]
            examples.append(row)
    return examples


def examples_html(examples: list[dict], thumbnails: dict) -> str:
    if not examples:
        return ""
    parts = [
        "<h2>Example segments</h2>",
        '<p class="note">a sentence and the clips inside its span, each with its visual token.</p>',
    ]
    for example in examples:
        figures = []
        for clip in example["clips"]:
            jpeg = thumbnails.get((clip["shard"], example["video_id"], clip["clip_index"]))
            if jpeg is None:
                continue
            title = html.escape(f"clip {clip['clip_index']} at {clip['start_s']:.1f}s, token {clip['token']}")
            figures.append(
                f'<figure><img src="{jpeg_data_uri(jpeg)}" alt="{title}" title="{title}">'
                f"<figcaption>v{clip['token']}</figcaption></figure>"
            )
        parts.append(
            f'<div class="example"><p><b>{html.escape(example["video_id"])}</b> '
            f"{example['start_s']:.1f}-{example['end_s']:.1f} s, segment {example['segment_index']}: "
            f"&ldquo;{html.escape(example['text'] or '')}&rdquo;</p>"
            f'<div class="thumbs">{"".join(figures)}</div></div>'
        )
    return "\n".join(parts)
