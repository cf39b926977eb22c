"""Whisper behind one interface for two backends: faster-whisper (CTranslate2) and openai-whisper, both on
PyAV-decoded 16 kHz audio with word timestamps and a voice-activity filter (Silero VAD, shipped inside
faster-whisper), so that silence and music do not turn into invented sentences."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from pipeline import models
from pipeline.audio import SAMPLE_RATE
from pipeline.config import AsrConfig
from speech.transcripts import Word
from speech.whisper_weights import ctranslate2_to_openai_whisper

@dataclass
class Recognition:
    words: list[Word]          # times relative to the first sample of the audio given
    language: str | None
    language_prob: float | None


class Backend(Protocol):
    source: str                # what the output's `source` column says, e.g. "faster-whisper:tiny.en"
    metadata: dict[str, str]   # model provenance for the output's Parquet metadata (Provenance.extra)

    def recognise(self, samples: np.ndarray, seed: int) -> Recognition: ...


# Both backends decode alike. Conditioning a window on the previous window's text lets one mistake
# repeat itself (seen here: openai-whisper looping on the padded tail of a clip), so it is off.
CONDITION_ON_PREVIOUS_TEXT = False


def _cuda_available_ctranslate2() -> bool:
    import ctranslate2
    return ctranslate2.get_cuda_device_count() > 0


def _vad_speech_chunks(samples: np.ndarray) -> list[dict]:
    """Silero VAD's speech spans (sample indices), faster-whisper's default options."""
    from faster_whisper.vad import VadOptions, get_speech_timestamps
    return get_speech_timestamps(samples, VadOptions())


class FasterWhisperBackend:
    def __init__(self, cfg: AsrConfig):
        import faster_whisper
        logging.getLogger("faster_whisper").setLevel(logging.WARNING)   # per-file INFO lines drown progress
        resolved = models.resolve(cfg.model)
        self.device = cfg.device if cfg.device != "auto" else ("cuda" if _cuda_available_ctranslate2() else "cpu")
        self.compute_type = cfg.compute_type if cfg.compute_type != "auto" else (
            "float16" if self.device == "cuda" else "int8")
        self.cfg = cfg
        self.model = faster_whisper.WhisperModel(resolved.location, device=self.device,
                                                 compute_type=self.compute_type, cpu_threads=cfg.num_threads)
        self.source = f"faster-whisper:{resolved.label}"
        self.metadata = {"backend": "faster-whisper", "asr_model": resolved.location,
                         "device": self.device, "compute_type": self.compute_type,
                         "faster_whisper_version": faster_whisper.__version__}
        if resolved.sha256:
            self.metadata["asr_model_sha256"] = resolved.sha256

    def recognise(self, samples: np.ndarray, seed: int) -> Recognition:
        import ctranslate2
        ctranslate2.set_random_seed(seed)   # the temperature fallback samples
        segments, info = self.model.transcribe(samples, language=self.cfg.language, beam_size=self.cfg.beam_size,
                                               word_timestamps=True, vad_filter=self.cfg.vad,
                                               condition_on_previous_text=CONDITION_ON_PREVIOUS_TEXT)
        words = [Word(text=w.word, start_s=float(w.start), end_s=float(w.end), prob=float(w.probability))
                 for segment in segments for w in (segment.words or [])]
        # a probability only where the language was detected: not forced, not an English-only model
        detected = self.model.model.is_multilingual and not self.cfg.language
        return Recognition(words=words, language=info.language,
                           language_prob=float(info.language_probability) if detected else None)


class OpenAIWhisperBackend:
    """openai-whisper on the PyAV-decoded array (its own load_audio needs an ffmpeg program). It has no
    voice-activity filter, so the stage runs the same Silero VAD faster-whisper uses and maps times back."""

    def __init__(self, cfg: AsrConfig):
        import torch
        import whisper
        resolved = models.resolve(cfg.model)
        self.device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        self.fp16 = cfg.compute_type == "float16" or (cfg.compute_type == "auto" and self.device == "cuda")
        if self.fp16 and self.device == "cpu":
            raise ValueError("asr.compute_type float16 needs asr.device cuda with the whisper backend")
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        location = Path(resolved.location)
        if location.is_dir() and (location / "model.bin").exists():
            self.model = ctranslate2_to_openai_whisper(location).to(self.device)
        else:
            self.model = whisper.load_model(resolved.location, device=self.device)
        if self.fp16:
            self.model = self.model.half()
        self.cfg = cfg
        self.source = f"whisper:{resolved.label}"
        self.metadata = {"backend": "whisper", "asr_model": resolved.location, "device": self.device,
                         "compute_type": "float16" if self.fp16 else "float32",
                         "whisper_version": whisper.__version__}
        if resolved.sha256:
            self.metadata["asr_model_sha256"] = resolved.sha256

    def _detect_language(self, samples: np.ndarray) -> tuple[str, float | None]:
        import whisper
        if not self.model.is_multilingual:
            return "en", None
        mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(samples), n_mels=self.model.dims.n_mels)
        mel = mel.to(self.device, dtype=next(self.model.parameters()).dtype)
        _, probs = self.model.detect_language(mel)
        language = max(probs, key=probs.get)
        return language, float(probs[language])

    def recognise(self, samples: np.ndarray, seed: int) -> Recognition:
        import torch
        import whisper
        from faster_whisper.vad import SpeechTimestampsMap, collect_chunks
        torch.manual_seed(seed)   # the temperature fallback samples
        timestamps = None
        if self.cfg.vad:
            chunks = _vad_speech_chunks(samples)
            if not chunks:
                return Recognition(words=[], language=None, language_prob=None)
            samples = collect_chunks(samples, chunks)[0][0]
            timestamps = SpeechTimestampsMap(chunks, SAMPLE_RATE)
        if self.cfg.language:
            language, language_prob = self.cfg.language, None
        else:
            language, language_prob = self._detect_language(samples)
        result = whisper.transcribe(self.model, samples, language=language, beam_size=self.cfg.beam_size,
                                    best_of=5, word_timestamps=True, fp16=self.fp16, verbose=None,
                                    condition_on_previous_text=CONDITION_ON_PREVIOUS_TEXT)
        words = []
        for segment in result["segments"]:
            for w in segment.get("words", []):
                start, end = float(w["start"]), float(w["end"])
                if timestamps is not None:
                    start = timestamps.get_original_time(start)
                    end = timestamps.get_original_time(end, is_end=True)
                words.append(Word(text=w["word"], start_s=start, end_s=end, prob=float(w["probability"])))
        return Recognition(words=words, language=language, language_prob=language_prob)


BACKENDS: dict[str, Callable[[AsrConfig], Backend]] = {
    "faster-whisper": FasterWhisperBackend,
    "whisper": OpenAIWhisperBackend,
}
_loaded: dict[str, Backend] = {}


def load_backend(cfg: AsrConfig) -> Backend:
    """The configured backend with its model loaded; cached per process (a model loads once per worker)."""
    key = repr(cfg)
    if key not in _loaded:
        _loaded.clear()   # one model in memory at a time
        _loaded[key] = BACKENDS[cfg.backend](cfg)
    return _loaded[key]
