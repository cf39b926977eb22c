"""Zero-shot verb and noun classification, as in the VideoBERT paper (section 4.2).

Each evaluation segment is fed as `[CLS] <eval.zero_shot_template> [>] visual tokens [SEP]` ("now let me
show you how to [MASK] the [MASK]"); the verb is read at the first [MASK], the noun at the second.

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

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import torch

from pipeline import storage, visual_words
from pipeline.config import Config
from pipeline.engine.workdir import WorkDir
from pipeline.progress import Progress
from pipeline.tokenizer import encode
from schemas.metadata import Provenance
from videobert.data import assemble
from videobert.eval.evaluate import Evaluator, batched
from videobert.model import build_model

PARTS = ("verb", "noun")
TOP_K = 5
ROWS = (
    ("videobert", "VideoBERT (video + text)"),
    ("text_only_prior", "VideoBERT text-only prior"),
    ("initial_bert_prior", "initial BERT prior"),
)
LABEL_SEPARATORS = ("|", ";")


# ---------------------------------------------------------------- word lists and labels


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


# ---------------------------------------------------------------- candidates and scoring


@dataclass
class Candidates:
    """The words that compete at one slot: `words[i]` has WordPiece ids `pieces[i]`; `closed` indexes the
    list words (in list order) within them."""

    words: list[str]
    pieces: list[tuple[int, ...]]
    closed: np.ndarray

    def index(self, word: str) -> int:
        return self.words.index(word)

    def closed_words(self) -> list[str]:
        return [self.words[i] for i in self.closed]


def vocabulary_words(tokenizer) -> list[tuple[str, int]]:
    """(word, id) of every whole-word WordPiece made of letters, by id: no ## continuation, no [special]
    token, no digit or punctuation."""
    return sorted(
        (
            (token, index)
            for token, index in tokenizer.get_vocab().items()
            if token.isalpha() and not token.startswith("##")
        ),
        key=lambda item: item[1],
    )


def make_candidates(tokenizer, words: list[str], open_vocabulary: bool) -> tuple[Candidates, list[dict]]:
    """The candidates of one slot and the list words WordPiece splits ({word, pieces}) for the report."""
    pieces = {}
    split = []
    for word in words:
        ids = tuple(encode(tokenizer, word))
        if not ids:
            raise ValueError(f"word list entry {word!r} has no word pieces")
        pieces[word] = ids
        if len(ids) > 1:
            split.append({"word": word, "pieces": tokenizer.convert_ids_to_tokens(list(ids))})
    all_words, all_pieces, at = [], [], {}
    if open_vocabulary:
        for token, index in vocabulary_words(tokenizer):
            at[token] = len(all_words)
            all_words.append(token)
            all_pieces.append((index,))
    for word in words:
        if word in at:
            continue
        if open_vocabulary and len(pieces[word]) == 1:
            # a single piece the vocabulary scan left out (digits, punctuation): it competes as itself
            token = tokenizer.convert_ids_to_tokens(pieces[word][0])
            if token in at:
                at[word] = at[token]
                continue
        at[word] = len(all_words)
        all_words.append(word)
        all_pieces.append(pieces[word])
    closed = np.array([at[word] for word in words], dtype=np.int64)
    return Candidates(all_words, all_pieces, closed), split


class Scorer:
    """Scores every candidate of both slots for a batch of segments (or for the template alone): one float32
    forward pass per piece count needed at a slot, each masking that many positions there."""

    def __init__(self, ev: Evaluator, template: str, verbs: Candidates, nouns: Candidates):
        self.ev, self.layout = ev, ev.layout
        ids = ev.text_ids(template)
        masks = np.flatnonzero(ids == self.layout.mask_id)
        if len(masks) != 2:
            raise ValueError(f"eval.zero_shot_template must hold two [MASK] (verb, noun): {template!r}")
        self.before, self.between, self.after = ids[: masks[0]], ids[masks[0] + 1 : masks[1]], ids[masks[1] + 1 :]
        self.slots = {"verb": verbs, "noun": nouns}
        self.by_count = {}
        for part, candidates in self.slots.items():
            lengths = np.array([len(p) for p in candidates.pieces])
            self.by_count[part] = {
                int(c): (
                    np.flatnonzero(lengths == c),
                    np.array([candidates.pieces[i] for i in np.flatnonzero(lengths == c)]),
                )
                for c in np.unique(lengths)
            }
        # (verb masks, noun masks) of each pass: the template's own (1, 1), then one per longer word length
        self.passes = sorted(
            {(1, 1)} | {(c, 1) for c in self.by_count["verb"]} | {(1, c) for c in self.by_count["noun"]}
        )
        longest = max(len(self.text(*shape)) for shape in self.passes)
        self.video_budget = ev.max_len - longest - 3
        if self.video_budget < 1:
            raise ValueError(
                "eval.zero_shot_template with the longest list word leaves no room for visual tokens "
                f"in {ev.max_len} positions (train.max_len)"
            )

    def text(self, verb_masks: int, noun_masks: int) -> np.ndarray:
        mask = self.layout.mask_id
        return np.concatenate([self.before, [mask] * verb_masks, self.between, [mask] * noun_masks, self.after]).astype(
            np.int64
        )

    def positions(self, verb_masks: int, noun_masks: int) -> dict[str, list[int]]:
        """Where each slot's masks are in `[CLS] text ...` (1 for [CLS])."""
        verb_start = 1 + len(self.before)
        noun_start = verb_start + verb_masks + len(self.between)
        return {
            "verb": list(range(verb_start, verb_start + verb_masks)),
            "noun": list(range(noun_start, noun_start + noun_masks)),
        }

    def score(self, videos: list[np.ndarray] | None, model=None) -> dict[str, np.ndarray]:
        """part -> (examples, candidates) float32 log-probabilities; `videos` None: the template alone (one
        example)."""
        rows = 1 if videos is None else len(videos)
        scores = {part: np.full((rows, len(c.words)), -np.inf, dtype=np.float32) for part, c in self.slots.items()}
        text_vocab = self.layout.text_vocab_size
        for verb_masks, noun_masks in self.passes:
            text = self.text(verb_masks, noun_masks)
            examples = (
                [assemble(self.layout, text, [], with_separator=False)]
                if videos is None
                else [assemble(self.layout, text, video[: self.video_budget], with_separator=True) for video in videos]
            )
            where = self.positions(verb_masks, noun_masks)
            # which slot this pass scores: the one with more than one mask, or both in the (1, 1) pass
            parts = [
                part
                for part, count in (("verb", verb_masks), ("noun", noun_masks))
                if count in self.by_count[part] and (count > 1 or (verb_masks, noun_masks) == (1, 1))
            ]
            if not parts:
                continue
            predict = [sum((where[part] for part in parts), [])] * rows
            _, logits, _ = self.ev.forward(examples, predict, float32=True, model=model)
            logp = torch.log_softmax(logits[:, :text_vocab].float(), dim=-1)
            logp = logp.view(rows, len(predict[0]), text_vocab).cpu().numpy()
            offset = 0
            for part in parts:
                count = len(where[part])
                indices, pieces = self.by_count[part][count]
                block = logp[:, offset : offset + count]  # (rows, count, text vocab)
                scores[part][:, indices] = block[:, np.arange(count)[None, :], pieces].sum(axis=2)
                offset += count
        return scores


