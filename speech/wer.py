"""Word error rate against a reference transcript, after a light normalisation, so that a transcript is
not charged for writing "Mr." where the reference says "mister" or "3" for "three": lower case,
punctuation removed (apostrophes kept), hyphens as spaces, English titles and the numbers 0 to 99
spelled out. Whisper's own English normaliser does the same and more; this subset covers the
benchmark's references (pipeline-independent: used by the benchmark and the tests)."""

from __future__ import annotations

import re

TITLES = {"mr": "mister", "mrs": "missus", "dr": "doctor", "st": "saint"}
ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def _number(token: str) -> list[str]:
    value = int(token)
    if value < 20:
        return [ONES[value]]
    if value < 100:
        return [TENS[value // 10]] + ([ONES[value % 10]] if value % 10 else [])
    return [token]


def normalise(text: str) -> list[str]:
    """The words of `text` as compared: see the module's docstring."""
    words = []
    for token in re.sub(r"[^\w\s']", " ", text.lower().replace("-", " ")).split():
        token = token.strip("'")
        if not token:
            continue
        if token in TITLES:
            words.append(TITLES[token])
        elif token.isdigit():
            words.extend(_number(token))
        else:
            words.append(token)
    return words


def edit_distance(reference: list[str], hypothesis: list[str]) -> int:
    """Substitutions + deletions + insertions turning `reference` into `hypothesis` (Levenshtein, by word)."""
    distance = list(range(len(hypothesis) + 1))
    for i, ref_word in enumerate(reference, start=1):
        previous, distance[0] = distance[0], i
        for j, hyp_word in enumerate(hypothesis, start=1):
            previous, distance[j] = (
                distance[j],
                min(distance[j] + 1, distance[j - 1] + 1, previous + (ref_word != hyp_word)),
            )
    return distance[len(hypothesis)]


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word errors per reference word (can exceed 1 when the hypothesis adds words)."""
    ref = normalise(reference)
    return edit_distance(ref, normalise(hypothesis)) / max(len(ref), 1)
