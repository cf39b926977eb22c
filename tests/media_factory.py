"""Small test videos made with PyAV: known frame rates, durations, start times, rotations and colours."""

from __future__ import annotations

import struct
from fractions import Fraction
from pathlib import Path

import av
import numpy as np


def frame_pattern(index: int, width: int, height: int) -> np.ndarray:
    """A frame whose content says which frame it is: the left half's grey level encodes the index."""
    image = np.zeros((height, width, 3), dtype=np.uint8)
    image[:, : width // 2] = (index * 7) % 256
    image[:, width // 2 :, 0] = 255 - (index * 7) % 256
    return image


def pattern_of(video: int):
    """A frame pattern of video number `video`: frame_pattern's halves split at a place of its own, with
    stripes of its own, so that videos made with different numbers are not copies of each other (the dedup
    stage groups frame_pattern's videos: one picture, whatever their length)."""

    def frame(index: int, width: int, height: int) -> np.ndarray:
        image = frame_pattern(index, width, height)
        split = (width * (2 + video % 5)) // 8
        image[:, :split], image[:, split:] = image[:, :1], image[:, -1:]
        period = 4 + 3 * (video % 7)
        image[(np.arange(height) // period) % 2 == 1, :, 1] = (60 * video) % 256
        return image

    return frame


def make_video(
    path: Path,
    *,
    duration_s: float = 3.0,
    fps: float = 25.0,
    width: int = 64,
    height: int = 48,
    rotation: int | None = None,
    start_s: float = 0.0,
    frame_times: list[float] | None = None,
    audio: bool = False,
    codec: str = "libx264",
    pix_fmt: str = "yuv420p",
    frame_fn=frame_pattern,
    container_format: str | None = None,
) -> Path:
    """Encode a video. `frame_times` (seconds) gives a variable frame rate; otherwise frames are at
    start_s + i/fps. `rotation` is the display-matrix angle (counter-clockwise, as FFmpeg reads it)."""
    path = Path(path)
    time_base = Fraction(1, 1000) if frame_times is not None or start_s else None
    if frame_times is None:
        count = int(round(duration_s * fps))
        frame_times = [start_s + i / fps for i in range(count)]
    with av.open(str(path), "w", format=container_format) as container:
        rate = Fraction(fps).limit_denominator(1001)
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        if codec == "libx264":
            stream.options = {"preset": "ultrafast", "crf": "30"}
        if time_base is not None:
            stream.time_base = stream.codec_context.time_base = time_base
        if rotation:
            stream.set_display_rotation(rotation)
        audio_stream = None
        if audio:
            audio_stream = container.add_stream("aac", rate=16000)
            audio_stream.layout = "mono"
        for index, t in enumerate(frame_times):
            frame = av.VideoFrame.from_ndarray(frame_fn(index, width, height), format="rgb24")
            frame = frame.reformat(format=pix_fmt)
            if time_base is not None:
                frame.pts = int(round(t / float(time_base)))
                frame.time_base = time_base
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if audio_stream is not None:
            total = int((frame_times[-1] + 1 / fps) * 16000)
            samples = (0.1 * np.sin(np.arange(total) * 2 * np.pi * 440 / 16000)).astype(np.float32)
            for offset in range(0, total, 1024):
                chunk = samples[offset : offset + 1024].reshape(1, -1)
                audio_frame = av.AudioFrame.from_ndarray(chunk, format="flt", layout="mono")
                audio_frame.sample_rate = 16000
                audio_frame.pts = offset
                for packet in audio_stream.encode(audio_frame):
                    container.mux(packet)
            for packet in audio_stream.encode():
                container.mux(packet)
    return path


def one_clip_videos(folder: Path, count: int) -> Path:
    """`count` small videos v0.mp4, v1.mp4, ... of one clip each (1.6 s at 25 fps), in a new `folder`."""
    folder.mkdir()
    for index in range(count):
        make_video(folder / f"v{index}.mp4", duration_s=1.6, fps=25, width=64, height=48)
    return folder


def mux_mono_audio(container, stream, samples: np.ndarray) -> None:
    """Encode float32 mono `samples` at 16 kHz into `stream` of `container`, in frames of 1024, then flush."""
    for offset in range(0, len(samples), 1024):
        frame = av.AudioFrame.from_ndarray(samples[offset : offset + 1024].reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate, frame.pts = 16000, offset
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)


def make_audio_only(path: Path, duration_s: float = 2.0) -> Path:
    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=16000)
        stream.layout = "mono"
        total = int(duration_s * 16000)
        mux_mono_audio(container, stream, (0.1 * np.sin(np.arange(total) * 0.2)).astype(np.float32))
    return path


def concatenate(parts: list[Path], path: Path) -> Path:
    """Files joined byte-wise, as `cat` joins them: MPEG-TS parts read as one stream whose timestamps, picture
    size or codec settings may change where a part begins."""
    path = Path(path)
    path.write_bytes(b"".join(Path(part).read_bytes() for part in parts))
    return path


def set_matroska_duration(path: Path, duration_s: float) -> Path:
    """Rewrite the Segment Duration a Matroska file's header declares (an 8-byte float in milliseconds, as
    FFmpeg writes it): the frames keep their timestamps."""
    data = bytearray(Path(path).read_bytes())
    position = data.find(b"\x44\x89\x88")  # element id 0x4489, size 8
    if position < 0:
        raise ValueError(f"{path} declares no 8-byte Segment Duration")
    data[position + 3 : position + 11] = struct.pack(">d", duration_s * 1000)
    Path(path).write_bytes(bytes(data))
    return path


def remux(source: Path, path: Path, rotation: int | None = None) -> Path:
    """The video stream of `source` copied, packet for packet, into the container `path` names, with a
    display-matrix `rotation` (counter-clockwise degrees) if given."""
    with av.open(str(source)) as reader, av.open(str(path), "w") as writer:
        video = reader.streams.video[0]
        stream = writer.add_stream_from_template(video)
        if rotation:
            stream.set_display_rotation(rotation)
        for packet in reader.demux(video):
            if packet.dts is not None:  # the demuxer's flush packets carry no data
                packet.stream = stream
                writer.mux(packet)
    return Path(path)
