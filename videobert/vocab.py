"""The vocabulary of VideoBERT: the text WordPiece ids unchanged, then the k**d visual words, then `[>]`."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class VocabLayout:
    text_vocab_size: int  # WordPiece ids keep their values: 0 .. text_vocab_size-1
    num_visual: int  # visual word v has id text_vocab_size + v
    cls_id: int
    sep_id: int
    mask_id: int
    pad_id: int

    @property
    def visual_offset(self) -> int:
        return self.text_vocab_size

    @property
    def visual_sep_id(self) -> int:
        return self.text_vocab_size + self.num_visual

    @property
    def vocab_size(self) -> int:
        return self.text_vocab_size + self.num_visual + 1

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_tokenizer(cls, tokenizer, num_visual: int) -> VocabLayout:
        return cls(
            text_vocab_size=len(tokenizer),
            num_visual=num_visual,
            cls_id=tokenizer.cls_token_id,
            sep_id=tokenizer.sep_token_id,
            mask_id=tokenizer.mask_token_id,
            pad_id=tokenizer.pad_token_id,
        )


def replacement_text_ids(tokenizer) -> np.ndarray:
    """Ids a masked text token may be replaced with: ordinary word pieces, not [CLS], [unused7] and the like."""
    vocab = tokenizer.get_vocab()
    return np.array(
        sorted(i for token, i in vocab.items() if not (token.startswith("[") and token.endswith("]"))), dtype=np.int64
    )


SENTENCE_ENDS = (".", "?", "!")


def sentence_end_ids(tokenizer) -> tuple[int, ...]:
    """Ids of the pieces that end a sentence (those of SENTENCE_ENDS the tokenizer has)."""
    vocab = tokenizer.get_vocab()
    return tuple(sorted(vocab[mark] for mark in SENTENCE_ENDS if mark in vocab))


def common_word_ids(tokenizer, count: int) -> np.ndarray:
    """Ids of the vocabulary's first `count` whole words of two or more ASCII letters, in its order: a WordPiece
    vocabulary (BERT's and its descendants') lists its words by frequency after its single characters, so these
    are its most common words ("the", "of", "and", ...), without sub-word pieces ("##ing") or symbols."""
    words = [
        i
        for token, i in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
        if len(token) > 1 and token.isascii() and token.isalpha()
    ]
    if count > len(words):
        raise ValueError(f"train.text_noise_words: {count}, but the tokenizer has {len(words)} whole words")
    return np.array(words[:count], dtype=np.int64)
