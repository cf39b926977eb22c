"""Evaluation of a trained VideoBERT (the newest checkpoint in DIR/train/checkpoints unless one is given).

- `zero_shot`: `[CLS] <eval.zero_shot_template> [>] visual tokens [SEP]`; the verb is read at the first
  [MASK] and the noun at the second, ranked only among the words of the eval.verbs / eval.nouns lists.
  A list word that WordPiece splits into several pieces is scored by its first piece (the report lists
  them). Top-1/top-5 accuracy against eval.labels, next to the text-only prior (`[CLS] template [SEP]`,
  no video) as the baseline. Writes DIR/eval/zero_shot.json and zero_shot_predictions.parquet.
- `extract_features`: the paper's downstream features: `[CLS] <eval.features_template> [>] visual
  tokens [SEP]`; the mean final state of the visual tokens concatenated with the mean final state of the
  masked text tokens, one vector per segment in DIR/eval/features.parquet.
- `predict_video`: `[CLS] sentence [>] [MASK] x n [SEP]`; the masked visual slots are filled one at a
  time, most confident first, each prediction restricted to visual words. DIR/eval/predict_video.parquet."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import torch

from pipeline import storage
from pipeline.config import Config
from pipeline.lineage import Lineage
from pipeline.progress import Progress
from pipeline.tokenizer import encode, load_tokenizer
from pipeline.workdir import WorkDir
from schemas.metadata import Provenance
from videobert import checkpoints
from videobert.data import VocabLayout, assemble, pad_examples, read_segments
from videobert.model import VideoBert
from videobert.train import autocast, resolve_device

_EXTRA_COLUMNS = ("segment_index", "start_s", "end_s", "kind")


class _Evaluator:
    """A trained model in eval mode with its tokenizer, and batched forward passes."""

    def __init__(self, cfg: Config, work_dir: Path, checkpoint: str | Path | None):
        path = Path(checkpoint) if checkpoint else checkpoints.latest_checkpoint(
            checkpoints.local_files(WorkDir(work_dir)))
        if path is None:
            raise FileNotFoundError(f"no checkpoint in {WorkDir(work_dir).checkpoints}: run train first")
        if cfg.train.num_threads:
            torch.set_num_threads(cfg.train.num_threads)
        self.cfg, self.path = cfg, path
        self.device = resolve_device(cfg.train.device)
        self.model, self.info = VideoBert.load(path, self.device)
        self.model.eval()
        self.layout: VocabLayout = self.model.layout
        self.tokenizer = load_tokenizer(cfg.align.tokenizer)
        if len(self.tokenizer) != self.layout.text_vocab_size:
            raise ValueError(f"align.tokenizer has {len(self.tokenizer)} word pieces but {path} was trained "
                             f"with {self.layout.text_vocab_size}")
        self.max_len = min(cfg.train.max_len, self.model.config.max_position_embeddings)

    def text_ids(self, text: str) -> np.ndarray:
        return np.array(encode(self.tokenizer, text), dtype=np.int64)

    @torch.no_grad()
    def forward(self, examples: list[tuple[np.ndarray, np.ndarray]], predict: list[list[int]] | None = None):
        """(hidden states, logits at the `predict` positions (row-major: example, then position), and the
        padded batch's attention mask) of some (ids, types) examples."""
        input_ids, token_types, attention = map(torch.from_numpy, pad_examples(examples, self.layout.pad_id))
        predict_mask = torch.zeros(input_ids.shape, dtype=torch.bool)
        for row, positions in enumerate(predict or []):
            predict_mask[row, positions] = True
        with autocast(self.device, self.cfg.train.precision):
            hidden, logits, _ = self.model(input_ids.to(self.device), token_types.to(self.device),
                                           attention.to(self.device),
                                           predict_mask.to(self.device) if predict is not None else None)
        return hidden.float(), None if logits is None else logits.float(), attention.to(self.device)

    def shards(self, work_dir) -> list[Path]:
        """The current align shards, refused when they were tokenised with another codebook than the
        model's visual words (the model would read every token as another word)."""
        work = WorkDir(work_dir)
        shards = [path for _, path in Lineage(work).current_parts("align")]
        if not shards:
            raise FileNotFoundError(f"no current align shards in {work.data_folder('align')}: run the align stage")
        for path in shards:
            made_with = storage.read_metadata(path).codebook_sha256
            if made_with != self.info.get("codebook_sha256"):
                raise ValueError(f"{path} was made from codebook {str(made_with)[:12]}, but {self.path} was "
                                 f"trained with {str(self.info.get('codebook_sha256'))[:12]}")
        return shards

    def segments(self, work_dir):
        """(segment, extra columns) of every current align shard, in order."""
        for path in self.shards(work_dir):
            yield from read_segments(path, self.layout, _EXTRA_COLUMNS)

    def provenance(self) -> dict[str, str]:
        return {"checkpoint": str(self.path), "step": str(self.info.get("step")),
                "train_config_hash": str(self.info.get("config_hash")),
                "eval_config": self.cfg.section_json("eval"), "config_hash": self.cfg.section_hash("eval")}


def _batched(items, size: int):
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


# ---------------------------------------------------------------- zero-shot

def read_word_list(path: str | None, key: str) -> list[str]:
    if not path:
        raise ValueError(f"{key} is not set: give a text file with one word per line")
    words = [line.strip().lower() for line in Path(path).read_text().splitlines() if line.strip()]
    if not words:
        raise ValueError(f"{key}: {path} holds no words")
    return list(dict.fromkeys(words))


def first_pieces(tokenizer, words: list[str]) -> tuple[np.ndarray, list[str]]:
    """The first WordPiece id of each word, and notes on words split into several pieces."""
    ids, notes = [], []
    for word in words:
        pieces = encode(tokenizer, word)
        if not pieces:
            raise ValueError(f"word list entry {word!r} has no word pieces")
        if len(pieces) > 1:
            notes.append(f"{word!r} is split into {tokenizer.convert_ids_to_tokens(pieces)}: scored by its "
                         f"first piece")
        ids.append(pieces[0])
    seen: dict[int, str] = {}
    for word, piece in zip(words, ids):
        if piece in seen:
            notes.append(f"{word!r} and {seen[piece]!r} share their first piece: they tie, list order decides")
        seen.setdefault(piece, word)
    return np.array(ids), notes


def read_labels(path: str) -> dict[tuple[str, int], tuple[str, str]]:
    """(video_id, segment_index) -> (verb, noun) from a CSV or Parquet file."""
    path = Path(path)
    if path.suffix == ".parquet":
        table = pq.read_table(path)
    else:
        table = pa_csv.read_csv(path, convert_options=pa_csv.ConvertOptions(
            column_types={"video_id": pa.string(), "verb": pa.string(), "noun": pa.string()}))
    missing = [name for name in ("video_id", "segment_index", "verb", "noun") if name not in table.column_names]
    if missing:
        raise ValueError(f"{path}: labels need columns video_id, segment_index, verb, noun (missing {missing})")
    return {(video_id, int(segment_index)): (str(verb).strip().lower(), str(noun).strip().lower())
            for video_id, segment_index, verb, noun in zip(*(table.column(name).to_pylist() for name in
                                                              ("video_id", "segment_index", "verb", "noun")))}


def _top(scores: np.ndarray, words: list[str], k: int = 5) -> list[str]:
    return [words[i] for i in np.argsort(-scores, kind="stable")[:k]]


def _accuracy(rankings: list[list[str]], truths: list[str | None], words: list[str]) -> dict:
    known = [(ranking, truth) for ranking, truth in zip(rankings, truths) if truth in words]
    if not known:
        return {"top1": None, "top5": None, "n": 0}
    return {"top1": sum(ranking[0] == truth for ranking, truth in known) / len(known),
            "top5": sum(truth in ranking[:5] for ranking, truth in known) / len(known), "n": len(known)}


def zero_shot(cfg: Config, work_dir: Path, checkpoint: str | Path | None = None, quiet: bool = False) -> dict:
    """Zero-shot verb and noun classification per segment; returns the report written to zero_shot.json."""
    work_dir = WorkDir(work_dir).root
    e = cfg.eval
    verbs, nouns = read_word_list(e.verbs, "eval.verbs"), read_word_list(e.nouns, "eval.nouns")
    labels = read_labels(e.labels) if e.labels else None
    ev = _Evaluator(cfg, work_dir, checkpoint)
    verb_ids, verb_notes = first_pieces(ev.tokenizer, verbs)
    noun_ids, noun_notes = first_pieces(ev.tokenizer, nouns)
    template = ev.text_ids(e.zero_shot_template)
    verb_at, noun_at = (1 + np.flatnonzero(template == ev.layout.mask_id)).tolist()
    video_budget = ev.max_len - len(template) - 3
    if video_budget < 1:
        raise ValueError("eval.zero_shot_template leaves no room for visual tokens")

    def rank(examples):
        _, logits, _ = ev.forward(examples, [[verb_at, noun_at]] * len(examples))
        logits = logits.view(len(examples), 2, -1).cpu().numpy()
        return ([_top(row[0, verb_ids], verbs) for row in logits], [_top(row[1, noun_ids], nouns) for row in logits])

    prior_verbs, prior_nouns = rank([assemble(ev.layout, template, [], with_separator=False)])
    records, skipped_no_video, found = [], 0, set()

    def wanted():
        nonlocal skipped_no_video
        for segment, extra in ev.segments(work_dir):
            key = (segment.video_id, extra["segment_index"])
            if labels is not None and key not in labels:
                continue
            found.add(key)
            if segment.visual_ids.size == 0:
                skipped_no_video += 1
                continue
            yield segment, extra

    with Progress(total=len(labels) if labels else None, unit="segments", desc="zero-shot", quiet=quiet) as progress:
        for batch in _batched(wanted(), e.batch_size):
            examples = [assemble(ev.layout, template, segment.visual_ids[:video_budget], with_separator=True)
                        for segment, _ in batch]
            verb_rankings, noun_rankings = rank(examples)
            for (segment, extra), verb_ranking, noun_ranking in zip(batch, verb_rankings, noun_rankings):
                truth = labels.get((segment.video_id, extra["segment_index"]), (None, None)) if labels else (None, None)
                records.append({"video_id": segment.video_id, "segment_index": extra["segment_index"],
                                "verb_top5": verb_ranking, "noun_top5": noun_ranking,
                                "verb": truth[0], "noun": truth[1]})
            progress.update(len(batch))

    out_dir = WorkDir(work_dir).eval_folder
    predictions_path = out_dir / "zero_shot_predictions.parquet"
    schema = pa.schema([("video_id", pa.string()), ("segment_index", pa.int32()), ("verb_top5", pa.list_(pa.string())),
                        ("noun_top5", pa.list_(pa.string())), ("verb", pa.string()), ("noun", pa.string())])
    storage.write_parquet(predictions_path, pa.Table.from_pylist(records, schema=schema),
                          Provenance(extra=dict(ev.provenance(), template=e.zero_shot_template)))
    report = {"checkpoint": str(ev.path), "step": ev.info.get("step"), "template": e.zero_shot_template,
              "verbs": len(verbs), "nouns": len(nouns), "segments": len(records),
              "segments_without_video": skipped_no_video, "notes": verb_notes + noun_notes,
              "prior_top5": {"verb": prior_verbs[0], "noun": prior_nouns[0]},
              "predictions": str(predictions_path), "config_hash": cfg.section_hash("eval")}
    if labels is not None:
        verb_truths, noun_truths = [r["verb"] for r in records], [r["noun"] for r in records]
        report["labels"] = e.labels
        report["labels_without_segment"] = len(labels) - len(found)
        report["labels_not_in_lists"] = {"verb": sum(t not in verbs for t in verb_truths),
                                         "noun": sum(t not in nouns for t in noun_truths)}
        report["model"] = {"verb": _accuracy([r["verb_top5"] for r in records], verb_truths, verbs),
                           "noun": _accuracy([r["noun_top5"] for r in records], noun_truths, nouns)}
        report["text_only_prior"] = {"verb": _accuracy(prior_verbs * len(records), verb_truths, verbs),
                                     "noun": _accuracy(prior_nouns * len(records), noun_truths, nouns)}
    storage.atomic_write_json(out_dir / "zero_shot.json", report)
    if not quiet:
        print(format_zero_shot(report), file=sys.stderr)
    return report


def format_zero_shot(report: dict) -> str:
    lines = [f"zero-shot on {report['segments']} segments ({report['verbs']} verbs, {report['nouns']} nouns), "
             f"checkpoint step {report['step']}"]
    if "model" not in report:
        lines.append(f"no labels (eval.labels): predictions written to {report['predictions']}")
    else:
        def cell(value):
            return "     -" if value is None else f"{value:6.3f}"
        lines.append(f"{'':18}{'verb top-1':>11}{'verb top-5':>11}{'noun top-1':>11}{'noun top-5':>11}")
        for title, key in (("VideoBERT", "model"), ("text-only prior", "text_only_prior")):
            row = report[key]
            lines.append(f"{title:18}" + "".join(f"{cell(row[part][top]):>11}" for part in ("verb", "noun")
                                                   for top in ("top1", "top5")))
    lines += [f"note: {note}" for note in report["notes"]]
    return "\n".join(lines)


# ---------------------------------------------------------------- features

def extract_features(cfg: Config, work_dir: Path, checkpoint: str | Path | None = None) -> Path:
    """One 2*hidden vector per segment with visual tokens: [mean of visual-token states, mean of the
    template's masked-token states]; returns DIR/eval/features.parquet."""
    work_dir = WorkDir(work_dir).root
    ev = _Evaluator(cfg, work_dir, checkpoint)
    template = ev.text_ids(cfg.eval.features_template)
    mask_at = torch.from_numpy(1 + np.flatnonzero(template == ev.layout.mask_id)).to(ev.device)
    video_start = 1 + len(template) + 1                     # after [CLS], the template and [>]
    video_budget = ev.max_len - video_start - 1
    if video_budget < 1:
        raise ValueError("eval.features_template leaves no room for visual tokens")
    width = 2 * ev.model.config.hidden_size
    schema = pa.schema([("video_id", pa.string()), ("segment_index", pa.int32()), ("start_s", pa.float64()),
                        ("end_s", pa.float64()), ("kind", pa.string()),
                        ("feature", pa.list_(pa.float32(), width))])

    def tables():
        segments = ((s, x) for s, x in ev.segments(work_dir) if s.visual_ids.size)
        with Progress(total=None, unit="segments", desc="features") as progress:
            for batch in _batched(segments, cfg.eval.batch_size):
                examples = [assemble(ev.layout, template, segment.visual_ids[:video_budget], with_separator=True)
                            for segment, _ in batch]
                hidden, _, attention = ev.forward(examples)
                positions = torch.arange(hidden.shape[1], device=ev.device)[None, :]
                lengths = attention.sum(dim=1, keepdim=True)
                # visual tokens sit between [>] and the final [SEP]
                is_video = (positions >= video_start) & (positions < lengths - 1)
                video_mean = (hidden * is_video[..., None]).sum(dim=1) / is_video.sum(dim=1, keepdim=True)
                text_mean = hidden[:, mask_at].mean(dim=1)
                features = torch.cat([video_mean, text_mean], dim=1).cpu().numpy()
                yield pa.table({"video_id": [s.video_id for s, _ in batch],
                                "segment_index": [x["segment_index"] for _, x in batch],
                                "start_s": [x["start_s"] for _, x in batch], "end_s": [x["end_s"] for _, x in batch],
                                "kind": [x["kind"] for _, x in batch],
                                "feature": pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), width)})
                progress.update(len(batch))

    final = WorkDir(work_dir).eval_folder / "features.parquet"
    storage.write_parquet_stream(final, schema, Provenance(extra=dict(
        ev.provenance(), template=cfg.eval.features_template,
        feature="mean(video token states) ++ mean(masked text states)")), tables())
    return final


