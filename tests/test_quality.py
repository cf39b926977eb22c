"""The quality stage: each flag on generated clips made to carry it and on real footage (the thresholds'
claims in stages/quality/__init__.py), flagged clips kept out of the k-means fit and the training shards
by default and kept with the switch, and what status, validate and the summary say of them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from kmeans_factory import make_work_dir, planted_hierarchy
from media_factory import make_video
from shot_factory import make_shot_video
from work_factory import write_quality_of

from pipeline import cli
from pipeline.config import load_config
from pipeline.engine.workdir import WorkDir
from pipeline.storage import read_table
from reports.validate import validate_work_dir
from stages.align.run import segment_video
from stages.decode.run import read_through
from stages.quality.run import clip_flags, video_flags

DEFAULTS = load_config(None, []).quality


def reasons(flags: list[dict]) -> list[str]:
    return [flag["reason"] for flag in flags]


def test_each_clip_flag_holds_at_its_threshold_and_says_its_value():
    usable = {"luma_mean": 120.0, "luma_contrast": 40.0, "motion_mean": 3.0, "motion_max": 9.0}
    assert clip_flags(usable, DEFAULTS) == []
    black = clip_flags({**usable, "luma_mean": 3.0, "luma_contrast": 1.0}, DEFAULTS)
    assert reasons(black) == ["black", "dark"] and black[0] == {"reason": "black", "value": 3.0, "threshold": 16.0}
    assert reasons(clip_flags({**usable, "luma_mean": 3.0, "luma_contrast": 13.0}, DEFAULTS)) == ["dark"]  # text
    assert reasons(clip_flags({**usable, "motion_mean": 0.0, "motion_max": 0.0}, DEFAULTS)) == ["frozen", "static"]
    assert reasons(clip_flags({**usable, "motion_mean": 0.2, "motion_max": 0.3}, DEFAULTS)) == ["static"]
    assert clip_flags({**usable, "luma_mean": 40.0}, DEFAULTS) == []  # "under": the threshold itself is fine


def test_a_video_carries_a_flag_of_most_of_its_clips_and_too_short():
    frozen = [{"reason": "frozen", "value": 0.0, "threshold": 0.1}]
    flags = video_flags({"decoded_s": 6.0}, [frozen, frozen, frozen, frozen, []], DEFAULTS)
    assert flags == [{"reason": "frozen", "value": 0.8, "threshold": 0.8}]
    assert video_flags({"decoded_s": 6.0}, [frozen, [], [], []], DEFAULTS) == []
    assert reasons(video_flags({"decoded_s": 1.2}, [[]], DEFAULTS)) == ["too_short"]
    assert video_flags({"decoded_s": None}, [], DEFAULTS) == []  # nothing decoded: the decode stage says why


def speck(index: int, width: int, height: int) -> np.ndarray:
    """The still picture with a white 3 x 3 speck crossing it at half a pixel a frame: near-static."""
    picture = still(index, width, height).copy()
    x = int(index * 0.5) % (width - 3)
    picture[10:13, x : x + 3] = 255
    return picture


def noise(level: float, spread: float, seed: int):
    rng = np.random.default_rng(seed)
    return lambda index, width, height: np.clip(rng.normal(level, spread, (height, width, 3)), 0, 255).astype(np.uint8)


def still(index: int, width: int, height: int) -> np.ndarray:
    yy, xx = np.mgrid[0:height, 0:width]
    return np.stack([(xx * 3) % 256, (yy * 5) % 256, ((xx + yy) * 2) % 256], axis=-1).astype(np.uint8)


@pytest.fixture(scope="module")
def flagged_videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("quality")
    make_video(folder / "black.mp4", duration_s=4.0, width=96, height=64, frame_fn=noise(4, 1, 0))
    # x264 refines a still's first frames once (a change of 0.5 levels): its first clip is not frozen
    make_video(folder / "still.mp4", duration_s=8.0, width=96, height=64, frame_fn=still)
    make_video(folder / "speck.mp4", duration_s=4.0, width=96, height=64, frame_fn=speck)
    make_shot_video(folder / "short.mp4", [25], [], width=96, height=64, seed=6)  # 1 s, moving
    make_shot_video(folder / "moving.mp4", [100], [], width=96, height=64, seed=4)
    return folder


def test_generated_clips_carry_the_flags_they_were_made_for(flagged_videos, tmp_path):
    work = tmp_path / "work"
    assert cli.main(["manifest", "--work-dir", str(work), "--input", str(flagged_videos), "--quiet"]) == 0
    assert cli.main(["decode", "--work-dir", str(work), "--quiet"]) == 0
    assert cli.main(["quality", "--work-dir", str(work), "--quiet"]) == 0
    ids = {row["uri"].rsplit("/", 1)[1]: row["video_id"] for row in read_table(WorkDir(work).manifest).to_pylist()}
    clips = read_table(WorkDir(work).data_folder("quality")).to_pylist()
    videos = {
        row["video_id"]: row for row in read_table(WorkDir(work).data_folder("quality", "quality_videos")).to_pylist()
    }
    clip_reasons = {name: {r for c in clips if c["video_id"] == ids[name] for r in reasons(c["flags"])} for name in ids}
    assert clip_reasons["black.mp4"] >= {"black", "dark"}
    assert clip_reasons["still.mp4"] == {"frozen", "static"}
    assert clip_reasons["speck.mp4"] == {"static"}  # something moves, a little
    assert clip_reasons["moving.mp4"] == set()
    assert reasons(videos[ids["short.mp4"]]["flags"]) == ["too_short"]
    assert reasons(videos[ids["still.mp4"]]["flags"]) == ["frozen", "static"]
    excluded = {c["video_id"] for c in clips if c["excluded"]}
    assert excluded == {ids[name] for name in ("black.mp4", "still.mp4", "speck.mp4", "short.mp4")}
    assert validate_work_dir(work) == []
    # the switch: nothing excluded, the flags kept; a changed threshold redoes quality only, not the decoding
    before = WorkDir(work).part("decode", 0).read_bytes()
    assert cli.main(["quality", "--work-dir", str(work), "--set", "quality.exclude=[]", "--quiet"]) == 0
    kept = read_table(WorkDir(work).data_folder("quality")).to_pylist()
    assert not any(c["excluded"] for c in kept) and [c["flags"] for c in kept] == [c["flags"] for c in clips]
    assert WorkDir(work).part("decode", 0).read_bytes() == before


def test_the_fit_never_draws_an_excluded_clip(tmp_path, capsys):
    vectors, _, _ = planted_hierarchy(groups=3, subgroups=3, per_subgroup=6, seed=2)
    tables = make_work_dir(tmp_path, [vectors[:27], vectors[27:]], clips_per_video=9)
    excluded = {(row["video_id"], row["clip_index"]) for row in tables[0].to_pylist()[:9]}
    write_quality_of(tmp_path, 0, tables[0], excluded)
    settings = ["--set", "kmeans.depth=2", "--set", "kmeans.k=3", "--set", "executor.workers=1"]
    assert cli.main(["kmeans", "--work-dir", str(tmp_path), *settings]) == 0
    info = json.loads(WorkDir(tmp_path).codebook_sidecar.read_text())
    assert info["sample_size"] == len(vectors) - 9 and info["quality_excluded"] == 9
    for shard, table in tables.items():
        write_quality_of(tmp_path, shard, table, {(r["video_id"], r["clip_index"]) for r in table.to_pylist()})
    capsys.readouterr()
    assert cli.main(["kmeans", "--work-dir", str(tmp_path), *settings]) == 1
    assert "the quality stage excludes every one of the 54 clips" in capsys.readouterr().err


def test_an_excluded_clip_is_in_no_segment_and_ends_a_video_only_run():
    clips = [(1.5 * i, 1.5 * (i + 1)) for i in range(12)]
    sentence = {"text": "Chop it.", "start_s": 0.0, "end_s": 4.5}
    segments, dropped, over_excluded = segment_video(clips, [sentence], 0.5, 16, excluded=frozenset({1, 6}))
    assert [s.clips for s in segments] == [[0, 2], [3, 4, 5], [7, 8, 9, 10, 11]] and segments[0].texts
    over = {"text": "Over black.", "start_s": 9.0, "end_s": 10.5}
    segments, dropped, over_excluded = segment_video(clips, [over], 0.5, 16, excluded=frozenset({6}))
    assert over_excluded == 1 and dropped == 0 and all(not s.texts for s in segments)


def test_a_short_sentence_takes_a_clip_of_its_own_shot():
    clips = [(0.0, 1.5), (1.5, 3.0), (3.0, 4.5)]
    short = {"text": "Now.", "start_s": 2.6, "end_s": 3.2}  # overlaps clip 1 most (0.4 s), but in clip 2's shot
    assert [s.clips for s in segment_video(clips, [short], 0.5, 16)[0] if s.texts] == [[1]]
    with_shots = segment_video(clips, [short], 0.5, 16, boundaries=[2.5])[0]
    assert [s.clips for s in with_shots if s.texts] == [[2]]
    runs = segment_video(clips, [], 0.5, 16, boundaries=[1.4], runs_end_at_shots=True)[0]
    assert [s.clips for s in runs] == [[0], [1, 2]]


def test_real_footage_gets_the_flags_its_thresholds_were_measured_on(realdata):
    cfg = load_config(None, [])
    found = {}
    for name in (
        "moviepy_no_duration.webm",
        "jfk_subtitled_speech.mp4",
        "intel_car-detection.mp4",
        "big_buck_bunny_0_30.webm",
        "tears_of_steel_10s_640x360_noaudio.mp4",
    ):
        one = read_through({"video_id": name, "uri": str(realdata / name)}, cfg)
        found[name] = [set(reasons(clip_flags(clip, cfg.quality))) for clip in one.clip_rows]
    assert all("black" in flags for flags in found["moviepy_no_duration.webm"])
    assert all(flags == {"dark", "frozen", "static"} for flags in found["jfk_subtitled_speech.mp4"])
    car = found["intel_car-detection.mp4"]
    assert sum(flags == {"static"} for flags in car) >= 8 and not any("frozen" in flags for flags in car)
    bunny = found["big_buck_bunny_0_30.webm"]
    assert bunny[0] == {"dark"} and bunny[14] == {"static"} and sum(bool(flags) for flags in bunny) == 2
    assert not any(found["tears_of_steel_10s_640x360_noaudio.mp4"])
