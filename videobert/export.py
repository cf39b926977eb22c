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
- `README.md` (the model card) and `videobert.json`: what it was trained on (the training summary from
  DIR/train/log.jsonl: steps, settings, the last training figures), the held-out figures (the last validation
  record, the zero-shot report of DIR/eval when there is one), the codebook's sha256, the S3D feature
  provenance (`pretrained: false` for random S3D weights; these facts: videobert/export_provenance.py), the
  layout of the vocabulary, limitations, licence;
- `videobert_inputs.py` (videobert/export_inputs.py, standard library only): input ids and the token types
  the model was trained with (visual words are type 1), malformed visual words refused;
- `codebook/` (the codebook the model was trained with) and `s3d.json` (the decode and S3D settings and
  weights of its features): `video_token_ids(OUT, video)` turns a new video into its visual words as
  training saw them (the same clips, S3D and tree descent), with this package installed.
Every file is written 0644: an export is for others to read."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from pipeline import storage, visual_words
from pipeline.engine.workdir import WorkDir
from pipeline.tokenizer import load_tokenizer
from videobert import checkpoints
from videobert.export_provenance import feature_provenance, feature_settings, training_summary
from videobert.model import VideoBert, _quiet_transformers

SEPARATOR_TOKEN = "[>]"
CARD_NAME = "videobert.json"
INPUTS_NAME = "videobert_inputs.py"
S3D_NAME = "s3d.json"
CODEBOOK_FOLDER = "codebook"
LICENCE = (
    "Apache-2.0 for this pipeline's code (LICENSE); the weights derive from the init checkpoint, whose own "
    "licence also applies, and from the training videos and transcripts, whose terms the user must check"
)


def visual_token(leaf: int) -> str:
    return f"[V{leaf}]"


def transformers_state(model: VideoBert) -> dict[str, torch.Tensor]:
    """The model's tensors under BertForPreTraining's names."""
    state = {f"bert.{name}": tensor for name, tensor in model.bert.state_dict().items()}
    state.update(
        {f"cls.predictions.transform.{name}": tensor for name, tensor in model.mlm_transform.state_dict().items()}
    )
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
        raise ValueError(
            f"tokenizer {spec!r} has {len(tokenizer)} word pieces but the model was trained with "
            f"{layout.text_vocab_size}"
        )
    tokenizer = type(tokenizer).from_pretrained(tokenizer.name_or_path)  # a copy: load_tokenizer caches
    added = [AddedToken(visual_token(leaf), special=True, normalized=False) for leaf in range(layout.num_visual)]
    added.append(AddedToken(SEPARATOR_TOKEN, special=True, normalized=False))
    tokenizer.add_tokens(added, special_tokens=True)
    ids = tokenizer.convert_tokens_to_ids([visual_token(0), visual_token(layout.num_visual - 1), SEPARATOR_TOKEN])
    if ids != [layout.visual_offset, layout.visual_sep_id - 1, layout.visual_sep_id]:
        raise ValueError(
            f"the tokenizer placed the visual words at {ids}, not at the shards' ids "
            f"{[layout.visual_offset, layout.visual_sep_id - 1, layout.visual_sep_id]}"
        )
    tokenizer.save_pretrained(str(out))
    return tokenizer


