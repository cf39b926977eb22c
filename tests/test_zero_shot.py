"""The zero-shot protocol (videobert/eval/zero_shot.py, zero_shot_scoring.py, verb_noun_labels.py) and
predict-video on a briefly trained VideoBERT: words WordPiece splits scored jointly with one [MASK] per piece,
any-of labels, the three rows in both rankings, float32 scores whatever the training precision, and no empty
leaf ever predicted."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from test_videobert import config, tiny_checkpoint

from pipeline.config import ConfigError, load_config
from pipeline.tokenizer import encode
from videobert.data import assemble
from videobert.eval import evaluate, verb_noun_labels, zero_shot, zero_shot_scoring
from videobert.model import VideoBert
from videobert.synthetic import NOUNS, VERBS, write_synthetic
from videobert.train import latest_checkpoint, train

SPLIT_NOUNS = ["lettuce", "tofu", "parsley", "parmesan", "onion"]


@pytest.fixture(scope="module")
def quick_dir(tmp_path_factory, tokenizer):
    """6 steps from a bare BERT checkpoint (no MLM head, like the packaged MiniLM) on synthetic shards."""
    work_dir = tmp_path_factory.mktemp("quick")
    write_synthetic(work_dir, tokenizer, videos=8, videos_per_shard=2)
    init = tiny_checkpoint(work_dir / "init", tokenizer, heads=False)
    train(config(work_dir, f"train.init_checkpoint={init}"), work_dir, quiet=True)
    return work_dir


def lists(tmp_path, verbs, nouns):
    (tmp_path / "verbs.txt").write_text("\n".join(verbs) + "\n")
    (tmp_path / "nouns.txt").write_text("\n".join(nouns) + "\n")
    return [f"eval.verbs={tmp_path / 'verbs.txt'}", f"eval.nouns={tmp_path / 'nouns.txt'}"]


def scorer_of(work_dir, tmp_path, *overrides, verbs=("cut", "whisk"), nouns=tuple(SPLIT_NOUNS), open_vocabulary=True):
    cfg = config(work_dir, *lists(tmp_path, verbs, nouns), *overrides)
    ev = evaluate.Evaluator(cfg, work_dir, None)
    verb_candidates, _ = zero_shot_scoring.make_candidates(ev.tokenizer, list(verbs), open_vocabulary)
    noun_candidates, split = zero_shot_scoring.make_candidates(ev.tokenizer, list(nouns), open_vocabulary)
    return ev, zero_shot_scoring.Scorer(ev, cfg.eval.zero_shot_template, verb_candidates, noun_candidates), split


def manual_score(ev, tokenizer, word_at_noun: str, video: np.ndarray) -> float:
    """The joint log-probability of a noun, computed by hand: the template with one [MASK] per piece."""
    pieces = encode(tokenizer, word_at_noun)
    text = ev.text_ids("now let me show you how to [MASK] the " + " ".join(["[MASK]"] * len(pieces)))
    ids, types = assemble(ev.layout, text, video, with_separator=True)
    start = 1 + len(text) - len(pieces)
    with torch.no_grad():
        _, logits, _ = ev.model(
            torch.from_numpy(ids)[None],
            torch.from_numpy(types)[None],
            torch.ones(1, len(ids), dtype=torch.int64),
            torch.from_numpy(np.isin(np.arange(len(ids)), range(start, start + len(pieces))))[None],
        )
    logp = torch.log_softmax(logits[:, : ev.layout.text_vocab_size].double(), dim=-1)
    return float(sum(logp[i, piece] for i, piece in enumerate(pieces)))


def test_split_words_are_scored_by_all_their_pieces(quick_dir, tmp_path, tokenizer):
    assert [
        tokenizer.convert_ids_to_tokens(encode(tokenizer, w)) for w in ("lettuce", "tofu", "parsley", "parmesan")
    ] == [["let", "##tu", "##ce"], ["to", "##fu"], ["par", "##sley"], ["par", "##mes", "##an"]]
    ev, scorer, split = scorer_of(quick_dir, tmp_path)
    assert {item["word"]: len(item["pieces"]) for item in split} == {
        "lettuce": 3,
        "tofu": 2,
        "parsley": 2,
        "parmesan": 3,
    }
    # the template's own pass, then one pass per longer word length at each slot
    assert scorer.passes == [(1, 1), (1, 2), (1, 3), (3, 1)]
    video = np.array([0, 4, 1, 5, 0, 4], dtype=np.int64)
    scores = scorer.score([video, video[::-1].copy()])
    nouns = scorer.slots["noun"]
    for word in ("lettuce", "tofu", "parsley", "parmesan", "onion", "let", "to", "par"):
        assert scores["noun"][0, nouns.index(word)] == pytest.approx(manual_score(ev, tokenizer, word, video), abs=1e-4)
    row = scores["noun"][0]
    # no word is its first piece any more, and the two "par" words no longer tie
    for word, first in (("lettuce", "let"), ("tofu", "to"), ("parsley", "par"), ("parmesan", "par")):
        assert row[nouns.index(word)] != row[nouns.index(first)]
    assert row[nouns.index("parsley")] != row[nouns.index("parmesan")]
    # open vocabulary: every whole-word piece of letters competes, and the split list words besides
    assert len(nouns.words) == len(zero_shot_scoring.vocabulary_words(tokenizer)) + 4
    assert nouns.closed_words() == SPLIT_NOUNS
    assert np.isfinite(scores["noun"]).all() and np.isfinite(scores["verb"]).all()


def test_scores_are_float32_whatever_the_training_precision(quick_dir, tmp_path):
    video = np.array([0, 4, 1, 5, 2, 6], dtype=np.int64)
    ev32, exact, _ = scorer_of(quick_dir, tmp_path, "train.precision=float32")
    ev16, rounded, _ = scorer_of(quick_dir, tmp_path, "train.precision=bfloat16")
    scores = rounded.score([video])
    assert scores["noun"].dtype == np.float32
    for part in ("verb", "noun"):
        assert np.array_equal(scores[part], exact.score([video])[part])
    # what the bf16 autocast would have given: other numbers (the test above would see them)
    example = [assemble(ev16.layout, exact.text(1, 1), video, with_separator=True)]
    where = exact.positions(1, 1)
    _, autocast_logits, _ = ev16.forward(example, [where["verb"] + where["noun"]])
    _, float_logits, _ = ev16.forward(example, [where["verb"] + where["noun"]], float32=True)
    assert not torch.equal(autocast_logits, float_logits)


def test_an_ensemble_averages_the_templates_probabilities(quick_dir, tmp_path):
    """eval.zero_shot_ensemble: a word's probability at a slot is its mean over the templates; one template
    alone scores as before; a sentence without two [MASK] stops at load, naming the key."""
    other = "so we [MASK] the [MASK]."
    ev, scorer, _ = scorer_of(quick_dir, tmp_path)
    cfg = config(quick_dir, *lists(tmp_path, ("cut", "whisk"), SPLIT_NOUNS), f"eval.zero_shot_ensemble=[{other!r}]")
    assert zero_shot.templates(cfg.eval) == [cfg.eval.zero_shot_template, other]
    second = zero_shot_scoring.Scorer(ev, other, scorer.slots["verb"], scorer.slots["noun"])
    video = np.array([0, 4, 1, 5, 2, 6], dtype=np.int64)
    alone, asked_otherwise = scorer.score([video]), second.score([video])
    both = zero_shot_scoring.Ensemble([scorer, second]).score([video])
    for part in ("verb", "noun"):
        mean = (np.exp(alone[part].astype(np.float64)) + np.exp(asked_otherwise[part].astype(np.float64))) / 2
        assert np.allclose(np.exp(both[part].astype(np.float64)), mean, rtol=1e-5)
        assert not np.allclose(alone[part], asked_otherwise[part])  # the two wordings do differ
        assert np.array_equal(zero_shot_scoring.Ensemble([scorer]).score([video])[part], alone[part])
    with pytest.raises(ConfigError, match=r"eval\.zero_shot_ensemble must hold two \[MASK\]"):
        load_config(None, ["eval.zero_shot_ensemble=['so we [MASK] it']"])


def test_calibration_takes_out_what_the_template_alone_leans_to(quick_dir, tmp_path):
    """eval.zero_shot_calibrate: a segment's scores less the template's with no visual words, per template
    before the ensemble's mean; the text-only prior is not calibrated; off, scores are as before."""
    ev, scorer, _ = scorer_of(quick_dir, tmp_path)
    verbs, nouns = scorer.slots["verb"], scorer.slots["noun"]
    template = "so we [MASK] the [MASK]."
    plain = zero_shot_scoring.Scorer(ev, template, verbs, nouns)
    calibrated = zero_shot_scoring.Scorer(ev, template, verbs, nouns, calibrate=True)
    videos = [np.array([0, 4, 1, 5, 2, 6], dtype=np.int64), np.array([3, 7], dtype=np.int64)]
    content_free = plain.score([np.zeros(0, dtype=np.int64)])
    got, before = calibrated.score(videos), plain.score(videos)
    for part in ("verb", "noun"):
        assert np.allclose(got[part], before[part] - content_free[part], atol=1e-6)
        assert not np.allclose(got[part], before[part])  # the template alone does lean
        # no video at all: the prior row, as it was
        assert np.array_equal(calibrated.score(None)[part], plain.score(None)[part])
    # in an ensemble each template is calibrated first, then the probabilities averaged
    other = zero_shot_scoring.Scorer(ev, "i will [MASK] the [MASK]", verbs, nouns, calibrate=True)
    both = zero_shot_scoring.Ensemble([calibrated, other]).score(videos)
    each = [calibrated.score(videos), other.score(videos)]
    for part in ("verb", "noun"):
        mean = np.mean([np.exp(s[part].astype(np.float64)) for s in each], axis=0)
        assert np.allclose(np.exp(both[part].astype(np.float64)), mean, rtol=1e-5)
    cfg = load_config(None, ["eval.zero_shot_calibrate=true"])
    assert cfg.eval.zero_shot_calibrate is True and load_config(None, []).eval.zero_shot_calibrate is False


