"""The run report's training section, when DIR/train/log.jsonl exists: the total loss and, per objective
(mlm_text, mlm_video, mlm_text_video, alignment), the losses and accuracies of the training windows beside
those of the `validation` records on held-out videos, each against the loss of a uniform guess."""

from __future__ import annotations

import html
import math
from pathlib import Path

from pipeline.config import Config
from pipeline.engine.workdir import WorkDir
from reports import summary
from reports.cells import counted, number
from reports.evaluation import read_json
from reports.page import html_table as _table
from reports.svg import axis_top as svg_axis_top
from reports.svg import svg_line, svg_lines

OBJECTIVES = ("mlm_text", "mlm_video", "mlm_text_video", "alignment")


def training_log(records: list[dict]) -> list[dict]:
    return [record for record in records if record.get("event") == "train"]


def validation_log(records: list[dict]) -> list[dict]:
    """The `validation` records (the objectives on held-out videos every train.validation_every steps)."""
    return [record for record in records if record.get("event") == "validation"]


def training_header(records: list[dict]) -> dict | None:
    """The latest start or resume record: notes, warnings, the held-out videos."""
    last = summary.train_header(records)
    if last is None:
        return None
    return {key: last.get(key) for key in ("event", "step", "notes", "warnings", "validation_videos")}


def uniform_losses(cfg: Config, work_dir: Path) -> dict | None:
    """The loss of a model that finds every token equally likely: ln V for the masked-token objectives (all
    three predict over the whole vocabulary: word pieces, visual words, [>]), ln 2 for alignment."""
    try:
        from pipeline.tokenizer import load_tokenizer

        info = read_json(WorkDir(work_dir).codebook_sidecar) or {}
        visual = int(info["k"]) ** int(info["depth"])
        text = len(load_tokenizer(cfg.align.tokenizer))
    except Exception:  # noqa: BLE001 - no codebook or tokenizer here: the report goes without the baseline
        return None
    vocabulary = text + visual + 1
    return {
        "vocabulary": vocabulary,
        "text_vocabulary": text,
        "visual_words": visual,
        "mlm": round(math.log(vocabulary), 4),
        "alignment": round(math.log(2), 4),
    }


def _objective_charts(
    records: list[dict], what: str, loss_top: float | None, steps_range: tuple[int, int]
) -> tuple[str, str]:
    """(loss chart, accuracy chart) of the four objectives over `records` (train or validation), on the
    loss axis ending at `loss_top` and the step axis `steps_range`."""
    steps = [record["step"] for record in records]
    losses = [(name, steps, [record.get(f"{name}_loss") for record in records]) for name in OBJECTIVES]
    accuracies = [(name, steps, [record.get(f"{name}_acc") for record in records]) for name in OBJECTIVES]
    if any(record.get("alignment_auc") is not None for record in records):
        accuracies.append(("alignment AUC", steps, [record.get("alignment_auc") for record in records]))
    return (
        svg_lines(
            losses,
            title=f"{what} loss by objective",
            x_label="step",
            y_label="loss",
            y_max=loss_top,
            x_range=steps_range,
        ),
        svg_lines(
            accuracies,
            title=f"{what} accuracy by objective",
            x_label="step",
            y_label="accuracy",
            y_max=1.0,
            x_range=steps_range,
        ),
    )


def _loss_top(records: list[dict]) -> float | None:
    values = [record.get(f"{name}_loss") for record in records for name in OBJECTIVES]
    values = [value for value in values if value is not None and math.isfinite(value)]
    if not values:
        return None
    return svg_axis_top(max(values))


def validation_protocol_html(record: dict) -> str:
    """How the validation figures were made (the clean protocol; the run's noise beside it) and what the
    held-out videos could not measure: a regime without examples is null for that reason, said so."""
    parts = []
    if record.get("protocol") == "clean":
        parts.append("<p>validation figures: the clean protocol (no joining, no subsampling), comparable across runs")
        noisy = record.get("noisy") or {}
        if noisy.get("alignment_acc") is not None:
            parts.append(
                f"; with this run's own noise, alignment accuracy {noisy['alignment_acc']:.3f}"
                + (f", AUC {noisy['alignment_auc']:.3f}" if noisy.get("alignment_auc") is not None else "")
            )
        parts.append(".</p>")
    if record.get("missing"):
        parts.append(
            '<p class="note">the held-out videos give nothing to measure for: '
            f"{html.escape(', '.join(record['missing']))} (those figures are empty, not zero).</p>"
        )
    return "".join(parts)


