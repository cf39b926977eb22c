"""VideoBERT: a Hugging Face BERT whose word-embedding table holds the text WordPieces, then the k**d visual
words, then `[>]`; a masked-LM head over that whole vocabulary and a 2-way alignment head on [CLS].

Initialisation (`build_model`), following the paper:
- every BERT weight from the checkpoint (hub name, local folder, pkg:<module>), or a random BERT of a
  named size (`random:tiny` ... `random:bert-large`);
- with `text_embeddings` (not the paper's), the text rows from another checkpoint's word embeddings,
  through a fixed PCA when the widths differ and scaled to the rows they replace: a small random model then
  starts with a pretrained model's word geometry, so the words it never trains on sit near those it does;
- the visual rows of the word embeddings from the codebook's leaf centroids: used directly when the model
  is 1024 wide (S3D's width), otherwise through a fixed PCA of the centroids; either way scaled by one
  factor so their mean norm is the text rows' (raw S3D activations are ~10x larger, and the embedding sum
  would drown the position embeddings); empty leaves get the mean visual row;
- `[>]`: a seeded random row of the text rows' mean norm (input embeddings are frozen, so it stays as is);
- the MLM output layer is untied from the (frozen) input embeddings: it starts as a copy and trains;
- the alignment head is BERT's pooler ([CLS] -> dense -> tanh) and a linear layer, which starts from the
  checkpoint's next-sentence head when it has one."""

from __future__ import annotations

import contextlib
import functools
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import BertConfig, BertModel
from transformers.models.bert.modeling_bert import BertPredictionHeadTransform

from pipeline import storage
from pipeline.models import PRESETS
from videobert.vocab import VocabLayout

WEIGHTS_NAME = "model.safetensors"
INFO_NAME = "model.json"


