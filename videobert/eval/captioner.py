"""The captioner of the YouCook II captioning experiment (captioning.py): its word vocabulary (the training
captions' words, coco-caption's tokenisation), the transformer encoder-decoder from a segment's feature
vector to caption words, its training (Adam, linearly decayed, teacher forcing, batches drawn with
replacement, seeded), greedy decoding, and the paper's choice of hyper-parameters by k-fold
cross-validation over folds of whole videos."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from pipeline.progress import Progress
from videobert.eval import caption_metrics

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"


# ---------------------------------------------------------------- vocabulary


@dataclass
class WordVocab:
    words: list[str]  # index -> word; the first four are PAD, BOS, EOS, UNK

    @classmethod
    def from_captions(cls, captions: list[str], min_count: int) -> WordVocab:
        counts: dict[str, int] = {}
        for caption in captions:
            for word in caption_metrics.simple_tokenize(caption).split():
                counts[word] = counts.get(word, 0) + 1
        kept = sorted(word for word, count in counts.items() if count >= min_count)
        return cls([PAD, BOS, EOS, UNK, *kept])

    def __post_init__(self):
        self.index = {word: i for i, word in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, caption: str, max_words: int) -> list[int]:
        """[BOS, words..., EOS] (at most max_words words)."""
        unk = self.index[UNK]
        ids = [self.index.get(word, unk) for word in caption_metrics.simple_tokenize(caption).split()[:max_words]]
        return [self.index[BOS], *ids, self.index[EOS]]

    def decode(self, ids) -> str:
        words = []
        for i in ids:
            if i == self.index[EOS]:
                break
            if i >= 4:
                words.append(self.words[i])
        return " ".join(words)


# ---------------------------------------------------------------- the encoder-decoder


class CaptionModel(nn.Module):
    """A transformer encoder-decoder from a segment's feature vector(s) to caption words."""

    def __init__(
        self,
        feature_dim: int,
        vocab_size: int,
        *,
        hidden: int = 128,
        layers: int = 2,
        heads: int = 8,
        feedforward: int = 512,
        dropout: float = 0.4,
        max_words: int = 20,
    ):
        super().__init__()
        self.max_words = max_words
        self.input = nn.Sequential(nn.Linear(feature_dim, hidden), nn.Dropout(dropout))
        self.embed = nn.Embedding(vocab_size, hidden, padding_idx=0)
        self.positions = nn.Embedding(max_words + 2, hidden)
        self.transformer = nn.Transformer(
            d_model=hidden,
            nhead=heads,
            num_encoder_layers=layers,
            num_decoder_layers=layers,
            dim_feedforward=feedforward,
            dropout=dropout,
            batch_first=True,
        )
        self.output = nn.Linear(hidden, vocab_size)
        self.scale = math.sqrt(hidden)

    def forward(self, features: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
        """Logits (batch, length, vocab) of the next word at each position of `words` (batch, length);
        `features` (batch, sequence, feature_dim)."""
        memory = self.transformer.encoder(self.input(features))
        length = words.shape[1]
        target = self.embed(words) * self.scale + self.positions(torch.arange(length, device=words.device))[None]
        causal = torch.ones((length, length), dtype=torch.bool, device=words.device).triu(1)
        hidden = self.transformer.decoder(
            target, memory, tgt_mask=causal, tgt_is_causal=True, tgt_key_padding_mask=words == 0
        )
        return self.output(hidden)

    @torch.no_grad()
    def greedy(self, features: torch.Tensor, bos: int, eos: int, banned: tuple[int, ...] = ()) -> list[list[int]]:
        """The most probable next word at each step, until EOS or max_words words."""
        words = torch.full((features.shape[0], 1), bos, dtype=torch.long, device=features.device)
        done = torch.zeros(features.shape[0], dtype=torch.bool, device=features.device)
        for _ in range(self.max_words):
            logits = self.forward(features, words)[:, -1]
            logits[:, list(banned)] = float("-inf")
            following = logits.argmax(dim=-1).masked_fill(done, 0)
            words = torch.cat([words, following[:, None]], dim=1)
            done |= following == eos
            if done.all():
                break
        return [row[1:] for row in words.tolist()]  # without EOS after max_words words: cut there


def train_captioner(
    features: np.ndarray,
    captions: list[str],
    *,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 8,
    feedforward: int = 512,
    dropout: float = 0.4,
    lr: float = 1e-3,
    batch_size: int = 128,
    steps: int = 40000,
    max_words: int = 20,
    min_word_count: int = 1,
    seed: int = 0,
    log_every: int = 0,
    progress: Progress | None = None,
):
    """(model, vocab, losses: (step, mean loss since the last record)) trained on (n, dim) features and
    their n captions."""
    if len(features) != len(captions) or not len(captions):
        raise ValueError(f"captioning needs training segments with captions (got {len(captions)})")
    torch.manual_seed(seed)
    generator = np.random.default_rng(seed)
    vocab = WordVocab.from_captions(captions, min_word_count)
    model = CaptionModel(
        features.shape[1],
        len(vocab),
        hidden=hidden,
        layers=layers,
        heads=heads,
        feedforward=feedforward,
        dropout=dropout,
        max_words=max_words,
    )
    encoded = [vocab.encode(caption, max_words) for caption in captions]
    # every caption padded once; a batch takes its rows, as wide as its longest
    lengths = torch.tensor([len(ids) for ids in encoded], dtype=torch.long)
    padded = torch.zeros((len(encoded), int(lengths.max()) if encoded else 0), dtype=torch.long)
    for row, ids in enumerate(encoded):
        padded[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    x = torch.from_numpy(features.astype(np.float32))[:, None, :]
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / steps))
    loss_fn = nn.CrossEntropyLoss(ignore_index=0)
    log_every = log_every or max(1, steps // 20)
    losses, running = [], []
    model.train()
    for step in range(1, steps + 1):
        rows = generator.integers(0, len(captions), size=min(batch_size, max(len(captions), 1)))
        rows = torch.from_numpy(rows)
        words = padded[rows, : int(lengths[rows].max())]
        logits = model(x[rows], words[:, :-1])
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), words[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        running.append(float(loss.detach()))
        if step % log_every == 0 or step == steps:
            losses.append((step, float(np.mean(running))))
            running = []
        if progress is not None:
            progress.update(1)
    model.eval()
    return model, vocab, losses


def caption(model: CaptionModel, vocab: WordVocab, features: np.ndarray, batch_size: int = 256) -> list[str]:
    """The greedy caption of each feature row."""
    out = []
    x = torch.from_numpy(features.astype(np.float32))[:, None, :]
    for start in range(0, len(x), batch_size):
        for ids in model.greedy(
            x[start : start + batch_size],
            vocab.index[BOS],
            vocab.index[EOS],
            banned=(vocab.index[PAD], vocab.index[BOS], vocab.index[UNK]),
        ):
            out.append(vocab.decode(ids))
    return out


# ---------------------------------------------------------------- cross-validation


def cross_validate(
    features: np.ndarray,
    captions: list[str],
    groups: list[str],
    params: dict,
    grid: dict,
    *,
    folds: int,
    seed: int,
    metric: str = "CIDEr",
    use_java: bool | None = False,
) -> dict:
    """The paper's hyper-parameter choice: every combination of `grid` (key -> values, over `params`) is
    trained on folds-1 folds of the training segments and scored (`metric`, coco-caption's) on the one
    left, each fold once; folds hold whole videos (`groups`), drawn by a seeded permutation. Returns
    {"chosen": params, "candidates": [{"params", "scores": per fold, "mean"}], "metric", "folds"}."""
    import itertools

    videos = sorted(set(groups))
    if len(videos) < folds:
        raise ValueError(f"caption.cv_folds {folds} needs at least as many training videos (got {len(videos)})")
    order = np.random.default_rng(seed).permutation(len(videos))
    fold_of = {videos[i]: rank % folds for rank, i in enumerate(order)}
    keys = sorted(grid)
    candidates = []
    for values in itertools.product(*(grid[key] for key in keys)):
        chosen = dict(params, **{key: type(params[key])(value) for key, value in zip(keys, values)})
        scores = []
        for fold in range(folds):
            held = np.array([fold_of[g] == fold for g in groups])
            model, vocab, _ = train_captioner(features[~held], [c for c, h in zip(captions, held) if not h], **chosen)
            decoded = caption(model, vocab, features[held])
            keys_held = [str(i) for i in np.flatnonzero(held)]
            scored = caption_metrics.score(
                {k: [captions[int(k)]] for k in keys_held}, dict(zip(keys_held, decoded)), use_java=use_java
            )
            if scored["scores"].get(metric) is None:
                raise ValueError(f"caption.cv_metric {metric} cannot be computed here: {'; '.join(scored['notes'])}")
            scores.append(scored["scores"][metric])
        candidates.append(
            {"params": {key: chosen[key] for key in keys}, "scores": scores, "mean": float(np.mean(scores))}
        )
    best = max(candidates, key=lambda c: c["mean"])  # the first of equals: grid order
    return {"chosen": dict(params, **best["params"]), "candidates": candidates, "metric": metric, "folds": folds}
