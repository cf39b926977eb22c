"""Bad inputs: one shard holding every kind of broken or unusual file (tests/bad_input_corpus.py) beside
good videos, through every stage (manifest, decode, features, asr, then quantize and align on one shared
codebook). Every stage gives each file correct output or an error row naming the video and the reason,
every shard completes, and the good videos come out exactly as in a run without the bad files."""

import io
import os
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
from bad_input_corpus import HUGE_SIZE, make_bad_corpus, make_good_videos
from kmeans_factory import pin_codebook
from PIL import Image

from pipeline import storage
from pipeline.config import load_config
from pipeline.engine.lineage import Lineage
from pipeline.engine.manifest import read_manifest, write_manifest
from pipeline.engine.workdir import WorkDir
from pipeline.executors.local import LocalExecutor
from stages.kmeans import run as kmeans

pytestmark = pytest.mark.slow

# one shard; the smallest clips S3D takes (14 frames), random weights; batches of one clip, so that no
# video's features can depend on which clips share its batch (in float32 they do, in the last bits)
SETTINGS = [
    "shards.videos_per_shard=100",
    "features.weights=random",
    "decode.clip_frames=14",
    "decode.min_clip_frames=7",
    "features.batch_size=1",
    "features.decode_workers=0",
    "kmeans.depth=1",
    "kmeans.k=2",
]
SHARD_STAGES = ("decode", "features", "shots", "quality", "asr", "quantize", "align")

# kind -> (decode statuses, clips, decode/features error type or None, asr: "ok" | "no_audio" | error type)
EXPECTED = {
    "zero_bytes": ({"error"}, 0, "EmptyFile", "AudioDecodeError"),
    "random_bytes": ({"error"}, 0, "VideoDecodeError", "AudioDecodeError"),
    "text_file": ({"error"}, 0, "VideoDecodeError", "AudioDecodeError"),
    "truncated_mp4": ({"error"}, 0, "VideoDecodeError", "AudioDecodeError"),
    # decode keeps what is there: with an audio track the header's duration is not the picture's, so only
    # asr (which sees every stream end early) calls the file truncated
    "truncated_mkv": ({"ok"}, 1, None, "AudioDecodeError"),
    "corrupt_middle": ({"partial"}, 1, "DecodeStoppedMidStream", "AudioDecodeError"),
    "audio_only": ({"error"}, 0, "NoVideoStream", "ok"),
    "no_audio": ({"ok"}, 1, None, "no_audio"),
    "too_short": ({"too_short"}, 0, None, "no_audio"),
    "one_pixel": ({"ok"}, 1, None, "no_audio"),
    "odd_size": ({"ok"}, 1, None, "no_audio"),
    "rotated_90": ({"ok"}, 1, None, "no_audio"),
    "rotated_180": ({"ok"}, 1, None, "no_audio"),
    "rotated_270": ({"ok"}, 1, None, "no_audio"),
    "variable_frame_rate": ({"ok"}, 1, None, "no_audio"),
    "late_start": ({"ok"}, 1, None, "ok"),
    "huge_resolution_header": ({"error"}, 0, "VideoTooLarge", "no_audio"),
    "spaces_and_unicode": ({"ok"}, 1, None, "ok"),
}


def _run_pipeline(cfg, videos, work, codebook_from=None):
    write_manifest(cfg, videos, work)
    executor = LocalExecutor(cfg, workers=1)
    for stage in ("decode", "features", "quality", "asr"):
        executor.run_shards(work, stage, [0], quiet=True)
    if codebook_from is None:
        kmeans.run(cfg, work, executor, quiet=True)
    else:  # one codebook for both runs: the tokens are then comparable
        shutil.copytree(codebook_from / "kmeans", work / "kmeans")
        pin_codebook(work)
    for stage in ("quantize", "align"):
        executor.run_shards(work, stage, [0], quiet=True)


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_inputs")
    kinds = make_bad_corpus(root / "with_bad")
    make_good_videos(root / "with_bad")
    make_good_videos(root / "clean")
    assert len(kinds) >= 12
    cfg = load_config(None, SETTINGS)
    _run_pipeline(cfg, root / "clean", root / "clean_run")
    _run_pipeline(cfg, root / "with_bad", root / "bad_run", codebook_from=root / "clean_run")
    manifest = read_manifest(root / "bad_run").to_pylist()
    ids = {row["uri"]: row["video_id"] for row in manifest}
    video_ids = {kind: ids[os.path.normpath(os.path.abspath(path))] for kind, path in kinds.items()}
    good_ids = sorted(set(ids.values()) - set(video_ids.values()))
    return {"bad": root / "bad_run", "clean": root / "clean_run", "kinds": kinds, "ids": video_ids, "good": good_ids}


