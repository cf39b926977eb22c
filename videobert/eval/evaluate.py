"""Evaluation of a trained VideoBERT (the newest checkpoint in DIR/train/checkpoints unless one is given).

- zero-shot verb/noun classification: videobert/eval/zero_shot.py; the supervised linear probe on the S3D
  features: videobert/eval/probe.py;
- `extract_features`: the paper's downstream features: `[CLS] <eval.features_template> [>] visual
  tokens [SEP]`; the mean final state of the visual tokens concatenated with the mean final state of the
  masked text tokens, one vector per segment in DIR/eval/features.parquet.
- `predict_video`: `[CLS] sentence [>] [MASK] x n [SEP]`; the masked visual slots are filled one at a
  time, most confident first, each prediction restricted to the visual words whose codebook leaf is not
  empty (an empty leaf has no clip: it has no picture and no meaning). DIR/eval/predict_video.parquet."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from pipeline import storage, threads, visual_words
from pipeline.config import Config
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir
from pipeline.progress import Progress
from pipeline.tokenizer import encode, load_tokenizer
from schemas.metadata import Provenance
from videobert import checkpoints
from videobert.data import VocabLayout, assemble, pad_examples, read_segments
from videobert.data_checks import require_codebook
from videobert.model import VideoBert
from videobert.runtime import autocast, resolve_device

_EXTRA_COLUMNS = ("segment_index", "start_s", "end_s", "kind")


class Evaluator:
    """A trained model in eval mode with its tokenizer, and batched forward passes."""

    def __init__(self, cfg: Config, work_dir: Path, checkpoint: str | Path | None):
        threads.set_torch_threads(cfg.train.num_threads)
        self.cfg, self.work_dir = cfg, WorkDir(work_dir).root
        self.device = resolve_device(cfg.train.device)
        # its files against the sha256 recorded when it was written (an older checkpoint: a note), held
        # until loaded: a running train's rotation may delete it meanwhile
        path, self.model, self.info, self.notes = checkpoints.load_for_evaluation(
            checkpoints.local_files(WorkDir(work_dir)), Path(checkpoint) if checkpoint else None, self.device
        )
        self.path = path
        for note in self.notes:
            print(f"[eval] {note}", file=sys.stderr)
        self.model.eval()
        self.layout: VocabLayout = self.model.layout
        self.tokenizer = load_tokenizer(cfg.align.tokenizer)
        if len(self.tokenizer) != self.layout.text_vocab_size:
            raise ValueError(
                f"align.tokenizer has {len(self.tokenizer)} word pieces but {path} was trained "
                f"with {self.layout.text_vocab_size}"
            )
        self.max_len = min(cfg.train.max_len, self.model.config.max_position_embeddings)

    def text_ids(self, text: str) -> np.ndarray:
        return np.array(encode(self.tokenizer, text), dtype=np.int64)

    @torch.no_grad()
    def forward(
        self,
        examples: list[tuple[np.ndarray, np.ndarray]],
        predict: list[list[int]] | None = None,
        *,
        float32: bool = False,
        model: VideoBert | None = None,
    ):
        """(hidden states, logits at the `predict` positions (row-major: example, then position), and the
        padded batch's attention mask) of some (ids, types) examples. `float32` runs the model without
        autocast whatever train.precision says (scores that are compared must not round to bf16's 8 bits);
        `model`: another model of the same vocabulary (the initial BERT)."""
        input_ids, token_types, attention = map(torch.from_numpy, pad_examples(examples, self.layout.pad_id))
        predict_mask = torch.zeros(input_ids.shape, dtype=torch.bool)
        for row, positions in enumerate(predict or []):
            predict_mask[row, positions] = True
        with contextlib.nullcontext() if float32 else autocast(self.device, self.cfg.train.precision):
            hidden, logits, _ = (model or self.model)(
                input_ids.to(self.device),
                token_types.to(self.device),
                attention.to(self.device),
                predict_mask.to(self.device) if predict is not None else None,
            )
        return hidden.float(), None if logits is None else logits.float(), attention.to(self.device)

    def shards(self, work_dir) -> list[Path]:
        """The current align shards, refused when they were tokenised with another codebook than the
        model's visual words (the model would read every token as another word)."""
        work = WorkDir(work_dir)
        shards = [path for _, path in Lineage(work).current_parts("align")]
        if not shards:
            raise FileNotFoundError(f"no current align shards in {work.data_folder('align')}: run the align stage")
        require_codebook(shards, self.info.get("codebook_sha256"), f"{self.path} was trained with")
        return shards

    def segments(self, work_dir):
        """(segment, extra columns) of every current align shard, in order."""
        for path in self.shards(work_dir):
            yield from read_segments(path, self.layout, _EXTRA_COLUMNS)

    def leaf_counts(self) -> np.ndarray:
        """Training members per leaf of the codebook the model was trained with (DIR/kmeans, checked by its
        sha256): 0 marks an empty leaf, one that descent never reaches."""
        codebook = visual_words.load(WorkDir(self.work_dir).codebook)
        if codebook.info.get("sha256") != self.info.get("codebook_sha256"):
            raise ValueError(
                f"{WorkDir(self.work_dir).codebook} is codebook {str(codebook.info.get('sha256'))[:12]}, "
                f"but {self.path} was trained with {str(self.info.get('codebook_sha256'))[:12]}"
            )
        return np.asarray(codebook.counts[-1])

    def provenance(self) -> dict[str, str]:
        return {
            "checkpoint": str(self.path),
            "step": str(self.info.get("step")),
            "train_config_hash": str(self.info.get("config_hash")),
            "eval_config": self.cfg.section_json("eval"),
            "config_hash": self.cfg.section_hash("eval"),
        }


def batched(items, size: int):
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


# ---------------------------------------------------------------- features


def segment_vectors(ev: Evaluator, template: str, segments, *, float32: bool = False):
    """Batches of (segment, extra) with visual tokens and their VideoBERT features, one 2*hidden row each:
    [mean of the visual-token states, mean of the template's masked-token states] (the paper's features for
    captioning and the linear probe), fed as [CLS] template [>] visual tokens [SEP]."""
    template_ids = ev.text_ids(template)
    mask_at = torch.from_numpy(1 + np.flatnonzero(template_ids == ev.layout.mask_id)).to(ev.device)
    video_start = 1 + len(template_ids) + 1  # after [CLS], the template and [>]
    video_budget = ev.max_len - video_start - 1
    if video_budget < 1:
        raise ValueError("eval.features_template leaves no room for visual tokens")
    for batch in batched(((s, x) for s, x in segments if s.visual_ids.size), ev.cfg.eval.batch_size):
        examples = [
            assemble(ev.layout, template_ids, segment.visual_ids[:video_budget], with_separator=True)
            for segment, _ in batch
        ]
        hidden, _, attention = ev.forward(examples, float32=float32)
        positions = torch.arange(hidden.shape[1], device=ev.device)[None, :]
        lengths = attention.sum(dim=1, keepdim=True)
        # visual tokens sit between [>] and the final [SEP]
        is_video = (positions >= video_start) & (positions < lengths - 1)
        video_mean = (hidden * is_video[..., None]).sum(dim=1) / is_video.sum(dim=1, keepdim=True)
        text_mean = hidden[:, mask_at].mean(dim=1)
        yield batch, torch.cat([video_mean, text_mean], dim=1).cpu().numpy()


def extract_features(cfg: Config, work_dir: Path, checkpoint: str | Path | None = None) -> Path:
    """One 2*hidden vector per segment with visual tokens (segment_vectors); returns DIR/eval/features.parquet."""
    work_dir = WorkDir(work_dir).root
    ev = Evaluator(cfg, work_dir, checkpoint)
    width = 2 * ev.model.config.hidden_size
    schema = pa.schema(
        [
            ("video_id", pa.string()),
            ("segment_index", pa.int32()),
            ("start_s", pa.float64()),
            ("end_s", pa.float64()),
            ("kind", pa.string()),
            ("feature", pa.list_(pa.float32(), width)),
        ]
    )

    def tables():
        with Progress(total=None, unit="segments", desc="features") as progress:
            for batch, features in segment_vectors(ev, cfg.eval.features_template, ev.segments(work_dir)):
                yield pa.table(
                    {
                        "video_id": [s.video_id for s, _ in batch],
                        "segment_index": [x["segment_index"] for _, x in batch],
                        "start_s": [x["start_s"] for _, x in batch],
                        "end_s": [x["end_s"] for _, x in batch],
                        "kind": [x["kind"] for _, x in batch],
                        "feature": pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), width),
                    }
                )
                progress.update(len(batch))

    final = WorkDir(work_dir).eval_folder / "features.parquet"
    storage.write_parquet_stream(
        final,
        schema,
        Provenance(
            extra=dict(
                ev.provenance(),
                template=cfg.eval.features_template,
                feature="mean(video token states) ++ mean(masked text states)",
            )
        ),
        tables(),
    )
    return final


