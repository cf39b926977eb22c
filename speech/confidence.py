"""How sure the recogniser is that a sentence is speech, and the filter that marks those that are not.

Whisper invents text on music and noise ("Hmm", "Thank you.", loops of one phrase); it says so in its own
signals, per word (probability) and per segment, one decoded stretch of text (no-speech probability, mean
token log-probability, gzip compression ratio of the text). A sentence may span several segments or part
of one, so a sentence gets:
- avg_word_prob, min_word_prob: the mean and the least probability of its words;
- no_speech_prob, avg_logprob, compression_ratio: the word-weighted mean over the segments it draws words
  from (each of its words counts its segment's value: a sentence inside one segment gets that segment's).

The filter (asr.filter, on by default) marks a sentence `rejected` with the first reason that holds:
- not_speech_language: the video's language detection was not sure enough for the speech found: below
  asr.language_threshold, or, where the voice-activity filter found under asr.filter_short_speech_s of
  speech, below asr.filter_short_speech_language_prob (the language is then recorded as unknown);
- no_speech: no_speech_prob above asr.filter_no_speech_prob with avg_logprob below
  asr.filter_no_speech_logprob (Whisper's own skip rule, 0.6 and -1.0, lets through what it half-trusts);
- repetition: compression_ratio above asr.filter_compression_ratio (Whisper's loop threshold, 2.4);
- low_confidence: avg_word_prob below asr.filter_min_word_prob.
Imported transcripts carry none of these signals and are never filtered. align keeps no rejected sentence."""

from __future__ import annotations

from dataclasses import dataclass

from speech.transcripts import Word
from stages.asr import AsrConfig


@dataclass(frozen=True)
class Confidence:
    avg_word_prob: float | None
    min_word_prob: float | None
    no_speech_prob: float | None
    avg_logprob: float | None
    compression_ratio: float | None

    def columns(self) -> dict:
        return {
            "avg_word_prob": self.avg_word_prob,
            "min_word_prob": self.min_word_prob,
            "no_speech_prob": self.no_speech_prob,
            "avg_logprob": self.avg_logprob,
            "compression_ratio": self.compression_ratio,
        }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def confidence(words: list[Word]) -> Confidence:
    """A sentence's confidence from its words (null where its words carry no such signal: imports)."""
    probs = [w.prob for w in words if w.prob is not None]
    segments = [w.segment for w in words if w.segment is not None]
    return Confidence(
        avg_word_prob=_mean(probs),
        min_word_prob=min(probs) if probs else None,
        no_speech_prob=_mean([s.no_speech_prob for s in segments]),
        avg_logprob=_mean([s.avg_logprob for s in segments]),
        compression_ratio=_mean([s.compression_ratio for s in segments]),
    )


def language_is_speech(cfg: AsrConfig, language_prob: float | None, speech_s: float | None) -> bool:
    """Whether a detected language is sure enough for the speech it was detected on. True where nothing
    was detected (forced language, English-only model): there is no detection to doubt."""
    if language_prob is None:
        return True
    needed = cfg.language_threshold
    if speech_s is not None and speech_s < cfg.filter_short_speech_s:
        needed = max(needed, cfg.filter_short_speech_language_prob)
    return language_prob >= needed


def rejection(cfg: AsrConfig, sentence: Confidence) -> str | None:
    """The reason a recognised sentence is not speech, or None to keep it (the video-level reason,
    not_speech_language, is the caller's)."""
    if (
        sentence.no_speech_prob is not None
        and sentence.no_speech_prob > cfg.filter_no_speech_prob
        and sentence.avg_logprob is not None
        and sentence.avg_logprob < cfg.filter_no_speech_logprob
    ):
        return "no_speech"
    if sentence.compression_ratio is not None and sentence.compression_ratio > cfg.filter_compression_ratio:
        return "repetition"
    if sentence.avg_word_prob is not None and sentence.avg_word_prob < cfg.filter_min_word_prob:
        return "low_confidence"
    return None