def _table(work, stage, name=""):
    return pq.read_table(WorkDir(work).part(stage, 0, name))


def _errors(work, stage) -> dict[str, list[dict]]:
    by_video: dict[str, list[dict]] = {}
    for row in pq.read_table(WorkDir(work).errors(stage, 0)).to_pylist():
        by_video.setdefault(row["video_id"], []).append(row)
    return by_video


def test_every_stage_completes_its_shard_with_output_or_an_error_row_per_kind(runs):
    work, ids = runs["bad"], runs["ids"]
    for stage in SHARD_STAGES:
        assert Lineage(work).current(stage, 0), stage
    videos = {row["video_id"]: row for row in _table(work, "decode", "videos").to_pylist()}
    decode_errors, features_errors, asr_errors = (_errors(work, stage) for stage in ("decode", "features", "asr"))
    clips = _table(work, "decode").to_pylist()
    features = _table(work, "features", "").select(["video_id", "clip_index"]).to_pylist()
    judged = _table(work, "quality").select(["video_id", "clip_index"]).to_pylist()
    judged_videos = {row["video_id"] for row in _table(work, "quality_videos").to_pylist()}
    asr = {row["video_id"]: row for row in _table(work, "asr").to_pylist()}
    for kind, (statuses, n_clips, error_type, asr_outcome) in EXPECTED.items():
        video_id = ids[kind]
        assert videos[video_id]["status"] in statuses, kind
        # decode and features report the same problem, once, naming the video; a clip of each stage per clip
        expected_errors = [error_type] if error_type else []
        assert [e["error_type"] for e in decode_errors.get(video_id, [])] == expected_errors, kind
        assert [e["error_type"] for e in features_errors.get(video_id, [])] == expected_errors, kind
        for row in decode_errors.get(video_id, []) + features_errors.get(video_id, []) + asr_errors.get(video_id, []):
            assert row["message"] and "\n" not in row["message"], kind
        video_clips = [(c["video_id"], c["clip_index"]) for c in clips if c["video_id"] == video_id]
        assert [(f["video_id"], f["clip_index"]) for f in features if f["video_id"] == video_id] == video_clips, kind
        # every clip judged once by quality, and every video (with clips or not) has its row there
        assert [(q["video_id"], q["clip_index"]) for q in judged if q["video_id"] == video_id] == video_clips, kind
        assert video_id in judged_videos, kind
        assert len(video_clips) == videos[video_id]["n_clips"] == n_clips, kind
        if asr_outcome in ("ok", "no_audio"):
            assert asr[video_id]["status"] == asr_outcome and video_id not in asr_errors, kind
        else:
            assert video_id not in asr and [e["error_type"] for e in asr_errors[video_id]] == [asr_outcome], kind
    # the clear reasons
    assert "is an empty file" in decode_errors[ids["zero_bytes"]][0]["message"]
    assert "has no video stream" in decode_errors[ids["audio_only"]][0]["message"]
    assert "decoding stopped after" in decode_errors[ids["corrupt_middle"]][0]["message"]
    assert str(runs["kinds"]["text_file"]) in decode_errors[ids["text_file"]][0]["message"]
    assert "file is truncated" in asr_errors[ids["truncated_mkv"]][0]["message"]
    # quantize and align: one token per clip, and every clip the quality stage kept in exactly one segment
    tokens = _table(work, "quantize").select(["video_id", "clip_index"]).to_pylist()
    assert tokens == sorted(features, key=lambda row: (row["video_id"], row["clip_index"]))
    excluded = {(q["video_id"], q["clip_index"]) for q in _table(work, "quality").to_pylist() if q["excluded"]}
    kept = [t for t in tokens if (t["video_id"], t["clip_index"]) not in excluded]
    visual_per_video: dict[str, int] = {}
    for segment in _table(work, "align").to_pylist():
        video_id = segment["video_id"]
        visual_per_video[video_id] = visual_per_video.get(video_id, 0) + len(segment["visual_ids"])
    assert visual_per_video == {
        video_id: sum(1 for t in kept if t["video_id"] == video_id) for video_id in {t["video_id"] for t in kept}
    }
    assert not _errors(work, "quantize") and not _errors(work, "align")


