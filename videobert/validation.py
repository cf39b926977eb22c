"""Held-out validation during pre-training (`train.validation_videos`, `train.validation_every`).

- **Split.** The validation videos are the first N of a permutation of the align shards' video ids (sorted),
  seeded by `train.seed`; N is a count, or a share of the videos (rounded, at least 1). Their segments are
  never trained on: training streams DIR/train/heldout/part-*.parquet, the align shards' rows of the other
  videos (the shards' names and provenance kept; shards left empty are not written), and
  DIR/train/heldout/videos.json names the validation videos. Or `train.splits`, a CSV fixing each video's
  split (train, validation, test): its validation videos are held out and scored the same way, its test
  videos are held out and never scored in training (`eval.videos: test`, `zero_shot.evaluate_videos`), so settings
  chosen on validation figures are judged on videos nobody looked at. A group of near-duplicate videos (the
  dedup stage's) is never split: the held-out videos take their copies with them (videobert/copies.py).
- **Examples.** Made once at train start from the validation videos, the way training makes them, with a
  generator seeded by `train.seed` alone, so the set is the same every time it is computed (and on every
  rank, and after a resume): neighbouring segments joined into units as training joins them; per unit a
  text example (if it has text), a video example (if it has video) and, if it has both, a text-video
  positive and a negative (visual tokens of another time, as many as its own, drawn by the training
  stream's rule: `stream.negative_window`, other units being the other validation units); all masked
  as in training. At most MAX_UNITS units (a seeded choice).
- **Protocols.** The examples above are made twice: under the fixed clean protocol (no joining, no
  subsampling, no inserted word pieces, no masked spans, no noisy context, no dropped sentence ends, no
  cropped clips, negatives' masked tokens scored: `concat_prob` 0, `max_subsample_step` 1, `text_insert_prob`
  0, `text_span_mask_prob` 0, `text_context_noise_prob` 0, `text_end_drop_prob` 0, `visual_crop_prob` 0,
  `negative_mlm` true),
  whatever the run's noise, so that held-out figures of runs with different noise compare; and, when the run
  has noise, under the run's own settings. A record's top-level figures are the clean protocol's
  (`protocol: clean`), the run's own are under `noisy`.
- **Empty regimes.** A regime the held-out videos give no example of (no segment with text, say) is named
  at train start (a warning, in the log's start record) and in every record's `missing`: its figures are
  null because there was nothing to measure, not because validation did not run.
- **Metrics.** Each regime's masked-LM loss and accuracy over its masked tokens, the alignment loss and
  accuracy over the text-video examples and the alignment ROC AUC (the probability of "aligned" ranking
  positives above negatives; ties count half). Beside them the alignment accuracy and AUC of the same
  text-video examples with nothing masked (`alignment_unmasked_*`): alignment as it is used, on a whole
  sentence and its whole window. The masked figures are training's objective, but masking hides the
  deciding word of some examples (on the synthetic set a rule that knows the answer reaches 0.905 on them,
  benchmarks/alignment_ceiling.py); the unmasked ones have no such ceiling. Under torchrun every rank scores
  a slice and the sums and scores are gathered, so all ranks agree."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from videobert.copies import Copies, say_moved
from videobert.data import (
    ALIGNED,
    EMPTY,
    IGNORE,
    NOT_ALIGNED,
    REGIMES,
    TEXT,
    TEXT_VIDEO,
    VIDEO,
    DataParams,
    Plan,
    Unit,
    Video,
    VocabLayout,
    build_example,
    collate,
    read_videos,
    runs,
)
from videobert.metrics import METRIC_PREFIXES, METRIC_ROWS, compute_losses
from videobert.stream import negative_window
from videobert.subset import shard_video_ids, write_video_rows

MAX_UNITS = 4096
FOLDER = "heldout"
CLEAN_PROTOCOL = {
    "concat_prob": 0.0,
    "max_subsample_step": 1,
    "text_insert_prob": 0.0,
    "text_span_mask_prob": 0.0,
    "text_context_noise_prob": 0.0,
    "text_end_drop_prob": 0.0,
    "visual_crop_prob": 0.0,
    "negative_mlm": True,
}
# what a record reports of the run's own (noisy) protocol beside the clean one
NOISY_KEYS = (
    "alignment_acc",
    "alignment_auc",
    "alignment_loss",
    "alignment_unmasked_acc",
    "alignment_unmasked_auc",
    "mlm_text_video_acc",
    "mlm_text_acc",
    "mlm_video_acc",
)


def validation_count(spec: float, videos: int) -> int:
    """How many of `videos` a train.validation_videos value holds out (0 = none)."""
    if spec <= 0:
        return 0
    count = max(1, round(spec * videos)) if spec < 1 else int(spec)
    if count >= videos:
        raise ValueError(
            f"train.validation_videos {spec:g} holds out {count} of the {videos} videos of the "
            f"align shards: none would be left to train on"
        )
    return count


def choose_validation_videos(video_ids: list[str], spec: float, seed: int) -> list[str]:
    """The held-out videos, in id order: the first N of a permutation of the sorted ids seeded by `seed`."""
    ids = sorted(set(video_ids))
    count = validation_count(spec, len(ids))
    order = np.random.default_rng([seed, 5]).permutation(len(ids))[:count]
    return sorted(ids[i] for i in order)


SPLIT_NAMES = ("train", "validation", "test")


def read_splits(path: str | Path) -> dict[str, str]:
    """video_id -> split of a train.splits CSV (columns video_id, split: train | validation | test)."""
    import csv

    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    if rows and not {"video_id", "split"} <= set(rows[0]):
        raise ValueError(f"train.splits {path}: needs the columns video_id and split (got {sorted(rows[0])})")
    splits = {}
    for number, row in enumerate(rows, start=2):
        if row["split"] not in SPLIT_NAMES:
            raise ValueError(
                f"train.splits {path} line {number}: split must be one of {', '.join(SPLIT_NAMES)} "
                f"(got {row['split']!r})"
            )
        if splits.setdefault(row["video_id"], row["split"]) != row["split"]:
            raise ValueError(f"train.splits {path}: {row['video_id']} is in two splits")
    return splits


def held_out_videos(cfg, video_ids: list[str], copies: Copies | None = None) -> tuple[list[str], list[str], dict]:
    """(validation videos, test videos, moved) among `video_ids`: by train.splits, else
    train.validation_videos (no test videos). A group of near-duplicates (`copies`) stays on one side:
    drawn validation videos take their copies with them, and a group the splits file divides goes whole to
    its most held-out side; `moved` names each video moved so, with where it went."""
    copies = copies or Copies()
    present = set(video_ids)
    if cfg.train.splits is None:
        spec = cfg.train.validation_videos
        if not spec:
            return [], [], {}
        chosen, moved = copies.with_copies(choose_validation_videos(video_ids, spec, cfg.train.seed), present)
        if len(chosen) >= len(present):
            raise ValueError(
                f"train.validation_videos {spec:g} with their near-duplicates (the dedup stage's groups) holds "
                f"out all {len(present)} videos of the align shards: none would be left to train on"
            )
        return chosen, [], {video: "validation" for video in moved}
    splits = read_splits(cfg.train.splits)
    sides, moved = copies.sides(splits, present)
    chosen = {name: sorted(v for v, side in sides.items() if side == name) for name in ("validation", "test")}
    if not chosen["validation"] and not chosen["test"]:
        raise ValueError(f"train.splits {cfg.train.splits} names no validation or test video of the align shards")
    return chosen["validation"], chosen["test"], moved


def split_shards(cfg, work_dir, shards: list[Path], *, write: bool = True) -> tuple[list[Path], list[str], list[str]]:
    """(the shards to train on, the validation videos, the test videos): `shards`, [] and [] without
    train.validation_videos or train.splits, else the shards without the held-out videos' rows (written when
    `write`: on one rank only)."""
    from pipeline.engine.workdir import WorkDir

    spec = cfg.train.validation_videos
    if not spec and cfg.train.splits is None:
        return shards, [], []
    chosen, test, moved = held_out_videos(cfg, shard_video_ids(shards), Copies.read(work_dir))
    if write:
        say_moved("to the held-out videos", moved)
    how = (
        {"splits": str(cfg.train.splits)}
        if cfg.train.splits is not None
        else {"validation_videos": f"{spec:g}", "validation_seed": str(cfg.train.seed)}
    )
    kept_paths = write_video_rows(
        shards,
        WorkDir(work_dir).train_folder / FOLDER,
        chosen + test,
        keep=False,
        source_key="heldout_of",
        write=write,
        extra=how,
        summary={
            "validation_videos": chosen,
            "test_videos": test,
            "spec": spec,
            "splits": cfg.train.splits,
            "seed": cfg.train.seed,
            "moved_with_copies": moved,
        },
    )
    if not kept_paths:
        raise ValueError("the held-out videos (train.validation_videos, train.splits) leave no segment to train on")
    return kept_paths, chosen, test


def read_validation_videos(shards: list[Path], layout: VocabLayout, chosen: list[str]) -> list[Video]:
    wanted = set(chosen)
    found = [video for path in shards for _, video in read_videos(path, layout) if video.video_id in wanted]
    return sorted(found, key=lambda video: video.video_id)


@dataclass
class ValidationSet:
    """The fixed held-out examples (see the module doc)."""

    examples: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    regimes: list[int]
    alignment_labels: list[int]
    videos: int
    pad_id: int

    @classmethod
    def build(
        cls, videos: list[Video], layout: VocabLayout, text_replacements: np.ndarray, params: DataParams, seed: int
    ) -> ValidationSet:
        rng = np.random.default_rng([seed, 4])
        units = [
            Unit(video, first, last)
            for video in videos
            for first, last in runs(video.segments, rng, params.concat_prob, params.max_concat)
        ]
        if len(units) > MAX_UNITS:
            units = [units[i] for i in sorted(rng.permutation(len(units))[:MAX_UNITS])]
        plans = []
        for unit in units:
            text, visual = unit.text_ids, unit.visual_ids
            if text.size:
                plans.append(Plan(TEXT, text, EMPTY, IGNORE, unit=unit))
            if visual.size:
                plans.append(Plan(VIDEO, EMPTY, visual, IGNORE, unit=unit))
            if text.size and visual.size:
                plans.append(Plan(TEXT_VIDEO, text, visual, ALIGNED, unit=unit))
                window, same_video = negative_window(unit, rng, params, units)
                if window is not None:
                    plans.append(Plan(TEXT_VIDEO, text, window, NOT_ALIGNED, same_video, unit))
        examples = [build_example(plan, layout, params, text_replacements, rng) for plan in plans]
        return cls(examples, [p.regime for p in plans], [p.alignment_label for p in plans], len(videos), layout.pad_id)

    @property
    def unmasked(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The text-video examples with their masked tokens restored."""
        return [unmasked(e) for e, regime in zip(self.examples, self.regimes) if regime == TEXT_VIDEO]

    @property
    def unmasked_labels(self) -> list[int]:
        """The alignment labels of `unmasked`."""
        return [label for label, regime in zip(self.alignment_labels, self.regimes) if regime == TEXT_VIDEO]

    def batches(self, batch_size: int, rank: int = 0, world_size: int = 1, masked: bool = True):
        """This rank's batches: every world_size-th of them, from the rank-th; of the text-video examples
        with nothing masked when not `masked`."""
        examples, labels = (self.examples, self.alignment_labels) if masked else (self.unmasked, self.unmasked_labels)
        regimes = self.regimes if masked else [TEXT_VIDEO] * len(examples)
        for index, first in enumerate(range(0, len(examples), batch_size)):
            if index % world_size == rank:
                end = first + batch_size
                yield collate(examples[first:end], regimes[first:end], labels[first:end], self.pad_id)

    def counts(self) -> dict[str, int]:
        """Examples per regime, and the text-video negatives among them."""
        counts = {
            name: sum(regime == index for regime in self.regimes)
            for index, name in zip((TEXT, VIDEO, TEXT_VIDEO), ("text", "video", "text_video"))
        }
        counts["negatives"] = sum(label == NOT_ALIGNED for label in self.alignment_labels)
        return counts

    def missing(self) -> list[str]:
        """What these examples cannot measure: a regime without examples, alignment without negatives."""
        counts = self.counts()
        missing = [name for name in ("text", "video", "text_video") if not counts[name]]
        if counts["text_video"] and not counts["negatives"]:
            missing.append("alignment_negatives")
        return missing


