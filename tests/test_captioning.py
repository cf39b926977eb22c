"""Caption training on a tiny planted set: the loss falls and held-out segments get their captions."""

from __future__ import annotations

import numpy as np
import pytest

from videobert.eval import captioner, captioning

CAPTIONS = ["chop the onion", "pour the sauce over the pasta", "beat the eggs in a bowl"]


def planted(per_class: int, seed: int) -> tuple[np.ndarray, list[str]]:
    """Feature vectors around one centre per caption (16-d), with their captions."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(0).normal(size=(len(CAPTIONS), 16)) * 3
    labels = np.repeat(np.arange(len(CAPTIONS)), per_class)
    return centres[labels] + rng.normal(size=(len(labels), 16)), [CAPTIONS[i] for i in labels]


def test_word_vocab_round_trip():
    vocab = captioner.WordVocab.from_captions(["Chop the onion.", "chop the garlic"], min_count=2)
    assert vocab.words[4:] == ["chop", "the"]
    ids = vocab.encode("chop the onion", max_words=20)
    assert ids[0] == vocab.index[captioner.BOS] and ids[-1] == vocab.index[captioner.EOS]
    assert ids[3] == vocab.index[captioner.UNK]
    assert vocab.decode(ids[1:]) == "chop the"  # <unk> is not written out
    assert len(vocab.encode("chop the onion and the garlic", max_words=2)) == 4


def test_training_lowers_the_loss_and_decodes_held_out_captions():
    x_train, captions = planted(per_class=6, seed=1)
    x_test, expected = planted(per_class=2, seed=2)
    model, vocab, losses = captioner.train_captioner(
        x_train,
        captions,
        hidden=32,
        layers=1,
        heads=4,
        feedforward=64,
        dropout=0.1,
        lr=3e-3,
        batch_size=8,
        steps=150,
        seed=0,
        log_every=25,
    )
    assert [step for step, _ in losses] == [25, 50, 75, 100, 125, 150]
    assert losses[-1][1] < 0.25 * losses[0][1]
    decoded = captioner.caption(model, vocab, x_test)
    assert decoded == expected


def test_the_same_seed_trains_the_same_model():
    x_train, captions = planted(per_class=2, seed=1)
    runs = [
        captioner.train_captioner(
            x_train, captions, hidden=16, layers=1, heads=2, feedforward=32, steps=6, seed=3, log_every=2
        )[2]
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and len(runs[0]) == 3


def test_decoding_stops_at_max_words():
    x_train, captions = planted(per_class=2, seed=1)
    model, vocab, _ = captioner.train_captioner(
        x_train, captions, hidden=16, layers=1, heads=2, feedforward=32, steps=2, max_words=3, seed=0
    )
    assert all(len(text.split()) <= 3 for text in captioner.caption(model, vocab, x_train))


def test_training_needs_captions():
    with pytest.raises(ValueError, match="training segments"):
        captioner.train_captioner(np.zeros((0, 4)), [], steps=1)


def test_standardise_uses_the_training_statistics():
    train, test = captioning.standardise(np.array([[1.0, 5.0], [3.0, 5.0]]), np.array([[2.0, 6.0]]))
    assert np.allclose(train, [[-1, 0], [1, 0]]) and np.allclose(test, [[0, 1]])


def test_cross_validation_picks_the_setting_that_learns():
    x_train, captions = planted(per_class=4, seed=1)
    groups = [f"video{i % 4}" for i in range(len(captions))]  # 4 videos, each with every caption
    params = dict(
        hidden=16,
        layers=1,
        heads=2,
        feedforward=32,
        dropout=0.1,
        lr=3e-3,
        batch_size=8,
        steps=60,
        max_words=20,
        min_word_count=1,
        seed=0,
    )
    result = captioner.cross_validate(
        x_train, captions, groups, params, {"lr": [1e-7, 3e-3]}, folds=2, seed=0, metric="ROUGE-L", use_java=False
    )
    assert [c["params"] for c in result["candidates"]] == [{"lr": 1e-7}, {"lr": 3e-3}]
    assert all(len(c["scores"]) == 2 for c in result["candidates"])
    assert result["chosen"]["lr"] == 3e-3 and result["chosen"]["hidden"] == 16
    assert result["candidates"][1]["mean"] > result["candidates"][0]["mean"]
    with pytest.raises(ValueError, match="training videos"):
        captioner.cross_validate(x_train, captions, groups, params, {"lr": [1e-3]}, folds=5, seed=0)
