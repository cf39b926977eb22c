"""Zero-shot verb and noun classification, as in the VideoBERT paper (section 4.2).

Each evaluation segment is fed as `[CLS] <eval.zero_shot_template> [>] visual tokens [SEP]` ("now let me
show you how to [MASK] the [MASK]"); the verb is read at the first [MASK], the noun at the second; with
`eval.zero_shot_ensemble` it is asked with each of those sentences too, and a word's probability is its mean
over them; with `eval.zero_shot_calibrate` each sentence's scores are first taken less its scores with no
visual words (`[CLS] template [>] [SEP]`), so that what the wording alone leans to is taken out (contextual
calibration with a content-free input, Zhao et al. 2021). This file holds the run, its segments, the
initial BERT and the report; the candidates and their scoring (with the ensemble's mean and the calibration)
are in videobert/eval/zero_shot_scoring.py, the word lists, labels and accuracy in
videobert/eval/verb_noun_labels.py.

- **Candidates.** `open` ranking (the paper's): every word of the WordPiece vocabulary competes: each
  whole-word piece made of letters (no `##` continuation, no [special], no digit or punctuation), plus every
  word of the eval.verbs / eval.nouns lists that WordPiece splits (scored as below). `closed` ranking: only
  the list words. Both come from the same forward passes; `eval.rankings` names those reported, the first
  being the headline.
- **Multi-piece words.** A word of p pieces is scored with p [MASK]s at its slot (the other slot keeps its
  one [MASK]) by the sum of its pieces' log-probabilities at those positions, all masked at once (the
  product of the marginals: one forward pass per piece count, not one per word). So "lettuce" (let ##tu
  ##ce) is scored as lettuce, not as "let", and "parsley" and "parmesan" no longer tie on "par". There is
  no length normalisation: a longer word needs each of its pieces to be likely. Log-probabilities are
  normalised over the text vocabulary (the slot is a text slot: the visual words take no mass there).
- **Labels.** eval.labels gives each segment any number of verbs and nouns; a prediction is right when it
  is any of them (the paper's rule). Only labels in the lists count (both rankings score the same labels,
  so they differ only in what competes); a segment without one does not count for that part.
- **Rows.** `videobert`: the template with the segment's video; `text_only_prior`: VideoBERT given the
  template alone (`[CLS] template [SEP]`), the same ranking for every segment; `initial_bert_prior`: the
  same text-only input to the model training started from (train.init_checkpoint, rebuilt as `train`
  built it). A checkpoint without MLM head weights (the demo's packaged MiniLM) gets a random head there:
  that row is then about chance, and the report says so.
- **Precision.** Every forward pass here runs in float32 whatever train.precision says: in bf16 (8 bits of
  mantissa) words a few hundredths of a logit apart tie.

Segments: the align shards' (eval.segments: align), or the annotated spans of a YouCook II annotations file
(videobert/eval/youcook2.py); `eval.videos: validation` keeps those of the videos the checkpoint never trained on
(train.validation_videos, recorded in the checkpoint), and their labels only; `eval.videos: test` those of
its test videos (train.splits). Writes DIR/eval/zero_shot.json (the report) and zero_shot_predictions.parquet
(per segment and ranking: the top-5 words and their log-probabilities, and the labels)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline import storage, visual_words
from pipeline.config import Config
from pipeline.engine.workdir import WorkDir
from pipeline.progress import Progress
from schemas.metadata import Provenance
from videobert.eval.evaluate import Evaluator, batched
from videobert.eval.verb_noun_labels import PARTS, accuracy, chance, format_cell, read_labels, read_word_list
from videobert.eval.zero_shot_scoring import Ensemble, Scorer, make_candidates, rankings
from videobert.model import build_model

ROWS = (
    ("videobert", "VideoBERT (video + text)"),
    ("text_only_prior", "VideoBERT text-only prior"),
    ("initial_bert_prior", "initial BERT prior"),
)


# ---------------------------------------------------------------- the initial BERT


def initial_model(ev: Evaluator):
    """(the model training started from, rebuilt as `train` built it, or None; notes on what it is)."""
    init = ev.info.get("init_checkpoint")
    train_config = (ev.info.get("config") or {}).get("train", {})
    if not init:
        return None, ["the checkpoint does not name its init checkpoint: no initial BERT row"]
    # the visual rows do not matter for a text-only input scored over the text vocabulary; the codebook is
    # used when present so the model is exactly the one training started from
    try:
        codebook = visual_words.load(WorkDir(ev.work_dir).codebook)
        centroids, counts = codebook.centroids[-1], codebook.counts[-1]
        if len(counts) != ev.layout.num_visual:
            raise FileNotFoundError
    except FileNotFoundError:
        centroids = np.zeros((ev.layout.num_visual, 1024), dtype=np.float32)
        counts = np.ones(ev.layout.num_visual)
    try:
        model, build_notes = build_model(
            init,
            ev.layout,
            centroids,
            counts,
            max_len=int(train_config.get("max_len", ev.max_len)),
            seed=int(train_config.get("seed", 0)),
            text_embeddings=train_config.get("text_embeddings", ""),
        )
    except (OSError, ImportError, ValueError) as error:
        return None, [f"initial BERT prior skipped: {str(error).splitlines()[0]}"]
    notes = []
    if init.startswith("random:"):
        notes.append(f"initial BERT prior: {init} is a randomly initialised BERT, so that row is about chance")
    elif any("no MLM head weights" in note for note in build_notes):
        notes.append(
            f"initial BERT prior: {init} has no MLM head weights, so training started from a random "
            f"head (its output layer tied to the word embeddings): that row measures that head, about "
            f"chance, not BERT's own language prior"
        )
    return model.to(ev.device).eval(), notes


# ---------------------------------------------------------------- segments


def evaluation_segments(ev: Evaluator, cfg: Config):
    """(segment, extra) of what is evaluated: the align shards' segments, or the annotated spans; with
    eval.videos: validation only those of the checkpoint's held-out videos."""
    if cfg.eval.segments == "align":
        segments = ev.segments(ev.work_dir)
    else:
        from videobert.eval import youcook2

        segments = youcook2.annotated_segments(cfg, ev.work_dir, ev.layout, ev.info.get("codebook_sha256"))
    if cfg.eval.videos == "all":
        return segments
    held_out = set(validation_videos(ev, cfg.eval.videos))
    return ((segment, extra) for segment, extra in segments if segment.video_id in held_out)