def unmasked(example: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`example` with every masked (or replaced) token back to its own id and nothing to predict."""
    ids, types, labels = example
    return np.where(labels != IGNORE, labels, ids), types, np.full_like(labels, IGNORE)


def is_clean(params: DataParams) -> bool:
    return all(getattr(params, key) == value for key, value in CLEAN_PROTOCOL.items())


@dataclass
class Protocols:
    """The held-out examples under the clean protocol and, for a noisy run, under its own (module doc)."""

    clean: ValidationSet
    noisy: ValidationSet | None

    @classmethod
    def build(
        cls, videos: list[Video], layout: VocabLayout, text_replacements: np.ndarray, params: DataParams, seed: int
    ) -> Protocols:
        clean = ValidationSet.build(videos, layout, text_replacements, replace(params, **CLEAN_PROTOCOL), seed)
        noisy = None if is_clean(params) else ValidationSet.build(videos, layout, text_replacements, params, seed)
        return cls(clean, noisy)

    def warnings(self) -> list[str]:
        """One line per regime the held-out videos cannot measure (said at train start)."""
        videos = self.clean.videos
        what = {
            "text": "no segment with text: no text figures",
            "video": "no visual tokens: no video figures",
            "text_video": "no segment with both text and visual tokens: no text-video or alignment figures",
            "alignment_negatives": "no negative for alignment (too few or too short videos): no alignment "
            "accuracy or AUC",
        }
        return [f"validation: the {videos} held-out video(s) give {what[name]}" for name in self.clean.missing()]


def validate_protocols(
    model,
    protocols: Protocols,
    step: int,
    batch_size: int,
    device: torch.device,
    autocast,
    rank: int = 0,
    world_size: int = 1,
) -> dict:
    """The `validation` record: the clean protocol's figures, the run's own under `noisy`, and `missing`."""
    record = validate(model, protocols.clean, step, batch_size, device, autocast, rank, world_size)
    record["protocol"] = "clean"
    record["examples"] = protocols.clean.counts()
    record["missing"] = protocols.clean.missing()
    if protocols.noisy is not None:
        noisy = validate(model, protocols.noisy, step, batch_size, device, autocast, rank, world_size)
        record["noisy"] = {key: noisy[key] for key in NOISY_KEYS}
    return record


def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """The probability that a random positive scores above a random negative (ties count half); None
    without both classes."""
    positives, negatives = int(positive.sum()), int((~positive).sum())
    if not positives or not negatives:
        return None
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    # mid-ranks of tied scores
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    mid = first + (counts - 1) / 2.0 + 1
    ranks[order] = np.repeat(mid, counts)
    return float((ranks[positive].sum() - positives * (positives + 1) / 2) / (positives * negatives))


@torch.no_grad()
def validate(
    model,
    validation: ValidationSet,
    step: int,
    batch_size: int,
    device: torch.device,
    autocast,
    rank: int = 0,
    world_size: int = 1,
) -> dict:
    """The `validation` log record of `model` on the held-out set (the same on every rank). `model` is the
    bare model (not its DDP wrapper); it is put in eval mode (no dropout: no RNG is drawn) and back."""
    was_training = model.training
    model.eval()
    metrics = torch.zeros(len(METRIC_ROWS), 4, device=device, dtype=torch.float64)
    scored = {True: ([], []), False: ([], [])}  # masked or not: (probability of "aligned", is a positive)

    def score(batch, alignment_logits, masked: bool):
        chosen = batch["alignment_labels"] != IGNORE
        probs = torch.softmax(alignment_logits.float(), dim=-1)[:, ALIGNED]
        scored[masked][0].extend(probs[chosen].cpu().tolist())
        scored[masked][1].extend((batch["alignment_labels"][chosen] == ALIGNED).cpu().tolist())

    try:
        for batch in validation.batches(batch_size, rank, world_size):
            batch = {name: tensor.to(device) for name, tensor in batch.items()}
            captured = {}

            def forward(*args, captured=captured):  # called within this batch only
                out = model(*args)
                captured["alignment"] = out[2]
                return out

            with autocast():
                _, batch_metrics = compute_losses(forward, batch, {name: 1.0 for name in REGIMES + ("alignment",)})
            metrics += batch_metrics.double()
            score(batch, captured["alignment"], masked=True)
        for batch in validation.batches(batch_size, rank, world_size, masked=False):
            batch = {name: tensor.to(device) for name, tensor in batch.items()}
            with autocast():
                alignment_logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])[2]
            score(batch, alignment_logits, masked=False)
    finally:
        model.train(was_training)
    if world_size > 1:
        dist.all_reduce(metrics)
        gathered = [None] * world_size
        dist.all_gather_object(gathered, scored)
        scored = {
            masked: tuple([value for part in gathered for value in part[masked][column]] for column in (0, 1))
            for masked in (True, False)
        }
    record = {"event": "validation", "step": step, "videos": validation.videos}
    for index, name in enumerate(METRIC_ROWS):
        loss_sum, correct, count, _ = (float(v) for v in metrics[index].cpu())
        prefix = METRIC_PREFIXES[name]
        record[f"{prefix}_loss"] = loss_sum / count if count else None
        record[f"{prefix}_acc"] = correct / count if count else None
    scores, labels = (np.asarray(column) for column in scored[True])
    record["alignment_auc"] = roc_auc(scores.astype(np.float64), labels.astype(bool))
    if record["alignment_auc"] is None:  # positives only (too few or short held-out videos for a negative)
        record["alignment_acc"] = None
    scores, labels = (np.asarray(column) for column in scored[False])
    record["alignment_unmasked_auc"] = roc_auc(scores.astype(np.float64), labels.astype(bool))
    record["alignment_unmasked_acc"] = (
        float(np.mean((scores > 0.5) == labels.astype(bool))) if record["alignment_unmasked_auc"] is not None else None
    )
    return record


def format_validation(record: dict) -> str:
    parts = [f"validation at step {record['step']} on {record['videos']} held-out video(s)"]
    for name, prefix in METRIC_PREFIXES.items():
        if record[f"{prefix}_loss"] is not None:
            accuracy = record[f"{prefix}_acc"]
            parts.append(
                f"{name} {record[f'{prefix}_loss']:.3f}"
                + (f" (acc {accuracy:.3f})" if accuracy is not None else " (no negatives: no accuracy)")
            )
    if record["alignment_auc"] is not None:
        parts.append(f"alignment AUC {record['alignment_auc']:.3f}")
    if record.get("alignment_unmasked_acc") is not None:
        parts.append(
            f"unmasked alignment acc {record['alignment_unmasked_acc']:.3f}, AUC {record['alignment_unmasked_auc']:.3f}"
        )
    noisy = record.get("noisy")
    if noisy and noisy.get("alignment_acc") is not None:
        parts.append(
            f"with the run's noise: alignment acc {noisy['alignment_acc']:.3f}"
            + (f", AUC {noisy['alignment_auc']:.3f}" if noisy.get("alignment_auc") is not None else "")
        )
    if record.get("missing"):
        parts.append("nothing to measure for: " + ", ".join(record["missing"]))
    return " | ".join(parts)
