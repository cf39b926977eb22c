"""The paper's supervised S3D baseline (Table 1, "S3D"): a linear classifier on the S3D features, predicting
a segment's verb and its noun among the eval.verbs / eval.nouns lists.

- A segment's feature is the mean of the S3D vectors (features stage, 1024-d) of the clips overlapping its
  span by at least `align.min_sentence_overlap` of a clip: the annotated segments of eval.segments (a
  YouCook II annotations file; trained on the `eval.probe_train_subsets` subsets, tested on `eval.subsets`),
  or the align shards' segments (eval.segments: align; `eval.probe_test_share` of the videos, drawn by
  `eval.probe_seed`, are held out for the test).
- Labels: eval.labels, several per segment allowed. The classifier (scikit-learn's multinomial logistic
  regression on standardised features, L2 with inverse strength `eval.probe_c`) is trained on one example
  per (segment, list label) pair; its classes are the list words seen in training (a list word never seen
  cannot be predicted). It ranks its classes per test segment, scored like the zero-shot rows: right when
  the top 1 / top 5 holds any of the segment's list labels.

Writes DIR/eval/linear_probe.json (the row, the split, the classes, the features' S3D weights)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from pipeline import storage
from pipeline.config import Config
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir
from videobert.eval.verb_noun_labels import (
    PARTS,
    TOP_K,
    accuracy,
    format_cell,
    read_labels,
    read_word_list,
)

ROW = ("s3d_linear_probe", "S3D linear probe (supervised)")


def train_probe(features: np.ndarray, labels: list[tuple[str, ...]], words: list[str], c: float, seed: int = 0):
    """A fitted (scaler, classifier) on one example per (segment, label among `words`); None when fewer than
    two classes are seen."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    listed = set(words)
    rows = [(i, label) for i, truth in enumerate(labels) for label in truth if label in listed]
    if len({label for _, label in rows}) < 2:
        return None
    x = features[[i for i, _ in rows]].astype(np.float64)
    y = np.array([label for _, label in rows])
    scaler = StandardScaler().fit(x)
    classifier = LogisticRegression(C=c, max_iter=2000, random_state=seed).fit(scaler.transform(x), y)
    return scaler, classifier


def rank(model, features: np.ndarray) -> list[list[str]]:
    """Each segment's TOP_K classes, most probable first."""
    scaler, classifier = model
    probabilities = classifier.predict_proba(scaler.transform(features.astype(np.float64)))
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :TOP_K]
    return [[str(classifier.classes_[i]) for i in row] for row in order]


def segment_features(work_dir, spans: dict[str, list[tuple[object, float, float]]], min_overlap: float):
    """key -> the mean S3D feature of the clips in its span (keys without a clip are left out), and the
    features' S3D weights."""
    from videobert.eval.youcook2 import clips_in_span, video_clips

    weights = {storage.read_metadata(path).weights for _, path in Lineage(WorkDir(work_dir)).current_parts("features")}
    found = {}
    # one features part in memory at a time; only the segment means are kept
    for video_id, own in video_clips(work_dir, "features", set(spans), ["start_s", "end_s", "feature"]):
        for key, start_s, end_s in spans[video_id]:
            inside = clips_in_span(own["start_s"], own["end_s"], start_s, end_s, min_overlap)
            if inside.size:
                found[key] = own["feature"][inside].astype(np.float32).mean(axis=0)
    return found, sorted(str(w) for w in weights if w)