# ---------------------------------------------------------------- video prediction

def predict_video(cfg: Config, work_dir: Path, sentences: list[str], checkpoint: str | Path | None = None) -> Path:
    """Visual tokens predicted for each sentence; returns DIR/eval/predict_video.parquet (sentence,
    visual_ids: codebook leaf ids, probs: each token's probability when it was filled)."""
    if not sentences:
        raise ValueError("predict-video needs at least one sentence")
    work_dir = WorkDir(work_dir).root
    ev = _Evaluator(cfg, work_dir, checkpoint)
    slots = cfg.eval.predict_video_tokens
    layout = ev.layout
    text_budget = ev.max_len - slots - 3
    if text_budget < 1:
        raise ValueError(f"eval.predict_video_tokens {slots} leaves no room for text in {ev.max_len} positions")
    records = []
    for batch in _batched(sentences, cfg.eval.batch_size):
        examples = [assemble(layout, ev.text_ids(sentence)[:text_budget], np.zeros(slots, dtype=np.int64),
                             with_separator=True) for sentence in batch]
        starts = [len(ids) - 1 - slots for ids, _ in examples]
        for (ids, _), start in zip(examples, starts):
            ids[start:start + slots] = layout.mask_id
        filled = np.zeros((len(batch), slots), dtype=bool)
        visual = np.zeros((len(batch), slots), dtype=np.int64)
        probs = np.zeros((len(batch), slots), dtype=np.float32)
        for _ in range(slots):
            _, logits, _ = ev.forward(examples, [list(range(start, start + slots)) for start in starts])
            visual_logits = logits[:, layout.visual_offset:layout.visual_sep_id].view(len(batch), slots, -1)
            best_prob, best_word = torch.softmax(visual_logits, dim=-1).max(dim=-1)
            best_prob, best_word = best_prob.cpu().numpy(), best_word.cpu().numpy()
            best_prob[filled] = -1.0                       # a filled slot stays as it is
            for row, slot in enumerate(best_prob.argmax(axis=1)):
                filled[row, slot], visual[row, slot] = True, best_word[row, slot]
                probs[row, slot] = best_prob[row, slot]
                examples[row][0][starts[row] + slot] = layout.visual_offset + best_word[row, slot]
        records += [{"sentence": sentence, "visual_ids": visual[row].tolist(), "probs": probs[row].tolist()}
                    for row, sentence in enumerate(batch)]
    schema = pa.schema([("sentence", pa.string()), ("visual_ids", pa.list_(pa.int32())),
                        ("probs", pa.list_(pa.float32()))])
    final = WorkDir(work_dir).eval_folder / "predict_video.parquet"
    storage.write_parquet(final, pa.Table.from_pylist(records, schema=schema),
                          Provenance(extra=dict(ev.provenance(), method="iterative fill, most confident visual slot first")))
    return final
