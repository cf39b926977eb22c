"""align: the training shards. Each ASR sentence becomes a segment paired with the visual tokens of the
clips in its time span; stretches with no sentence become video-only segments of
`align.tokens_per_segment_without_text` tokens. Text is BERT WordPiece (uncased, 30,522 tokens).

Which clips a sentence gets (every clip lands in exactly one segment):
- a clip belongs to a sentence it overlaps by at least `align.min_sentence_overlap` (half) of the clip;
- a clip that two sentences both overlap that much (overlapping captions) goes to the one it overlaps
  most; on a tie, to the earlier sentence;
- a sentence too short to own a clip that way gets the single clip it overlaps most, if no other sentence
  owns that clip; if one does, the short sentence joins that sentence's segment (text appended in time
  order); a sentence that overlaps no clip at all (speech after the last frame) is dropped and counted.

A sentence the asr stage's not-speech filter rejected (its `rejected` is not null: no_speech,
low_confidence, repetition, not_speech_language) is no text: its clips become video-only segments, as
for silence, and it is counted in `sentences_rejected`.

Curation (the quality and shots stages):
- a clip the quality stage excludes (black, frozen, ...: `quality.exclude`) is in no segment: no sentence
  owns it and it ends a run of video-only clips; a sentence with no other clip is dropped and counted in
  `sentences_over_excluded_clips`;
- a sentence's visual words stay within the shots it spans: a short sentence gets the clip it overlaps most
  among those whose middle lies in one of its shots (a clip it overlaps by half lies there already);
- with `decode.clip_policy: shots` a run of video-only clips also ends where a shot does."""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field

import pyarrow as pa

import schemas
from pipeline.contract import ShardContext, ShardResult
from pipeline.tokenizer import encode, load_tokenizer, vocabulary_sha256
from schemas.metadata import Provenance


@dataclass
class Segment:
    start_s: float
    end_s: float
    texts: list[tuple[float, int, str]] = field(default_factory=list)  # (start_s, sentence position, text)
    clips: list[int] = field(default_factory=list)  # positions in the video's clip list

    @property
    def text(self) -> str | None:
        return " ".join(text for _, _, text in sorted(self.texts)) if self.texts else None


def identities(cfg, videos: list[dict]) -> dict[str, str]:
    """What shapes the segments besides the config: the WordPiece vocabulary, by content, and whether the
    clip grid follows the shots (decode.clip_policy: video-only runs then end at shots too) (lineage)."""
    grid = {"clip grid": "starts again at every shot"} if cfg.decode.clip_policy == "shots" else {}
    return {"tokenizer": vocabulary_sha256(load_tokenizer(cfg.align.tokenizer)), **grid}


def primary_language(tag: str | None) -> str | None:
    """A language tag's primary subtag (BCP 47), lowercased: `en-US`, `en_gb` and `EN` are all `en`."""
    return tag.replace("_", "-").split("-", 1)[0].strip().lower() or None if tag else None


def _overlap(a_start: float, a_end: float, b_start: float, b_end: float) -> float:
    return max(0.0, min(a_end, b_end) - max(a_start, b_start))


