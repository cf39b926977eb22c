"""The captioning metrics against reference values computed independently of coco-caption's code.

References: BLEU (Papineni et al. 2002, corpus-level, closest reference length), ROUGE-L (Lin 2004, LCS
F-measure with beta 1.2) and CIDEr-D (Vedantam et al. 2015: raw-count tf-idf with idf = log(N/df),
clipped numerator, Gaussian length penalty sigma 6, times 10, mean over n = 1..4) are written out from the
papers' formulas below, and a few values are worked by hand (the comments show the arithmetic). METEOR
(a Java program) is checked on what its definition fixes: an exact full match scores 1, no shared word 0."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from videobert.eval import caption_metrics

# lower-case, unpunctuated captions: the PTB tokenizer leaves them as they are, so the references can
# split on spaces
REFERENCES = {
    "a": ["the cat is on the mat"],
    "b": ["chop the onion"],
    "c": ["add the pasta to the boiling water"],
    "d": ["pour the sauce over the pasta"],
}
PREDICTIONS = {
    "a": "the cat sat on the mat",
    "b": "chop the onion",
    "c": "add the pasta to water",
    "d": "pour the sauce on the pasta and serve",
}


def ngrams(words, n):
    return Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))


def reference_bleu(refs, preds, n_max):
    """Corpus BLEU-n_max, uniform weights, brevity penalty from the closest reference length."""
    correct, guess = [0] * n_max, [0] * n_max
    hyp_len = ref_len = 0
    for key in preds:
        hyp = preds[key].split()
        ref_lists = [r.split() for r in refs[key]]
        hyp_len += len(hyp)
        ref_len += min((abs(len(r) - len(hyp)), len(r)) for r in ref_lists)[1]
        for n in range(1, n_max + 1):
            counts = ngrams(hyp, n)
            best = Counter()
            for r in ref_lists:
                best |= ngrams(r, n)
            correct[n - 1] += sum(min(c, best[g]) for g, c in counts.items())
            guess[n - 1] += max(len(hyp) - n + 1, 0)
    log_precision = sum(math.log(c / g) for c, g in zip(correct, guess)) / n_max
    penalty = min(0.0, 1 - ref_len / hyp_len)
    return math.exp(log_precision + penalty)


def lcs(a, b):
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            table[i + 1][j + 1] = table[i][j] + 1 if x == y else max(table[i][j + 1], table[i + 1][j])
    return table[-1][-1]


def reference_rouge_l(refs, preds, beta=1.2):
    scores = []
    for key in preds:
        hyp = preds[key].split()
        precision = max(lcs(hyp, r.split()) / len(hyp) for r in refs[key])
        recall = max(lcs(hyp, r.split()) / len(r.split()) for r in refs[key])
        scores.append(
            0.0
            if precision == 0 or recall == 0
            else (1 + beta**2) * precision * recall / (recall + beta**2 * precision)
        )
    return sum(scores) / len(scores)


def reference_cider_d(refs, preds, sigma=6.0):
    n_docs = len(preds)
    df = [Counter() for _ in range(4)]
    for key in preds:
        for n in range(4):
            df[n].update(set().union(*(ngrams(r.split(), n + 1) for r in refs[key])))

    def vector(words, n):
        return {g: c * (math.log(n_docs) - math.log(max(1.0, df[n][g]))) for g, c in ngrams(words, n + 1).items()}

    total = 0.0
    for key in preds:
        hyp = preds[key].split()
        per_n = []
        for n in range(4):
            g_hyp = vector(hyp, n)
            norm_hyp = math.sqrt(sum(v * v for v in g_hyp.values()))
            value = 0.0
            for r in refs[key]:
                g_ref = vector(r.split(), n)
                norm_ref = math.sqrt(sum(v * v for v in g_ref.values()))
                numerator = sum(min(g_hyp[g], g_ref[g]) * g_ref[g] for g in g_hyp if g in g_ref)
                cosine = numerator / (norm_hyp * norm_ref) if norm_hyp and norm_ref else 0.0
                value += math.exp(-((len(hyp) - len(r.split())) ** 2) / (2 * sigma**2)) * cosine
            per_n.append(value / len(refs[key]))
        total += 10.0 * sum(per_n) / 4
    return total / n_docs


@pytest.fixture(
    scope="module", params=[False, pytest.param(True, marks=pytest.mark.slow)], ids=["python-tokenizer", "java"]
)
def scored(request):
    if request.param and not caption_metrics.java_available():
        pytest.skip("no Java runtime: the PTB tokenizer and METEOR cannot run")
    return caption_metrics.score(REFERENCES, PREDICTIONS, use_java=request.param)


def test_bleu_rouge_cider_match_the_formulas(scored):
    scores = scored["scores"]
    assert scores["BLEU-3"] == pytest.approx(reference_bleu(REFERENCES, PREDICTIONS, 3), rel=1e-6)
    assert scores["BLEU-4"] == pytest.approx(reference_bleu(REFERENCES, PREDICTIONS, 4), rel=1e-6)
    assert scores["ROUGE-L"] == pytest.approx(reference_rouge_l(REFERENCES, PREDICTIONS), rel=1e-9)
    assert scores["CIDEr"] == pytest.approx(reference_cider_d(REFERENCES, PREDICTIONS), rel=1e-9)
    assert scored["segments"] == 4


def test_values_worked_by_hand(scored):
    a = scored["per_segment"]["a"]
    # "the cat sat on the mat" vs "the cat is on the mat": 1-grams 5/6, 2-grams 3/5, 3-grams 1/4, equal
    # lengths (no brevity penalty): BLEU-3 = (5/6 * 3/5 * 1/4) ** (1/3) = 0.125 ** (1/3) = 0.5
    assert a["BLEU-3"] == pytest.approx(0.5, rel=1e-6)
    # the LCS "the cat on the mat" has 5 of the 6 words of each: P = R = 5/6, so F = 5/6
    assert a["ROUGE-L"] == pytest.approx(5 / 6, rel=1e-9)
    # an exact match: every precision 1 (BLEU-4 of 3 words has no 4-gram: coco-caption's epsilons make
    # that ~0.03, not 1), ROUGE-L 1
    b = scored["per_segment"]["b"]
    assert b["BLEU-3"] == pytest.approx(1.0, rel=1e-6) and b["ROUGE-L"] == 1.0


def test_cider_of_one_segment_is_zero():
    # with one segment every reference n-gram has df = N = 1: idf = log(1/1) = 0, so CIDEr-D is 0
    # even for an exact match (CIDEr rewards n-grams rare across the set's references)
    result = caption_metrics.score({"x": ["chop the onion"]}, {"x": "chop the onion"}, use_java=False)
    assert result["scores"]["CIDEr"] == 0.0
    assert result["scores"]["BLEU-3"] == pytest.approx(1.0, rel=1e-6)


def test_meteor_with_java(scored, monkeypatch):
    if scored["meteor"] is None:
        assert scored["scores"]["METEOR"] is None and scored["notes"]
        return
    # METEOR 1.5: an exact full match has no fragmentation penalty (1), a caption sharing no word with its
    # reference (not even a stem, synonym or paraphrase) scores 0; partial matches lie between
    assert scored["per_segment"]["b"]["METEOR"] == pytest.approx(1.0)
    assert 0 < scored["per_segment"]["a"]["METEOR"] < 1
    # within one_meteor every score uses one METEOR process (a JVM start each otherwise), scoring the same
    from pycocoevalcap.meteor import meteor

    started, original = [], meteor.Meteor.__init__
    monkeypatch.setattr(meteor.Meteor, "__init__", lambda self: (started.append(self), original(self))[-1])
    with caption_metrics.one_meteor():
        again = caption_metrics.score(REFERENCES, PREDICTIONS, use_java=True)
        disjoint = caption_metrics.score(
            {"x": ["chop the onion"], "y": ["beat the eggs"]}, {"x": "pour milk", "y": "beat the eggs"}, use_java=True
        )
    assert again["per_segment"] == scored["per_segment"] and len(started) == 1
    assert started[0].meteor_p.poll() is not None  # ended with the block
    assert disjoint["per_segment"]["x"]["METEOR"] == 0.0
    assert disjoint["per_segment"]["y"]["METEOR"] == pytest.approx(1.0)
    assert disjoint["tokenizer"].startswith("Stanford PTBTokenizer")


def test_ptb_tokenizer_drops_punctuation_and_case():
    if not caption_metrics.java_available():
        pytest.skip("no Java runtime")
    tokens = caption_metrics.tokenize({"x": ["Now, add the Pasta."]}, use_java=True)
    assert tokens == {"x": ["now add the pasta"]}
    assert caption_metrics.simple_tokenize("Now, add the Pasta.") == "now add the pasta"


def test_mismatched_keys_are_refused():
    with pytest.raises(ValueError, match="different segments"):
        caption_metrics.score({"x": ["a b"]}, {"y": "a b"}, use_java=False)


def test_paper_units():
    units = caption_metrics.as_paper_units(
        {"BLEU-3": 0.0759, "BLEU-4": 0.0433, "METEOR": None, "ROUGE-L": 0.288, "CIDEr": 0.55}
    )
    assert units["BLEU-4"] == pytest.approx(4.33) and units["CIDEr"] == 0.55 and units["METEOR"] is None
