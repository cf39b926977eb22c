"""A trained checkpoint as a folder plain Hugging Face `transformers` loads: `BertForPreTraining` (or
`BertForMaskedLM`) `.from_pretrained(OUT)` and `AutoTokenizer.from_pretrained(OUT)`.

- `config.json`: the model's BertConfig with the extended vocabulary and `tie_word_embeddings: false` (the
  input embeddings were frozen while the MLM output layer trained: they differ, and must stay untied);
- `model.safetensors`: the weights under transformers' names: `bert.*` as is, the MLM head as
  `cls.predictions.transform.*` / `cls.predictions.decoder.weight` / `cls.predictions.bias`, the
  alignment head as `cls.seq_relationship.*` (BERT's next-sentence convention: 0 = the text and video
  belong together);
- the tokenizer: the training WordPiece vocabulary plus the visual words `[V0]`, `[V1]`, ... and `[>]` as
  special tokens at the ids the align shards use (text_vocab_size + leaf id; `[>]` after the last leaf);
- `README.md` (the model card) and `videobert.json`: what it was trained on, the codebook's sha256, the
  S3D feature provenance (`pretrained: false` for random S3D weights), the layout of the vocabulary."""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline import storage
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir
from pipeline.tokenizer import load_tokenizer
from videobert import checkpoints
from videobert.model import VideoBert, _quiet_transformers

SEPARATOR_TOKEN = "[>]"
CARD_NAME = "videobert.json"


def visual_token(leaf: int) -> str:
    return f"[V{leaf}]"


def transformers_state(model: VideoBert) -> dict[str, torch.Tensor]:
    """The model's tensors under BertForPreTraining's names."""
    state = {f"bert.{name}": tensor for name, tensor in model.bert.state_dict().items()}
    state.update({f"cls.predictions.transform.{name}": tensor
                  for name, tensor in model.mlm_transform.state_dict().items()})
    state["cls.predictions.decoder.weight"] = model.mlm_decoder.weight
    state["cls.predictions.bias"] = model.mlm_decoder.bias
    state["cls.predictions.decoder.bias"] = model.mlm_decoder.bias
    state["cls.seq_relationship.weight"] = model.alignment_head.weight
    state["cls.seq_relationship.bias"] = model.alignment_head.bias
    return {name: tensor.detach().clone().contiguous().cpu() for name, tensor in state.items()}


def export_tokenizer(spec: str, layout, out: Path):
    """The training tokenizer with the visual words and [>] added at their ids, saved into `out`."""
    from transformers import AddedToken

    tokenizer = load_tokenizer(spec)
    if len(tokenizer) != layout.text_vocab_size:
        raise ValueError(f"tokenizer {spec!r} has {len(tokenizer)} word pieces but the model was trained with "
                         f"{layout.text_vocab_size}")
    tokenizer = type(tokenizer).from_pretrained(tokenizer.name_or_path)     # a copy: load_tokenizer caches
    added = [AddedToken(visual_token(leaf), special=True, normalized=False) for leaf in range(layout.num_visual)]
    added.append(AddedToken(SEPARATOR_TOKEN, special=True, normalized=False))
    tokenizer.add_tokens(added, special_tokens=True)
    ids = tokenizer.convert_tokens_to_ids([visual_token(0), visual_token(layout.num_visual - 1), SEPARATOR_TOKEN])
    if ids != [layout.visual_offset, layout.visual_sep_id - 1, layout.visual_sep_id]:
        raise ValueError(f"the tokenizer placed the visual words at {ids}, not at the shards' ids "
                         f"{[layout.visual_offset, layout.visual_sep_id - 1, layout.visual_sep_id]}")
    tokenizer.save_pretrained(str(out))
    return tokenizer


def feature_provenance(work_dir) -> dict:
    """The S3D weights and feature settings recorded by the features stage's current parts."""
    weights = set()
    for _, path in Lineage(WorkDir(work_dir)).current_parts("features"):
        weights.add(str(storage.read_metadata(path).weights))
    found = sorted(weights)
    return {"s3d_weights": found, "pretrained": bool(found) and not any("random" in w for w in found)}


