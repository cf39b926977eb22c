"""Whisper behind one interface for two backends: faster-whisper (CTranslate2) and openai-whisper, both on
PyAV-decoded 16 kHz audio with word timestamps and a voice-activity filter (Silero VAD, shipped inside
faster-whisper), so that silence and music do not turn into invented sentences.

The language decision is the stage's, the same for both backends (`decide_language`): `asr.language`
forces a language; otherwise a multilingual model detects it per video on the first
`asr.language_detection_s` seconds of speech, and a top probability below `asr.language_threshold` is
recorded as unknown (null). An English-only model (tiny.en) cannot detect a language, so without
`asr.language` it records unknown, never "en": align keeps only text of a language it knows.

A recognition also carries what the not-speech filter (speech/confidence.py) weighs: each word its
segment's no-speech probability, mean log-probability and compression ratio, and the seconds of speech
the voice-activity filter found (`speech_s`), against which the stage weighs the language probability."""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from pipeline import devices, models, threads
from pipeline.media.audio import SAMPLE_RATE
from speech.transcripts import SegmentSignals, Word
from speech.whisper_weights import ctranslate2_to_openai_whisper
from stages.asr import AsrConfig

WINDOW_S = 30  # Whisper's input window


@dataclass
class Recognition:
    words: list[Word]  # times relative to the first sample of the audio given
    language: str | None  # None: unknown (not detectable, below the threshold, or nothing heard)
    language_prob: float | None  # the detected language's probability (or, below the threshold, the top
    # language's); None where nothing was detected (forced, English-only)
    speech_s: float | None = None  # seconds of speech the voice-activity filter found; None without it


@dataclass(frozen=True)
class LanguageDecision:
    language: str | None  # what the output records
    language_prob: float | None
    decode_as: str  # the language Whisper decodes in (the top guess when below the threshold)


def decide_language(
    cfg: AsrConfig, multilingual: bool, probabilities: Callable[[], dict[str, float]]
) -> LanguageDecision:
    """The language a video is recorded and decoded in. `probabilities` is called only when the language
    is to be detected (not forced, multilingual model)."""
    if cfg.language:
        return LanguageDecision(cfg.language, None, cfg.language)
    if not multilingual:
        return LanguageDecision(None, None, "en")
    probs = probabilities()
    top = max(probs, key=probs.get)
    confident = probs[top] >= cfg.language_threshold
    return LanguageDecision(top if confident else None, float(probs[top]), top)


def detection_windows(speech: np.ndarray, seconds: float) -> list[np.ndarray]:
    """The first `seconds` of `speech` in consecutive windows of at most 30 s (Whisper's input)."""
    speech = speech[: round(seconds * SAMPLE_RATE)]
    step = WINDOW_S * SAMPLE_RATE
    return [speech[start : start + step] for start in range(0, len(speech), step)]


def mean_probabilities(per_window: list[dict[str, float]], windows: list[np.ndarray]) -> dict[str, float]:
    """Language probabilities averaged over the windows, each weighted by its length."""
    total = sum(len(window) for window in windows)
    languages = per_window[0].keys()
    return {
        language: sum(probs[language] * len(window) for probs, window in zip(per_window, windows)) / total
        for language in languages
    }


def language_note(cfg: AsrConfig, multilingual: bool, label: str) -> str:
    """How languages are decided, for the output's metadata (and, for an English-only model, a warning)."""
    if cfg.language:
        return f"forced by asr.language: {cfg.language}"
    if not multilingual:
        return (
            f"none: {label} is English-only and cannot detect a language, so every video's language is "
            f"recorded as unknown (null) and align keeps none of its text; set asr.language=en to claim "
            f"English, or use a multilingual model"
        )
    return (
        f"detected per video on the first {cfg.language_detection_s:g} s of speech; below probability "
        f"{cfg.language_threshold:g} recorded as unknown (null)"
    )


class Backend(Protocol):
    source: str  # what the output's `source` column says, e.g. "faster-whisper:tiny.en"
    metadata: dict[str, str]  # model provenance for the output's Parquet metadata (Provenance.extra)

    def recognise(self, samples: np.ndarray, seed: int) -> Recognition: ...


# Both backends decode alike. Conditioning a window on the previous window's text lets one mistake
# repeat itself (seen here: openai-whisper looping on the padded tail of a clip), so it is off.
CONDITION_ON_PREVIOUS_TEXT = False