def test_a_prediction_is_right_when_it_is_any_of_the_labels(tmp_path):
    rankings = [
        ["cut", "mix", "pour", "fry", "boil"],
        ["mix", "cut", "pour", "fry", "boil"],
        ["fry", "pour", "boil", "mix", "stir"],
        ["stir", "mix", "pour", "boil", "fry"],
    ]
    truths = [("chop", "cut"), ("pour", "cut"), ("cut",), ("bake",)]
    words = ["cut", "mix", "pour", "fry", "boil", "stir"]
    # segment 4's only label is not in the list: it does not count
    assert verb_noun_labels.accuracy(rankings, truths, words) == {"top1": 1 / 3, "top5": 2 / 3, "n": 3}
    assert verb_noun_labels.accuracy(rankings, [(t[0],) for t in truths], words)["n"] == 2
    # a random ranking of 6 words: one label of six is right at top-1 with 1/6, at top-5 with 5/6
    assert verb_noun_labels.chance([("cut",)], words) == pytest.approx({"top1": 1 / 6, "top5": 5 / 6, "n": 1})
    assert verb_noun_labels.chance([("cut", "mix")], words) == pytest.approx({"top1": 2 / 6, "top5": 1.0, "n": 1})
    # several labels per segment: a | in a cell, a list column, several rows of one segment
    (tmp_path / "labels.csv").write_text(
        "video_id,segment_index,verb,noun\na,0,Cut|chop,onion\na,0,slice,\nb,3,mix,egg; Bowl\n"
    )
    pq.write_table(
        pa.table(
            {
                "video_id": ["a", "b"],
                "segment_index": [0, 3],
                "verb": [["cut", "chop", "slice"], ["mix"]],
                "noun": [["onion"], ["egg", "bowl"]],
            }
        ),
        tmp_path / "labels.parquet",
    )
    expected = {("a", 0): (("cut", "chop", "slice"), ("onion",)), ("b", 3): (("mix",), ("egg", "bowl"))}
    assert verb_noun_labels.read_labels(str(tmp_path / "labels.csv")) == expected
    assert verb_noun_labels.read_labels(str(tmp_path / "labels.parquet")) == expected
    (tmp_path / "bad.csv").write_text("video_id,verb\na,cut\n")
    with pytest.raises(ValueError, match=r"missing \['segment_index', 'noun'\]"):
        verb_noun_labels.read_labels(str(tmp_path / "bad.csv"))