def export_codebook(work: WorkDir, out: Path, codebook_sha256: str | None) -> dict | None:
    """The work dir's codebook copied into OUT/codebook when it is the model's (None when there is none);
    another codebook is refused: its visual words would not be the model's."""
    if not (work.codebook / visual_words.FILE_NAME if work.codebook.is_dir() else work.codebook).exists():
        return None
    codebook = visual_words.load(work.codebook)
    sha = codebook.info.get("sha256")
    if codebook_sha256 and sha != codebook_sha256:
        raise ValueError(
            f"{work.codebook} ({sha}) is not the codebook the checkpoint was trained with "
            f"({codebook_sha256}): export the checkpoint from the work dir it was trained in"
        )
    visual_words.save(codebook, out / CODEBOOK_FOLDER)
    return {
        "sha256": sha,
        "depth": codebook.depth,
        "k": codebook.k,
        "leaves": codebook.num_leaves,
        "folder": CODEBOOK_FOLDER,
    }


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
    config = BertConfig.from_dict(
        dict(
            model.config.to_dict(),
            vocab_size=layout.vocab_size,
            tie_word_embeddings=False,
            architectures=["BertForPreTraining"],
            pad_token_id=layout.pad_id,
        )
    )
    with _quiet_transformers():
        exported = BertForPreTraining(config)
    missing, unexpected = exported.load_state_dict(transformers_state(model), strict=False)
    if missing or unexpected:
        raise ValueError(
            f"cannot map the checkpoint onto BertForPreTraining: missing {missing}, unexpected {unexpected}"
        )
    with _quiet_transformers():  # no progress bar of its own
        exported.save_pretrained(str(out))
    spec = tokenizer_spec or info.get("tokenizer")
    if not spec:
        raise ValueError(f"{path} does not record its tokenizer: give align.tokenizer")
    export_tokenizer(spec, layout, out)
    codebook = export_codebook(work, out, info.get("codebook_sha256"))
    settings = feature_settings(work.root)
    if settings is not None:
        storage.atomic_write_json(out / S3D_NAME, settings)
    shutil.copyfile(Path(__file__).with_name("export_inputs.py"), out / INPUTS_NAME)
    features = feature_provenance(work.root)
    card = {
        "format": "transformers BertForPreTraining",
        "work_dir": str(work.root),
        "checkpoint": str(path),
        "step": info.get("step"),
        "init_checkpoint": info.get("init_checkpoint"),
        "tokenizer": spec,
        "codebook_sha256": info.get("codebook_sha256"),
        "train_config": info.get("config"),
        "train_config_hash": info.get("config_hash"),
        "shards": info.get("shards"),
        "validation_videos": info.get("validation_videos"),
        "features": features,
        "layout": dict(layout.to_dict(), visual_offset=layout.visual_offset, visual_sep_id=layout.visual_sep_id),
        "visual_tokens": f"{visual_token(0)} .. {visual_token(layout.num_visual - 1)} (leaf id = token id - "
        f"{layout.visual_offset}), {SEPARATOR_TOKEN} = {layout.visual_sep_id}",
        "token_types": "[CLS], text and [>] are 0; the visual words and the final [SEP] are 1 (no visual word: "
        f"all 0); {INPUTS_NAME}'s encode() makes them",
        "alignment_head": "cls.seq_relationship: index 0 = text and video belong together (BERT's NSP convention)",
        "codebook": codebook,
        "s3d_settings": S3D_NAME if settings is not None else None,
        "training": training_summary(work, info, path),
        "licence": LICENCE,
    }
    card["limitations"] = limitations(card)
    storage.atomic_write_json(out / CARD_NAME, card)
    storage.atomic_write_bytes(out / "README.md", model_card(card).encode("utf-8"))
    readable(out)
    return out


def readable(folder: Path) -> None:
    """Every file 0644 and every folder 0755 (safetensors and atomic writes leave 0600)."""
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(Path(root) / name, 0o755)
        for name in files:
            os.chmod(Path(root) / name, 0o644)


def limitations(card: dict) -> list[str]:
    notes = []
    if not card["features"]["pretrained"]:
        notes.append(
            "the S3D features came from random (calibrated) weights, NOT the Kinetics-pretrained S3D: "
            "its visual words are not the paper's (action features)"
        )
    training = card["training"]
    settings = training["settings"]
    notes.append(
        f"trained {training['step']} steps of batch {settings.get('batch_size')} from "
        f"{settings.get('init_checkpoint')} (the paper: 500K steps of 128 from BERT-large on 312K videos); "
        f"figures on other data need their own held-out test"
    )
    if training["last_validation"] is None:
        notes.append(
            "no held-out validation was run (train.validation_videos = 0): nothing shows that it "
            "generalises beyond its training videos"
        )
    if card["codebook"] is None:
        notes.append("the codebook is not in this folder: new videos cannot be turned into its visual words")
    if card["s3d_settings"] is None:
        notes.append("the S3D settings are not in this folder (no features parts in the work dir)")
    notes.append(f"inputs longer than train.max_len = {settings.get('max_len')} tokens were never seen in training")
    return notes