# ---------------------------------------------------------------- video prediction


def predict_video(cfg: Config, work_dir: Path, sentences: list[str], checkpoint: str | Path | None = None) -> Path:
    """Visual tokens predicted for each sentence; returns DIR/eval/predict_video.parquet (sentence,
    visual_ids: codebook leaf ids, probs: each token's probability when it was filled)."""
    if not sentences:
        raise ValueError("predict-video needs at least one sentence")
    work_dir = WorkDir(work_dir).root
    ev = Evaluator(cfg, work_dir, checkpoint)
    slots = cfg.eval.predict_video_tokens
    layout = ev.layout
    text_budget = ev.max_len - slots - 3
    if text_budget < 1:
        raise ValueError(f"eval.predict_video_tokens {slots} leaves no room for text in {ev.max_len} positions")
    empty = torch.from_numpy(ev.leaf_counts() == 0).to(ev.device)
    records = []
    for batch in batched(sentences, cfg.eval.batch_size):
        examples = [
            assemble(layout, ev.text_ids(sentence)[:text_budget], np.zeros(slots, dtype=np.int64), with_separator=True)
            for sentence in batch
        ]
        starts = [len(ids) - 1 - slots for ids, _ in examples]
        for (ids, _), start in zip(examples, starts):
            ids[start : start + slots] = layout.mask_id
        filled = np.zeros((len(batch), slots), dtype=bool)
        visual = np.zeros((len(batch), slots), dtype=np.int64)
        probs = np.zeros((len(batch), slots), dtype=np.float32)
        for _ in range(slots):
            _, logits, _ = ev.forward(examples, [list(range(start, start + slots)) for start in starts])
            visual_logits = logits[:, layout.visual_offset : layout.visual_sep_id].view(len(batch), slots, -1)
            # an empty leaf (no member clip) is never predicted: it has no picture and no meaning
            visual_logits = visual_logits.masked_fill(empty, float("-inf"))
            best_prob, best_word = torch.softmax(visual_logits, dim=-1).max(dim=-1)
            best_prob, best_word = best_prob.cpu().numpy(), best_word.cpu().numpy()
            best_prob[filled] = -1.0  # a filled slot stays as it is
            for row, slot in enumerate(best_prob.argmax(axis=1)):
                filled[row, slot], visual[row, slot] = True, best_word[row, slot]
                probs[row, slot] = best_prob[row, slot]
                examples[row][0][starts[row] + slot] = layout.visual_offset + best_word[row, slot]
        records += [
            {"sentence": sentence, "visual_ids": visual[row].tolist(), "probs": probs[row].tolist()}
            for row, sentence in enumerate(batch)
        ]
    schema = pa.schema(
        [("sentence", pa.string()), ("visual_ids", pa.list_(pa.int32())), ("probs", pa.list_(pa.float32()))]
    )
    final = WorkDir(work_dir).eval_folder / "predict_video.parquet"
    storage.write_parquet(
        final,
        pa.Table.from_pylist(records, schema=schema),
        Provenance(
            codebook_sha256=ev.info.get("codebook_sha256"),
            extra=dict(
                ev.provenance(), method="iterative fill, most confident visual slot first, among the non-empty leaves"
            ),
        ),
    )
    return final
