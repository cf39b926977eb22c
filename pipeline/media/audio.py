"""Audio decoding for speech recognition: a video's audio stream (the default, else the longest) as 16 kHz
mono float32, beside the clip reader (pipeline/media/video.py) and opened the same way (regular files only,
time limits). Times are on the container clock, the clock of the clip times."""

from __future__ import annotations

from dataclasses import dataclass

import av
import numpy as np

from pipeline.media.inputs import input_timeout, open_input
from pipeline.media.video import choose_stream, is_truncated
from stages.decode import DecodeConfig

SAMPLE_RATE = 16_000  # what Whisper models take


class AudioDecodeError(Exception):
    """The audio stream exists but cannot be decoded completely (bad header, corrupt or cut-off data)."""


@dataclass
class Audio:
    samples: np.ndarray  # float32 mono at SAMPLE_RATE
    offset_s: float  # time of the first sample on the container clock

    @property
    def duration_s(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def decode_audio(uri: str, io_timeout_s: float = DecodeConfig.io_timeout_s) -> Audio | None:
    """The audio stream (marked default, else the longest) as 16 kHz mono float32; None when the file has no
    audio stream.

    Streams packet by packet through FFmpeg's resampler (which also downmixes any layout, 5.1 included),
    so memory holds only the 64 KB per second of output, never the source's decoded channels. Other
    streams' packets are read (the file is read whole anyway) but not decoded: where every stream ends
    tells a cut-off file, which FFmpeg reads to its end without an error, from one whose audio is short.
    Opened by inputs.open_input, as the decode stage opens it: a FIFO or a device is refused unopened, and
    waiting longer than io_timeout_s (decode.io_timeout_s) to open it or for its next packet is InputTimeout."""
    try:
        container = open_input(uri, io_timeout_s)
    except (av.error.FFmpegError, OSError, ValueError) as error:
        raise AudioDecodeError(f"cannot open {uri}: {error}") from error
    with container:
        if not container.streams.audio:
            return None
        stream, _ = choose_stream(container.streams.audio, motion=False)  # the default, else the longest
        container_start_s = (container.start_time or 0) / av.time_base
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        chunks: list[np.ndarray] = []
        first_time: float | None = None
        packets_end_s = 0.0
        try:
            for packet in container.demux():
                if packet.pts is not None and packet.time_base is not None:
                    packets_end_s = max(packets_end_s, float((packet.pts + (packet.duration or 0)) * packet.time_base))
                if packet.stream.index != stream.index:
                    continue
                for frame in packet.decode():
                    if first_time is None and frame.time is not None:
                        first_time = float(frame.time)
                    chunks += [out.to_ndarray()[0] for out in resampler.resample(frame)]
            chunks += [out.to_ndarray()[0] for out in resampler.resample(None)]
        except av.error.ExitError as error:
            decoded_s = sum(len(chunk) for chunk in chunks) / SAMPLE_RATE
            raise input_timeout(uri, io_timeout_s, f"after {decoded_s:.2f} s of audio") from error
        except (av.error.FFmpegError, ValueError) as error:
            decoded_s = sum(len(chunk) for chunk in chunks) / SAMPLE_RATE
            raise AudioDecodeError(f"{uri}: audio decoding failed after {decoded_s:.2f} s: {error}") from error
        if container.duration:
            declared_s = container.duration / av.time_base
            data_s = packets_end_s - container_start_s
            if is_truncated(data_s, declared_s):
                raise AudioDecodeError(
                    f"{uri}: file is truncated: its streams end at {data_s:.2f} s of the "
                    f"{declared_s:.2f} s its header declares"
                )
        samples = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
        offset_s = (first_time - container_start_s) if first_time is not None else 0.0
        return Audio(samples=samples, offset_s=offset_s)