def validation_videos(ev: Evaluator, which: str = "validation") -> list[str]:
    """The videos the checkpoint was never trained on: its validation videos (train.validation_videos or
    train.splits), or with `which` "test" its test videos (train.splits)."""
    videos = ev.info.get(f"{which}_videos") or []
    if not videos:
        raise ValueError(
            f"eval.videos {which}: {ev.path} was trained without {which} videos "
            + ("(train.validation_videos 0, no train.splits)" if which == "validation" else "(train.splits names none)")
        )
    return list(videos)


# ---------------------------------------------------------------- the run


def templates(e) -> list[str]:
    """The sentences a segment is asked with: eval.zero_shot_template, then eval.zero_shot_ensemble's."""
    return list(dict.fromkeys([e.zero_shot_template, *e.zero_shot_ensemble]))


def zero_shot(cfg: Config, work_dir: Path, checkpoint: str | Path | None = None, quiet: bool = False) -> dict:
    """Zero-shot verb and noun classification per segment; returns the report written to zero_shot.json."""
    work_dir = WorkDir(work_dir).root
    e = cfg.eval
    verbs, nouns = read_word_list(e.verbs, "eval.verbs"), read_word_list(e.nouns, "eval.nouns")
    labels = read_labels(e.labels) if e.labels else None
    ev = Evaluator(cfg, work_dir, checkpoint)
    if labels is not None and e.videos != "all":
        held_out = set(validation_videos(ev, e.videos))
        labels = {key: value for key, value in labels.items() if key[0] in held_out}
    open_vocabulary = "open" in e.rankings
    verb_candidates, verb_split = make_candidates(ev.tokenizer, verbs, open_vocabulary)
    noun_candidates, noun_split = make_candidates(ev.tokenizer, nouns, open_vocabulary)
    slots = {"verb": verb_candidates, "noun": noun_candidates}
    scorer = Ensemble([Scorer(ev, t, verb_candidates, noun_candidates, e.zero_shot_calibrate) for t in templates(e)])

    priors = {"text_only_prior": rankings(scorer.score(None), slots, e.rankings)}
    initial, initial_notes = initial_model(ev)
    if initial is not None:
        priors["initial_bert_prior"] = rankings(scorer.score(None, model=initial), slots, e.rankings)
        del initial

    records, skipped_no_video, found = [], 0, set()

    def wanted():
        nonlocal skipped_no_video
        for segment, extra in evaluation_segments(ev, cfg):
            key = (segment.video_id, extra["segment_index"])
            if labels is not None and key not in labels:
                continue
            found.add(key)
            if segment.visual_ids.size == 0:
                skipped_no_video += 1
                continue
            yield segment, extra

    with Progress(total=len(labels) if labels else None, unit="segments", desc="zero-shot", quiet=quiet) as progress:
        for batch in batched(wanted(), e.batch_size):
            ranked = rankings(scorer.score([segment.visual_ids for segment, _ in batch]), slots, e.rankings)
            for row, (segment, extra) in enumerate(batch):
                truth = labels.get((segment.video_id, extra["segment_index"]), ((), ())) if labels else ((), ())
                record = {
                    "video_id": segment.video_id,
                    "segment_index": extra["segment_index"],
                    "start_s": extra["start_s"],
                    "end_s": extra["end_s"],
                    "verbs": list(truth[0]),
                    "nouns": list(truth[1]),
                }
                for mode in e.rankings:
                    for part in PARTS:
                        words, scores = ranked[mode][part][row]
                        record[f"{part}_top5_{mode}"], record[f"{part}_scores_{mode}"] = words, scores
                records.append(record)
            progress.update(len(batch))

    out_dir = WorkDir(work_dir).eval_folder
    predictions_path = out_dir / "zero_shot_predictions.parquet"
    fields = [
        ("video_id", pa.string()),
        ("segment_index", pa.int32()),
        ("start_s", pa.float64()),
        ("end_s", pa.float64()),
        ("verbs", pa.list_(pa.string())),
        ("nouns", pa.list_(pa.string())),
    ]
    for mode in e.rankings:
        for part in PARTS:
            fields += [
                (f"{part}_top5_{mode}", pa.list_(pa.string())),
                (f"{part}_scores_{mode}", pa.list_(pa.float32())),
            ]
    how = {
        "template": " | ".join(templates(e)),
        "rankings": ",".join(e.rankings),
        "precision": "float32",
        "segments": e.segments,
        "videos": e.videos,
        "scoring": "sum of the pieces' log-probabilities (text vocabulary), one [MASK] "
        "per piece; closed set: normalised over the closed set"
        + ("; calibrated: less the template's with no visual words" if e.zero_shot_calibrate else ""),
        "labels": str(e.labels),
    }
    storage.write_parquet(
        predictions_path,
        pa.Table.from_pylist(records, schema=pa.schema(fields)),
        Provenance(codebook_sha256=ev.info.get("codebook_sha256"), extra=dict(ev.provenance(), **how)),
    )
    split = [dict(item, slot="verb") for item in verb_split] + [dict(item, slot="noun") for item in noun_split]
    report = {
        "checkpoint": str(ev.path),
        "step": ev.info.get("step"),
        "template": e.zero_shot_template,
        "ensemble": list(e.zero_shot_ensemble),
        "calibrated": e.zero_shot_calibrate,
        "init_checkpoint": ev.info.get("init_checkpoint"),
        "precision": "float32",
        "segment_source": e.segments,
        "rankings": list(e.rankings),
        "videos": e.videos,
        "verbs": len(verbs),
        "nouns": len(nouns),
        "candidates": {
            mode: {part: len(slots[part].words) if mode == "open" else len(slots[part].closed) for part in PARTS}
            for mode in e.rankings
        },
        "segments": len(records),
        "segments_without_video": skipped_no_video,
        "split_words": split,
        "notes": initial_notes
        + [
            f"{item['word']!r} is split into {item['pieces']}: scored jointly with {len(item['pieces'])} [MASK]"
            for item in split
        ],
        "prior_top5": {
            row: {mode: {part: ranked[mode][part][0][0] for part in PARTS} for mode in e.rankings}
            for row, ranked in priors.items()
        },
        "predictions": str(predictions_path),
        "config_hash": cfg.section_hash("eval"),
    }
    if labels is not None:
        truths = {"verb": [tuple(r["verbs"]) for r in records], "noun": [tuple(r["nouns"]) for r in records]}
        lists = {"verb": verbs, "noun": nouns}
        report["labels"] = e.labels
        report["labels_without_segment"] = len(labels) - len(found)
        report["labels_not_in_lists"] = {
            part: sum(word not in lists[part] for truth in truths[part] for word in truth) for part in PARTS
        }
        results = {}
        for mode in e.rankings:
            rows = {
                "videobert": {
                    part: accuracy([r[f"{part}_top5_{mode}"] for r in records], truths[part], lists[part])
                    for part in PARTS
                }
            }
            for row, ranked in priors.items():
                rows[row] = {
                    part: accuracy([ranked[mode][part][0][0]] * len(records), truths[part], lists[part])
                    for part in PARTS
                }
            if mode == "closed":
                rows["chance"] = {part: chance(truths[part], lists[part]) for part in PARTS}
            results[mode] = rows
        report["results"] = results
    storage.atomic_write_json(out_dir / "zero_shot.json", report)
    if not quiet:
        print(format_zero_shot(report), file=sys.stderr)
    return report


