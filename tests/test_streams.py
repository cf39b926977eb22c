"""Which stream of a file with several is decoded: the one marked default, else the longest real one, never
a cover picture or a still image; the choice is in the videos table and the summary names such files."""

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from media_factory import mux_mono_audio

from pipeline import cli
from pipeline.config import load_config
from pipeline.engine.workdir import WorkDir
from pipeline.media import ffmpeg_libs
from pipeline.media.audio import decode_audio
from pipeline.media.video import ClipReader

Disposition = av.stream.Disposition


def write_streams(path, container_format, specs) -> None:
    """One file with a video stream per spec (codec, width, height, frames, fps, disposition), each frame a
    flat grey of its index, streams written one after the other."""
    with av.open(str(path), "w", format=container_format) as container:
        streams = []
        for codec, width, height, frames, fps, disposition in specs:
            stream = container.add_stream(codec, rate=fps)
            stream.width, stream.height = width, height
            stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
            stream.disposition = disposition
            streams.append((stream, frames))
        for stream, frames in streams:
            for index in range(frames):
                image = np.full((stream.height, stream.width, 3), (index * 7) % 256, np.uint8)
                frame = av.VideoFrame.from_ndarray(image, format="rgb24")
                frame.pts = index
                for packet in stream.encode(frame):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("streams")
    # stream 0 a 2 s side stream at 64x48, stream 1 the 6 s default at 160x120
    write_streams(
        folder / "side_first.mp4",
        "mp4",
        [("libx264", 64, 48, 50, 25, Disposition(0)), ("libx264", 160, 120, 150, 25, Disposition.default)],
    )
    # stream 0 a one-frame cover picture (as downloaded files carry), stream 1 the 6 s video
    write_streams(
        folder / "cover_first.mkv",
        "matroska",
        [("mjpeg", 64, 48, 1, 1, Disposition.attached_pic), ("libx264", 160, 120, 150, 25, Disposition(0))],
    )
    write_streams(folder / "cover_only.mkv", "matroska", [("mjpeg", 64, 48, 1, 1, Disposition(0))])
    return folder


def test_the_pyav_reader_takes_the_default_or_longest_stream_never_a_cover(videos):
    cfg = load_config(None, []).decode
    for name in ("side_first.mp4", "cover_first.mkv"):
        with ClipReader(str(videos / name), cfg) as reader:
            clips = list(reader.clips(with_frames=False))
            assert (reader.info.stream_index, reader.info.width, reader.info.height) == (1, 160, 120), name
            assert len(clips) == 4 and reader.error is None, name  # 6 s at 20 fps: four 1.5 s clips
    with ClipReader(str(videos / "side_first.mp4"), cfg) as reader:
        assert reader.info.video_streams == 2
    with ClipReader(str(videos / "cover_first.mkv"), cfg) as reader:
        assert reader.info.video_streams == 1  # the cover is no candidate


def test_the_torchcodec_reader_decodes_the_stream_pyav_chose(videos):
    if ffmpeg_libs.torchcodec_error() is not None:
        pytest.skip(f"torchcodec does not load here: {ffmpeg_libs.torchcodec_error()}")
    from pipeline.media.torchcodec_reader import TorchcodecClipReader, open_torchcodec_reader

    cfg = load_config(None, ["decode.backend=torchcodec"]).decode
    for name in ("side_first.mp4", "cover_first.mkv"):
        reader = open_torchcodec_reader(str(videos / name), cfg)
        with reader:
            assert isinstance(reader, TorchcodecClipReader), name
            assert len(list(reader.clips(with_frames=False))) == 4, name


def test_decode_records_the_stream_names_several_and_gives_a_cover_only_file_an_error_row(videos, tmp_path, capsys):
    work = tmp_path / "work"
    assert cli.main(["manifest", "--work-dir", str(work), "--input", str(videos)]) == 0
    code = cli.main(["decode", "--work-dir", str(work), "--quiet", "--set", "executor.workers=1"])
    err = capsys.readouterr().err
    assert code == 0
    rows = {
        row["uri"].rsplit("/", 1)[1]: row
        for row in pq.read_table(WorkDir(work).part("decode", 0, "videos")).to_pylist()
    }
    for name in ("side_first.mp4", "cover_first.mkv"):
        row = rows[name]
        assert (row["status"], row["n_clips"], row["width"], row["video_stream"]) == ("ok", 4, 160, 1), row
    assert rows["side_first.mp4"]["video_streams"] == 2 and rows["cover_first.mkv"]["video_streams"] == 1
    assert rows["cover_only.mkv"]["status"] == "error"
    errors = pq.read_table(WorkDir(work).errors("decode", 0)).to_pylist()
    assert [row["error_type"] for row in errors] == ["NoVideoStream"] and "cover" in errors[0]["message"]
    summary = [line for line in err.splitlines() if "several video streams" in line]
    assert len(summary) == 1 and "1 video(s)" in summary[0] and "side_first" in summary[0]
    assert "cover_first" not in summary[0]


def test_the_audio_of_the_default_stream_is_decoded(tmp_path):
    path = tmp_path / "two_tracks.mp4"
    with av.open(str(path), "w") as container:
        tracks = []
        for seconds, disposition in ((1.0, Disposition(0)), (3.0, Disposition.default)):
            stream = container.add_stream("aac", rate=16000)
            stream.layout, stream.disposition = "mono", disposition
            tracks.append((stream, seconds))
        for stream, seconds in tracks:
            total = int(seconds * 16000)
            mux_mono_audio(
                container, stream, (0.1 * np.sin(np.arange(total) * 2 * np.pi * 440 / 16000)).astype(np.float32)
            )
    audio = decode_audio(str(path))
    assert audio is not None and abs(audio.duration_s - 3.0) < 0.1
