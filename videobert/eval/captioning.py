"""YouCook II captioning as the paper's transfer experiment (section 4.5, Table 4): VideoBERT as a feature
extractor, a small transformer encoder-decoder (Zhou et al. 2018) trained on the annotated training
segments' captions, greedy-decoded on the validation segments (ground-truth segments, as in both papers)
and scored with coco-caption's metrics (videobert/eval/caption_metrics.py). This file holds the features, the
run and the table; the captioner itself (vocabulary, model, training, decoding, cross-validation) is
videobert/eval/captioner.py.

- **Features** (one vector per annotated segment, its clips being those that overlap the annotated span
  by at least `align.min_sentence_overlap` of a clip, as for zero-shot):
  `s3d`: the average-pooled S3D features of its clips (the features stage); `videobert`: the paper's
  `[CLS] <eval.features_template> [>] visual tokens [SEP]` pass, the mean final state of the visual tokens
  concatenated with the mean final state of the template's masked tokens; `videobert_s3d`: both
  concatenated. Each row's features are standardised with the training segments' mean and deviation.
- **Encoder sequence.** The paper's features are pooled per segment, so the encoder reads a one-element
  sequence: the segment's vector projected to `caption.hidden` (Zhou et al. encode the per-frame features
  of the segment instead).
- **Model** (`caption.*`, the paper's values by default): `caption.layers` encoder and decoder layers of
  width `caption.hidden` (128), `caption.heads` heads, feed-forward `caption.feedforward`, dropout
  `caption.dropout` (0.4); the decoder's vocabulary is the words of the training captions (lower case,
  coco-caption's tokenisation without Java: `caption_metrics.simple_tokenize`) seen at least
  `caption.min_word_count` times, others are <unk>. Adam (`caption.lr` 1e-3, linearly decayed to 0) for
  `caption.steps` steps (40,000) of `caption.batch_size` (128) captions drawn with replacement, seeded by
  `caption.seed`; cross-entropy with teacher forcing.
- **Hyper-parameters**: the values above, or (`caption.cv_folds` >= 2 and a `caption.cv_grid`) chosen per
  row as the paper did, by k-fold cross-validation on the training segments (folds of whole videos).
- **Decoding**: greedy (Zhou et al.'s), at most `caption.max_words` words, <unk> never emitted.

Writes DIR/eval/captioning.json (the table, the paper's row, the setup, the training losses, the metric
toolkit and notes) and DIR/eval/captioning_predictions.parquet (per row and validation segment: the
reference, the decoded caption and its per-segment scores)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline import storage, threads
from pipeline.config import Config
from pipeline.engine.workdir import WorkDir
from pipeline.progress import Progress
from schemas.metadata import Provenance
from videobert.eval import caption_metrics
from videobert.eval.captioner import caption, cross_validate, train_captioner
from videobert.eval.evaluate import Evaluator, segment_vectors

ROWS = (("s3d", "S3D"), ("videobert", "VideoBERT"), ("videobert_s3d", "VideoBERT + S3D"))
# the paper's Table 4 (YouCook II validation, ground-truth segments), in its units (percent, CIDEr as is)
PAPER = {
    "s3d": {"BLEU-3": 6.12, "BLEU-4": 3.24, "METEOR": 9.52, "ROUGE-L": 26.09, "CIDEr": 0.31},
    "videobert": {"BLEU-3": 6.80, "BLEU-4": 4.04, "METEOR": 11.01, "ROUGE-L": 27.50, "CIDEr": 0.49},
    "videobert_s3d": {"BLEU-3": 7.59, "BLEU-4": 4.33, "METEOR": 11.94, "ROUGE-L": 28.80, "CIDEr": 0.55},
}
# the table's other rows, captioners this setup does not train: Zhou et al. 2018's end-to-end transformer, and
# VideoBERT's features without S3D's from its video-only pre-training. BLEU-4, METEOR and CIDEr of Zhou et al.,
# S3D, VideoBERT (video only) and VideoBERT + S3D agree with a second copy of the table; the video-only row's
# BLEU-3 and ROUGE-L are left out, as that copy does not have them
PAPER_OTHER = {
    "Zhou et al. 2018": {"BLEU-3": 7.53, "BLEU-4": 3.84, "METEOR": 11.55, "ROUGE-L": 27.44, "CIDEr": 0.38},
    "VideoBERT (video only)": {"BLEU-3": None, "BLEU-4": 3.81, "METEOR": 10.81, "ROUGE-L": None, "CIDEr": 0.47},
}
PAPER_SETUP = (
    "the paper: Kinetics-pretrained S3D, VideoBERT (BERT-large) pre-trained 500K steps on 312K cooking "
    "videos without YouCook II, the captioner trained 40K steps of batch 128 on about 10K training captions"
)


# ---------------------------------------------------------------- features of the annotated segments


def videobert_features(ev: Evaluator, template: str, segments) -> dict[tuple[str, int], np.ndarray]:
    """(video_id, segment_index) -> the VideoBERT features (evaluate.segment_vectors) of each segment with
    visual tokens (float32 forward passes)."""
    return {
        (s.video_id, int(x["segment_index"])): row
        for batch, features in segment_vectors(ev, template, segments, float32=True)
        for (s, x), row in zip(batch, features)
    }


def standardise(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean, deviation = train.mean(axis=0), train.std(axis=0)
    deviation[deviation < 1e-6] = 1.0
    return (train - mean) / deviation, (test - mean) / deviation


# ---------------------------------------------------------------- the experiment


def run_captioning(
    cfg: Config,
    work_dir: Path,
    checkpoint: str | Path | None = None,
    *,
    quiet: bool = False,
    use_java: bool | None = None,
) -> dict:
    """Train and score the `caption.rows` rows; returns captioning.json's content (and prints the table).
    `use_java`: None = coco-caption's PTB tokenizer and METEOR where a Java runtime exists."""
    from videobert.eval import youcook2
    from videobert.eval.probe import segment_features

    if not cfg.eval.segments.endswith(".json"):  # a config mistake: exit status 2, as the other unset values
        from pipeline.config import ConfigError

        got = f" (got {cfg.eval.segments!r})" if cfg.eval.segments else ""
        raise ConfigError(
            f"config error: eval captioning needs eval.segments to be a YouCook II annotations .json "
            f"file (the captions and their subsets){got}: --set eval.segments=FILE.json"
        )
    c = cfg.caption
    work_dir = WorkDir(work_dir).root
    ev = Evaluator(cfg, work_dir, checkpoint)
    threads.set_torch_threads(c.num_threads or cfg.train.num_threads)
    wanted = [*c.train_subsets, *[s for s in c.test_subsets if s not in c.train_subsets]]
    segments = list(
        youcook2.annotated_segments(cfg, work_dir, ev.layout, ev.info.get("codebook_sha256"), subsets=wanted)
    )
    subset_of = {(s.video_id, int(x["segment_index"])): x["subset"] for s, x in segments}
    sentence_of = {(s.video_id, int(x["segment_index"])): x["sentence"] for s, x in segments}
    spans: dict[str, list] = {}
    for s, x in segments:
        spans.setdefault(s.video_id, []).append(((s.video_id, int(x["segment_index"])), x["start_s"], x["end_s"]))
    s3d, s3d_weights = segment_features(work_dir, spans, cfg.align.min_sentence_overlap)
    joint = videobert_features(ev, cfg.eval.features_template, segments)
    # every row uses the same segments: those with both features and a caption
    keys = sorted(k for k in subset_of if k in s3d and k in joint and sentence_of[k].strip())
    train_keys = [k for k in keys if subset_of[k] in c.train_subsets]
    test_keys = [k for k in keys if subset_of[k] in c.test_subsets]
    if not train_keys or not test_keys:
        raise ValueError(
            f"captioning needs segments with features and captions in both {c.train_subsets} "
            f"(found {len(train_keys)}) and {c.test_subsets} (found {len(test_keys)})"
        )
    notes = (
        [
            f"{len(segments) - len(keys)} annotated segments without clips (features or visual tokens) or caption "
            f"are left out"
        ]
        if len(segments) > len(keys)
        else []
    )
    if any(w.startswith("random") or "NOT pretrained" in w for w in s3d_weights):
        notes.append("the S3D features come from random (calibrated) weights, NOT the Kinetics-pretrained S3D")

    def row_features(name: str, chosen):
        parts = {"s3d": [s3d], "videobert": [joint], "videobert_s3d": [joint, s3d]}[name]
        return np.stack([np.concatenate([p[k].astype(np.float32) for p in parts]) for k in chosen])

    references = {f"{v}/{i}": [sentence_of[(v, i)]] for v, i in test_keys}
    results, records, trained = {}, [], {}
    total_steps = c.steps * len(c.rows)
    with (
        Progress(total=total_steps, unit="steps", desc="captioning", quiet=quiet) as progress,
        caption_metrics.one_meteor(),
    ):
        for name in c.rows:
            x_train, x_test = standardise(row_features(name, train_keys), row_features(name, test_keys))
            params = dict(
                hidden=c.hidden,
                layers=c.layers,
                heads=c.heads,
                feedforward=c.feedforward,
                dropout=c.dropout,
                lr=c.lr,
                batch_size=c.batch_size,
                steps=c.steps,
                max_words=c.max_words,
                min_word_count=c.min_word_count,
                seed=c.seed,
            )
            validation = None
            if c.cv_folds >= 2 and c.cv_grid:
                validation = cross_validate(
                    x_train,
                    [sentence_of[k] for k in train_keys],
                    [v for v, _ in train_keys],
                    params,
                    c.cv_grid,
                    folds=c.cv_folds,
                    seed=c.seed,
                    metric=c.cv_metric,
                    use_java=use_java,
                )
                params = validation["chosen"]
            model, vocab, losses = train_captioner(
                x_train, [sentence_of[k] for k in train_keys], **params, progress=progress
            )
            predicted = caption(model, vocab, x_test)
            predictions = {f"{v}/{i}": text or "" for (v, i), text in zip(test_keys, predicted)}
            scored = caption_metrics.score(references, predictions, use_java=use_java)
            results[name] = {
                "scores": scored["scores"],
                "paper_units": caption_metrics.as_paper_units(scored["scores"]),
                "feature_dim": int(x_train.shape[1]),
                "vocabulary": len(vocab),
                "losses": losses,
                "notes": scored["notes"],
                "params": params,
                "cross_validation": validation,
            }
            trained[name] = scored
            for (v, i), text in zip(test_keys, predicted):
                per = scored["per_segment"][f"{v}/{i}"]
                records.append(
                    {
                        "row": name,
                        "video_id": v,
                        "segment_index": i,
                        "reference": sentence_of[(v, i)],
                        "prediction": text,
                        **{m.lower().replace("-", "_"): per.get(m) for m in caption_metrics.METRICS},
                    }
                )
    any_scored = next(iter(trained.values()))
    report = {
        "task": "YouCook II captioning on ground-truth segments (VideoBERT paper, Table 4)",
        "train_subsets": c.train_subsets,
        "test_subsets": c.test_subsets,
        "train_segments": len(train_keys),
        "test_segments": len(test_keys),
        "rows": {name: dict(results[name], label=dict(ROWS)[name]) for name in c.rows},
        "train_videos": len({v for v, _ in train_keys}),
        "test_videos": len({v for v, _ in test_keys}),
        "made_by": {
            "caption_steps": c.steps,
            "caption_batch_size": c.batch_size,
            "videobert_step": ev.info.get("step"),
            "videobert_init": ev.info.get("init_checkpoint"),
            "s3d_weights": s3d_weights,
        },
        "paper": PAPER,
        "paper_other": PAPER_OTHER,
        "paper_setup": PAPER_SETUP,
        "units": "BLEU, METEOR, ROUGE-L in percent; CIDEr as is (the paper's)",
        "metrics": {
            "toolkit": any_scored["toolkit"],
            "tokenizer": any_scored["tokenizer"],
            "meteor": any_scored["meteor"],
        },
        "setup": {
            "features_template": cfg.eval.features_template,
            "s3d_weights": s3d_weights,
            "encoder_sequence": "one element: the segment's pooled feature vector",
            "decoding": f"greedy, at most {c.max_words} words",
            "standardised": "per feature with the training segments' mean and deviation",
            "caption": json_section(cfg),
        },
        "notes": notes + any_scored["notes"],
        **ev.provenance(),
    }
    eval_folder = WorkDir(work_dir).eval_folder
    schema = pa.schema(
        [
            ("row", pa.string()),
            ("video_id", pa.string()),
            ("segment_index", pa.int32()),
            ("reference", pa.string()),
            ("prediction", pa.string()),
            *[(m.lower().replace("-", "_"), pa.float64()) for m in caption_metrics.METRICS],
        ]
    )
    storage.write_parquet(
        eval_folder / "captioning_predictions.parquet",
        pa.Table.from_pylist(records, schema=schema),
        Provenance(
            codebook_sha256=ev.info.get("codebook_sha256"),
            extra=dict(
                ev.provenance(),
                caption_config=json_section(cfg),
                metrics=any_scored["toolkit"],
                tokenizer=any_scored["tokenizer"],
            ),
        ),
    )
    report["predictions"] = str(eval_folder / "captioning_predictions.parquet")
    storage.atomic_write_json(eval_folder / "captioning.json", report)
    print(format_table(report), file=sys.stdout)
    return report


