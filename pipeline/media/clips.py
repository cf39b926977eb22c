"""Frames into clips: the fixed grid of `decode.clip_frames`, or a grid that starts again at every shot
boundary, and what watches the frames on the way (pipeline.media.video's ClipReader and the torchcodec
reader hand their frames here). A clip holds its frames, or only its middle one, and a few sampled ones;
frames wait here only as long as a shot detector may still find a boundary before them."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass
class Clip:
    clip_index: int
    start_s: float
    end_s: float
    frames: np.ndarray  # (clip_frames, crop, crop, 3) uint8 RGB
    n_real_frames: int  # frames before padding with the last one
    padded: bool
    first_frame: int = 0  # its first frame's number in the video's frames at the target rate
    # (offset in its real frames, frame) for each share of `samples_at`, even without its frames
    samples: tuple = ()


class FrameWatcher(Protocol):
    """What sees every frame of a video as the clip reader cuts it (the shot detector, the clips' measures):
    `see` is called once per frame at the target rate, in order, with the frame as the model sees it
    (crop x crop x 3 uint8 RGB, valid during the call only), and `finish` once after the last frame."""

    def see(self, number: int, frame: np.ndarray) -> None: ...

    def finish(self) -> None: ...


class ShotBoundaries(FrameWatcher, Protocol):
    """A watcher that finds where shots begin: `found` holds the first frame number of every new shot found
    so far, in order, and a boundary at frame n is found by the time frame n + `lag` has been seen."""

    lag: int
    found: list[int]


def cut_clips(
    reader, frames: Iterator[np.ndarray], with_frames: bool, watchers, shots, samples_at=()
) -> Iterator[Clip]:
    """The clips of `frames` (a reader's, at the target rate; the reader gives `cfg` and, once the first frame
    is out, `first_frame_s`): see ClipReader.clips."""
    cfg = reader.cfg
    clip_s = cfg.clip_frames / cfg.fps
    watchers = list(watchers) + ([shots] if shots is not None and shots not in watchers else [])
    window: list[np.ndarray] = []  # the converted frames own their buffers: no copy until a clip is cut
    state = {"clip_index": 0, "first": 0, "boundary": 0}

    def cut(n_real: int) -> Clip:
        clip_index, first = state["clip_index"], state["first"]
        # the grid's start times as they always were; after a shot boundary the clip starts at its frame
        start = reader.first_frame_s + (clip_index * clip_s if shots is None else first / cfg.fps)
        if with_frames:
            frames_out = np.stack(window + [window[-1]] * (cfg.clip_frames - n_real))
        else:
            frames_out = window[(n_real - 1) // 2][None].copy()
        state["clip_index"] += 1
        offsets = [int(share * n_real) for share in samples_at]
        return Clip(
            clip_index,
            round(start, 6),
            round(start + n_real / cfg.fps, 6),
            frames_out,
            n_real,
            n_real < cfg.clip_frames,
            first,
            tuple((offset, window[offset]) for offset in offsets),
        )

    def place(number: int, frame: np.ndarray) -> Iterator[Clip]:
        """Frame `number` into the current window: a shot beginning at it closes the window first."""
        found = shots.found if shots is not None else ()
        starts_shot = False
        while state["boundary"] < len(found) and found[state["boundary"]] <= number:
            starts_shot = starts_shot or found[state["boundary"]] == number
            state["boundary"] += 1
        if starts_shot and window:
            if len(window) >= cfg.min_clip_frames:
                yield cut(len(window))
            window.clear()
        if not window:
            state["first"] = number
        window.append(frame)
        if len(window) == cfg.clip_frames:
            yield cut(cfg.clip_frames)
            window.clear()

    waiting: deque[tuple[int, np.ndarray]] = deque()  # frames a boundary may still be found before
    lag = shots.lag if shots is not None else 0
    for number, frame in enumerate(frames):
        for watcher in watchers:
            watcher.see(number, frame)
        waiting.append((number, frame))
        while waiting and waiting[0][0] <= number - lag:
            yield from place(*waiting.popleft())
    for watcher in watchers:
        watcher.finish()
    while waiting:
        yield from place(*waiting.popleft())
    if len(window) >= cfg.min_clip_frames:
        yield cut(len(window))  # padded by repeating the last real frame
