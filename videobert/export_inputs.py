"""VideoBERT model inputs exactly as the model was trained on them, for a transformers export folder.

`videobert export` copies this file into the folder as `videobert_inputs.py`; it needs only the Python
standard library (and torch for `return_tensors="pt"`), not the pipeline that trained the model, and reads
the vocabulary layout from `videobert.json` beside it.

The training format is `[CLS] text [>] visual words [SEP]` (a text-only example: `[CLS] text [SEP]`; a
video-only one: `[CLS] visual words [SEP]`). Token types: [CLS], the text and `[>]` are 0; the visual words
and the final [SEP] are 1 (with no visual word, every token is 0). A tokenizer alone gives 0 everywhere,
which shifts the logits: use `encode`.

Visual words are leaf ids of the exported codebook, in [0, num_visual), written `[V<leaf>]` in text. A
token that looks like a visual word but is not one (`[v0]`, `[V05]`, `[V-1]`, a leaf out of range) is
refused: the tokenizer would silently cut it into word pieces."""

from __future__ import annotations

import json
import re
from pathlib import Path

CARD_NAME = "videobert.json"
# anything bracketed that starts with a v: the candidates for a visual word (or a malformed one)
_LOOKS_VISUAL = re.compile(r"\[\s*[vV][^\]\s]*\s*\]")
_VISUAL = re.compile(r"\[V(0|[1-9][0-9]*)\]")


def layout(folder: str | Path | None = None) -> dict:
    """The vocabulary layout the model was trained with (text_vocab_size, num_visual, visual_offset,
    visual_sep_id, cls_id, sep_id, pad_id, mask_id), from the export folder (default: this file's)."""
    folder = Path(folder) if folder is not None else Path(__file__).resolve().parent
    return json.loads((folder / CARD_NAME).read_text(encoding="utf-8"))["layout"]


def check_leaves(leaves, vocab: dict) -> list[int]:
    """The leaf ids as ints, each refused unless an int in [0, num_visual)."""
    checked = []
    for position, leaf in enumerate(leaves):
        if isinstance(leaf, bool) or not hasattr(leaf, "__index__"):
            raise ValueError(f"visual word {position} is {leaf!r}: a leaf id is an integer")
        leaf = int(leaf)
        if not 0 <= leaf < vocab["num_visual"]:
            raise ValueError(
                f"visual word {position} is leaf {leaf}: this model has leaves 0..{vocab['num_visual'] - 1}"
            )
        checked.append(leaf)
    return checked


def check_text(text: str, vocab: dict) -> list[int]:
    """The leaves of the well-formed `[V<leaf>]` tokens in `text`; a malformed or out-of-range one is refused."""
    leaves = []
    for match in _LOOKS_VISUAL.finditer(text):
        token = match.group(0)
        well_formed = _VISUAL.fullmatch(token)
        if not well_formed:
            raise ValueError(
                f"{token!r} is not a visual word: they are written [V<leaf>] (capital V, the leaf id "
                f"without leading zeros, e.g. [V0] .. [V{vocab['num_visual'] - 1}])"
            )
        leaf = int(well_formed.group(1))
        if leaf >= vocab["num_visual"]:
            raise ValueError(
                f"{token!r} is out of range: this model has visual words [V0] .. [V{vocab['num_visual'] - 1}]"
            )
        leaves.append(leaf)
    return leaves


def visual_ids(leaves, vocab: dict | None = None) -> list[int]:
    """The token ids of visual words given as leaf ids (the ids the codebook's descent gives)."""
    vocab = vocab or layout()
    return [vocab["visual_offset"] + leaf for leaf in check_leaves(leaves, vocab)]


def token_type_ids(input_ids, vocab: dict | None = None) -> list[int]:
    """The token types training used for one example's ids: 1 from its first visual word to its end (the
    final [SEP] included), 0 before it, and 0 everywhere without a visual word; padding is 0."""
    vocab = vocab or layout()
    ids = [int(i) for i in input_ids]
    first = next((n for n, i in enumerate(ids) if vocab["visual_offset"] <= i < vocab["visual_sep_id"]), None)
    if first is None:
        return [0] * len(ids)
    end = len(ids)
    while end > first and ids[end - 1] == vocab["pad_id"]:
        end -= 1
    return [0] * first + [1] * (end - first) + [0] * (len(ids) - end)


def encode(tokenizer, text: str = "", leaves=(), *, return_tensors: str | None = "pt", vocab: dict | None = None):
    """`input_ids`, `token_type_ids` and `attention_mask` of `[CLS] text [>] visual words [SEP]` (one example):
    `text` is words (visual words in it are refused: give them as `leaves`), `leaves` the video's visual words
    as leaf ids. As a batch of one torch tensor each with return_tensors="pt", else as lists."""
    vocab = vocab or layout()
    if _LOOKS_VISUAL.search(text) or "[>]" in text:
        check_text(text, vocab)
        raise ValueError("give the visual words as `leaves`, not in `text` (the text is the sentence alone)")
    text_ids = tokenizer(text, add_special_tokens=False)["input_ids"] if text.strip() else []
    video = visual_ids(leaves, vocab)
    ids = [vocab["cls_id"], *text_ids]
    if text_ids and video:
        ids.append(vocab["visual_sep_id"])
    ids += [*video, vocab["sep_id"]]
    encoded = {"input_ids": ids, "token_type_ids": token_type_ids(ids, vocab), "attention_mask": [1] * len(ids)}
    if return_tensors == "pt":
        import torch

        return {name: torch.tensor([values], dtype=torch.long) for name, values in encoded.items()}
    if return_tensors is not None:
        raise ValueError(f"return_tensors must be 'pt' or None (got {return_tensors!r})")
    return encoded
