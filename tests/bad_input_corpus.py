"""The bad-input corpus: files of every kind that breaks video pipelines, generated with PyAV, plus good
videos with real speech to run beside them. Each video is short enough for one 14-frame clip."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from media_factory import frame_pattern, make_audio_only, make_video

SPEECH_WAV = Path(__file__).resolve().parent / "fixtures" / "speech" / "narration_en.wav"
SPEECH_S = (3.0, 5.6)  # "Now let me show you how to chop the onion."
HUGE_SIZE = 12_000  # the huge-resolution header claims 12000x12000 (144 Mpixel)


def make_speech_video(path: Path, video_s: float = 0.8, width: int = 64, height: int = 48) -> Path:
    """A short picture (frame_pattern at 25 fps) with the speech fixture's first sentence as AAC audio."""
    with av.open(str(SPEECH_WAV)) as source:
        samples = np.concatenate([frame.to_ndarray().reshape(-1) for frame in source.decode(audio=0)])
        rate = source.streams.audio[0].rate
    speech = samples[int(SPEECH_S[0] * rate) : int(SPEECH_S[1] * rate)]
    if speech.dtype == np.int16:
        speech = speech.astype(np.float32) / 32768.0
    with av.open(str(path), "w") as container:
        video = container.add_stream("libx264", rate=25)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.options = {"preset": "ultrafast", "crf": "30"}
        audio = container.add_stream("aac", rate=rate)
        audio.layout = "mono"
        for index in range(int(round(video_s * 25))):
            frame = av.VideoFrame.from_ndarray(frame_pattern(index, width, height), format="rgb24")
            for packet in video.encode(frame.reformat(format="yuv420p")):
                container.mux(packet)
        for packet in video.encode():
            container.mux(packet)
        for offset in range(0, len(speech), 1024):
            chunk = av.AudioFrame.from_ndarray(
                speech[offset : offset + 1024].reshape(1, -1), format="flt", layout="mono"
            )
            chunk.sample_rate, chunk.pts = rate, offset
            for packet in audio.encode(chunk):
                container.mux(packet)
        for packet in audio.encode():
            container.mux(packet)
    return path


def claim_huge_resolution(path: Path, size: int = HUGE_SIZE) -> Path:
    """Rewrite every MPEG-2 sequence header (and its extension) of `path` to claim size x size pixels;
    the coded pictures stay small. The fields have fixed widths, so nothing else in the file moves."""
    data = bytearray(path.read_bytes())
    low, high = size & 0xFFF, size >> 12
    position = data.find(b"\x00\x00\x01\xb3")
    patched = 0
    while position >= 0:
        # horizontal_size_value (12 bits), vertical_size_value (12 bits)
        data[position + 4] = low >> 4
        data[position + 5] = ((low & 0xF) << 4) | (low >> 8)
        data[position + 6] = low & 0xFF
        patched += 1
        position = data.find(b"\x00\x00\x01\xb3", position + 4)
    position = data.find(b"\x00\x00\x01\xb5")
    while position >= 0:
        if data[position + 4] >> 4 == 1:  # sequence extension: ..., horizontal/vertical_size_extension (2 bits each)
            data[position + 5] = (data[position + 5] & 0xFE) | (high >> 1)
            data[position + 6] = (data[position + 6] & 0x1F) | ((high & 1) << 7) | (high << 5)
        position = data.find(b"\x00\x00\x01\xb5", position + 4)
    if not patched:
        raise ValueError(f"{path} holds no MPEG-2 sequence header")
    path.write_bytes(bytes(data))
    return path


def _cut(path: Path, share: float) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * share)])
    return path


def _garble_middle(path: Path, length: int = 400, seed: int = 1) -> Path:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    garbage = np.random.default_rng(seed).integers(0, 256, length, np.uint8).tobytes()
    data[middle - length // 2 : middle + length // 2] = garbage
    path.write_bytes(bytes(data))
    return path


def _written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def make_bad_corpus(folder: Path) -> dict[str, Path]:
    """Every bad kind, by name -> its file in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    kinds = {
        "zero_bytes": _written(folder / "zero_bytes.mp4", b""),
        "random_bytes": _written(folder / "random_bytes.mp4", rng.integers(0, 256, 20_000, np.uint8).tobytes()),
        "text_file": _written(folder / "text_file.mov", b"This is a shopping list, not a video.\n" * 40),
        # an MP4 keeps its index at the end: cut off, it cannot be opened at all
        "truncated_mp4": _cut(make_video(folder / "truncated_mp4.mp4", duration_s=1.6, audio=True), 0.6),
        # a Matroska file streams: cut off, its first part still decodes, but its header says 2 s
        "truncated_mkv": _cut(make_video(folder / "truncated_mkv.mkv", duration_s=2.0, audio=True), 0.3),
        "corrupt_middle": _garble_middle(make_video(folder / "corrupt_middle.mp4", duration_s=1.6, audio=True)),
        "audio_only": make_audio_only(folder / "audio_only.mp4", duration_s=1.0),
        "no_audio": make_video(folder / "no_audio.mp4", duration_s=0.8),
        "too_short": make_video(folder / "too_short_0.2s.mp4", duration_s=0.2),
        "one_pixel": make_video(
            folder / "one_pixel.mkv", duration_s=0.8, width=1, height=1, codec="ffv1", pix_fmt="yuv444p"
        ),
        "odd_size": make_video(folder / "odd_321x241.mp4", duration_s=0.8, width=321, height=241, pix_fmt="yuv444p"),
        **{
            f"rotated_{degrees}": make_video(folder / f"rotated_{degrees}.mp4", duration_s=0.8, rotation=degrees)
            for degrees in (90, 180, 270)
        },
        "variable_frame_rate": make_video(
            folder / "variable_frame_rate.mp4", frame_times=[0.0] + np.cumsum(rng.uniform(0.02, 0.09, 14)).tolist()
        ),
        # the picture starts 5 s after the container (and its audio) start
        "late_start": make_video(folder / "late_start.mp4", duration_s=0.8, start_s=5.0, audio=True),
        "huge_resolution_header": claim_huge_resolution(
            make_video(
                folder / "huge_resolution_header.mpg", duration_s=0.8, codec="mpeg2video", container_format="mpeg"
            )
        ),
        "spaces_and_unicode": make_speech_video(folder / "spaces and ünïcödé 名前.mp4"),
    }
    return kinds


def make_good_videos(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [
        make_speech_video(folder / "good_speech.mp4"),
        make_video(folder / "good_tone.mp4", duration_s=0.8, fps=Fraction(30000, 1001), audio=True),
    ]