class VideoBert(nn.Module):
    def __init__(self, config: BertConfig, layout: VocabLayout):
        super().__init__()
        if config.vocab_size != layout.vocab_size:
            raise ValueError(f"BERT vocab_size {config.vocab_size} != layout's {layout.vocab_size}")
        self.config, self.layout = config, layout
        self.bert = BertModel(config)  # embeddings, encoder, pooler
        self.mlm_transform = BertPredictionHeadTransform(config)
        self.mlm_decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.alignment_head = nn.Linear(config.hidden_size, 2)
        for module in (self.mlm_transform.dense, self.mlm_decoder, self.alignment_head):
            nn.init.normal_(module.weight, std=config.initializer_range)
            nn.init.zeros_(module.bias)

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.bert.embeddings.word_embeddings

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        predict: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(final hidden states (batch, length, hidden), vocabulary logits (n, vocab) at the n positions
        where the bool mask `predict` is set (None without it), alignment logits (batch, 2)).

        Only the asked positions go through the MLM decoder: over ~30k text + k**d visual words it is
        the costliest layer."""
        out = self.bert(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
        hidden = out.last_hidden_state
        logits = None if predict is None else self.mlm_decoder(self.mlm_transform(hidden[predict]))
        return hidden, logits, self.alignment_head(out.pooler_output)

    def save(self, folder: Path, info: dict) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {name: tensor.detach().contiguous().cpu() for name, tensor in self.state_dict().items()}
        save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "videobert"})
        record = dict(info, bert_config=self.config.to_dict(), layout=self.layout.to_dict())
        storage.atomic_write_json(folder / INFO_NAME, record)

    @classmethod
    def load(cls, folder: Path, device: str | torch.device = "cpu") -> tuple[VideoBert, dict]:
        """A saved model and its info record (how it was made)."""
        from safetensors.torch import load_file

        folder = Path(folder)
        info = json.loads((folder / INFO_NAME).read_text())
        model = cls(BertConfig.from_dict(info["bert_config"]), VocabLayout(**info["layout"]))
        model.load_state_dict(load_file(str(folder / WEIGHTS_NAME)))  # onto the CPU model; moved once below
        return model.to(device), info


def principal_projection(rows: np.ndarray, used: np.ndarray, hidden_size: int) -> tuple[np.ndarray, float]:
    """(`rows` as float64, as they are when they are `hidden_size` wide, else projected on the top principal
    components of the `used` rows; the share of the used rows' variance those components keep)."""
    if not used.any():
        raise ValueError("no row to take the embeddings from")
    rows = rows.astype(np.float64)
    if hidden_size == rows.shape[1]:
        return rows, 1.0
    mean = rows[used].mean(axis=0)
    _, singular, components = np.linalg.svd(rows[used] - mean, full_matrices=False)
    kept = float((singular[:hidden_size] ** 2).sum() / (singular**2).sum())
    components = components[:hidden_size]
    # an SVD's signs are arbitrary: fix them so the projection is the same on every machine
    pivots = np.abs(components).argmax(axis=1)
    components *= np.sign(components[np.arange(len(components)), pivots])[:, None]
    projected = (rows - mean) @ components.T
    # fewer used rows than hidden dimensions: the remaining dimensions stay 0
    rows = np.zeros((len(rows), hidden_size))
    rows[:, : projected.shape[1]] = projected
    return rows, kept


def scaled_rows(rows: np.ndarray, used: np.ndarray, target_norm: float) -> np.ndarray:
    """float32 `rows` scaled by one factor so the used rows' mean norm is `target_norm`; the unused rows set to
    the used rows' mean."""
    rows = rows.copy()
    norm = np.linalg.norm(rows[used], axis=1).mean()
    if norm > 0:
        rows *= target_norm / norm
    rows[~used] = rows[used].mean(axis=0)
    return rows.astype(np.float32)


def visual_embedding_rows(
    centroids: np.ndarray, counts: np.ndarray, hidden_size: int, target_norm: float
) -> np.ndarray:
    """(num_leaves, hidden_size) rows for the visual words from the leaf centroids (see module doc)."""
    used = counts > 0
    if not used.any():
        raise ValueError("the codebook has no non-empty leaf")
    return scaled_rows(principal_projection(centroids, used, hidden_size)[0], used, target_norm)


@contextlib.contextmanager
def _quiet_transformers():
    """transformers prints a load report and a progress bar; `build_model` logs its own summary instead."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()


def _load_pretrained(spec: str, key: str = "train.init_checkpoint"):
    from transformers import BertForPreTraining

    from pipeline import models

    path = models.location(spec)
    try:
        with _quiet_transformers():
            return BertForPreTraining.from_pretrained(path, output_loading_info=True)
    except OSError as error:
        raise FileNotFoundError(
            f"{key} {spec!r}: cannot load a BERT checkpoint from {path!r} "
            f"(a local folder, pkg:<module>, or a hub name on a machine that reaches the "
            f"hub): {str(error).splitlines()[0]}"
        ) from None


def build_model(
    init_checkpoint: str,
    layout: VocabLayout,
    leaf_centroids: np.ndarray,
    leaf_counts: np.ndarray,
    *,
    max_len: int,
    seed: int,
    text_embeddings: str = "",
) -> tuple[VideoBert, list[str]]:
    """A freshly initialised VideoBERT and notes on how it was initialised (for the log). `text_embeddings`:
    a checkpoint whose word embeddings become the text rows (train.text_embeddings); "" = the init's own."""
    torch.manual_seed(seed)
    notes: list[str] = []
    if init_checkpoint.startswith("random:"):
        preset = init_checkpoint[len("random:") :]
        config = BertConfig(
            vocab_size=layout.vocab_size,
            max_position_embeddings=max(512, max_len),
            tie_word_embeddings=False,
            **PRESETS[preset],
        )
        model = VideoBert(config, layout)
        text_rows = model.word_embeddings.weight.data[: layout.text_vocab_size].clone()
        text_bias = torch.zeros(layout.text_vocab_size)
        notes.append(f"random {preset} BERT: no pre-trained weights")
    else:
        pretrained, loading = _load_pretrained(init_checkpoint)
        if pretrained.config.vocab_size != layout.text_vocab_size:
            raise ValueError(
                f"train.init_checkpoint {init_checkpoint!r} has {pretrained.config.vocab_size} word "
                f"pieces but the tokenizer (align.tokenizer) has {layout.text_vocab_size}"
            )
        if max_len > pretrained.config.max_position_embeddings:
            raise ValueError(
                f"train.max_len {max_len} exceeds the checkpoint's "
                f"{pretrained.config.max_position_embeddings} positions"
            )
        config = BertConfig.from_dict(
            dict(pretrained.config.to_dict(), vocab_size=layout.vocab_size, tie_word_embeddings=False)
        )
        model = VideoBert(config, layout)
        state = pretrained.bert.state_dict()
        text_rows = state.pop("embeddings.word_embeddings.weight").float()
        missing, unexpected = model.bert.load_state_dict(state, strict=False)
        assert missing == ["embeddings.word_embeddings.weight"] and not unexpected, (missing, unexpected)
        model.mlm_transform.load_state_dict(pretrained.cls.predictions.transform.state_dict())
        model.alignment_head.load_state_dict(pretrained.cls.seq_relationship.state_dict())
        text_bias = pretrained.cls.predictions.bias.detach().float().clone()
        missing_keys = set(loading["missing_keys"])
        notes.append(f"BERT weights from {init_checkpoint}")
        if any(key.startswith("cls.predictions") for key in missing_keys):
            notes.append(
                "the checkpoint has no MLM head weights: the head's transform starts random, "
                "its output layer from the word embeddings"
            )
        if any(key.startswith("cls.seq_relationship") for key in missing_keys):
            notes.append("the checkpoint has no next-sentence head: the alignment head starts random")
        if any(key.startswith("bert.pooler") for key in missing_keys):
            notes.append("the checkpoint has no pooler: the [CLS] pooler starts random")
        del pretrained

    if text_embeddings:
        text_rows, note = _text_rows_from(text_embeddings, text_rows)
        notes.append(note)
    target_norm = float(text_rows.norm(dim=1).mean())
    visual_rows = torch.from_numpy(visual_embedding_rows(leaf_centroids, leaf_counts, config.hidden_size, target_norm))
    generator = torch.Generator().manual_seed(seed)
    separator_row = torch.randn(1, config.hidden_size, generator=generator)
    separator_row *= target_norm / separator_row.norm()
    with torch.no_grad():
        rows = torch.cat([text_rows.to(visual_rows.dtype), visual_rows, separator_row])
        model.word_embeddings.weight.copy_(rows)
        model.mlm_decoder.weight.copy_(rows)
        model.mlm_decoder.bias.copy_(torch.cat([text_bias, torch.zeros(layout.num_visual + 1)]))
    empty = int((leaf_counts == 0).sum())
    notes.append(
        f"{layout.num_visual} visual words from the codebook's leaf centroids "
        f"({'used directly' if config.hidden_size == leaf_centroids.shape[1] else f'PCA to {config.hidden_size} dims'}"
        f", scaled to the text rows' mean norm {target_norm:.3f}; {empty} empty leaves at the mean)"
    )
    return model, notes


@functools.lru_cache(maxsize=2)
def _word_rows(spec: str, width: int) -> tuple[np.ndarray, float, int]:
    """`spec`'s word embeddings projected to `width` (principal_projection) and their own width, loaded and
    decomposed once per process: zero-shot rebuilds the initial model for every template it is asked."""
    pretrained, _ = _load_pretrained(spec, "train.text_embeddings")
    rows = pretrained.bert.embeddings.word_embeddings.weight.detach().double().numpy()
    del pretrained
    return (*principal_projection(rows, np.ones(len(rows), bool), width), rows.shape[1])


def _text_rows_from(spec: str, initial: torch.Tensor) -> tuple[torch.Tensor, str]:
    """The text rows from `spec`'s word embeddings, projected to the initial rows' width and scaled to
    their mean norm (so a random preset's balance of word and position embeddings stays as it was)."""
    width = initial.shape[1]
    rows, kept, original = _word_rows(spec, width)
    if rows.shape[0] != initial.shape[0]:
        raise ValueError(
            f"train.text_embeddings {spec!r} has {rows.shape[0]} word pieces but the tokenizer (align.tokenizer) "
            f"has {initial.shape[0]}"
        )
    target = float(initial.norm(dim=1).mean())
    projected = scaled_rows(rows, np.ones(len(rows), bool), target)
    how = "as they are" if width == original else f"PCA from {original} to {width} dims, {kept:.0%} of their variance"
    return torch.from_numpy(projected), f"text rows from {spec}'s word embeddings ({how}, scaled to norm {target:.3f})"


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(all parameters, trainable parameters)."""
    return (sum(p.numel() for p in model.parameters()), sum(p.numel() for p in model.parameters() if p.requires_grad))