def _of_videos(count) -> str:
    return "" if count is None else f" of {count} video{'s' if count != 1 else ''}"


def json_section(cfg: Config) -> str:
    return cfg.section_json("caption")


def format_table(report: dict) -> str:
    """The table in the paper's units, each row beside the paper's where it gives one."""

    def cell(value):
        return "-" if value is None else f"{value:.2f}"

    paper_rows = [("  paper: " + label, report["paper"][name]) for name, label in ROWS if name in report["paper"]]
    paper_rows += [("  paper: " + label, scores) for label, scores in (report.get("paper_other") or {}).items()]
    width = max(28, *(len(label) + 1 for label, _ in paper_rows))
    header = f"{'':{width}}" + "".join(f"{m:>9}" for m in caption_metrics.METRICS)
    made = report.get("made_by") or {}
    weights = ", ".join(sorted(set(made.get("s3d_weights") or []))) or "unknown"
    lines = [
        f"YouCook II captioning: scored on {report['test_segments']} {'/'.join(report['test_subsets'])} captions"
        f"{_of_videos(report.get('test_videos'))}, trained on {report['train_segments']} "
        f"{'/'.join(report['train_subsets'])} captions{_of_videos(report.get('train_videos'))}; "
        f"{report['metrics']['tokenizer']}",
        f"made by: captioner {made.get('caption_steps')} steps of batch {made.get('caption_batch_size')}; "
        f"VideoBERT step {made.get('videobert_step')} from {made.get('videobert_init')}; S3D weights {weights}",
        header,
    ]
    for row in report["rows"].values():
        lines.append(
            f"{row['label']:{width}}" + "".join(f"{cell(row['paper_units'][m]):>9}" for m in caption_metrics.METRICS)
        )
    # the paper's rows apart from this run's: a far larger setup, for comparison only
    lines.append(f"for comparison, {report.get('paper_setup', 'the paper')}:")
    for label, scores in paper_rows:
        lines.append(f"{label:{width}}" + "".join(f"{cell(scores[m]):>9}" for m in caption_metrics.METRICS))
    lines += [f"note: {note}" for note in report["notes"]]
    return "\n".join(lines)