def test_three_rows_in_both_rankings_and_the_initial_bert_without_a_head(quick_dir, tmp_path):
    synthetic = quick_dir / "synthetic"
    cfg = config(quick_dir, *lists(tmp_path, VERBS, [*NOUNS, "lettuce"]), f"eval.labels={synthetic / 'labels.csv'}")
    report = zero_shot.zero_shot(cfg, quick_dir, quiet=True)
    assert report["rankings"] == ["open", "closed"] and report["precision"] == "float32"
    for mode in ("open", "closed"):
        rows = report["results"][mode]
        assert {"videobert", "text_only_prior", "initial_bert_prior"} <= set(rows)
        for row in ("videobert", "text_only_prior", "initial_bert_prior"):
            assert rows[row]["verb"]["n"] == rows[row]["noun"]["n"] == report["segments"] > 0
    assert report["candidates"]["closed"] == {"verb": 4, "noun": 5}
    assert report["candidates"]["open"]["noun"] > 20_000
    # the bare checkpoint has no MLM head: the row is computed and says what it measures
    assert any("no MLM head weights" in note and "about chance" in note for note in report["notes"])
    assert any("'lettuce' is split into" in note and "3 [MASK]" in note for note in report["notes"])
    text = zero_shot.format_zero_shot(report)
    rows_shown = [line.split("  ")[1] for line in text.splitlines() if line.startswith("  ")]
    assert rows_shown.count("initial BERT prior") == rows_shown.count("VideoBERT text-only prior") == 2
    assert "open vocabulary" in text and "closed set" in text
    rows = pq.read_table(report["predictions"]).to_pylist()
    assert len(rows) == report["segments"]
    assert set(rows[0]["verb_top5_closed"]) == set(VERBS) and len(rows[0]["noun_top5_open"]) == 5
    assert rows[0]["noun_scores_open"] == sorted(rows[0]["noun_scores_open"], reverse=True)
    metadata = pq.read_schema(report["predictions"]).metadata
    assert metadata[b"videobert.precision"] == b"float32" and b"videobert.checkpoint" in metadata
    # only the closed ranking, on request
    closed = zero_shot.zero_shot(
        load_config(None, [*cfg_overrides(cfg), "eval.rankings=[closed]"]), quick_dir, quiet=True
    )
    assert list(closed["results"]) == ["closed"] and closed["results"]["closed"] == report["results"]["closed"]