def _halves_red(thumbnail: bytes) -> dict[str, float]:
    """Mean red level of each half of a thumbnail: frame_pattern paints its left half grey, its right red."""
    red = np.asarray(Image.open(io.BytesIO(thumbnail)).convert("RGB"), dtype=np.float64)[:, :, 0]
    h, w = red.shape
    return {
        "left": red[:, : w // 2].mean(),
        "right": red[:, w // 2 :].mean(),
        "top": red[: h // 2].mean(),
        "bottom": red[h // 2 :].mean(),
    }


def test_unusual_but_valid_videos_come_out_right(runs):
    work, ids = runs["bad"], runs["ids"]
    videos = {row["video_id"]: row for row in _table(work, "decode", "videos").to_pylist()}
    clips = {row["video_id"]: row for row in _table(work, "decode").to_pylist()}
    halves = {
        kind: _halves_red(clips[ids[kind]]["thumbnail_jpeg"])
        for kind in ("no_audio", "rotated_90", "rotated_180", "rotated_270")
    }
    assert halves["no_audio"]["right"] - halves["no_audio"]["left"] > 60  # upright: red on the right
    assert halves["rotated_180"]["left"] - halves["rotated_180"]["right"] > 60  # turned over
    for kind in ("rotated_90", "rotated_270"):  # the halves are now rows
        assert abs(halves[kind]["top"] - halves[kind]["bottom"]) > 60, kind
        assert abs(halves[kind]["left"] - halves[kind]["right"]) < 20, kind
    assert np.sign(halves["rotated_90"]["top"] - halves["rotated_90"]["bottom"]) == -np.sign(
        halves["rotated_270"]["top"] - halves["rotated_270"]["bottom"]
    )
    assert {videos[ids[kind]]["rotation"] for kind in ("rotated_90", "rotated_270")} == {90, 270}
    assert videos[ids["rotated_180"]]["rotation"] == 180
    assert (videos[ids["odd_size"]]["width"], videos[ids["odd_size"]]["height"]) == (321, 241)
    assert (videos[ids["one_pixel"]]["width"], videos[ids["one_pixel"]]["height"]) == (1, 1)
    # times are on the container clock: the picture of late_start begins 5 s in
    assert clips[ids["late_start"]]["start_s"] == pytest.approx(5.0)
    assert clips[ids["variable_frame_rate"]]["n_real_frames"] == 14
    # the huge header is refused from the header, before any frame is decoded (memory stays small)
    message = _errors(work, "decode")[ids["huge_resolution_header"]][0]["message"]
    assert f"{HUGE_SIZE}x{HUGE_SIZE} exceeds decode.max_pixels" in message and "frame" not in message
    # a cut-off Matroska file decodes up to the cut; its row shows how much of the declared length that was
    truncated = videos[ids["truncated_mkv"]]
    assert truncated["decoded_s"] < 0.5 * truncated["duration_s"]
    assert videos[ids["spaces_and_unicode"]]["uri"] == os.path.abspath(runs["kinds"]["spaces_and_unicode"])
    asr = {row["video_id"]: row for row in _table(work, "asr").to_pylist()}
    assert "onion" in " ".join(s["text"] for s in asr[ids["spaces_and_unicode"]]["sentences"]).lower()


def test_the_good_videos_come_out_as_in_a_run_without_the_bad_files(runs):
    assert len(runs["good"]) == 2
    for stage, name in [
        ("decode", ""),
        ("decode", "videos"),
        ("features", ""),
        ("asr", ""),
        ("quantize", ""),
        ("align", ""),
    ]:
        tables = []
        for run in ("bad", "clean"):
            table = _table(runs[run], stage, name)
            rows = [row for row in table.to_pylist() if row["video_id"] in runs["good"]]
            for row in rows:
                row.pop("uri", None)  # the two runs read their videos from two folders
            tables.append(rows)
        assert tables[0] and tables[0] == tables[1], (stage, name)
        metadata = [storage.read_metadata(WorkDir(runs[run]).part(stage, 0, name)) for run in ("bad", "clean")]
        assert metadata[0].config_hash == metadata[1].config_hash


def test_one_broken_video_is_one_failed_video_in_errors_summary_and_status(runs):
    from reports import status, summary

    work = runs["bad"]
    failed = {
        runs["ids"][kind]
        for kind, (_, _, read_error, asr) in EXPECTED.items()
        if read_error or asr not in ("ok", "no_audio")
    }
    text = status.errors_text(work)
    assert text.splitlines()[0] == f"{len(failed)} failed video(s) in any stage of {work}"
    # the features pass's one read of an empty file is one failure, recorded by decode and features
    empty = [line for line in text.splitlines()[1:] if runs["ids"]["zero_bytes"] in line]
    assert [line.split(" part ")[0].strip() for line in empty] == ["decode, features", "asr"]
    assert sum("EmptyFile" in line for line in text.splitlines()) == 1
    collected = summary.collect(work)
    assert collected["failed_videos"] == len(failed)
    assert collected["failures_by_type"]["EmptyFile"] == {"videos": 1, "stages": ["decode", "features"]}
    assert collected["errors"]["decode"]["EmptyFile"] == collected["errors"]["features"]["EmptyFile"] == 1
    assert f"  errors: {len(failed)} failed video(s)" in summary.render(collected).splitlines()
    assert f"videos failed in any stage: {len(failed)}" in status.status_text(work).splitlines()
