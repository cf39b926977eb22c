"""The dedup stage: copies of real footage (re-encoded, rescaled, cropped, trimmed) found and distinct videos
never grouped, a collection of copies of one video, candidates that grow like n log n, and the splits of
training, which never separate a group."""

from __future__ import annotations

import json
from fractions import Fraction

import av
import numpy as np
import pyarrow as pa
import pytest
from work_factory import MADE_BY

import schemas
from pipeline import cli, storage
from pipeline.config import load_config
from pipeline.engine import lineage
from pipeline.engine.workdir import WorkDir
from reports.validate import validate_work_dir
from stages.dedup.checks import problems_of
from stages.dedup.run import Signature, candidate_pairs, groups, match
from videobert.copies import Copies
from videobert.validation import held_out_videos


def transformed(source, destination, *, scale=1.0, crop=0.0, trim_s=0.0, crf=35) -> None:
    """A copy of `source`'s picture, re-encoded with x264 at `crf`, cropped by `crop` of each side's length,
    rescaled by `scale`, without its first `trim_s` seconds (and without its audio)."""
    with av.open(str(source)) as reader, av.open(str(destination), "w") as writer:
        video = reader.streams.video[0]
        stream = None
        for frame in reader.decode(video):
            if frame.pts is not None and float(frame.pts * video.time_base) < trim_s:
                continue
            picture = frame.to_ndarray(format="rgb24")
            height, width = picture.shape[:2]
            if crop:
                dy, dx = int(height * crop / 2), int(width * crop / 2)
                picture = picture[dy : height - dy, dx : width - dx]
            size = (int(picture.shape[1] * scale) // 2 * 2, int(picture.shape[0] * scale) // 2 * 2)
            image = av.VideoFrame.from_ndarray(np.ascontiguousarray(picture), format="rgb24")
            if stream is None:
                stream = writer.add_stream("libx264", rate=video.average_rate or Fraction(25))
                stream.width, stream.height, stream.pix_fmt = *size, "yuv420p"
                stream.options = {"preset": "ultrafast", "crf": str(crf)}
            for packet in stream.encode(image.reformat(width=size[0], height=size[1], format="yuv420p")):
                writer.mux(packet)
        for packet in stream.encode():
            writer.mux(packet)


# real footage long enough to keep a clip after a 2 s trim; the others of realdata are broken or shorter
ORIGINALS = (
    "tears_of_steel_10s_640x360_noaudio.mp4",
    "big_buck_bunny_0_30.webm",
    "intel_car-detection.mp4",
    "jfk_subtitled_speech.mp4",
    "bigbuckbunny_h264_aac51.mp4",
    "moviepy_no_duration.webm",
)
COPIES = {"crf": {"crf": 42}, "half": {"scale": 0.5}, "crop": {"crop": 0.1}, "trim": {"trim_s": 2.0}}


@pytest.mark.slow
def test_copies_of_real_footage_are_found_and_no_two_originals_are_grouped(realdata, tmp_path):
    videos = tmp_path / "videos"
    videos.mkdir()
    for name in ORIGINALS:
        (videos / name).write_bytes((realdata / name).read_bytes())
        for copy, how in COPIES.items():
            transformed(realdata / name, videos / f"{name.split('.')[0]}-{copy}.mp4", **how)
    work = tmp_path / "work"
    for command in (["manifest", "--input", str(videos)], ["decode"], ["quality"], ["dedup"]):
        assert cli.main([*command, "--work-dir", str(work), "--quiet"]) == 0, command
    names = {
        row["video_id"]: row["uri"].rsplit("/", 1)[1] for row in storage.read_table(WorkDir(work).manifest).to_pylist()
    }
    rows = storage.read_table(WorkDir(work).dedup_groups).to_pylist()
    group_of = {names[row["video_id"]]: row["group_id"] for row in rows}
    original_of = {name: name for name in ORIGINALS} | {
        f"{name.split('.')[0]}-{copy}.mp4": name for name in ORIGINALS for copy in COPIES
    }
    groups_of_originals = [group_of.get(name) for name in ORIGINALS]
    grouped = [g for g in groups_of_originals if g is not None]
    assert len(grouped) == len(set(grouped)), "two originals in one group"
    # the almost black recording (moviepy_no_duration) is all black: no clip to compare, so none of its copies
    comparable = [name for name in original_of if not name.startswith("moviepy")]
    found = [
        name
        for name in comparable
        if name not in ORIGINALS
        and group_of.get(name) is not None
        and group_of.get(name) == group_of.get(original_of[name])
    ]
    assert len(found) >= 0.95 * (len(comparable) - len(ORIGINALS) + 1), (
        len(found),
        sorted(set(comparable) - set(found)),
    )
    assert all(
        group_of.get(name) is None or group_of[name] == group_of.get(original_of[name]) for name in names.values()
    )
    assert validate_work_dir(work) == []
    assert "dedup" in open(WorkDir(work).record("dedup")).read()


def signature(video_id: str, hashes: np.ndarray, start_s: float = 0.0, clips: int | None = None) -> Signature:
    times = start_s + 0.5 * np.arange(len(hashes), dtype=np.float32)
    return Signature(video_id, times.astype(np.float32), hashes.astype(np.uint64), clips or len(hashes) // 3, 100)


def test_a_trimmed_copy_matches_at_its_offset_and_a_reshuffled_video_does_not():
    rng = np.random.default_rng(0)
    original = rng.integers(0, 2**63, 60, dtype=np.int64).view(np.uint64)
    flips = np.array([1 << int(b) for b in rng.integers(0, 64, 60)], dtype=np.uint64)
    copy = (original ^ flips)[4:]  # two seconds trimmed, one bit off each hash
    matched, offset = match(
        np.arange(56, dtype=np.float32) * 0.5, copy, np.arange(60, dtype=np.float32) * 0.5, original, 18, 0.5
    )
    assert matched == 56 and offset == pytest.approx(2.0)
    shuffled = np.concatenate([original[30:], original[:30]])[::2]  # the same pictures, another order
    matched, _ = match(
        np.arange(30, dtype=np.float32) * 0.5, shuffled, np.arange(60, dtype=np.float32) * 0.5, original, 18, 0.5
    )
    assert matched <= 15


def test_candidates_grow_with_the_videos_not_their_pairs():
    rng = np.random.default_rng(1)
    for count in (100, 400, 1600):
        pairs = candidate_pairs(rng.random((count, 64), dtype=np.float32), neighbours=10)
        assert len(pairs) <= 10 * count and all(i < j for i, j in pairs)
    assert candidate_pairs(np.zeros((5, 64), np.float32), 10) == [(i, j) for i in range(5) for j in range(i + 1, 5)]


def test_a_collection_of_copies_of_one_video_is_one_group(tmp_path):
    rng = np.random.default_rng(2)
    hashes = rng.integers(0, 2**63, 90, dtype=np.int64).view(np.uint64)
    signatures = [signature(f"copy{n:03d}", hashes, clips=30 + (n == 7)) for n in range(300)]
    descriptors = np.stack([s.descriptor() for s in signatures])
    pairs = candidate_pairs(descriptors, neighbours=10)
    copies = [(i, j, 1.0, 0.0) for i, j in pairs]
    rows = groups(signatures, copies)
    assert len(pairs) <= 3000 and {row["group_id"] for row in rows} == {0} and len(rows) == 300
    assert rows[0]["video_id"] == rows[0]["representative"] == "copy007"  # the most clips
    assert problems_of(rows, {s.video_id for s in signatures}, "groups") == []


def write_groups(work_dir, members: list[list[str]]) -> None:
    """A dedup group table of these groups (each's first video its representative), with its record."""
    rows = [
        {
            "video_id": video,
            "group_id": group_id,
            "representative": group[0],
            "matched_to": None if position == 0 else group[0],
            "matched_share": None if position == 0 else 1.0,
            "offset_s": None if position == 0 else 0.0,
        }
        for group_id, group in enumerate(members)
        for position, video in enumerate(group)
    ]
    work = WorkDir(work_dir)
    written = storage.write_parquet(
        work.dedup_groups,
        pa.Table.from_pylist(rows, schema=schemas.DEDUP_GROUPS.arrow),
        schemas.metadata.Provenance(stage="dedup", schema=schemas.DEDUP_GROUPS.tag),
    )
    lineage.write_record(
        work,
        "dedup",
        None,
        lineage.external_lineage(MADE_BY),
        lineage.output_entry(work, work.dedup_groups, len(rows), written),
        {},
    )


def test_no_split_ever_separates_a_group(tmp_path):
    rng = np.random.default_rng(3)
    videos = [f"v{n:03d}" for n in range(60)]
    for trial in range(40):
        order = rng.permutation(videos).tolist()
        members, position = [], 0
        while position < 45:
            size = int(rng.integers(2, 5))
            members.append(order[position : position + size])
            position += size
        write_groups(tmp_path, members)
        copies = Copies.read(tmp_path)
        sides = {v: str(rng.choice(["train", "validation", "test"], p=[0.6, 0.2, 0.2])) for v in videos}
        splits = tmp_path / "splits.csv"
        splits.write_text("video_id,split\n" + "".join(f"{v},{s}\n" for v, s in sides.items() if rng.random() < 0.8))
        for overrides in ([f"train.splits={splits}"], ["train.validation_videos=0.2", f"train.seed={trial}"]):
            validation, test, moved = held_out_videos(load_config(None, overrides), videos, copies)
            side = {v: "validation" for v in validation} | {v: "test" for v in test}
            for group in members:
                assert len({side.get(v, "train") for v in group}) == 1, (overrides, group)
            for video, where in moved.items():
                assert side[video] == where


def test_a_moved_video_is_said_and_training_keeps_one_video_of_a_group(tmp_path, capsys):
    from videobert.validation import split_shards

    write_groups(tmp_path, [["a", "b", "c"], ["d", "e"]])
    copies = Copies.read(tmp_path)
    assert copies.not_kept({"a", "b", "c", "d", "e", "f"}) == ["b", "c", "e"]
    assert copies.not_kept({"b", "c"}) == ["c"]  # its representative not here: the first present stays
    splits = tmp_path / "splits.csv"
    splits.write_text("video_id,split\nb,test\nd,validation\n")
    validation, test, moved = held_out_videos(load_config(None, [f"train.splits={splits}"]), list("abcdef"), copies)
    assert (
        test == ["a", "b", "c"] and validation == ["d", "e"] and moved == {"a": "test", "c": "test", "e": "validation"}
    )
    align = WorkDir(tmp_path).part("align", 0)
    rows = [
        {
            "video_id": v,
            "segment_index": 0,
            "start_s": 0.0,
            "end_s": 1.5,
            "kind": "video_only",
            "text": None,
            "text_ids": [],
            "visual_ids": [1],
            "language": None,
        }
        for v in "abcdef"
    ]
    storage.write_parquet(align, pa.Table.from_pylist(rows, schema=schemas.ALIGN.arrow), schemas.metadata.Provenance())
    kept, validation, test = split_shards(load_config(None, [f"train.splits={splits}"]), tmp_path, [align])
    assert storage.read_table(kept[0])["video_id"].to_pylist() == ["f"]
    err = capsys.readouterr().err
    assert "dedup: 3 video(s) moved to the held-out videos with their copies: a (test), c (test), e (validation)" in err
    summary = json.loads((WorkDir(tmp_path).train_folder / "heldout" / "videos.json").read_text())
    assert summary["moved_with_copies"] == moved
