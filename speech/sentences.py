"""A word stream (recognised or imported) split into sentences: at Whisper's punctuation, or at pauses
for unpunctuated captions; a sentence longer than asr.max_sentence_s is split at its longest pause."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from speech.transcripts import Word
from stages.asr import AsrConfig

SENTENCE_END = (".", "?", "!", "…", "。", "？", "！")
CLOSING_MARKS = "\"'”’)]}»"
# "Mr." ends no sentence; the list stays short because Whisper rarely writes abbreviations with dots
ABBREVIATIONS = {"mr.", "mrs.", "ms.", "dr.", "prof.", "st.", "vs.", "e.g.", "i.e.", "jr.", "sr."}


@dataclass
class Sentence:
    text: str
    start_s: float
    end_s: float
    words: list[Word] = field(default_factory=list, repr=False, compare=False)  # what its confidence is of


def ends_sentence(word: str) -> bool:
    token = word.strip().rstrip(CLOSING_MARKS)
    return token.endswith(SENTENCE_END) and token.lower() not in ABBREVIATIONS


def has_sentence_punctuation(words: list[Word]) -> bool:
    return any(ends_sentence(word.text) for word in words)


def _marks_a_boundary(previous: Word, word: Word) -> bool:
    """A sentence boundary Whisper left unpunctuated: a clause mark before, or a capital after (Whisper
    capitalises a sentence's first word even where it leaves out the full stop before it: "stir the dough
    Now we are going to fold it"). "I" and words in capitals throughout are no sign."""
    text = word.text.strip()
    return previous.text.strip().endswith((",", ";", ":")) or (text[:1].isupper() and not text.isupper())


def _split_at_longest_pause(words: list[Word], max_sentence_s: float) -> list[list[Word]]:
    """Split recursively at the longest pause until each part lasts at most max_sentence_s (or is one
    word). Ties (Whisper's word times in a run-on often leave no gap at all; captions may have none) go to
    an unpunctuated boundary (_marks_a_boundary), then to the pause nearest the middle."""
    if len(words) < 2 or words[-1].end_s - words[0].start_s <= max_sentence_s:
        return [words]
    middle = (words[0].start_s + words[-1].end_s) / 2
    cut = max(
        range(1, len(words)),
        key=lambda i: (
            round(words[i].start_s - words[i - 1].end_s, 6),
            _marks_a_boundary(words[i - 1], words[i]),
            -abs(words[i].start_s - middle),
        ),
    )
    return _split_at_longest_pause(words[:cut], max_sentence_s) + _split_at_longest_pause(words[cut:], max_sentence_s)


def split_sentences(words: list[Word], max_sentence_s: float, pause_split_s: float | None = None) -> list[Sentence]:
    """Group a word stream into sentences.

    Punctuated text (pause_split_s None) ends a sentence after a word ending in . ? ! (closing quotes
    allowed); unpunctuated text (auto-captions) ends one where the pause before the next word exceeds
    pause_split_s. Either way a sentence longer than max_sentence_s is split at its longest pause.
    A sentence starts at its first word's start and ends at its last word's end."""
    groups: list[list[Word]] = []
    current: list[Word] = []
    for word in words:
        if current and pause_split_s is not None and word.start_s - current[-1].end_s > pause_split_s:
            groups.append(current)
            current = []
        current.append(word)
        if pause_split_s is None and ends_sentence(word.text):
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    sentences = []
    for group in groups:
        for part in _split_at_longest_pause(group, max_sentence_s):
            text = "".join(word.text for word in part).strip()
            if text:
                sentences.append(
                    Sentence(text=text, start_s=part[0].start_s, end_s=max(part[-1].end_s, part[0].start_s), words=part)
                )
    return sentences


Punctuator = Callable[[list[Word]], list[Word]]  # a punctuation model: words in, punctuated words out


def sentences_from_words(
    words: list[Word], cfg: AsrConfig, punctuate: Punctuator | None = None
) -> tuple[list[Word], list[Sentence]]:
    """Sentences of a recognised or imported word stream. Text without any sentence punctuation
    (auto-captions; Whisper output that came out unpunctuated) is punctuated by `punctuate` when one is
    given (the hook for a punctuation model, like the paper's LSTM), else split at pauses longer than
    asr.pause_split_s."""
    if punctuate is not None and not has_sentence_punctuation(words):
        words = punctuate(words)
    pause_split_s = None if has_sentence_punctuation(words) else cfg.pause_split_s
    return words, split_sentences(words, cfg.max_sentence_s, pause_split_s)