def _figures(record: dict | None, skip=("event", "time", "step")) -> str:
    if not record:
        return "none"
    parts = []
    for key, value in record.items():
        if key in skip or value is None or isinstance(value, (dict, list)):
            continue
        parts.append(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}")
    return ", ".join(parts)


def _zero_shot_lines(zero: dict | None) -> list[str]:
    if not zero or not zero.get("results"):
        return ["- zero-shot: not evaluated"]
    lines = [f"- zero-shot on {zero.get('segments')} segments of {zero.get('segment_source')} (top-1 / top-5):"]
    for mode, rows in zero["results"].items():
        for name, parts in rows.items():
            cells = [
                f"{part} {parts[part].get('top1', float('nan')):.3f} / {parts[part].get('top5', float('nan')):.3f}"
                for part in ("verb", "noun")
                if isinstance(parts, dict) and isinstance(parts.get(part), dict)
            ]
            if cells:
                lines.append(f"  - {mode}, {name}: {', '.join(cells)}")
    return lines


def _kept_apart(kept: dict | None) -> str:
    if not kept:
        return "none"
    return (
        f"{len(kept['videos'])} of the {'/'.join(kept['subsets'])} subsets ({', '.join(kept['videos'][:10])}"
        f"{', ...' if len(kept['videos']) > 10 else ''})"
    )


SNIPPET = """from transformers import AutoTokenizer, BertForPreTraining
import sys
sys.path.insert(0, folder)                        # folder: this folder
from videobert_inputs import encode              # the token types the model was trained with

model = BertForPreTraining.from_pretrained(folder).eval()
tokenizer = AutoTokenizer.from_pretrained(folder)
# leaves: the video's visual words (leaf ids of ./codebook), e.g. from video_token_ids below
inputs = encode(tokenizer, "cut the onion", leaves)   # [CLS] text [>] visual words [SEP], types 0 then 1
out = model(**inputs)
logits, aligned = out.prediction_logits, out.seq_relationship_logits
# aligned[..., 0]: text and video belong together"""


def model_card(card: dict) -> str:
    s3d = card["features"]
    pretrained = (
        "false: the S3D features came from random (calibrated) weights, NOT Kinetics-pretrained"
        if not s3d["pretrained"]
        else "true"
    )
    training = card["training"]
    settings = ", ".join(f"{key} {value}" for key, value in training["settings"].items())
    return "\n".join(
        [
            "---",
            "library_name: transformers",
            "pipeline_tag: fill-mask",
            "license: apache-2.0",
            "tags: [videobert, video, bert]",
            "---",
            "",
            "# VideoBERT",
            "",
            "A VideoBERT (Sun et al. 2019) trained by this pipeline: BERT over WordPiece text and visual words "
            "(hierarchical k-means leaves of S3D clip features), `[CLS] text [>] visual words [SEP]`.",
            "",
            "## Use",
            "",
            "Needs only `transformers` (and torch):",
            "",
            "```python",
            SNIPPET,
            "```",
            "",
            f"Visual words need token type 1: the tokenizer alone gives 0 everywhere, which changes the logits. "
            f"`{INPUTS_NAME}` refuses malformed visual words (`[v0]`, `[V05]`, a leaf out of range).",
            "",
            "A new video's visual words, with the pipeline that made this model installed (the same clips, S3D "
            f"weights and tree descent as training; settings in `{S3D_NAME}`, the codebook in `{CODEBOOK_FOLDER}/`):",
            "",
            "```python",
            "from videobert.export import video_token_ids",
            'leaves = video_token_ids(folder, "new_video.mp4")["leaves"]',
            "```",
            "",
            "## Training",
            "",
            f"- trained from: `{card['init_checkpoint']}`, checkpoint step {card['step']} ({card['checkpoint']})",
            f"- settings: {settings}",
            f"- training shards: {', '.join(card['shards'] or [])}",
            f"- last training record: {_figures(training['last_training'])}",
            "",
            "## Held-out figures",
            "",
            f"- validation videos (never trained on): {', '.join(card.get('validation_videos') or []) or 'none'}",
            f"- YouCook II videos kept out of pre-training: {_kept_apart(training.get('youcook2_kept_apart'))}",
            f"- last validation record: {_figures(training['last_validation'])}",
            *_zero_shot_lines(training["zero_shot"]),
            "",
            "## Inputs",
            "",
            f"- codebook sha256: `{card['codebook_sha256']}` (visual words must come from this codebook)",
            f"- S3D weights: {', '.join(s3d['s3d_weights']) or 'unknown'}; pretrained: {pretrained}",
            f"- vocabulary: {card['visual_tokens']}",
            f"- token types: {card['token_types']}",
            f"- {card['alignment_head']}",
            "- the MLM output layer is untied from the (frozen) input embeddings (`tie_word_embeddings: false`)",
            f"- machine-readable: `{CARD_NAME}`",
            "",
            "## Limitations",
            "",
            *[f"- {note}" for note in card["limitations"]],
            "",
            "## Licence",
            "",
            card["licence"],
            "",
        ]
    )