def _vad(samples: np.ndarray, vad: bool) -> tuple[np.ndarray, list[dict] | None]:
    """The speech Silero VAD finds (faster-whisper's default options), joined, and its spans in sample
    indices; without the filter all of `samples` and None. Run once per video: language detection and
    recognition both take the joined speech, whose word times the spans map back."""
    if not vad:
        return samples, None
    from faster_whisper.vad import VadOptions, collect_chunks, get_speech_timestamps

    chunks = get_speech_timestamps(samples, VadOptions())
    return np.concatenate(collect_chunks(samples, chunks)[0]), chunks


def _speech(samples: np.ndarray, vad: bool) -> np.ndarray:
    """What the language is detected on: the speech the voice-activity filter finds (joined), or all of it."""
    return _vad(samples, vad)[0]


def _describe(
    kind: str, cfg: AsrConfig, resolved: models.ResolvedModel, multilingual: bool, **settings: str
) -> tuple[str, dict]:
    """A backend's `source` and output metadata; says on stderr when no language will be detected."""
    note = language_note(cfg, multilingual, resolved.label)
    if not multilingual and not cfg.language:
        print(f"asr: {note.removeprefix('none: ')}", file=sys.stderr)
    metadata = {"backend": kind, "asr_model": cfg.model, **settings, "language_detection": note}
    if resolved.sha256:
        metadata["asr_model_sha256"] = resolved.sha256
    return f"{kind}:{resolved.label}", metadata


class FasterWhisperBackend:
    def __init__(self, cfg: AsrConfig):
        import faster_whisper

        logging.getLogger("faster_whisper").setLevel(logging.WARNING)  # per-file INFO lines drown progress
        resolved = models.resolve(cfg.model)
        self.device = devices.resolve_name(cfg.device)
        self.compute_type = (
            cfg.compute_type if cfg.compute_type != "auto" else ("float16" if self.device == "cuda" else "int8")
        )
        self.cfg = cfg
        self.model = faster_whisper.WhisperModel(
            resolved.location,
            device=self.device,
            compute_type=self.compute_type,
            cpu_threads=threads.threads(cfg.num_threads),
        )
        self.multilingual = bool(self.model.model.is_multilingual)
        self.batched = faster_whisper.BatchedInferencePipeline(self.model) if cfg.batch_size else None
        self.source, self.metadata = _describe(
            "faster-whisper",
            cfg,
            resolved,
            self.multilingual,
            device=self.device,
            compute_type=self.compute_type,
            batch_size=str(cfg.batch_size),
        )
        self.metadata["faster_whisper_version"] = faster_whisper.__version__

    def language_probabilities(self, speech: np.ndarray) -> dict[str, float]:
        """Whisper's language probabilities on the first asr.language_detection_s seconds of `speech`."""
        from faster_whisper.audio import pad_or_trim

        windows = detection_windows(speech, self.cfg.language_detection_s)
        per_window = []
        for window in windows:
            encoded = self.model.encode(pad_or_trim(self.model.feature_extractor(window)))
            per_window.append({token[2:-2]: prob for token, prob in self.model.model.detect_language(encoded)[0]})
        return mean_probabilities(per_window, windows)

    def recognise(self, samples: np.ndarray, seed: int) -> Recognition:
        import ctranslate2

        ctranslate2.set_random_seed(seed)  # the temperature fallback samples
        speech, chunks = _vad(samples, self.cfg.vad)
        speech_s = len(speech) / SAMPLE_RATE if self.cfg.vad else None
        if not len(speech):
            return Recognition(words=[], language=None, language_prob=None, speech_s=speech_s)
        decision = decide_language(self.cfg, self.multilingual, lambda: self.language_probabilities(speech))
        options = {"language": decision.decode_as, "beam_size": self.cfg.beam_size, "word_timestamps": True}
        if self.batched is not None:  # its own filter, with the batched pipeline's options
            options["vad_filter"] = self.cfg.vad
            duration_s = len(samples) / SAMPLE_RATE
            # without the filter, the batched pipeline needs the windows given
            windows = (
                None
                if self.cfg.vad
                else [
                    {"start": start, "end": min(start + WINDOW_S, duration_s)}
                    for start in range(0, math.ceil(duration_s), WINDOW_S)
                ]
            )
            segments, _ = self.batched.transcribe(
                samples, batch_size=self.cfg.batch_size, clip_timestamps=windows, **options
            )
        else:  # the speech found above, its times mapped back as faster-whisper's own filter does
            from faster_whisper.transcribe import restore_speech_timestamps

            segments, _ = self.model.transcribe(
                speech, condition_on_previous_text=CONDITION_ON_PREVIOUS_TEXT, vad_filter=False, **options
            )
            if chunks:
                segments = restore_speech_timestamps(segments, chunks, SAMPLE_RATE)
        words = [
            Word(text=w.word, start_s=float(w.start), end_s=float(w.end), prob=float(w.probability), segment=signals)
            for segment in segments
            for signals in [
                SegmentSignals(
                    float(segment.no_speech_prob), float(segment.avg_logprob), float(segment.compression_ratio)
                )
            ]
            for w in (segment.words or [])
        ]
        return Recognition(
            words=words, language=decision.language, language_prob=decision.language_prob, speech_s=speech_s
        )