def _split(cfg: Config, work_dir) -> tuple[dict, set, set]:
    """(video -> [(key, start, end)], training keys, test keys)."""
    from videobert.youcook2 import read_annotations

    spans: dict[str, list] = {}
    train_keys, test_keys = set(), set()
    if cfg.eval.segments != "align":
        for video in read_annotations(cfg.eval.segments).values():
            side = (
                test_keys
                if video.subset in cfg.eval.subsets
                else train_keys
                if video.subset in cfg.eval.probe_train_subsets
                else None
            )
            if side is None:
                continue
            for annotation in video.annotations:
                key = (video.video_id, annotation.index)
                spans.setdefault(video.video_id, []).append((key, annotation.start_s, annotation.end_s))
                side.add(key)
        return spans, train_keys, test_keys
    rows = []
    for _, path in Lineage(WorkDir(work_dir)).current_parts("align"):
        rows += storage.read_table(path, columns=["video_id", "segment_index", "start_s", "end_s"]).to_pylist()
    videos = sorted({row["video_id"] for row in rows})
    held_out = max(1, round(cfg.eval.probe_test_share * len(videos)))
    order = np.random.default_rng(cfg.eval.probe_seed).permutation(len(videos))
    test_videos = {videos[i] for i in order[:held_out]}
    for row in rows:
        key = (row["video_id"], row["segment_index"])
        spans.setdefault(row["video_id"], []).append((key, row["start_s"], row["end_s"]))
        (test_keys if row["video_id"] in test_videos else train_keys).add(key)
    return spans, train_keys, test_keys


def linear_probe(cfg: Config, work_dir: Path, quiet: bool = False) -> dict:
    """Train and test the probe; returns the report written to DIR/eval/linear_probe.json."""
    e = cfg.eval
    if not e.labels:
        from pipeline.config import ConfigError

        raise ConfigError(
            "config error: eval.labels is not set: the linear probe is supervised (--set eval.labels=FILE)"
        )
    lists = {"verb": read_word_list(e.verbs, "eval.verbs"), "noun": read_word_list(e.nouns, "eval.nouns")}
    labels = read_labels(e.labels)
    spans, train_keys, test_keys = _split(cfg, work_dir)
    features, weights = segment_features(work_dir, spans, cfg.align.min_sentence_overlap)
    split = {
        name: sorted(k for k in keys if k in labels and k in features)
        for name, keys in (("train", train_keys), ("test", test_keys))
    }
    notes = []
    if any("NOT pretrained" in w for w in weights):
        notes.append(
            "the S3D features come from random weights (features.weights: random): the probe learns from noise"
        )
    result, classes = {}, {}
    for index, part in enumerate(PARTS):
        truth = {key: labels[key][index] for key in split["train"] + split["test"]}
        model = None
        if split["train"] and split["test"]:
            model = train_probe(
                np.stack([features[k] for k in split["train"]]),
                [truth[k] for k in split["train"]],
                lists[part],
                e.probe_c,
                e.probe_seed,
            )
        if model is None:
            result[part] = {"top1": None, "top5": None, "n": 0}
            notes.append(f"{part}: fewer than two list words among the training labels, or no test segment: no probe")
            continue
        classes[part] = [str(c) for c in model[1].classes_]
        rankings = rank(model, np.stack([features[k] for k in split["test"]]))
        result[part] = accuracy(rankings, [truth[k] for k in split["test"]], lists[part])
    report = {
        "row": ROW[0],
        "results": {ROW[0]: result},
        "segments": {name: len(keys) for name, keys in split.items()},
        "segments_without_clips": len((train_keys | test_keys) - set(features)),
        "split": ("annotation subsets: train " + ",".join(e.probe_train_subsets) + ", test " + ",".join(e.subsets))
        if e.segments != "align"
        else f"held-out videos: {e.probe_test_share:g} drawn by seed {e.probe_seed}",
        "classes": classes,
        "features_weights": weights,
        "feature": "mean S3D vector of the segment's clips",
        "classifier": f"multinomial logistic regression, standardised features, C={e.probe_c:g}",
        "notes": notes,
        "config_hash": cfg.section_hash("eval"),
    }
    storage.atomic_write_json(WorkDir(work_dir).eval_folder / "linear_probe.json", report)
    if not quiet:
        print(format_probe(report), file=sys.stderr)
    return report


def format_probe(report: dict) -> str:
    lines = [
        f"linear probe on S3D features: {report['segments']['train']} training and {report['segments']['test']} "
        f"test segments ({report['split']})",
        f"  {'':30}{'verb top-1':>11}{'verb top-5':>11}{'noun top-1':>11}{'noun top-5':>11}",
    ]
    row = report["results"][ROW[0]]
    lines.append(
        f"  {ROW[1]:30}" + "".join(f"{format_cell(row[part][top]):>11}" for part in PARTS for top in ("top1", "top5"))
    )
    lines += [f"note: {note}" for note in report["notes"]]
    return "\n".join(lines)