def segment_video(
    clips: list[tuple[float, float]],
    sentences: list[dict],
    min_overlap: float,
    tokens_without_text: int,
    *,
    excluded: frozenset[int] = frozenset(),
    boundaries: list[float] = (),
    runs_end_at_shots: bool = False,
) -> tuple[list[Segment], int, int]:
    """Segments of one video in time order, as (segments, sentences dropped, sentences dropped because every
    clip they span is excluded). `clips` are (start_s, end_s)
    in clip order; `sentences` have text, start_s, end_s; `excluded` the positions of clips no segment may
    hold; `boundaries` the times where shots begin."""
    sentences = sorted(sentences, key=lambda s: (s["start_s"], s["end_s"]))

    def shot_at(time_s: float) -> int:
        return bisect.bisect_right(boundaries, time_s)

    shot_of_clip = [shot_at((start + end) / 2) for start, end in clips]
    # clips are in time order: only those from bisect(ends) to bisect(starts) can overlap a span
    starts, ends = [start for start, _ in clips], [end for _, end in clips]

    def overlapping(sentence: dict) -> range:
        return range(bisect.bisect_right(ends, sentence["start_s"]), bisect.bisect_left(starts, sentence["end_s"]))

    owner: dict[int, int] = {}  # clip position -> sentence position
    best_share: dict[int, float] = {}
    for s_pos, sentence in enumerate(sentences):
        for c_pos in overlapping(sentence):
            if c_pos in excluded:
                continue
            c_start, c_end = clips[c_pos]
            share = _overlap(c_start, c_end, sentence["start_s"], sentence["end_s"]) / max(c_end - c_start, 1e-9)
            if share >= min_overlap - 1e-9 and share > best_share.get(c_pos, -1.0):
                owner[c_pos], best_share[c_pos] = s_pos, share
    owned: dict[int, list[int]] = {s_pos: [] for s_pos in range(len(sentences))}
    for c_pos in sorted(owner):
        owned[owner[c_pos]].append(c_pos)
    segments: dict[int, Segment] = {}  # sentence position (the segment's owner) -> segment
    dropped = over_excluded = 0
    for s_pos, sentence in enumerate(sentences):
        text = (sentence["start_s"], s_pos, sentence["text"])
        if owned[s_pos]:
            segment = segments.setdefault(s_pos, Segment(sentence["start_s"], sentence["end_s"]))
            segment.clips = owned[s_pos]
            segment.texts.append(text)
            continue
        shots = range(shot_at(sentence["start_s"]), shot_at(sentence["end_s"]) + 1)
        overlaps = {
            c_pos: _overlap(*clips[c_pos], sentence["start_s"], sentence["end_s"])
            for c_pos in overlapping(sentence)
            if c_pos not in excluded and shot_of_clip[c_pos] in shots
        }
        if not overlaps or max(overlaps.values()) <= 0:
            spanned = [
                c_pos
                for c_pos in overlapping(sentence)
                if _overlap(*clips[c_pos], sentence["start_s"], sentence["end_s"]) > 0
            ]
            if spanned and all(c_pos in excluded for c_pos in spanned):
                over_excluded += 1
            else:
                dropped += 1
            continue
        best = max(overlaps, key=lambda c: (overlaps[c], -c))
        if best in owner:
            # the short sentence joins the segment that owns its clip
            host = segments.setdefault(
                owner[best], Segment(sentences[owner[best]]["start_s"], sentences[owner[best]]["end_s"])
            )
            host.texts.append(text)
            host.start_s, host.end_s = min(host.start_s, sentence["start_s"]), max(host.end_s, sentence["end_s"])
        else:
            owner[best] = s_pos
            segments[s_pos] = Segment(sentence["start_s"], sentence["end_s"], [text], [best])
    # clips no sentence owns: runs of consecutive clips, cut every `tokens_without_text`
    video_only: list[Segment] = []
    run: list[int] = []
    for c_pos in range(len(clips) + 1):
        new_shot = runs_end_at_shots and run and c_pos < len(clips) and shot_of_clip[c_pos] != shot_of_clip[run[-1]]
        if c_pos < len(clips) and c_pos not in owner and c_pos not in excluded and not new_shot:
            run.append(c_pos)
            continue
        for chunk_start in range(0, len(run), tokens_without_text):
            chunk = run[chunk_start : chunk_start + tokens_without_text]
            video_only.append(Segment(clips[chunk[0]][0], clips[chunk[-1]][1], [], chunk))
        run = [c_pos] if new_shot and c_pos not in owner and c_pos not in excluded else []
    ordered = sorted(list(segments.values()) + video_only, key=lambda s: (min(s.clips), s.start_s))
    return ordered, dropped, over_excluded


def _leaves(tokens_made: Provenance) -> int | None:
    """k ** depth of the codebook the tokens came from, when the quantize part names k and depth."""
    k, depth = tokens_made.codebook_k, tokens_made.codebook_depth
    return k**depth if k and depth else None