def cfg_overrides(cfg) -> list[str]:
    e, t = cfg.eval, cfg.train
    return [
        f"eval.verbs={e.verbs}",
        f"eval.nouns={e.nouns}",
        f"eval.labels={e.labels}",
        f"train.max_len={t.max_len}",
        "train.num_threads=1",
    ]


def test_predict_video_never_chooses_an_empty_leaf(quick_dir, tmp_path):
    cfg = config(quick_dir)
    model, info = VideoBert.load(latest_checkpoint(quick_dir))
    empty_leaf = len(VERBS) + len(NOUNS) + 3  # synthetic leaves 8..24 have no member clip
    with torch.no_grad():
        model.mlm_decoder.bias[model.layout.visual_offset + empty_leaf] += 100.0
    biased = tmp_path / "step-00000099"
    model.save(biased, info)
    ev = evaluate.Evaluator(cfg, quick_dir, biased)
    assert (ev.leaf_counts() == 0).sum() == 25 - 8
    # the model itself now prefers the empty leaf at every visual slot ...
    example = assemble(ev.layout, ev.text_ids("cut the onion"), np.zeros(3, dtype=np.int64), with_separator=True)
    example[0][-4:-1] = ev.layout.mask_id
    _, logits, _ = ev.forward([example], [[len(example[0]) - 4, len(example[0]) - 3, len(example[0]) - 2]])
    assert (logits[:, ev.layout.visual_offset : ev.layout.visual_sep_id].argmax(dim=1) == empty_leaf).all()
    # ... and predict-video still picks only leaves with members
    rows = pq.read_table(evaluate.predict_video(cfg, quick_dir, ["cut the onion", "fry the egg"], biased)).to_pylist()
    for row in rows:
        assert row["visual_ids"] and all(0 <= leaf < len(VERBS) + len(NOUNS) for leaf in row["visual_ids"])
