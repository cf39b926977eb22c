"""Held-out validation during pre-training (`train.validation_videos`, `train.validation_every`).

- **Split.** The validation videos are the first N of a permutation of the align shards' video ids (sorted),
  seeded by `train.seed`; N is a count, or a share of the videos (rounded, at least 1). Their segments are
  never trained on: training streams DIR/train/heldout/part-*.parquet, the align shards' rows of the other
  videos (the shards' names and provenance kept; shards left empty are not written), and
  DIR/train/heldout/videos.json names the validation videos.
- **Examples.** Made once at train start from the validation videos, the way training makes them, with a
  generator seeded by `train.seed` alone, so the set is the same every time it is computed (and on every
  rank, and after a resume): neighbouring segments joined into units as training joins them; per unit a
  text example (if it has text), a video example (if it has video) and, if it has both, a text-video
  positive and a negative (visual tokens of another time, as many as its own, drawn by the training
  stream's rule: `stream.negative_window`, other units being the other validation units); all masked
  as in training. At most MAX_UNITS units (a seeded choice).
- **Metrics.** Each regime's masked-LM loss and accuracy over its masked tokens, the alignment loss and
  accuracy over the text-video examples and the alignment ROC AUC (the probability of "aligned" ranking
  positives above negatives; ties count half). Under torchrun every rank scores a slice and the sums and
  scores are gathered, so all ranks agree."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from videobert.data import (ALIGNED, EMPTY, IGNORE, NOT_ALIGNED, REGIMES, TEXT, TEXT_VIDEO, VIDEO, DataParams, Plan,
                            Unit, Video, VocabLayout, build_example, collate, read_videos, runs)
from videobert.metrics import METRIC_PREFIXES, METRIC_ROWS, compute_losses
from videobert.stream import negative_window
from videobert.subset import shard_video_ids, write_video_rows

MAX_UNITS = 4096
FOLDER = "heldout"


def validation_count(spec: float, videos: int) -> int:
    """How many of `videos` a train.validation_videos value holds out (0 = none)."""
    if spec <= 0:
        return 0
    count = max(1, round(spec * videos)) if spec < 1 else int(spec)
    if count >= videos:
        raise ValueError(f"train.validation_videos {spec:g} holds out {count} of the {videos} videos of the "
                         f"align shards: none would be left to train on")
    return count


def choose_validation_videos(video_ids: list[str], spec: float, seed: int) -> list[str]:
    """The held-out videos, in id order: the first N of a permutation of the sorted ids seeded by `seed`."""
    ids = sorted(set(video_ids))
    count = validation_count(spec, len(ids))
    order = np.random.default_rng([seed, 5]).permutation(len(ids))[:count]
    return sorted(ids[i] for i in order)


def split_shards(cfg, work_dir, shards: list[Path], *, write: bool = True) -> tuple[list[Path], list[str]]:
    """(the shards to train on, the validation videos): `shards` and [] without train.validation_videos,
    else the shards without the validation videos' rows (written when `write`: on one rank only)."""
    from pipeline.engine.workdir import WorkDir

    spec = cfg.train.validation_videos
    if not spec:
        return shards, []
    chosen = choose_validation_videos(shard_video_ids(shards), spec, cfg.train.seed)
    kept_paths = write_video_rows(
        shards, WorkDir(work_dir).train_folder / FOLDER, chosen, keep=False, source_key="heldout_of", write=write,
        extra={"validation_videos": f"{spec:g}", "validation_seed": str(cfg.train.seed)},
        summary={"validation_videos": chosen, "spec": spec, "seed": cfg.train.seed})
    if not kept_paths:
        raise ValueError("train.validation_videos leaves no segment to train on")
    return kept_paths, chosen


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
    def build(cls, videos: list[Video], layout: VocabLayout, text_replacements: np.ndarray, params: DataParams,
              seed: int) -> "ValidationSet":
        rng = np.random.default_rng([seed, 4])
        units = [Unit(video, first, last) for video in videos
                 for first, last in runs(video.segments, rng, params.concat_prob, params.max_concat)]
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
        return cls(examples, [p.regime for p in plans], [p.alignment_label for p in plans], len(videos),
                   layout.pad_id)

    def batches(self, batch_size: int, rank: int = 0, world_size: int = 1):
        """This rank's batches: every world_size-th of them, from the rank-th."""
        for index, first in enumerate(range(0, len(self.examples), batch_size)):
            if index % world_size == rank:
                end = first + batch_size
                yield collate(self.examples[first:end], self.regimes[first:end], self.alignment_labels[first:end],
                              self.pad_id)


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
def validate(model, validation: ValidationSet, step: int, batch_size: int, device: torch.device, autocast,
             rank: int = 0, world_size: int = 1) -> dict:
    """The `validation` log record of `model` on the held-out set (the same on every rank). `model` is the
    bare model (not its DDP wrapper); it is put in eval mode (no dropout: no RNG is drawn) and back."""
    was_training = model.training
    model.eval()
    metrics = torch.zeros(len(METRIC_ROWS), 4, device=device, dtype=torch.float64)
    scores, labels = [], []
    try:
        for batch in validation.batches(batch_size, rank, world_size):
            batch = {name: tensor.to(device) for name, tensor in batch.items()}
            captured = {}

            def forward(*args, captured=captured):     # called within this batch only
                out = model(*args)
                captured["alignment"] = out[2]
                return out

            with autocast():
                _, batch_metrics = compute_losses(forward, batch, {name: 1.0 for name in REGIMES + ("alignment",)})
            metrics += batch_metrics.double()
            chosen = batch["alignment_labels"] != IGNORE
            probs = torch.softmax(captured["alignment"].float(), dim=-1)[:, ALIGNED]
            scores += probs[chosen].cpu().tolist()
            labels += (batch["alignment_labels"][chosen] == ALIGNED).cpu().tolist()
    finally:
        model.train(was_training)
    if world_size > 1:
        dist.all_reduce(metrics)
        gathered = [None] * world_size
        dist.all_gather_object(gathered, (scores, labels))
        scores = [s for part, _ in gathered for s in part]
        labels = [label for _, part in gathered for label in part]
    record = {"event": "validation", "step": step, "videos": validation.videos}
    for index, name in enumerate(METRIC_ROWS):
        loss_sum, correct, count, _ = (float(v) for v in metrics[index].cpu())
        prefix = METRIC_PREFIXES[name]
        record[f"{prefix}_loss"] = loss_sum / count if count else None
        record[f"{prefix}_acc"] = correct / count if count else None
    auc = roc_auc(np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=bool))
    record["alignment_auc"] = auc
    if auc is None:   # positives only (held-out videos too few or short for a negative): no accuracy to tell
        record["alignment_acc"] = None
    return record


def format_validation(record: dict) -> str:
    parts = [f"validation at step {record['step']} on {record['videos']} held-out video(s)"]
    for name, prefix in METRIC_PREFIXES.items():
        if record[f"{prefix}_loss"] is not None:
            accuracy = record[f"{prefix}_acc"]
            parts.append(f"{name} {record[f'{prefix}_loss']:.3f}"
                         + (f" (acc {accuracy:.3f})" if accuracy is not None else " (no negatives: no accuracy)"))
    if record["alignment_auc"] is not None:
        parts.append(f"alignment AUC {record['alignment_auc']:.3f}")
    return " | ".join(parts)
