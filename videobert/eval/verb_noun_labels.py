"""The verb and noun word lists and the segment labels that zero-shot classification (zero_shot.py) and the
probe (probe.py) score against, and their top-1 / top-5 accuracy: a word list is a text file of one word per
line; a labels file (CSV or Parquet) gives each (video_id, segment_index) any number of verbs and nouns, and
a ranking is right when it holds any of them (the paper's rule); `chance` is what a random ranking of a
closed set scores."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

PARTS = ("verb", "noun")
TOP_K = 5
LABEL_SEPARATORS = ("|", ";")


def read_word_list(path: str | None, key: str) -> list[str]:
    if not path:  # a config mistake found after loading: exit status 2 like the others
        from pipeline.config import ConfigError

        raise ConfigError(f"config error: {key} is not set: give a text file with one word per line (--set {key}=FILE)")
    words = [line.strip().lower() for line in Path(path).read_text().splitlines() if line.strip()]
    if not words:
        raise ValueError(f"{key}: {path} holds no words")
    return list(dict.fromkeys(words))


def _label_words(value) -> list[str]:
    """The words of one label cell: a list, or a string with words separated by | or ;."""
    if value is None:
        return []
    items = value if isinstance(value, (list, tuple)) else [value]
    words = []
    for item in items:
        text = str(item)
        for separator in LABEL_SEPARATORS:
            text = text.replace(separator, "\n")
        words += [word.strip().lower() for word in text.splitlines() if word.strip()]
    return words


def read_labels(path: str) -> dict[tuple[str, int], tuple[tuple[str, ...], tuple[str, ...]]]:
    """(video_id, segment_index) -> (verbs, nouns) from a CSV or Parquet file with columns video_id,
    segment_index, verb, noun. A segment may have several labels: a cell holding words separated by | (or ;),
    a Parquet list column, or several rows of the same segment (merged)."""
    path = Path(path)
    if path.suffix == ".parquet":
        table = pq.read_table(path)
    else:
        table = pa_csv.read_csv(
            path,
            convert_options=pa_csv.ConvertOptions(
                column_types={"video_id": pa.string(), "verb": pa.string(), "noun": pa.string()}
            ),
        )
    missing = [name for name in ("video_id", "segment_index", "verb", "noun") if name not in table.column_names]
    if missing:
        raise ValueError(f"{path}: labels need columns video_id, segment_index, verb, noun (missing {missing})")
    merged: dict[tuple[str, int], tuple[list[str], list[str]]] = {}
    for video_id, segment_index, verb, noun in zip(
        *(table.column(name).to_pylist() for name in ("video_id", "segment_index", "verb", "noun"))
    ):
        verbs, nouns = merged.setdefault((video_id, int(segment_index)), ([], []))
        verbs += _label_words(verb)
        nouns += _label_words(noun)
    return {key: (tuple(dict.fromkeys(verbs)), tuple(dict.fromkeys(nouns))) for key, (verbs, nouns) in merged.items()}


def accuracy(rankings: list[list[str]], truths: list[tuple[str, ...]], words: set[str] | list[str]) -> dict:
    """Top-1 / top-5 accuracy where a ranking is right when it holds any of its segment's labels; only
    labels among `words` count, and segments with none are left out (n says how many counted)."""
    words = set(words)
    known = [(ranking, [t for t in truth if t in words]) for ranking, truth in zip(rankings, truths)]
    known = [(ranking, truth) for ranking, truth in known if truth]
    if not known:
        return {"top1": None, "top5": None, "n": 0}
    return {
        "top1": sum(ranking[0] in truth for ranking, truth in known) / len(known),
        "top5": sum(any(word in truth for word in ranking[:TOP_K]) for ranking, truth in known) / len(known),
        "n": len(known),
    }


def chance(truths: list[tuple[str, ...]], words: list[str]) -> dict:
    """The expected accuracy of a uniformly random ranking of `words` (closed set): a segment with m of its
    labels among n words is right at top-1 with m/n and at top-5 with 1 - C(n-m, 5)/C(n, 5)."""
    n, words = len(words), set(words)
    counts = [len(set(truth) & words) for truth in truths]
    counts = [m for m in counts if m]
    if not counts or n == 0:
        return {"top1": None, "top5": None, "n": 0}
    top5 = [1 - (math.comb(n - m, TOP_K) / math.comb(n, TOP_K) if n >= TOP_K else 0.0) for m in counts]
    return {"top1": sum(m / n for m in counts) / len(counts), "top5": sum(top5) / len(counts), "n": len(counts)}


def format_cell(value) -> str:
    return "     -" if value is None else f"{value:6.3f}"