def _top(scores: np.ndarray, words: list[str], subset: np.ndarray | None = None) -> list[tuple[list[str], list[float]]]:
    """Per row, the TOP_K best words (ties: candidate order) and their scores, among `subset` if given: then
    log-probabilities over that set (they sum to 1 over it, so a closed set of 10 words never reads "0%")."""
    if subset is not None:
        scores = scores[:, subset]
        top = scores.max(axis=1, keepdims=True)
        scores = scores - (top + np.log(np.exp(scores - top).sum(axis=1, keepdims=True)))
    order = np.argsort(-scores, axis=1, kind="stable")[:, :TOP_K]
    index = subset if subset is not None else np.arange(scores.shape[1])
    return [([words[index[i]] for i in row], [float(scores[r, i]) for i in row]) for r, row in enumerate(order)]


def rankings(scores: dict[str, np.ndarray], slots: dict[str, Candidates], modes) -> dict:
    """mode -> part -> per row (top words, their scores)."""
    return {
        mode: {
            part: _top(scores[part], slots[part].words, None if mode == "open" else slots[part].closed)
            for part in PARTS
        }
        for mode in modes
    }


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
    scorer = Scorer(ev, e.zero_shot_template, verb_candidates, noun_candidates)

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
        "template": e.zero_shot_template,
        "rankings": ",".join(e.rankings),
        "precision": "float32",
        "segments": e.segments,
        "videos": e.videos,
        "scoring": "sum of the pieces' log-probabilities (text vocabulary), one [MASK] "
        "per piece; closed set: normalised over the closed set",
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


def format_cell(value) -> str:
    return "     -" if value is None else f"{value:6.3f}"


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
    protocols = Protocols.build(
        read_validation_videos(list(ev.shards(ev.work_dir)), ev.layout, videos),
        ev.layout,
        replacement_text_ids(load_tokenizer(cfg.align.tokenizer)),
        DataParams.from_config(cfg.train),
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
