"""make bench-decode: decode stage frames/s over a bare threaded PyAV decode with the same fps + scale
filter, measured side by side (alternating rounds, best of each) on the same file. Goal: >= 0.9."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import av
from common import machine, realdata_video, synthetic_video

from pipeline.config import load_config
from stages.decode.run import decode_video


def bare_pyav(path: Path, cfg) -> int:
    """The baseline: PyAV threaded decode through one FFmpeg graph (fps, scale, crop, rgb24)."""
    frames = 0
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        graph = None
        for frame in container.decode(stream):
            if graph is None:
                graph = av.filter.Graph()
                chain = [
                    graph.add_buffer(template=stream),
                    graph.add("fps", f"fps={cfg.fps}:round=up"),
                    graph.add("scale", f"{cfg.resize}:{cfg.resize}:flags=bilinear"),
                    graph.add("crop", f"{cfg.crop}:{cfg.crop}"),
                    graph.add("format", "rgb24"),
                    graph.add("buffersink"),
                ]
                for a, b in zip(chain, chain[1:]):
                    a.link_to(b)
                graph.configure()
            graph.push(frame)
            while True:
                try:
                    graph.pull().to_ndarray()
                    frames += 1
                except (BlockingIOError, EOFError, av.error.FFmpegError):
                    break
    return frames


def ffmpeg_cli(path: Path, cfg) -> int | None:
    if not shutil.which("ffmpeg"):
        return None
    command = [
        "ffmpeg",
        "-v",
        "error",
        "-i",
        str(path),
        "-vf",
        f"fps={cfg.fps},scale={cfg.resize}:{cfg.resize},crop={cfg.crop}:{cfg.crop}",
        "-pix_fmt",
        "rgb24",
        "-f",
        "rawvideo",
        "-",
    ]
    output = subprocess.run(command, capture_output=True, check=True).stdout
    return len(output) // (cfg.crop * cfg.crop * 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--video", type=Path, help="default: realdata big_buck_bunny_0_30.webm, else synthetic 720p")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cfg = load_config(None)
    video = args.video or realdata_video("big_buck_bunny_0_30.webm")
    if video is None:
        video = synthetic_video(Path(tempfile.mkdtemp()) / "synthetic_720p.mp4")
    row = {"video_id": "bench", "uri": str(video), "bytes": video.stat().st_size}
    runners = {
        "decode stage (clips + thumbnails)": lambda: sum(c["n_real_frames"] for c in decode_video(row, cfg)[0]),
        "bare threaded PyAV + fps/scale graph": lambda: bare_pyav(video, cfg.decode),
    }
    if shutil.which("ffmpeg"):
        runners["ffmpeg CLI (rawvideo to a pipe)"] = lambda: ffmpeg_cli(video, cfg.decode)
    best: dict[str, float] = {}
    frames: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, run in runners.items():
            started = time.perf_counter()
            frames[name] = run()
            rate = frames[name] / (time.perf_counter() - started)
            best[name] = max(best.get(name, 0.0), rate)
    print(f"machine: {machine()}")
    print(f"video: {video.name}; {args.rounds} alternating rounds, best of each")
    for name, rate in best.items():
        print(f"  {name:<40} {rate:8.1f} frames/s  ({frames[name]} frames)")
    stage, bare = best["decode stage (clips + thumbnails)"], best["bare threaded PyAV + fps/scale graph"]
    print(f"ratio stage / bare PyAV: {stage / bare:.2f}  (goal >= 0.9)")
    if "ffmpeg CLI (rawvideo to a pipe)" in best:
        print(f"ratio bare PyAV / ffmpeg CLI: {bare / best['ffmpeg CLI (rawvideo to a pipe)']:.2f}")


if __name__ == "__main__":
    main()
