"""Clips decoded by torchcodec (`decode.backend: torchcodec`), on the CPU or on a GPU (`decode.device:
cuda`, NVDEC, resized and cropped there), with the clips of the PyAV path: the same output times (frame
n is the source frame on screen at the first frame's time + n/fps), clip boundaries, padding and times
on the container clock.

The container is opened by PyAV's ClipReader first (it reads the header only: streams, durations, the
decode.max_pixels check, the error rows of unreadable inputs); torchcodec then reads the stream once.
What this path does not check: a clock that jumps (decode.max_gap_s, timestamps going back), a picture
that changes size mid-stream, a display rotation. A rotated video, and any video torchcodec cannot open,
is decoded by PyAV instead (the fallback); a stream that fails mid-way keeps the clips before the failure
(`error`, status partial), as on the PyAV path."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator

import torch

from pipeline.media import ffmpeg_libs
from pipeline.media.clips import Clip
from pipeline.media.inputs import open_target
from pipeline.media.video import ClipReader, truncation
from stages.decode import DecodeConfig

log = logging.getLogger("pipeline.media")

# added to each output time: a frame whose timestamp is exactly on an output slot is shown in it
SLOT_EPSILON_S = 1e-6


class TorchcodecUnavailable(RuntimeError):
    """torchcodec cannot load in this process: a configuration problem, not a bad video (the shard fails)."""


def open_torchcodec_reader(uri: str, cfg: DecodeConfig):
    problem = ffmpeg_libs.torchcodec_error()
    if problem:
        raise TorchcodecUnavailable(problem)
    header = ClipReader(uri, cfg)  # raises VideoDecodeError for inputs that cannot be opened
    try:
        return TorchcodecClipReader(header, uri, cfg)
    except Exception as error:  # noqa: BLE001 - any video torchcodec cannot take is decoded by PyAV
        log.warning(
            "%s: decoded by PyAV, not torchcodec (%s)",
            uri,
            str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__,
        )
        return header


class TorchcodecClipReader:
    """ClipReader's interface (info, clips(), n_frames, error, rotation, stop_reason) over torchcodec."""

    def __init__(self, header: ClipReader, uri: str, cfg: DecodeConfig):
        from torchcodec.decoders import VideoDecoder

        self.header, self.uri, self.cfg = header, uri, cfg
        self.info = header.info
        # frames come at their own size and are scaled here, on their device: torchcodec's own Resize
        # transform ran 4x slower than the decode itself on the CPU (measured on 720p VP8)
        self.decoder = VideoDecoder(
            open_target(uri),
            stream_index=header.stream.index,  # PyAV's choice
            dimension_order="NHWC",
            seek_mode="approximate",
            device=cfg.device,
            num_ffmpeg_threads=cfg.decode_threads or 0,
        )
        metadata = self.decoder.metadata
        if metadata.rotation not in (None, 0, 0.0):
            raise ValueError("rotated: decoded by PyAV")
        self.begin_s = float(metadata.begin_stream_seconds or 0.0)
        self.end_s = float(metadata.end_stream_seconds)
        if not self.end_s > self.begin_s:
            raise ValueError("no duration in the header: decoded by PyAV")
        self.n_frames = 0
        self.error: Exception | None = None
        self.rotation = 0
        self.picture_sizes = [(self.info.width, self.info.height)]
        self.first_frame_s = self.begin_s - self.info.start_s

    def close(self) -> None:
        self.header.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def stop_reason(self) -> tuple[str, str]:
        return ClipReader.stop_reason(self)

    def _scaled(self, frames: torch.Tensor) -> torch.Tensor:
        """(N, h, w, 3) uint8 -> (N, crop, crop, 3) uint8: resized to resize x resize (bilinear, antialiased,
        as the KINETICS400_V1 transform) and centre-cropped, on the frames' device (on a CPU in uint8,
        torch's vectorised path; on a GPU in float32)."""
        cfg = self.cfg
        x = frames.permute(0, 3, 1, 2)  # channels_last (N, 3, h, w): no copy
        size = (cfg.resize, cfg.resize)
        if x.device.type == "cpu":
            x = torch.nn.functional.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)
        else:
            x = (
                torch.nn.functional.interpolate(
                    x.float(), size=size, mode="bilinear", antialias=True, align_corners=False
                )
                .round_()
                .clamp_(0, 255)
                .to(torch.uint8)
            )
        top = (cfg.resize - cfg.crop) // 2
        return x[:, :, top : top + cfg.crop, top : top + cfg.crop].permute(0, 2, 3, 1).contiguous()

    def _slots(self) -> int:
        end = self.end_s
        if self.header._frames_end_s is not None:
            end = min(end, self.header._frames_end_s + self.info.start_s)
        return math.ceil((end - self.begin_s) * self.cfg.fps - 1e-9)

    def clips(self, with_frames: bool = True, watchers=(), shots=None, samples_at=()) -> Iterator[Clip]:
        """The clips of the PyAV path's grid; `watchers` see every frame (scaled for them, on its device,
        then copied to the CPU). A grid that starts again at shot boundaries (`shots`) is the PyAV path's
        only: decode.clip_policy shots needs decode.backend pyav (the config refuses the pair)."""
        if shots is not None:
            raise ValueError("decode.clip_policy shots needs decode.backend pyav")
        cfg = self.cfg
        clip_s = cfg.clip_frames / cfg.fps
        slots = self._slots()
        for clip_index, first in enumerate(range(0, slots, cfg.clip_frames)):
            n_real = min(cfg.clip_frames, slots - first)
            if n_real < cfg.min_clip_frames:
                break
            times = [self.begin_s + (first + n) / cfg.fps + SLOT_EPSILON_S for n in range(n_real)]
            try:
                decoded = self.decoder.get_frames_played_at(times).data
                # without frames only the middle one is kept: it alone is scaled (frame by frame, the same pixels)
                whole = with_frames or bool(watchers) or bool(samples_at)
                frames = self._scaled(decoded if whole else decoded[(n_real - 1) // 2][None])
            except Exception as error:  # noqa: BLE001 - the clips before it are kept (partial)
                self.error = error
                break
            offsets = [int(share * n_real) for share in samples_at]
            samples = tuple((offset, frames[offset].cpu().numpy()) for offset in offsets)
            if watchers:
                seen = frames.cpu().numpy()
                for offset, frame in enumerate(seen):
                    for watcher in watchers:
                        watcher.see(first + offset, frame)
            if not with_frames and whole:
                frames = frames[(n_real - 1) // 2][None]
            self.n_frames += n_real
            if with_frames and n_real < cfg.clip_frames:
                frames = torch.cat([frames, frames[-1:].expand(cfg.clip_frames - n_real, *frames.shape[1:])])
            start = self.first_frame_s + clip_index * clip_s
            yield Clip(
                clip_index,
                round(start, 6),
                round(start + n_real / cfg.fps, 6),
                frames.cpu().numpy() if frames.device.type == "cpu" else frames,
                n_real,
                n_real < cfg.clip_frames,
                first,
                samples,
            )
        for watcher in watchers:
            watcher.finish()
        if self.error is None:
            self.error = truncation(self.first_frame_s, self.n_frames, cfg.fps, self.header._video_duration_s)
