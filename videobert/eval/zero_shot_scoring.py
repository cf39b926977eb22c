"""The candidates and scoring of zero-shot classification (zero_shot.py): the words that compete at the verb
and the noun slot of the template (the whole-word pieces of the WordPiece vocabulary and the list words, or
the list words alone), their log-probabilities from float32 forward passes (a word of p pieces scored with p
[MASK]s at its slot, by the sum of its pieces' log-probabilities; with several templates, the log of the
mean probability over them), and each row's top words per ranking."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.tokenizer import encode
from videobert.data import assemble
from videobert.eval.evaluate import Evaluator
from videobert.eval.verb_noun_labels import PARTS, TOP_K


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

    def __init__(self, ev: Evaluator, template: str, verbs: Candidates, nouns: Candidates, calibrate: bool = False):
        self.ev, self.layout, self.calibrate = ev, ev.layout, calibrate
        self._content_free = {}  # model id -> the template's scores with no visual words (calibrate)
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
        example). With `calibrate`, a segment's scores less those of the template with no visual words: log
        ratios, which the closed ranking normalises over its words."""
        scores = self._scores(videos, model)
        if videos is None or not self.calibrate:
            return scores
        key = id(model)
        if key not in self._content_free:
            self._content_free[key] = self._scores([np.zeros(0, dtype=np.int64)], model)
        return {part: scores[part] - self._content_free[key][part] for part in scores}

    def _scores(self, videos: list[np.ndarray] | None, model=None) -> dict[str, np.ndarray]:
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


class Ensemble:
    """Several templates' scorers as one: a candidate's log-probability at a slot is the log of its mean
    probability over the templates (each normalised over the text vocabulary), so one wording's quirk moves
    the answer by a share, not wholly (prompt ensembling, as CLIP averages its prompts)."""

    def __init__(self, scorers: list[Scorer]):
        self.scorers = scorers

    def score(self, videos, model=None) -> dict[str, np.ndarray]:
        # one scorer: its own scores, bit for bit (the log of a mean of one)
        each = [scorer.score(videos, model=model) for scorer in self.scorers]
        return {
            part: (np.logaddexp.reduce(np.stack([s[part] for s in each]), axis=0) - np.log(len(each))).astype(
                np.float32
            )
            for part in each[0]
        }


def rankings(scores: dict[str, np.ndarray], slots: dict[str, Candidates], modes) -> dict:
    """mode -> part -> per row (top words, their scores)."""
    return {
        mode: {
            part: _top(scores[part], slots[part].words, None if mode == "open" else slots[part].closed)
            for part in PARTS
        }
        for mode in modes
    }