def train_html(
    records: list[dict], validation: list[dict] | None = None, header: dict | None = None, uniform: dict | None = None
) -> str:
    if not records:
        return ""
    validation = validation or []
    header = header or {}
    last = records[-1]
    steps, losses = [r["step"] for r in records], [r["loss"] for r in records]

    def baseline(name: str) -> list[str]:
        if not uniform:
            return []
        return [number(uniform["alignment" if name == "alignment" else "mlm"])]

    metrics = [
        [name, *baseline(name), number(last.get(f"{name}_loss")), number(last.get(f"{name}_acc"))]
        + (
            [number(validation[-1].get(f"{name}_loss")), number(validation[-1].get(f"{name}_acc"))]
            if validation
            else []
        )
        for name in OBJECTIVES
        if f"{name}_loss" in last
    ]
    held_out = header.get("validation_videos")
    parts = [
        "<h2>Training</h2>",
        f"<p>step {last['step']:,}, loss {last['loss']:.4g}, {number(last.get('tokens_per_s'))} tokens/s</p>",
        _table(
            ["objective"]
            + (["uniform baseline"] if uniform else [])
            + ["loss", "accuracy"]
            + ([f"validation loss (step {validation[-1]['step']:,})", "validation accuracy"] if validation else []),
            metrics,
        ),
    ]
    if uniform:
        parts.append(
            f'<p class="note">uniform baseline: the loss of a model that finds every token equally likely, ln V = '
            f"{uniform['mlm']:.2f} for the masked-token objectives (each predicts over the whole vocabulary, "
            f"V = {uniform['vocabulary']:,}: {uniform['text_vocabulary']:,} word pieces, "
            f"{uniform['visual_words']:,} visual words and [&gt;]) and ln 2 = {uniform['alignment']:.2f} for "
            f"alignment. A loss below it has learnt something; a loss above it is confidently wrong, not merely "
            f"uninformed: usual early in training, and on held-out videos whose visual words training rarely "
            f"saw.</p>"
        )
    if validation:
        videos = validation[-1].get("videos")
        parts.append(
            f"<p>validation: the objectives on {number(videos)} held-out video{'' if videos == 1 else 's'}"
            + (f" ({html.escape(', '.join(held_out[:10]))}{', ...' if len(held_out) > 10 else ''})" if held_out else "")
            + f" at {counted(len(validation), 'step')}; the training curves are each logging window's mean.</p>"
        )
        last = validation[-1]
        if last.get("alignment_auc") is not None:
            parts.append(
                f"<p>validation alignment accuracy {last['alignment_acc']:.3f}, AUC {last['alignment_auc']:.3f} "
                "(0.5 = chance)"
                + (
                    f"; on the same examples with nothing masked, accuracy {last['alignment_unmasked_acc']:.3f}, "
                    f"AUC {last['alignment_unmasked_auc']:.3f}"
                    if last.get("alignment_unmasked_auc") is not None
                    else ""
                )
                + ".</p>"
            )
        parts.append(validation_protocol_html(validation[-1]))
    elif held_out is not None:
        parts.append("<p>no validation records yet (train.validation_every).</p>")
    else:
        parts.append(
            '<p class="note">no held-out videos (train.validation_videos): the curves are training '
            "loss only, which says nothing of what generalises.</p>"
        )
    charts = [svg_line(steps, losses, title="training loss", x_label="step", y_label="loss", integer_x=True)]
    if any(f"{name}_loss" in record for record in records for name in OBJECTIVES):
        top = _loss_top(records + validation)  # one loss axis and one step axis for training and validation
        every_step = [record["step"] for record in records + validation]
        steps_range = (min(every_step), max(every_step))
        train_loss, train_acc = _objective_charts(records, "training", top, steps_range)
        rows = [charts + [train_loss, train_acc]]
        if validation:  # each training chart beside its validation chart
            validation_loss, validation_acc = _objective_charts(validation, "validation", top, steps_range)
            rows = [charts, [train_loss, validation_loss], [train_acc, validation_acc]]
        parts += ['<div class="plots">' + "".join(row) + "</div>" for row in rows]
    else:
        parts.append('<div class="plots">' + "".join(charts) + "</div>")
    return "\n".join(parts)
