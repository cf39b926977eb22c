"""Captioning metrics as the coco-caption toolkit computes them (BLEU-1..4, METEOR 1.5, ROUGE-L, CIDEr-D),
the scorers the paper's captioning table (and Zhou et al. 2018's YouCook II evaluation) uses.

The scorers are coco-caption's own code, from PyPI (`pycocoevalcap` 1.2): every caption is first
tokenised by the Stanford PTB tokenizer (lower case, punctuation dropped) and METEOR runs the METEOR 1.5
jar (`-l en -norm`, stems, synonyms and paraphrases); both are Java programs shipped in that package and
need a Java runtime (`java` on the PATH). Without one, METEOR is left out (None, with a note) and the
captions are tokenised by `simple_tokenize` (lower case, words and numbers; punctuation dropped), which
agrees with the PTB tokenizer on plain lower-case captions like YouCook II's but is recorded as the
fallback it is.

BLEU is corpus-level (clipped n-gram counts summed over all segments, brevity penalty from the closest
reference length), ROUGE-L and METEOR are the mean / the jar's aggregate over segments, CIDEr-D has its
document frequencies from the references of the scored set. `score` returns fractions (BLEU 0.0759 is the
paper's "7.59"); `PAPER_PERCENT` says which the paper prints times 100 (all but CIDEr)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess

METRICS = ("BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr")
PAPER_PERCENT = {"BLEU-3": True, "BLEU-4": True, "METEOR": True, "ROUGE-L": True, "CIDEr": False}
# the PTB tokens coco-caption drops after tokenising (pycocoevalcap/tokenizer/ptbtokenizer.py)
_PUNCTUATION = {
    "''",
    "'",
    "``",
    "`",
    "-LRB-",
    "-RRB-",
    "-LCB-",
    "-RCB-",
    ".",
    "?",
    "!",
    ",",
    ":",
    "-",
    "--",
    "...",
    ";",
}
_WORD = re.compile(r"[a-z0-9]+(?:['.][a-z0-9]+)*")


def java_available() -> bool:
    """A Java runtime that starts (the PTB tokenizer and METEOR are Java programs)."""
    java = shutil.which("java")
    if java is None:
        return False
    try:
        return subprocess.run([java, "-version"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def simple_tokenize(text: str) -> str:
    """Lower-case words and numbers separated by single spaces (the fallback without Java)."""
    return " ".join(token for token in _WORD.findall(text.lower()) if token not in _PUNCTUATION)


def _import_scorers():
    try:
        from pycocoevalcap.bleu.bleu import Bleu
        from pycocoevalcap.cider.cider import Cider
        from pycocoevalcap.rouge.rouge import Rouge
        from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer
    except ImportError:
        raise ImportError("the coco-caption scorers are not installed: pip install pycocoevalcap==1.2") from None
    return Bleu, Cider, Rouge, PTBTokenizer


def tokenize(captions: dict[str, list[str]], use_java: bool) -> dict[str, list[str]]:
    """key -> its captions tokenised: coco-caption's PTB tokenizer with Java, else `simple_tokenize`."""
    if not use_java:
        return {key: [simple_tokenize(text) for text in texts] for key, texts in captions.items()}
    *_, PTBTokenizer = _import_scorers()
    # the tokenizer reads one caption per line: a line break inside one would shift every later caption
    with _quiet_stderr():
        return PTBTokenizer().tokenize(
            {key: [{"caption": " ".join(text.split())} for text in texts] for key, texts in captions.items()}
        )


@contextlib.contextmanager
def _quiet_stderr():
    """The Java tokenizer reports a token rate on the process's stderr (its file descriptor, not sys.stderr)."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


_block: dict | None = None  # inside one_meteor(): {"scorer": its METEOR process, once started}


@contextlib.contextmanager
def one_meteor():
    """Every score() inside the block uses one METEOR process: each one started is a JVM loading METEOR's
    paraphrase table, about 5 s, and cross-validation scores many times. Started at the first METEOR
    score, ended with the block; a block inside another uses the outer one's."""
    global _block
    if _block is not None:
        yield
        return
    _block = {}
    try:
        yield
    finally:
        scorer, _block = _block.get("scorer"), None
        if scorer is not None:
            _end(scorer)