def format_zero_shot(report: dict) -> str:
    lines = [
        f"zero-shot on {report['segments']} segments ({report['verbs']} verbs, {report['nouns']} nouns), "
        f"checkpoint step {report['step']}, logits in {report['precision']}"
    ]
    if "results" not in report:
        lines.append(f"no labels (eval.labels): predictions written to {report['predictions']}")
        for row, by_mode in report["prior_top5"].items():
            for mode, parts in by_mode.items():
                lines.append(f"{row} ({mode}): verb {', '.join(parts['verb'])}; noun {', '.join(parts['noun'])}")
    else:
        titles = dict(ROWS, chance="chance (random ranking)")
        for mode in report["rankings"]:
            sizes = report["candidates"][mode]
            what = "open vocabulary" if mode == "open" else "closed set"
            lines.append(f"{what}: {sizes['verb']:,} verb and {sizes['noun']:,} noun candidates")
            lines.append(f"  {'':30}{'verb top-1':>11}{'verb top-5':>11}{'noun top-1':>11}{'noun top-5':>11}")
            for key, title in titles.items():
                row = report["results"][mode].get(key)
                if row is None:
                    if key != "chance":
                        lines.append(f"  {title:30}{'(not computed: see the notes)':>44}")
                    continue
                lines.append(
                    f"  {title:30}"
                    + "".join(f"{format_cell(row[part][top]):>11}" for part in PARTS for top in ("top1", "top5"))
                )
        counted = report["results"][report["rankings"][0]]["videobert"]
        lines.append(
            f"segments counted: verb {counted['verb']['n']}, noun {counted['noun']['n']} (those with a label "
            f"in the lists); labels outside the lists: verb {report['labels_not_in_lists']['verb']}, "
            f"noun {report['labels_not_in_lists']['noun']}"
        )
    lines += [f"note: {note}" for note in report["notes"]]
    return "\n".join(lines)


def evaluate_videos(cfg, work_dir, which: str = "test", checkpoint=None) -> dict:
    """The `validation` record of a checkpoint (the newest unless given) on its `which` videos (test or
    validation, as recorded in it), made as at train start; for the test split, which training never scores."""
    from pipeline.tokenizer import load_tokenizer
    from videobert.data import DataParams
    from videobert.runtime import autocast
    from videobert.validation import Protocols, read_validation_videos, validate_protocols
    from videobert.vocab import replacement_text_ids

    ev = Evaluator(cfg, work_dir, checkpoint)
    videos = validation_videos(ev, which)
    tokenizer = load_tokenizer(cfg.align.tokenizer)
    protocols = Protocols.build(
        read_validation_videos(list(ev.shards(ev.work_dir)), ev.layout, videos),
        ev.layout,
        replacement_text_ids(tokenizer),
        DataParams.from_config(cfg.train, tokenizer),
        cfg.train.seed,
    )
    record = validate_protocols(
        ev.model,
        protocols,
        int(ev.info.get("step") or 0),
        cfg.eval.batch_size,
        ev.device,
        lambda: autocast(ev.device, cfg.train.precision),
    )
    record["split"] = which
    return record