def export(work_dir, out: Path, checkpoint: str | Path | None = None, *, tokenizer_spec: str | None = None) -> Path:
    """Write the transformers folder `out` from `checkpoint` (default: the newest in DIR/train)."""
    from transformers import BertConfig, BertForPreTraining

    work = WorkDir(work_dir)
    path = Path(checkpoint) if checkpoint else checkpoints.latest_checkpoint(checkpoints.local_files(work))
    if path is None:
        raise FileNotFoundError(f"no checkpoint in {work.checkpoints}: run train first")
    model, info = VideoBert.load(path)
    layout = model.layout
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = BertConfig.from_dict(dict(model.config.to_dict(), vocab_size=layout.vocab_size,
                                       tie_word_embeddings=False, architectures=["BertForPreTraining"],
                                       pad_token_id=layout.pad_id))
    with _quiet_transformers():
        exported = BertForPreTraining(config)
    missing, unexpected = exported.load_state_dict(transformers_state(model), strict=False)
    if missing or unexpected:
        raise ValueError(f"cannot map the checkpoint onto BertForPreTraining: missing {missing}, unexpected {unexpected}")
    with _quiet_transformers():                      # no progress bar of its own
        exported.save_pretrained(str(out))
    spec = tokenizer_spec or info.get("tokenizer")
    if not spec:
        raise ValueError(f"{path} does not record its tokenizer: give align.tokenizer")
    export_tokenizer(spec, layout, out)
    features = feature_provenance(work.root)
    card = {"format": "transformers BertForPreTraining", "work_dir": str(work.root), "checkpoint": str(path),
            "step": info.get("step"),
            "init_checkpoint": info.get("init_checkpoint"), "tokenizer": spec,
            "codebook_sha256": info.get("codebook_sha256"), "train_config": info.get("config"),
            "train_config_hash": info.get("config_hash"), "shards": info.get("shards"),
            "features": features, "layout": dict(layout.to_dict(), visual_offset=layout.visual_offset,
                                                 visual_sep_id=layout.visual_sep_id),
            "visual_tokens": f"{visual_token(0)} .. {visual_token(layout.num_visual - 1)} (leaf id = token id - "
                             f"{layout.visual_offset}), {SEPARATOR_TOKEN} = {layout.visual_sep_id}",
            "alignment_head": "cls.seq_relationship: index 0 = text and video belong together (BERT's NSP "
                              "convention)"}
    storage.atomic_write_json(out / CARD_NAME, card)
    (out / "README.md").write_text(model_card(card), encoding="utf-8")
    return out


def model_card(card: dict) -> str:
    s3d = card["features"]
    pretrained = "false: the S3D features came from random (calibrated) weights, NOT Kinetics-pretrained" \
        if not s3d["pretrained"] else "true"
    return "\n".join([
        "---", "library_name: transformers", "pipeline_tag: fill-mask", "tags: [videobert, video, bert]", "---", "",
        "# VideoBERT", "",
        "A VideoBERT (Sun et al. 2019) trained by this pipeline: BERT over WordPiece text and visual words "
        "(hierarchical k-means leaves of S3D clip features), `[CLS] text [>] visual words [SEP]`.", "",
        "```python", "from transformers import AutoTokenizer, BertForPreTraining",
        "model = BertForPreTraining.from_pretrained(FOLDER)", "tokenizer = AutoTokenizer.from_pretrained(FOLDER)",
        "```", "",
        f"- trained from: `{card['init_checkpoint']}`, checkpoint step {card['step']} ({card['checkpoint']})",
        f"- training shards: {', '.join(card['shards'] or [])}",
        f"- codebook sha256: `{card['codebook_sha256']}` (visual words must come from this codebook)",
        f"- S3D weights: {', '.join(s3d['s3d_weights']) or 'unknown'}; pretrained: {pretrained}",
        f"- vocabulary: {card['visual_tokens']}",
        f"- {card['alignment_head']}",
        "- the MLM output layer is untied from the (frozen) input embeddings (`tie_word_embeddings: false`)",
        f"- machine-readable: `{CARD_NAME}`", ""])