def run_shard(ctx: ShardContext) -> ShardResult:
    cfg = ctx.cfg.align
    tokenizer = load_tokenizer(cfg.tokenizer)
    tokens = ctx.read_input("quantize").to_pylist()
    asr_rows = {
        row["video_id"]: row for row in ctx.read_input("asr", columns=["video_id", "language", "sentences"]).to_pylist()
    }
    tokens_made = ctx.input_provenance("quantize")
    excluded_clips = {
        (row["video_id"], row["clip_index"])
        for row in ctx.read_input("quality", columns=["video_id", "clip_index", "excluded"]).to_pylist()
        if row["excluded"]
    }
    boundaries: dict[str, list[float]] = {}
    for row in ctx.read_input("shots", columns=["video_id", "boundary_index", "time_s"]).to_pylist():
        boundaries.setdefault(row["video_id"], []).append(row["time_s"])
    runs_end_at_shots = ctx.cfg.decode.clip_policy == "shots"
    clips_by_video: dict[str, list[dict]] = {}
    for row in tokens:
        clips_by_video.setdefault(row["video_id"], []).append(row)
    rows, dropped_sentences, videos_with_text, rejected_sentences, over_excluded = [], 0, 0, 0, 0
    languages = set(cfg.text_languages)
    primary_languages = {primary_language(language) for language in languages}
    for video in ctx.videos:
        video_id = video["video_id"]
        clips = sorted(clips_by_video.get(video_id, []), key=lambda r: r["clip_index"])
        if not clips:
            continue
        asr = asr_rows.get(video_id)
        language = asr["language"] if asr else None
        sentences = asr["sentences"] if asr and primary_language(language) in primary_languages else []
        kept = [s for s in sentences if s.get("rejected") is None]
        rejected_sentences += len(sentences) - len(kept)
        sentences = kept
        videos_with_text += bool(sentences)
        segments, dropped, dropped_over_excluded = segment_video(
            [(c["start_s"], c["end_s"]) for c in clips],
            sentences,
            cfg.min_sentence_overlap,
            cfg.tokens_per_segment_without_text,
            excluded=frozenset(pos for pos, c in enumerate(clips) if (video_id, c["clip_index"]) in excluded_clips),
            boundaries=sorted(boundaries.get(video_id, [])),
            runs_end_at_shots=runs_end_at_shots,
        )
        dropped_sentences += dropped
        over_excluded += dropped_over_excluded
        for segment_index, segment in enumerate(segments):
            text = segment.text
            rows.append(
                {
                    "video_id": video_id,
                    "segment_index": segment_index,
                    "start_s": segment.start_s,
                    "end_s": segment.end_s,
                    "kind": "text_video" if text else "video_only",
                    "text": text,
                    "text_ids": encode(tokenizer, text) if text else [],
                    "visual_ids": [clips[c]["token"] for c in segment.clips],
                    "language": language,
                }
            )
    rows.sort(key=lambda row: (row["video_id"], row["segment_index"]))
    kinds = [row["kind"] for row in rows]
    return ShardResult(
        tables={"": pa.Table.from_pylist(rows, schema=schemas.ALIGN.arrow)},
        stats={
            "segments": len(rows),
            "text_video": kinds.count("text_video"),
            "video_only": kinds.count("video_only"),
            "videos_with_text": videos_with_text,
            "sentences_without_clips": dropped_sentences,
            "sentences_rejected": rejected_sentences,
            "sentences_over_excluded_clips": over_excluded,
            "clips": sum(len(row["visual_ids"]) for row in rows),
            "clips_excluded": len(excluded_clips),
        },
        provenance=Provenance(
            codebook_sha256=tokens_made.codebook_sha256,
            feature_provenance_hash=tokens_made.feature_provenance_hash,
            visual_vocab_size=tokens_made.visual_vocab_size or _leaves(tokens_made),
            tokenizer=cfg.tokenizer,
            tokenizer_vocab_sha256=vocabulary_sha256(tokenizer),
            tokenizer_vocab_size=len(tokenizer.get_vocab()),
            text_languages=json.dumps(sorted(languages)),
        ),
        row_group_size=cfg.row_group_size,
    )