def _end(scorer) -> None:
    """End a METEOR process now (what its __del__ does, which waits for the last reference to go)."""
    with scorer.lock:
        scorer.meteor_p.stdin.close()
        scorer.meteor_p.kill()
        scorer.meteor_p.wait()


def _meteor(gts: dict, res: dict):
    from pycocoevalcap.meteor.meteor import Meteor

    if _block is None:
        scorer = Meteor()
        try:
            return scorer.compute_score(gts, res)
        finally:
            _end(scorer)
    if "scorer" not in _block:
        _block["scorer"] = Meteor()
    return _block["scorer"].compute_score(gts, res)


def score(references: dict[str, list[str]], predictions: dict[str, str], *, use_java: bool | None = None) -> dict:
    """{"scores": {metric: fraction or None}, "per_segment": {key: {metric: value}}, "notes": [...],
    "tokenizer": ..., "meteor": ...} of one predicted caption per key against that key's references."""
    if set(references) != set(predictions):
        raise ValueError(
            f"references and predictions cover different segments ({len(set(references) ^ set(predictions))} differ)"
        )
    if not predictions:
        raise ValueError("no captions to score")
    Bleu, Cider, Rouge, _ = _import_scorers()
    asked = use_java
    use_java = java_available() if use_java is None else use_java
    keys = sorted(predictions)
    gts = tokenize({key: list(references[key]) for key in keys}, use_java)
    res = tokenize({key: [predictions[key]] for key in keys}, use_java)
    # an empty prediction: coco-caption's BLEU and CIDEr need a string; an empty one scores 0
    notes = []
    with contextlib.redirect_stdout(io.StringIO()):  # BLEU prints its n-gram counts
        bleu, bleu_each = Bleu(4).compute_score(gts, res)
    rouge, rouge_each = Rouge().compute_score(gts, res)
    cider, cider_each = Cider().compute_score(gts, res)
    scores = {
        "BLEU-1": bleu[0],
        "BLEU-2": bleu[1],
        "BLEU-3": bleu[2],
        "BLEU-4": bleu[3],
        "ROUGE-L": float(rouge),
        "CIDEr": float(cider),
        "METEOR": None,
    }
    per_segment = {
        key: {
            "BLEU-3": float(bleu_each[2][i]),
            "BLEU-4": float(bleu_each[3][i]),
            "ROUGE-L": float(rouge_each[i]),
            "CIDEr": float(cider_each[i]),
        }
        for i, key in enumerate(keys)
    }
    if use_java:
        meteor, meteor_each = _meteor(gts, res)
        scores["METEOR"] = float(meteor)
        for i, key in enumerate(keys):
            per_segment[key]["METEOR"] = float(meteor_each[i])
    else:
        why = "no Java runtime" if asked is None else "scored without Java"
        notes.append(
            f"{why}: METEOR (a Java program) is left out and captions are tokenised by the Python "
            f"fallback instead of the PTB tokenizer"
        )
    return {
        "scores": {name: None if value is None else float(value) for name, value in scores.items()},
        "per_segment": per_segment,
        "notes": notes,
        "tokenizer": "Stanford PTBTokenizer 3.4.1 (coco-caption)" if use_java else "python fallback",
        "meteor": "METEOR 1.5 -l en -norm (coco-caption)" if use_java else None,
        "toolkit": "pycocoevalcap 1.2",
        "segments": len(keys),
    }


def as_paper_units(scores: dict) -> dict:
    """The scores in the paper's units: percent for BLEU, METEOR and ROUGE-L, CIDEr as is."""
    return {
        name: None if scores.get(name) is None else scores[name] * (100 if PAPER_PERCENT[name] else 1)
        for name in METRICS
    }
