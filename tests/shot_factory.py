"""Videos with known shot boundaries, made with PyAV: shots of textured pictures that pan and carry a moving
square (so that a shot is not a still), joined by hard cuts, cross-dissolves or fades through black of
known length. Each video comes with its truth: (kind, start_s, end_s) per transition, a cut's two times
equal (the first frame of the new shot)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np

# the transitions a video cycles through: a cut, dissolves and fades through black of 0.4 to 1.2 s at 25 fps
TRANSITIONS = ("cut", ("dissolve", 20), ("fade", 20), ("dissolve", 10), ("fade", 30), "cut")


def _texture(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A picture twice the frame's size to pan over: a base colour, discs of other colours, diagonal waves."""
    big_h, big_w = height * 2, width * 2
    yy, xx = np.mgrid[0:big_h, 0:big_w]
    image = np.empty((big_h, big_w, 3), np.float32)
    image[:] = rng.uniform(30, 220, 3)
    for _ in range(12):
        cy, cx, radius = rng.uniform(0, big_h), rng.uniform(0, big_w), rng.uniform(8, big_h / 3)
        image[((yy - cy) ** 2 + (xx - cx) ** 2) < radius * radius] = rng.uniform(0, 255, 3)
    waves = np.sin(xx / rng.uniform(3, 12) + yy / rng.uniform(3, 12)) * rng.uniform(5, 30)
    return np.clip(image + waves[..., None], 0, 255)


def _bounce(position: float, span: int) -> int:
    """A position moving at constant speed, reflected at 0 and `span`: motion without jumps."""
    return int(span - abs(position % (2 * span) - span))


def make_shot_video(
    path: Path,
    shot_frames: list[int],
    transitions: list,
    *,
    fps: float = 25.0,
    width: int = 160,
    height: int = 120,
    seed: int = 0,
) -> list[tuple[str, float, float]]:
    """Encode shots of these lengths (frames) joined by `transitions` ("cut", ("dissolve", n) or
    ("fade", n): n frames blending the end of one shot into the start of the next). Returns the truth:
    ("cut", t, t) with t the new shot's first frame's time, ("gradual", start_s, end_s) for the others."""
    rng = np.random.default_rng(seed)
    textures = [_texture(rng, height, width) for _ in shot_frames]
    speeds = [rng.uniform(-2, 2, 2) for _ in shot_frames]

    def frame(shot: int, index: int) -> np.ndarray:
        vy, vx = speeds[shot]
        y, x = _bounce(height / 2 + vy * index, height), _bounce(width / 2 + vx * index, width)
        picture = textures[shot][y : y + height, x : x + width].copy()
        cy, cx = _bounce(height / 3 + 2 * index, height - 20), _bounce(width / 3 + 3 * index, width - 20)
        picture[cy : cy + 20, cx : cx + 20] = 255 - picture[cy : cy + 20, cx : cx + 20]
        return picture

    frames: list[np.ndarray] = []
    truth = []
    for shot, length in enumerate(shot_frames):
        if shot == 0:
            frames += [frame(0, i) for i in range(length)]
            continue
        kind = transitions[shot - 1]
        if kind == "cut":
            truth.append(("cut", len(frames) / fps, len(frames) / fps))
            frames += [frame(shot, i) for i in range(length)]
            continue
        name, blend = kind
        start = len(frames) - blend // 2
        tail = frames[start:]
        del frames[start:]
        for j in range(blend):
            before = tail[j] if j < len(tail) else frame(shot - 1, shot_frames[shot - 1] + j - len(tail))
            after = frame(shot, j)
            alpha = (j + 1) / (blend + 1)
            if name == "dissolve":
                frames.append((1 - alpha) * before + alpha * after)
            else:  # through black: the old shot fades out, the new one in
                frames.append(before * max(0.0, 1 - 2 * alpha) if alpha < 0.5 else after * (2 * alpha - 1))
        truth.append(("gradual", start / fps, (start + blend) / fps))
        frames += [frame(shot, i) for i in range(blend, length)]
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "23"}
        for picture in frames:
            video_frame = av.VideoFrame.from_ndarray(np.clip(picture, 0, 255).astype(np.uint8), format="rgb24")
            for packet in stream.encode(video_frame.reformat(format="yuv420p")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return truth


def shot_videos(folder: Path, count: int, shots: int = 12, seed: int = 1) -> dict[Path, list]:
    """`count` videos of `shots` shots (30 to 90 frames each) cycling through TRANSITIONS: path -> truth."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    made = {}
    for video in range(count):
        lengths = [int(n) for n in rng.integers(30, 90, shots)]
        transitions = [TRANSITIONS[i % len(TRANSITIONS)] for i in range(shots - 1)]
        path = folder / f"shots_{video}.mp4"
        made[path] = make_shot_video(path, lengths, transitions, seed=seed * 100 + video)
    return made


def f1_scores(found: dict[Path, list], truth: dict[Path, list], cut_tolerance_s: float = 0.1) -> dict:
    """Boundary F1 per kind: a found cut matches a true cut within `cut_tolerance_s`; a found gradual
    boundary a true transition it lies within (0.3 s either side); each truth matched once."""
    counts = {kind: {"tp": 0, "fp": 0, "fn": 0} for kind in ("cut", "gradual")}
    for path, transitions in truth.items():
        for kind in ("cut", "gradual"):
            true = [(start, end) for k, start, end in transitions if k == kind]
            used = set()
            for time_s in [time for k, time in found.get(path, []) if k == kind]:
                hit = next(
                    (
                        i
                        for i, (start, end) in enumerate(true)
                        if i not in used
                        and (
                            abs(time_s - start) <= cut_tolerance_s
                            if kind == "cut"
                            else start - 0.3 <= time_s <= end + 0.3
                        )
                    ),
                    None,
                )
                if hit is None:
                    counts[kind]["fp"] += 1
                else:
                    used.add(hit)
                    counts[kind]["tp"] += 1
            counts[kind]["fn"] += len(true) - len(used)
    return {kind: 2 * c["tp"] / max(2 * c["tp"] + c["fp"] + c["fn"], 1) for kind, c in counts.items()} | {
        "counts": counts
    }