class OpenAIWhisperBackend:
    """openai-whisper on the PyAV-decoded array (its own load_audio needs an ffmpeg program). It has no
    voice-activity filter, so the stage runs the same Silero VAD faster-whisper uses and maps times back."""

    def __init__(self, cfg: AsrConfig):
        import whisper

        resolved = models.resolve(cfg.model)
        self.device = devices.resolve_name(cfg.device)
        self.fp16 = cfg.compute_type == "float16" or (cfg.compute_type == "auto" and self.device == "cuda")
        if self.fp16 and self.device == "cpu":
            raise ValueError("asr.compute_type float16 needs asr.device cuda with the whisper backend")
        threads.set_torch_threads(cfg.num_threads)
        location = Path(resolved.location)
        if location.is_dir() and (location / "model.bin").exists():
            self.model = ctranslate2_to_openai_whisper(location).to(self.device)
        else:
            self.model = whisper.load_model(resolved.location, device=self.device)
        if self.fp16:
            self.model = self.model.half()
        self.cfg = cfg
        self.multilingual = bool(self.model.is_multilingual)
        self.source, self.metadata = _describe(
            "whisper",
            cfg,
            resolved,
            self.multilingual,
            device=self.device,
            compute_type="float16" if self.fp16 else "float32",
        )
        self.metadata["whisper_version"] = whisper.__version__

    def language_probabilities(self, speech: np.ndarray) -> dict[str, float]:
        """Whisper's language probabilities on the first asr.language_detection_s seconds of `speech`."""
        import torch
        import whisper

        windows = detection_windows(speech, self.cfg.language_detection_s)
        dtype = next(self.model.parameters()).dtype
        mels = [
            whisper.log_mel_spectrogram(whisper.pad_or_trim(window), n_mels=self.model.dims.n_mels)
            for window in windows
        ]
        _, per_window = self.model.detect_language(torch.stack(mels).to(self.device, dtype=dtype))
        return mean_probabilities(per_window, windows)

    def recognise(self, samples: np.ndarray, seed: int) -> Recognition:
        import torch
        import whisper
        from faster_whisper.vad import SpeechTimestampsMap

        torch.manual_seed(seed)  # the temperature fallback samples
        samples, chunks = _vad(samples, self.cfg.vad)
        speech_s = len(samples) / SAMPLE_RATE if self.cfg.vad else None
        timestamps = SpeechTimestampsMap(chunks, SAMPLE_RATE) if chunks else None
        if not len(samples):
            return Recognition(words=[], language=None, language_prob=None, speech_s=speech_s)
        decision = decide_language(self.cfg, self.multilingual, lambda: self.language_probabilities(samples))
        result = whisper.transcribe(
            self.model,
            samples,
            language=decision.decode_as,
            beam_size=self.cfg.beam_size,
            best_of=5,
            word_timestamps=True,
            fp16=self.fp16,
            verbose=None,
            condition_on_previous_text=CONDITION_ON_PREVIOUS_TEXT,
        )
        words = []
        for segment in result["segments"]:
            signals = SegmentSignals(
                float(segment["no_speech_prob"]), float(segment["avg_logprob"]), float(segment["compression_ratio"])
            )
            for w in segment.get("words", []):
                start, end = float(w["start"]), float(w["end"])
                if timestamps is not None:
                    start = timestamps.get_original_time(start)
                    end = timestamps.get_original_time(end, is_end=True)
                words.append(
                    Word(text=w["word"], start_s=start, end_s=end, prob=float(w["probability"]), segment=signals)
                )
        return Recognition(
            words=words, language=decision.language, language_prob=decision.language_prob, speech_s=speech_s
        )


BACKENDS: dict[str, Callable[[AsrConfig], Backend]] = {
    "faster-whisper": FasterWhisperBackend,
    "whisper": OpenAIWhisperBackend,
}
_loaded: dict[str, Backend] = {}


def load_backend(cfg: AsrConfig) -> Backend:
    """The configured backend with its model loaded; cached per process (a model loads once per worker)."""
    key = repr(cfg)
    if key not in _loaded:
        _loaded.clear()  # one model in memory at a time
        _loaded[key] = BACKENDS[cfg.backend](cfg)
    return _loaded[key]
