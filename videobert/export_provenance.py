"""What an export records of how its model was made, read from the work dir it was trained in: the S3D
weights and feature settings of the current features parts (`feature_provenance`, `feature_settings`: the
card's provenance and s3d.json, with which new videos get the same visual words), and the training summary
(`training_summary`: the checkpoint's train settings, its last training and validation records, the YouCook
II videos kept apart and the zero-shot report of this very checkpoint)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pipeline import storage
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir


def feature_provenance(work_dir) -> dict:
    """The S3D weights and feature settings recorded by the features stage's current parts."""
    weights = set()
    for _, path in Lineage(WorkDir(work_dir)).current_parts("features"):
        weights.add(str(storage.read_metadata(path).weights))
    found = sorted(weights)
    return {"s3d_weights": found, "pretrained": bool(found) and not any("random" in w for w in found)}


def feature_settings(work_dir) -> dict | None:
    """The decode and features config sections, the S3D weights and the feature provenance of the current
    features parts, with the run's seed (random S3D weights are seeded by it); None without features parts."""
    made = {}
    for _, path in Lineage(WorkDir(work_dir)).current_parts("features"):
        meta = storage.read_metadata(path)
        made[(meta.config, meta.weights, meta.feature_provenance)] = path
    if not made:
        return None
    if len(made) > 1:
        raise ValueError(
            f"the features parts of {work_dir} were made with {len(made)} different settings: "
            f"their visual words do not share one S3D space"
        )
    config, weights, provenance = next(iter(made))
    sections = json.loads(config or "{}")
    # random S3D weights are seeded by the run's seed, which their identity names ("random(seed=N, ...")
    seeded = re.match(r"random\(seed=(\d+)", weights or "")
    return {
        "config": {"seed": int(seeded.group(1)) if seeded else 0, **sections},
        "weights": weights,
        "feature_provenance": json.loads(provenance or "{}"),
    }


def training_summary(work: WorkDir, info: dict, checkpoint: Path) -> dict:
    """What the checkpoint was trained with and reached: its train settings, the last training record and
    the last validation record of DIR/train/log.jsonl (up to the checkpoint's step), the zero-shot report."""
    t = (info.get("config") or {}).get("train", {})
    keys = (
        "init_checkpoint",
        "max_steps",
        "batch_size",
        "lr",
        "max_len",
        "regime_weights",
        "concat_prob",
        "max_subsample_step",
        "text_insert_prob",
        "text_span_mask_prob",
        "text_context_noise_prob",
        "text_noise_words",
        "text_end_drop_prob",
        "visual_crop_prob",
        "negative_mlm",
        "validation_videos",
        "youcook2_excluded_subsets",
    )
    summary = {
        "step": info.get("step"),
        "settings": {key: t[key] for key in keys if key in t},
        "youcook2_kept_apart": None,
        "last_training": None,
        "last_validation": None,
        "zero_shot": None,
    }
    log = work.train_log
    if log.exists():
        last_train = last_validation = None
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if info.get("step") is not None and record.get("step", 0) > info["step"]:
                continue
            if record.get("event") == "train":
                last_train = record
            elif record.get("event") == "validation":
                last_validation = record
        summary["last_training"], summary["last_validation"] = last_train, last_validation
    from videobert.youcook2 import KEPT_APART_FOLDER

    kept = work.train_folder / KEPT_APART_FOLDER / "videos.json"
    record = json.loads(kept.read_text()) if kept.exists() else {}
    # the record of this run: its subsets and the shards it trained on (a part of them when others were held out)
    if (
        record
        and record.get("excluded_subsets") == t.get("youcook2_excluded_subsets")
        and set(info.get("shards") or []) <= set(record.get("shards") or [])
    ):
        summary["youcook2_kept_apart"] = {
            "videos": record.get("videos_left_out"),
            "subsets": record.get("excluded_subsets"),
            "annotations_sha256": record.get("annotations_sha256"),
        }
    report = work.eval_folder / "zero_shot.json"
    if report.exists():
        try:
            zero = json.loads(report.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            zero = None
        # only a report of this very checkpoint
        if zero and Path(str(zero.get("checkpoint"))).resolve() == Path(checkpoint).resolve():
            summary["zero_shot"] = {
                "checkpoint": zero.get("checkpoint"),
                "segments": zero.get("segments"),
                "segment_source": zero.get("segment_source"),
                "results": zero.get("results"),
            }
    return summary
