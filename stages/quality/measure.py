"""What the quality stage judges of each clip, measured in the visual pass on the frames as the model sees
them (the decode stage writes the figures into its clip index): a watcher of the clip reader's frames
(pipeline.media.video.FrameWatcher). Luma is BT.601's on a 56 x 56 copy of each frame (block means: the
figures of a 224 crop within 0.1 of a level, at a sixteenth of the work)."""

from __future__ import annotations

import cv2
import numpy as np

SIDE = 56


class ClipMeasure:
    """Per frame: its mean luma, its spatial luma std and its mean absolute luma change from the frame
    before; `clip(first, count)` gives a clip's figures and forgets the frames before it."""

    def __init__(self):
        self.frames: dict[int, tuple[float, float, float]] = {}
        self.previous: np.ndarray | None = None

    def see(self, number: int, frame: np.ndarray) -> None:
        gray = cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY)
        small = cv2.resize(gray, (SIDE, SIDE), interpolation=cv2.INTER_AREA).astype(np.float32)
        change = float(np.abs(small - self.previous).mean()) if self.previous is not None else 0.0
        self.frames[number] = (float(small.mean()), float(small.std()), change)
        self.previous = small

    def finish(self) -> None:
        pass

    def clip(self, first: int, count: int) -> dict[str, float]:
        """luma_mean, luma_contrast, motion_mean and motion_max of frames first .. first + count - 1 (the
        changes between the clip's own frames: a one-frame clip has none, 0)."""
        rows = [self.frames[number] for number in range(first, first + count)]
        changes = [change for _, _, change in rows[1:]]
        for old in [number for number in self.frames if number < first + count]:
            del self.frames[old]
        figures = {
            "luma_mean": np.mean([mean for mean, _, _ in rows]),
            "luma_contrast": np.mean([std for _, std, _ in rows]),
            "motion_mean": np.mean(changes) if changes else 0.0,
            "motion_max": np.max(changes) if changes else 0.0,
        }
        # as the clip index stores them (float32): a row in memory equals the row read back
        return {name: float(np.float32(value)) for name, value in figures.items()}
