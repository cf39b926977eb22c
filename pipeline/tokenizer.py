"""The WordPiece vocabulary that the align shards' `text_ids` index into: the contract on text between
align (which writes the ids) and the trainer (which reads them and extends the vocabulary)."""

from __future__ import annotations

from functools import lru_cache

from pipeline import models
from pipeline.storage import text_sha256


@lru_cache(maxsize=4)
def load_tokenizer(spec: str):
    """BERT WordPiece from a hub name or a local folder; `pkg:<module>` names a package that ships one.
    (transformers 5's BertTokenizerFast(vocab_file=...) silently ignores the file: load the folder.)"""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(models.location(spec))
    if tokenizer.unk_token_id is None or tokenizer.mask_token_id is None:
        raise ValueError(f"align.tokenizer {spec!r} is not a BERT WordPiece tokenizer ([UNK]/[MASK] missing)")
    return tokenizer


def encode(tokenizer, text: str) -> list[int]:
    """The word-piece ids of `text` as align writes them: no [CLS]/[SEP] (the trainer adds its own)."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def vocabulary_sha256(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return text_sha256("\n".join(token for token, _ in vocab))
