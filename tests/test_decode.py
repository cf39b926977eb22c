"""decode: clip counts and times for known rates and starts, rotation, colour range, and bad inputs."""

import math
from urllib.parse import quote

import numpy as np
import pytest
from media_factory import concatenate, make_audio_only, make_video, remux, set_matroska_duration

from pipeline.config import load_config
from pipeline.media.video import ClipReader
from stages.decode.run import decode_video

CFG = load_config(None)


def expected_clip_count(duration_s, cfg):
    """Clips for a stream of `duration_s` seconds: output slots n with n / fps < duration, cut into
    clips; a last partial clip counts when it has at least min_clip_frames."""
    frames = math.ceil(duration_s * cfg.fps - 1e-9)
    full, rest = divmod(frames, cfg.clip_frames)
    return full + (1 if rest >= cfg.min_clip_frames else 0)


def index_pattern(index, width, height):
    """The left half's colour says the source frame index: red and green in steps of 16."""
    image = np.zeros((height, width, 3), dtype=np.uint8)
    image[:, : width // 2, 0] = (index % 16) * 16
    image[:, : width // 2, 1] = (index // 16) * 16
    return image


def source_index(frame):
    red, green = frame[:, :80, 0].mean(), frame[:, :80, 1].mean()
    return int(round(green / 16)) * 16 + int(round(red / 16))


@pytest.mark.parametrize("fps", [24, 25, 29.97, 30, 60])
def test_clip_count_and_times_for_common_frame_rates(tmp_path, fps):
    path = make_video(tmp_path / "v.mp4", duration_s=4.0, fps=fps, frame_fn=index_pattern)
    source_frames = round(4.0 * fps)
    duration = source_frames / fps  # 4.004 s at 29.97
    with ClipReader(str(path), CFG.decode) as reader:
        clips = list(reader.clips())
    # 80 frames at 20 fps (81 for 4.004 s) = 2 full clips + a last one of 20-21 frames (>= 15: padded)
    last = math.ceil(duration * 20 - 1e-9) - 60
    assert len(clips) == expected_clip_count(duration, CFG.decode) == 3
    assert [(c.start_s, c.end_s) for c in clips] == [(0.0, 1.5), (1.5, 3.0), (3.0, 3.0 + last / 20)]
    assert [c.n_real_frames for c in clips] == [30, 30, last]
    # frame n of the output is the source frame on screen at n/20
    frames = np.concatenate([c.frames[: c.n_real_frames] for c in clips])
    shown = [source_index(f) for f in frames]
    assert shown == [min(math.floor(n / 20 * fps + 1e-6), source_frames - 1) for n in range(len(frames))]
    assert [c.padded for c in clips] == [False, False, True]
    assert clips[-1].frames.shape == (30, 224, 224, 3)
    assert (clips[-1].frames[last:] == clips[-1].frames[last - 1]).all()  # padded with the last real frame


def test_short_last_window_is_dropped(tmp_path):
    path = make_video(tmp_path / "v.mp4", duration_s=2.1, fps=25)  # 42 frames: 30 + 12 (< 15)
    with ClipReader(str(path), CFG.decode) as reader:
        assert [c.n_real_frames for c in reader.clips()] == [30]


def test_file_uri_with_escaped_characters_decodes_like_its_path(tmp_path):
    path = make_video(tmp_path / "a b#1.mp4", duration_s=3.1, fps=25)
    uri = "file://" + quote(str(path))
    with ClipReader(str(path), CFG.decode) as by_path, ClipReader(uri, CFG.decode) as by_uri:
        assert [c.frames.tobytes() for c in by_uri.clips()] == [c.frames.tobytes() for c in by_path.clips()]


def test_frames_follow_timestamps_for_variable_frame_rate(tmp_path):
    rng = np.random.default_rng(0)
    times = [0.0]
    while times[-1] < 3.0:
        times.append(round(times[-1] + float(rng.choice([0.02, 0.05, 0.1, 0.13])), 3))
    path = make_video(tmp_path / "vfr.mp4", frame_times=times, frame_fn=index_pattern)
    with ClipReader(str(path), CFG.decode) as reader:
        frames = list(reader.frames())
    # output frame i is the source frame on screen at i/20: the latest one with time <= i/20
    expected = [max(j for j, t in enumerate(times) if t <= i / 20 + 1e-9) for i in range(len(frames))]
    assert [source_index(f) for f in frames] == expected


def _decoded(path, cfg=CFG):
    """(clips with their frames, the reader) for a video."""
    with ClipReader(str(path), cfg.decode) as reader:
        return list(reader.clips()), reader


def test_timestamp_reset_stops_the_video_and_keeps_the_clips_before(tmp_path):
    # two MPEG-TS files joined byte-wise: the second part's clock starts again at 0
    first = make_video(tmp_path / "first.ts", duration_s=3.0, container_format="mpegts", frame_fn=index_pattern)
    second = make_video(tmp_path / "second.ts", duration_s=2.0, container_format="mpegts")
    joined = concatenate([first, second], tmp_path / "joined.ts")
    clips, video, errors = decode_video(_row(joined), CFG)
    assert video["status"] == "partial" and len(clips) == 2
    assert [(e["error_type"], e["message"]) for e in errors] == [
        (
            "TimestampDiscontinuity",
            f"{joined}: timestamps jump back from 2.960 s to 0.000 s at source frame 75; the clips before it are kept",
        )
    ]
    # the clips are the first part's, exactly
    kept, reader = _decoded(joined)
    alone, _ = _decoded(first)
    assert [(c.start_s, c.end_s, c.frames.tobytes()) for c in kept] == [
        (c.start_s, c.end_s, c.frames.tobytes()) for c in alone
    ]
    assert reader.stop_reason()[1] == "TimestampDiscontinuity"


def test_timestamps_a_little_back_are_jitter_not_a_reset(tmp_path):
    # the second part starts 20 ms before the first one's last frame: that frame is dropped, nothing stops
    first = make_video(tmp_path / "first.ts", duration_s=3.0, container_format="mpegts")
    second = make_video(tmp_path / "second.ts", duration_s=2.0, start_s=2.94, container_format="mpegts")
    clips, video, errors = decode_video(_row(concatenate([first, second], tmp_path / "joined.ts")), CFG)
    assert (video["status"], errors) == ("ok", [])
    assert len(clips) == expected_clip_count(4.94, CFG.decode) == 3


def test_an_hour_long_timestamp_gap_stops_the_video_instead_of_repeating_a_frame(tmp_path):
    # 2 s of frames, then one an hour later: a 2 KB file that used to give 2,400 clips of one frame. Its
    # header agrees with the gap (3600 s), so the gap rule, not the declared duration, stops it
    path = make_video(tmp_path / "gap.mp4", frame_times=[i * 0.04 for i in range(50)] + [3600.0])
    clips, video, errors = decode_video(_row(path), CFG)
    assert video["duration_s"] > 3600
    assert (video["status"], len(clips), video["n_frames"]) == ("partial", 1, 40)
    assert [(e["error_type"], e["message"]) for e in errors] == [
        (
            "TimestampDiscontinuity",
            f"{path}: timestamps jump forward from 1.960 s to 3600.000 s at source frame "
            f"50, a gap over decode.max_gap_s=60 s; the clips before it are kept",
        )
    ]
    # a longer limit takes the gap as a picture held on screen
    clips, video, errors = decode_video(_row(path), load_config(None, ["decode.max_gap_s=4000"]))
    assert (video["status"], len(clips), errors) == ("ok", expected_clip_count(3600.04, CFG.decode), [])


def test_slideshow_holding_pictures_under_a_minute_is_kept_whole(tmp_path):
    times = [0.0, 20.0, 40.0, 59.0, 59.04]
    path = make_video(tmp_path / "slides.mp4", frame_times=times, frame_fn=index_pattern)
    clips, video, errors = decode_video(_row(path), CFG)
    assert (video["status"], errors) == ("ok", [])
    assert len(clips) == expected_clip_count(59.08, CFG.decode) == 39
    with ClipReader(str(path), CFG.decode) as reader:
        shown = [source_index(frame) for frame in reader.frames()]
    assert shown == [max(j for j, t in enumerate(times) if t <= i / 20 + 1e-9) for i in range(len(shown))]


def test_frames_past_the_declared_duration_stop_the_video(tmp_path):
    # 6 s of frames in a Matroska file whose header says 2 s: frames up to 2 s + 1 s of tolerance are kept
    path = set_matroska_duration(make_video(tmp_path / "v.mkv", duration_s=6.0, container_format="matroska"), 2.0)
    clips, video, errors = decode_video(_row(path), CFG)
    assert (video["status"], len(clips), video["n_frames"]) == ("partial", 2, 60)
    assert [(e["error_type"], e["message"]) for e in errors] == [
        (
            "FramesPastDuration",
            f"{path}: source frame 76 at 3.040 s lies past the 2.000 s the header declares; "
            f"the clips before it are kept",
        )
    ]


def test_non_zero_start_time(tmp_path):
    # video starts 2 s after the container's zero (the audio starts at 0)
    path = make_video(tmp_path / "late.mp4", duration_s=3.0, fps=25, start_s=2.0, audio=True)
    with ClipReader(str(path), CFG.decode) as reader:
        clips = list(reader.clips())
    assert clips[0].start_s == pytest.approx(2.0, abs=0.05)
    assert clips[1].start_s - clips[0].start_s == pytest.approx(1.5)


def quadrant_pattern(index, width, height):
    image = np.zeros((height, width, 3), dtype=np.uint8)
    image[: height // 2, : width // 2] = (255, 0, 0)  # top-left red
    image[: height // 2, width // 2 :] = (0, 255, 0)  # top-right green
    return image


@pytest.mark.parametrize("display_rotation, np_turns", [(90, 1), (180, 2), (270, 3), (-90, 3)])
def test_rotation_metadata_is_applied(tmp_path, display_rotation, np_turns):
    path = make_video(
        tmp_path / "r.mp4",
        duration_s=2.0,
        fps=25,
        width=64,
        height=32,
        rotation=display_rotation,
        frame_fn=quadrant_pattern,
    )
    with ClipReader(str(path), CFG.decode) as reader:
        frame = next(reader.clips()).frames[0].astype(int)
    # the display matrix angle is counter-clockwise: np.rot90 turns counter-clockwise too
    upright = np.rot90(quadrant_pattern(0, 64, 32), np_turns)
    h, w = upright.shape[:2]
    corners = {
        "tl": upright[h // 8, w // 8],
        "tr": upright[h // 8, -w // 8],
        "bl": upright[-h // 8, w // 8],
        "br": upright[-h // 8, -w // 8],
    }
    got = {"tl": frame[20, 20], "tr": frame[20, -20], "bl": frame[-20, 20], "br": frame[-20, -20]}
    for corner, colour in corners.items():
        assert np.abs(got[corner] - colour).max() < 60, (corner, got[corner], colour)


def test_full_range_source_is_not_washed_out(tmp_path):
    def black_and_white(index, width, height):
        image = np.zeros((height, width, 3), dtype=np.uint8)
        image[:, width // 2 :] = 255
        return image

    path = make_video(
        tmp_path / "full.mkv", duration_s=2.0, fps=25, codec="mjpeg", pix_fmt="yuvj420p", frame_fn=black_and_white
    )
    with ClipReader(str(path), CFG.decode) as reader:
        frame = next(reader.clips()).frames[0]
    # a washed-out (limited-range) reading would give about 16 and 235
    assert frame[:, :80].mean() < 6
    assert frame[:, -80:].mean() > 249


def _size_change(folder, second_size, rotation=None, second_s=3.0):
    """3 s of 64x48 pictures, then `second_s` of `second_size` ones (one H.264 stream, new sequence headers
    where the second part begins) from 3.0 s on; with a display rotation when given."""
    first = make_video(folder / "first.ts", duration_s=3.0, container_format="mpegts", frame_fn=quadrant_pattern)
    second = make_video(
        folder / "second.ts",
        duration_s=second_s,
        start_s=3.0,
        width=second_size[0],
        height=second_size[1],
        container_format="mpegts",
        frame_fn=quadrant_pattern,
    )
    joined = concatenate([first, second], folder / "joined.ts")
    if rotation is None:
        return joined, second
    return remux(joined, folder / "joined.mp4", rotation), remux(second, folder / "second.mp4", rotation)


@pytest.mark.parametrize("rotation", [None, 90])
def test_picture_size_change_mid_stream_is_scaled_and_cropped_like_the_size_alone(tmp_path, rotation):
    joined, second = _size_change(tmp_path, (320, 240), rotation)
    with ClipReader(str(joined), CFG.decode) as reader:
        clips = list(reader.clips())
    assert (reader.error, reader.picture_sizes) == (None, [(64, 48), (320, 240)])
    alone, _ = _decoded(second)
    assert len(clips) == 4 and len(alone) == 2
    for mixed, single in zip(clips[2:], alone):
        assert np.abs(mixed.frames.astype(int) - single.frames).mean() < 1


def test_every_frame_over_max_pixels_stops_the_video_before_the_filter_graph(tmp_path):
    # the first 3 s are 64x48, then one 6000x6000 frame (36 Mpixel, over the default 8192x4320)
    joined, _ = _size_change(tmp_path, (6000, 6000), second_s=0.04)
    with ClipReader(str(joined), CFG.decode) as reader:
        assert reader.info.width * reader.info.height == 64 * 48  # the header shows the first part
        clips = list(reader.clips(with_frames=False))
    assert reader.picture_sizes == [(64, 48)]  # the big picture never reached the filter graph
    clip_rows, video, errors = decode_video(_row(joined), CFG)
    assert (video["status"], len(clips), len(clip_rows)) == ("partial", 2, 2)
    assert [(e["error_type"], e["message"]) for e in errors] == [
        (
            "VideoTooLarge",
            f"{joined}: source frame 75 is 6000x6000, over decode.max_pixels={CFG.decode.max_pixels}; "
            f"the clips before it are kept",
        )
    ]


def test_real_full_range_video_keeps_black(realdata):
    with ClipReader(str(realdata / "intel_asl_again.mkv"), CFG.decode) as reader:
        frames = next(reader.clips()).frames
    assert frames.min() < 16


def _row(path, video_id="v"):
    return {"video_id": video_id, "uri": str(path), "bytes": path.stat().st_size if path.exists() else None}


def test_bad_inputs_become_error_rows_or_statuses(tmp_path):
    zero = tmp_path / "zero.mp4"
    zero.write_bytes(b"")
    text = tmp_path / "text.mp4"
    text.write_text("this is not a video\n" * 50)
    audio_only = make_audio_only(tmp_path / "audio.m4a")
    tiny = make_video(tmp_path / "tiny.mp4", duration_s=0.4, fps=25)
    good = make_video(tmp_path / "good.mp4", duration_s=4.0, fps=25)
    truncated = tmp_path / "truncated.mp4"
    data = make_video(
        tmp_path / "long.mkv", duration_s=6.0, fps=25, width=160, height=120, container_format="matroska"
    ).read_bytes()
    truncated.write_bytes(data[: len(data) * 2 // 3])
    outcomes = {}
    for path in (zero, text, audio_only, tiny, good, truncated, tmp_path / "missing.mp4"):
        clips, video, errors = decode_video(_row(path, path.stem), CFG)
        outcomes[path.stem] = (
            len(clips),
            video["status"],
            [e["error_type"] for e in errors],
            [e["message"] for e in errors],
        )
    assert outcomes["zero"][:3] == (0, "error", ["EmptyFile"])
    assert outcomes["text"][:2] == (0, "error") and "cannot open" in outcomes["text"][3][0]
    assert outcomes["audio"][:3] == (0, "error", ["NoVideoStream"])
    assert outcomes["tiny"][:3] == (0, "too_short", [])
    assert outcomes["good"][:3] == (3, "ok", [])
    assert outcomes["missing"][:2] == (0, "error")
    # truncated: the clips before the cut are kept, and the video is marked partial
    assert outcomes["truncated"][0] >= 1 and outcomes["truncated"][1] == "partial"
    assert outcomes["truncated"][2] in (["TruncatedStream"], ["DecodeStoppedMidStream"])


def test_stream_failing_midway_keeps_earlier_clips(realdata):
    path = realdata / "decord_corrupted.mp4"
    clips, video, errors = decode_video(_row(path), CFG)
    assert video["status"] == "partial" and len(clips) == 2
    assert errors[0]["error_type"] == "DecodeStoppedMidStream"


def test_oversized_frames_are_refused_not_decoded(tmp_path):
    path = make_video(tmp_path / "big.mp4", duration_s=2.0, fps=25, width=320, height=240)
    cfg = load_config(None, ["decode.max_pixels=10000"])
    clips, video, errors = decode_video(_row(path), cfg)
    assert clips == [] and errors[0]["error_type"] == "VideoTooLarge"
    assert "320x240" in errors[0]["message"]