def video_token_ids(folder, video, *, device: str | None = None) -> dict:
    """The visual words of a new video (a path or URL) as the exported model's training saw them: its clips
    decoded with the export's decode settings, their S3D features (float16, as the features stage stores them)
    with its weights, each descended in its codebook. Returns {"leaves", "start_s", "end_s"} (lists, clip
    order) and "errors" (why a video gave no clips). S3D weights other than the export's are refused."""
    from pipeline.config import load_config
    from stages.decode import run as decode
    from stages.features.s3d.encoder import encoder_for
    from stages.features.s3d.model import weights_identity

    folder = Path(folder)
    if not (folder / S3D_NAME).exists() or not (folder / CODEBOOK_FOLDER).is_dir():
        raise FileNotFoundError(
            f"{folder} has no {S3D_NAME} and {CODEBOOK_FOLDER}/: export it from the work dir it was trained in"
        )
    settings = json.loads((folder / S3D_NAME).read_text(encoding="utf-8"))
    cfg = load_config(None, [f"features.device={device}"] if device else [], base=settings["config"])
    if weights_identity(cfg) != settings["weights"]:
        raise ValueError(
            f"these S3D weights ({weights_identity(cfg)}) are not the export's ({settings['weights']}): "
            f"the visual words would not be the model's"
        )
    codebook = visual_words.load(folder / CODEBOOK_FOLDER)
    card = json.loads((folder / CARD_NAME).read_text(encoding="utf-8"))
    if card.get("codebook_sha256") and codebook.info.get("sha256") != card["codebook_sha256"]:
        raise ValueError(f"{folder / CODEBOOK_FOLDER} is not the codebook the model was trained with")
    encoder = encoder_for(cfg)
    size = cfg.features.batch_size or 8
    one = decode.VideoPass({"video_id": Path(str(video)).stem, "uri": str(video)}, cfg)
    spans, frames, vectors = [], [], []
    for clip in one.clips():
        spans.append((clip.start_s, clip.end_s))
        frames.append(clip.frames)
        if len(frames) == size:
            vectors.append(_encode(encoder, frames))
            frames = []
    if frames:
        vectors.append(_encode(encoder, frames))
    if not vectors:
        return {"leaves": [], "start_s": [], "end_s": [], "errors": one.errors}
    features = np.concatenate(vectors).astype(np.float16)
    leaves = visual_words.descend(codebook, features)
    return {
        "leaves": leaves.tolist(),
        "start_s": [a for a, _ in spans],
        "end_s": [b for _, b in spans],
        "errors": one.errors,
    }


def _encode(encoder, frames: list) -> np.ndarray:
    batch = torch.stack(frames) if isinstance(frames[0], torch.Tensor) else torch.from_numpy(np.stack(frames))
    return encoder(batch).numpy()
