"""Checks of the data a model reads. `require_codebook`: every part tokenised with the model's codebook.
Warnings at train start where the training data cannot teach much: text repeated so often that a few
sentences make most of the text examples, fewer segments than a batch, no text at all. They are printed
once and recorded in the train log's start (and resume) record as `warnings`."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc

from pipeline import storage

FEW_SENTENCES = 5  # "the few most frequent sentences"
REPEATED_SHARE = 0.5  # warn when they are at least this share of the segments with text


def require_codebook(
    parts, codebook_sha256: str | None, against: str, error: type[Exception] = ValueError, advice: str = ""
) -> None:
    """Refuse the first part made from another codebook than `codebook_sha256`: a model would read each of
    its visual tokens as another word. `against` names the other side ("DIR/kmeans/... is", "the model was
    trained with")."""
    for path in parts:
        made_with = storage.read_metadata(path).codebook_sha256
        if made_with != codebook_sha256:
            raise error(
                f"{path} was made from codebook {str(made_with)[:12]}, but {against} "
                f"{str(codebook_sha256)[:12]}{advice}"
            )


def text_example_share(weights: dict[str, float], regime_mix: str, text_share: float) -> float:
    """About the share of training examples built from text (text and text-video regimes) when `text_share`
    of the segments have text: `exact` keeps the weights' share whenever there is text; `natural` draws a
    regime per unit among those it can make."""
    total = sum(weights.values())
    textual = (weights["text"] + weights["text_video"]) / total if total else 0.0
    if text_share <= 0:
        return 0.0
    if regime_mix == "exact":
        return textual
    return text_share * textual


def data_warnings(shards: list[Path], batch_size: int, regime_weights: dict[str, float], regime_mix: str) -> list[str]:
    """What in the training shards (the ones actually trained on) keeps the model from learning."""
    segments, text_counts = 0, {}
    for path in shards:
        table = storage.read_table(path, columns=["kind", "text"])
        segments += table.num_rows
        texts = table.filter(pc.equal(table["kind"], "text_video"))["text"]
        for item in pc.value_counts(texts).to_pylist():
            if item["values"] is not None:
                text_counts[item["values"]] = text_counts.get(item["values"], 0) + item["counts"]
    warnings = []
    with_text = sum(text_counts.values())
    if segments < batch_size:
        warnings.append(
            f"the training shards hold {segments} segment(s), fewer than train.batch_size "
            f"{batch_size}: every batch repeats segments"
        )
    if with_text == 0:
        warnings.append(
            f"none of the {segments} training segments has text: the text and text-video regimes "
            f"(masked text, alignment) have nothing to learn from"
        )
        return warnings
    top = sorted(text_counts.values(), reverse=True)[:FEW_SENTENCES]
    covered = sum(top) / with_text
    if covered >= REPEATED_SHARE:
        examples = text_example_share(regime_weights, regime_mix, with_text / max(segments, 1)) * covered
        warnings.append(
            f"repeated text: {len(text_counts)} distinct sentence(s) over {with_text} segment(s) with "
            f"text; the {len(top)} most frequent make {100 * covered:.0f}% of them, so about "
            f"{100 * examples:.0f}% of the training examples (train.regime_weights, regime_mix "
            f"{regime_mix}) are built from {len(top)} sentence(s)"
        )
    return warnings
