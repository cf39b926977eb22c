#!/usr/bin/env python
"""Generate the demo sample videos and the speech/transcript test fixtures.

Run from the repository root:

    .venv/bin/python scripts/make_samples.py

The outputs are committed, so nobody needs to run this to use or test the project.
Regenerating them needs the ``espeak-ng`` command-line synthesiser (``apt-get install
espeak-ng``) besides PyAV and numpy; the product itself never needs espeak-ng or the
ffmpeg CLI.  All encoding and muxing goes through PyAV (libx264 + FFmpeg's native AAC).

Outputs
-------
samples/
    cooking_pasta.mp4, cooking_salad.mp4   English narration (espeak-ng), one visual scene per step
    recipes/recipe_NN.mp4                  ten short English recipes whose steps recur across videos, each step
                                           a still picture (the demo's training and held-out videos)
    recipes/splits.csv                     train.splits for the demo: the last two recipes are validation
    cooking_spanish.mp4                    Spanish narration (for the English-only text filter)
    no_audio.mp4                           video stream only, 480x270 at 30 fps
    music_only.mp4                         synthesized chords + melody, no speech
    narration.json                         per video: duration, audio, language, sentence times (English ones
                                           with their verbs and nouns: the demo's zero-shot labels), scenes
tests/fixtures/speech/
    narration_en.wav / narration_en.json   16 kHz mono int16 speech with known sentences and times
    silence.wav                            5 s of digital silence
    narration_en.srt / .vtt / _transcript.json / _auto.vtt   the same narration as import fixtures
    malformed.srt / malformed.vtt          each with one bad timestamp line

Sentence times: each espeak-ng utterance is trimmed of its trailing silence (espeak-ng starts
speaking at sample 0 and ends with ~0.4 s of exact zeros), then placed so that it starts exactly
at ``start_s``; ``end_s = start_s + trimmed duration``.  Times are deterministic for a given
espeak-ng version (recorded in narration.json); the layout (gaps, colours) uses a fixed seed.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import tempfile
import wave
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

# --------------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
SAMPLES_DIR = ROOT / "samples"
SPEECH_FIXTURES_DIR = ROOT / "tests" / "fixtures" / "speech"

SEED = 20190401  # layout randomness (gaps between sentences)
AUDIO_RATE = 16_000  # Hz, mono, for both the mp4 audio tracks and the fixture WAVs
ESPEAK_RATE = 22_050  # what espeak-ng writes
ESPEAK_SPEED = 150  # words per minute (espeak-ng -s)
ESPEAK_TRIM_THRESHOLD = 64  # |int16| above this counts as sound when trimming espeak output

VIDEO_SIZE = (320, 240)  # width, height of the cooking videos
VIDEO_FPS = 25
CRF = 32  # libx264 constant rate factor: small files, still clear shapes
GOP_SECONDS = 2  # a keyframe every 2 s, so seeking decoders stay cheap
AAC_BITRATE = 32_000

FIRST_SENTENCE_START_S = 2.0  # the narrations start this far into the video
GAP_RANGE_S = (0.8, 1.5)  # silence between sentences, drawn per gap, rounded to 0.1 s
TAIL_S = 2.0  # after the last sentence

# each English sentence with the verbs and nouns a cook would name in it (recorded in narration.json: the demo's
# zero-shot labels, scripts/demo_labels.py)
PASTA_SENTENCES = [
    ("Today we are going to cook a simple tomato pasta.", ["cook"], ["pasta", "tomato"]),
    ("First, fill a large pot with water and bring it to a boil.", ["fill", "boil"], ["pot", "water"]),
    ("Now let me show you how to chop the onion.", ["chop"], ["onion"]),
    ("Add the pasta to the boiling water and stir it well.", ["add", "stir", "boil"], ["pasta", "water"]),
    ("Finally, pour the tomato sauce over the pasta and serve it.", ["pour", "serve"], ["sauce", "pasta", "tomato"]),
]
SALAD_SENTENCES = [
    ("Let me show you how to make a fresh green salad.", ["make"], ["salad"]),
    ("First, wash the lettuce under cold water.", ["wash"], ["lettuce", "water"]),
    ("Now cut the tomatoes into small pieces.", ["cut"], ["tomatoes", "tomato"]),
    ("Slice the cucumber and add it to the bowl.", ["slice", "add"], ["cucumber", "bowl"]),
    ("Mix the olive oil with a little lemon juice.", ["mix"], ["oil", "juice"]),
    ("Pour the dressing over the salad and toss it.", ["pour", "toss"], ["dressing", "salad"]),
]
SPANISH_SENTENCES = [
    "Hoy vamos a preparar una tortilla de patatas.",
    "Primero, pela las patatas y córtalas en rodajas finas.",
    "Ahora bate los huevos en un cuenco grande.",
    "Finalmente, cocina la tortilla a fuego lento.",
]

# The demo's recipes: four or five steps each from the pasta and salad videos' scenes, each step said in one of
# three wordings, so that every step of a held-out recipe, and the words it is said in, are shown by training
# recipes (sentences in wordings never trained on are the learning benchmark's question, not the demo's: with
# them, held-out positives fell to 0.0-0.3). Each step is a still picture (the scene's first frame): with moving
# scenes the random S3D gave a step a different mix of the 36 visual words in each video (the phase of its
# motion under the 1.5 s clips), and the held-out alignment of the small preset stayed at 0.44-0.67 over three
# seeds.
# step (= scene): (wordings, the verbs and nouns a cook would name in them)
RECIPE_STEPS = {
    "boil": (
        [
            "Bring a large pot of water to the boil.",
            "Boil the water in a big pot.",
            "Heat the pot of water until it boils.",
        ],
        ["boil", "bring", "heat"],
        ["water", "pot"],
    ),
    "chop": (
        ["Chop the onion into small pieces.", "Now chop the onion finely.", "Use a sharp knife to chop the onion."],
        ["chop"],
        ["onion"],
    ),
    "pasta": (
        [
            "Add the pasta to the boiling water.",
            "Put the pasta in the pot and stir it.",
            "Stir the pasta so it does not stick.",
        ],
        ["add", "put", "stir"],
        ["pasta"],
    ),
    "sauce": (
        ["Pour the tomato sauce over the pasta.", "Spoon the red sauce on top.", "Warm the tomato sauce in a pan."],
        ["pour", "spoon", "warm"],
        ["sauce"],
    ),
    "wash": (
        ["Wash the lettuce under cold water.", "Rinse the lettuce leaves in the sink.", "Wash the fresh lettuce well."],
        ["wash", "rinse"],
        ["lettuce"],
    ),
    "cut": (
        ["Cut the tomatoes into small pieces.", "Now cut the tomatoes in half.", "Cut the ripe tomatoes with a knife."],
        ["cut"],
        ["tomatoes", "tomato"],
    ),
    "slice": (
        ["Slice the cucumber into thin rounds.", "Now slice the cucumber.", "Slice the green cucumber for the bowl."],
        ["slice"],
        ["cucumber"],
    ),
    "oil": (
        [
            "Mix the olive oil with a little lemon juice.",
            "Drizzle some olive oil into the bowl.",
            "Whisk the oil and the lemon juice.",
        ],
        ["mix", "drizzle", "whisk"],
        ["oil", "juice"],
    ),
    "toss": (
        ["Toss the salad with the dressing.", "Toss everything together in the bowl.", "Gently toss the green salad."],
        ["toss"],
        ["salad", "dressing"],
    ),
}
# each recipe's steps. The last two are the demo's held-out videos: each of their steps is in at least three
# training recipes, and they share none, so that a held-out negative (the other held-out video's clips) never
# shows the step its sentence names.
RECIPES = [
    ["wash", "cut", "slice", "toss"],
    ["boil", "pasta", "sauce", "toss"],
    ["chop", "oil", "sauce", "pasta"],
    ["wash", "chop", "boil", "oil"],
    ["cut", "slice", "oil", "toss"],
    ["boil", "chop", "pasta", "cut"],
    ["wash", "slice", "sauce", "oil"],
    ["boil", "sauce", "chop", "toss"],
    ["chop", "cut", "boil", "toss"],
    ["wash", "pasta", "oil", "slice", "sauce"],
]
RECIPE_HELD_OUT = 2
RECIPE_SEED = 20190402  # the recipes' own gaps, so that the other samples' layout does not move
# longer pauses than the other samples' (at 0.8-1.5 s Whisper base ran a recipe's four sentences into one), and
# slower speech: a sentence spans 2-3 clips of 1.5 s, not 1-2
RECIPE_GAP_RANGE_S = (1.2, 1.6)
RECIPE_SPEECH_SPEED = 115
# and every step starts on the pipeline's clip grid, its sentence CLIP_LEAD_S later: a clip that began in the
# step before (half of it over the sentence, so aligned with it) gave the sentence a visual word of the wrong
# step (Whisper's sentence starts were up to 0.4 s early)
CLIP_S = 1.5  # the pipeline's clips: 30 frames at 20 fps
CLIP_LEAD_S = 0.5

NO_AUDIO_SIZE = (480, 270)
NO_AUDIO_FPS = 30
NO_AUDIO_SCENE_S = 4.0
NO_AUDIO_SCENES = 4  # 16 s

MUSIC_SIZE = (320, 240)
MUSIC_FPS = 30
MUSIC_CHORD_S = 4.5
# (root MIDI note, chord intervals): C major, A minor, F major, G major -> 18 s
MUSIC_CHORDS = [(48, (0, 4, 7)), (45, (0, 3, 7)), (41, (0, 4, 7)), (43, (0, 4, 7))]
MUSIC_MELODY = [
    72,
    74,
    76,
    79,
    76,
    74,
    72,
    69,
    72,
    76,
    77,
    76,
    74,
    72,
    71,
    74,
    72,
    69,
    72,
    74,
    76,
    74,
    72,
    67,
    71,
    74,
    79,
    77,
    76,
    74,
    72,
    71,
    72,
    72,
    72,
    72,
]
MUSIC_NOTE_S = 0.5

# The speech fixture: speech starts at 3 s, pauses > 1.5 s so caption importers can split on them.
FIXTURE_SENTENCES = [
    "Now let me show you how to chop the onion.",
    "Put the onion in a hot pan with some oil.",
    "Stir it until it turns golden brown.",
]
FIXTURE_FIRST_START_S = 3.0
FIXTURE_GAP_S = 1.8
FIXTURE_TAIL_S = 0.5
FIXTURE_SILENCE_S = 5.0
AUTO_CAPTION_WORDS_PER_CUE = 3

# One visual scene per narration step: (label, pattern, two RGB colours).  The colours and patterns
# differ strongly between steps so that visual-word clustering has something to find.
SCENES = {
    "title": ("title", "bars", (40, 40, 48), (230, 230, 230)),
    "boil": ("boil", "rings", (20, 60, 200), (200, 230, 255)),
    "chop": ("chop", "checker", (245, 245, 235), (120, 70, 30)),
    "pasta": ("pasta", "stripes", (250, 210, 60), (200, 120, 20)),
    "sauce": ("sauce", "dots", (190, 20, 20), (255, 140, 100)),
    "wash": ("wash", "waves", (60, 170, 220), (230, 250, 255)),
    "cut": ("cut", "checker", (230, 40, 50), (250, 220, 210)),
    "slice": ("slice", "rings", (40, 160, 60), (210, 250, 200)),
    "oil": ("oil", "gradient", (200, 190, 40), (90, 70, 10)),
    "toss": ("toss", "stripes", (30, 120, 40), (160, 220, 90)),
    "potato": ("potato", "dots", (220, 190, 140), (120, 80, 40)),
    "egg": ("egg", "waves", (255, 230, 90), (250, 250, 240)),
    "pan": ("pan", "gradient", (60, 60, 70), (250, 160, 40)),
    "outro": ("outro", "bars", (20, 20, 20), (120, 120, 120)),
}
PASTA_SCENES = ["title", "boil", "chop", "pasta", "sauce"]
SALAD_SCENES = ["title", "wash", "cut", "slice", "oil", "toss"]
SPANISH_SCENES = ["title", "potato", "egg", "pan"]
NO_AUDIO_SCENE_NAMES = ["boil", "cut", "oil", "egg"]
MUSIC_SCENE_NAMES = ["rings_blue", "stripes_purple", "dots_teal", "waves_orange"]
SCENES.update(
    {
        "rings_blue": ("rings_blue", "rings", (10, 20, 90), (80, 160, 255)),
        "stripes_purple": ("stripes_purple", "stripes", (90, 20, 120), (230, 150, 250)),
        "dots_teal": ("dots_teal", "dots", (0, 110, 110), (180, 255, 230)),
        "waves_orange": ("waves_orange", "waves", (230, 110, 0), (255, 220, 150)),
    }
)


# --------------------------------------------------------------------------------------------
# Audio helpers
# --------------------------------------------------------------------------------------------


def espeak_version(binary: str = "espeak-ng") -> str:
    out = subprocess.run([binary, "--version"], check=True, capture_output=True, text=True)
    return out.stdout.split("Data at")[0].strip()


def espeak_pcm(text: str, voice: str, speed: int = ESPEAK_SPEED, binary: str = "espeak-ng") -> tuple[np.ndarray, int]:
    """`text` spoken by espeak-ng at `speed` words per minute: int16 mono samples with the leading and
    trailing silence trimmed, and their rate."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speech.wav"
        subprocess.run([binary, "-v", voice, "-s", str(speed), "-w", str(path), text], check=True, capture_output=True)
        with wave.open(str(path)) as w:
            assert w.getnchannels() == 1 and w.getsampwidth() == 2, "unexpected espeak-ng output"
            rate = w.getframerate()
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    loud = np.nonzero(np.abs(pcm.astype(np.int32)) > ESPEAK_TRIM_THRESHOLD)[0]
    if not loud.size:
        raise RuntimeError(f"espeak-ng made silence for {text!r}")
    return pcm[loud[0] : loud[-1] + 1], rate


def synthesize(text: str, voice: str, speed: int = ESPEAK_SPEED) -> np.ndarray:
    """Speak `text` with espeak-ng at `speed` words per minute; return float32 mono at AUDIO_RATE, trailing
    silence trimmed."""
    pcm, rate = espeak_pcm(text, voice, speed)
    speech = resample(pcm.astype(np.float64) / 32768.0, rate, AUDIO_RATE)
    rms = float(np.sqrt(np.mean(speech**2)))
    assert rms > 0.02, f"espeak-ng output too quiet (rms {rms:.4f}) for {text!r}"
    return speech.astype(np.float32)


def resample(x: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Band-limited FFT resampling; fine for short clips that start and end near zero."""
    if rate_in == rate_out:
        return x
    n_out = int(round(len(x) * rate_out / rate_in))
    spectrum = np.fft.rfft(x)
    keep = min(len(spectrum), n_out // 2 + 1)
    out_spec = np.zeros(n_out // 2 + 1, dtype=complex)
    out_spec[:keep] = spectrum[:keep]
    return np.fft.irfft(out_spec, n_out) * (n_out / len(x))


def on_10ms_grid(t: float) -> float:
    return math.ceil(t * 100) / 100


def on_clip_grid(t: float) -> float:
    """CLIP_LEAD_S after the first multiple of CLIP_S (the pipeline's clip length) at or after `t`."""
    return math.ceil(t / CLIP_S - 1e-9) * CLIP_S + CLIP_LEAD_S


def layout_narration(
    speeches: list[np.ndarray], first_start: float, gaps: list[float], snap=on_10ms_grid
) -> list[tuple[float, float]]:
    """Start/end times (s) for consecutive utterances: each starts where `snap` puts the earliest time it may,
    `first_start` for the first, its gap after the end of the one before for the others."""
    times, earliest = [], first_start
    for i, speech in enumerate(speeches):
        start = snap(earliest)
        end = start + len(speech) / AUDIO_RATE
        times.append((round(start, 3), round(end, 3)))
        if i < len(gaps):
            earliest = end + gaps[i]
    return times


def mix_track(speeches: list[np.ndarray], times: list[tuple[float, float]], duration: float) -> np.ndarray:
    track = np.zeros(int(round(duration * AUDIO_RATE)), dtype=np.float32)
    for speech, (start, _) in zip(speeches, times):
        i = int(round(start * AUDIO_RATE))
        track[i : i + len(speech)] += speech
    return track


def write_wav(path: Path, samples: np.ndarray) -> None:
    pcm = np.clip(np.round(samples * 32767.0), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(AUDIO_RATE)
        w.writeframes(pcm.tobytes())


def midi_hz(note: int) -> float:
    return 440.0 * 2.0 ** ((note - 69) / 12.0)


def tone(freq: float, seconds: float, harmonics: int, attack: float, release: float) -> np.ndarray:
    """A band-limited saw-ish tone (1/k harmonics) with a linear attack / exponential release."""
    t = np.arange(int(round(seconds * AUDIO_RATE))) / AUDIO_RATE
    wave_ = np.zeros_like(t)
    for k in range(1, harmonics + 1):
        if k * freq < AUDIO_RATE / 2 * 0.9:
            wave_ += np.sin(2 * np.pi * k * freq * t) / k
    env = np.minimum(1.0, t / attack) * np.exp(-t / release)
    fade = np.minimum(1.0, (seconds - t) / 0.02)  # no click at the end of the note
    return wave_ * env * fade


# --------------------------------------------------------------------------------------------
# Picture helpers
# --------------------------------------------------------------------------------------------


def draw_frame(scene: str, t: float, size: tuple[int, int], grid: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """One RGB frame of `scene` at scene-local time `t` (s): a moving pattern plus moving shapes."""
    _, pattern, c0, c1 = SCENES[scene]
    w, h = size
    yy, xx = grid  # float pixel coordinates
    c0 = np.array(c0, dtype=np.float32)
    c1 = np.array(c1, dtype=np.float32)
    if pattern == "stripes":
        mix = (np.sin((xx + yy) * 0.08 - t * 3.0) > 0).astype(np.float32)
    elif pattern == "checker":
        cell = 32
        mix = (((xx + t * 20) // cell + yy // cell) % 2).astype(np.float32)
    elif pattern == "rings":
        r = np.hypot(xx - w / 2, yy - h / 2)
        mix = (np.sin(r * 0.15 - t * 4.0) > 0.3).astype(np.float32)
    elif pattern == "dots":
        mix = ((np.sin(xx * 0.2 + t) * np.sin(yy * 0.2 - t)) > 0.5).astype(np.float32)
    elif pattern == "waves":
        mix = 0.5 + 0.5 * np.sin(yy * 0.06 + 2.0 * np.sin(xx * 0.03 + t * 2.0))
    elif pattern == "gradient":
        mix = np.clip(xx / w + 0.25 * np.sin(t * 1.5), 0, 1)
    elif pattern == "bars":
        mix = (((xx + t * 40) % 80) < 12).astype(np.float32)
    else:
        raise ValueError(pattern)
    img = c0 + (c1 - c0) * mix[..., None]

    # A bouncing disc (the "ingredient") and a sweeping bar (the "knife / spoon").
    cx = w * (0.5 + 0.35 * math.sin(t * 1.7))
    cy = h * (0.5 + 0.30 * math.sin(t * 2.3 + 1.0))
    disc = (xx - cx) ** 2 + (yy - cy) ** 2 < (min(w, h) * 0.12) ** 2
    img[disc] = 255.0 - c0
    bar_x = (w * (0.5 + 0.45 * math.sin(t * 1.1))) % w
    bar = (np.abs(xx - bar_x) < 5) & (yy > h * 0.15) & (yy < h * 0.85)
    img[bar] = 255.0 - c1
    return img.astype(np.uint8)


def make_grid(size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    return yy, xx


def scene_at(scenes: list[tuple[str, float, float]], t: float) -> tuple[str, float]:
    """The scene covering time t and the time since it began."""
    for name, start, end in scenes:
        if start <= t < end:
            return name, t - start
    name, start, _ = scenes[-1]
    return name, t - start


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


def encode_mp4(
    path: Path,
    scenes: list[tuple[str, float, float]],
    duration: float,
    size: tuple[int, int],
    fps: int,
    audio: np.ndarray | None,
    still: bool = False,
) -> None:
    """Write an H.264 (+ AAC mono) mp4 with PyAV.  `audio` is float32 at AUDIO_RATE or None.  `still`: each
    scene is its first frame throughout."""
    n_frames = int(round(duration * fps))
    grid = make_grid(size)
    with av.open(
        str(path), "w", format="mp4", container_options={"movflags": "+faststart", "fflags": "+bitexact"}
    ) as container:
        video = container.add_stream("libx264", rate=fps)
        video.width, video.height = size
        video.pix_fmt = "yuv420p"
        video.codec_context.gop_size = GOP_SECONDS * fps
        # Reproducible bytes: x264's SIMD macroblock-tree code gave different bitstreams from run
        # to run (even in one process, one thread); cpu-independent=1 selects its C version.  One
        # thread too, so the output does not depend on the machine's core count.
        video.options = {"crf": str(CRF), "preset": "medium", "x264-params": "cpu-independent=1"}
        video.codec_context.thread_count = 1
        video.codec_context.flags |= av.codec.context.Flags.bitexact
        astream = None
        if audio is not None:
            astream = container.add_stream("aac", rate=AUDIO_RATE, layout="mono")
            astream.bit_rate = AAC_BITRATE
            astream.codec_context.flags |= av.codec.context.Flags.bitexact

        for i in range(n_frames):
            name, local_t = scene_at(scenes, i / fps)
            frame = av.VideoFrame.from_ndarray(draw_frame(name, 0.0 if still else local_t, size, grid), format="rgb24")
            frame.pts = i
            frame.time_base = Fraction(1, fps)
            container.mux(video.encode(frame))
        container.mux(video.encode(None))

        if astream is not None:
            chunk = 1024
            for start in range(0, len(audio), chunk):
                block = np.ascontiguousarray(audio[None, start : start + chunk], dtype=np.float32)
                aframe = av.AudioFrame.from_ndarray(block, format="fltp", layout="mono")
                aframe.sample_rate = AUDIO_RATE
                aframe.pts = start
                aframe.time_base = Fraction(1, AUDIO_RATE)
                container.mux(astream.encode(aframe))
            container.mux(astream.encode(None))


# --------------------------------------------------------------------------------------------
# One function per video kind
# --------------------------------------------------------------------------------------------


def narrated_video(
    name: str,
    sentences: list[tuple[str, list[str], list[str]] | str],
    scene_names: list[str],
    voice: str,
    language: str,
    rng: np.random.Generator,
    recipe: bool = False,
) -> dict:
    """A cooking-like video: one scene per sentence (the first also over the silent lead-in), with narration.
    A sentence is its text, or (text, verbs, nouns): its labels, recorded beside its times. `recipe`: paced
    and drawn as the demo's recipes are (RECIPE_GAP_RANGE_S, RECIPE_SPEECH_SPEED, still pictures, steps on
    the clip grid)."""
    assert len(scene_names) == len(sentences), "one scene per step"
    labels = [{} if isinstance(s, str) else {"verbs": s[1], "nouns": s[2]} for s in sentences]
    sentences = [s if isinstance(s, str) else s[0] for s in sentences]
    speeches = [synthesize(s, voice, RECIPE_SPEECH_SPEED if recipe else ESPEAK_SPEED) for s in sentences]
    gaps = [round(float(rng.uniform(*(RECIPE_GAP_RANGE_S if recipe else GAP_RANGE_S))), 1) for _ in sentences[1:]]
    times = layout_narration(speeches, FIRST_SENTENCE_START_S, gaps, on_clip_grid if recipe else on_10ms_grid)
    duration = math.ceil((times[-1][1] + TAIL_S) * VIDEO_FPS) / VIDEO_FPS

    # Scene k covers step k, from its sentence's start (on a clip grid: the grid point before it) to the next
    # one; scene 0 (the title card of the pasta and salad videos, a recipe's first step) also covers the silent
    # lead-in from 0 s.
    starts = [t[0] - CLIP_LEAD_S if recipe else t[0] for t in times]
    bounds = [0.0] + starts[1:] + [duration]
    scenes = [(scene_names[k], bounds[k], bounds[k + 1]) for k in range(len(sentences))]
    track = mix_track(speeches, times, duration)
    encode_mp4(SAMPLES_DIR / name, scenes, duration, VIDEO_SIZE, VIDEO_FPS, track, still=recipe)
    return {
        "duration_s": duration,
        "has_audio": True,
        "language": language,
        "width": VIDEO_SIZE[0],
        "height": VIDEO_SIZE[1],
        "fps": VIDEO_FPS,
        "audio_sample_rate": AUDIO_RATE,
        "sentences": [
            {"text": s, "start_s": a, "end_s": b, **label} for s, (a, b), label in zip(sentences, times, labels)
        ],
        "scenes": [{"label": n, "start_s": round(a, 3), "end_s": round(b, 3)} for n, a, b in scenes],
    }


def cooking_pasta(rng: np.random.Generator) -> dict:
    return narrated_video("cooking_pasta.mp4", PASTA_SENTENCES, PASTA_SCENES, "en-us", "en", rng)


def cooking_salad(rng: np.random.Generator) -> dict:
    return narrated_video("cooking_salad.mp4", SALAD_SENTENCES, SALAD_SCENES, "en-us", "en", rng)


def cooking_spanish(rng: np.random.Generator) -> dict:
    return narrated_video("cooking_spanish.mp4", SPANISH_SENTENCES, SPANISH_SCENES, "es", "es", rng)


def recipe_name(number: int) -> str:
    return f"recipes/recipe_{number:02d}.mp4"


def recipes() -> dict:
    """RECIPES as narrated videos: the n-th time a step comes (in recipe order), it is said in wording n mod 3, so
    that the training recipes say each step in all three wordings (each step is in at least three of them)."""
    rng = np.random.default_rng(RECIPE_SEED)
    (SAMPLES_DIR / "recipes").mkdir(exist_ok=True)
    videos, said = {}, {step: 0 for step in RECIPE_STEPS}
    for number, steps in enumerate(RECIPES, start=1):
        sentences = []
        for step in steps:
            wordings, verbs, nouns = RECIPE_STEPS[step]
            sentences.append((wordings[said[step] % len(wordings)], verbs, nouns))
            said[step] += 1
        videos[recipe_name(number)] = narrated_video(
            recipe_name(number), sentences, steps, "en-us", "en", rng, recipe=True
        )
    return videos


def write_recipe_splits() -> None:
    """samples/recipes/splits.csv (train.splits): the last RECIPE_HELD_OUT recipes are validation videos."""
    sys.path.insert(0, str(ROOT))
    from pipeline.engine.manifest import make_video_id

    rows = ["video_id,split"]
    for number in range(1, len(RECIPES) + 1):
        split = "validation" if number > len(RECIPES) - RECIPE_HELD_OUT else "train"
        rows.append(f"{make_video_id(recipe_name(number))},{split}")
    write_text(SAMPLES_DIR / "recipes" / "splits.csv", "\n".join(rows) + "\n")


def no_audio() -> dict:
    """Video stream only (no audio stream at all), 16:9 at 30 fps to vary the input format."""
    duration = NO_AUDIO_SCENE_S * NO_AUDIO_SCENES
    scenes = [(n, k * NO_AUDIO_SCENE_S, (k + 1) * NO_AUDIO_SCENE_S) for k, n in enumerate(NO_AUDIO_SCENE_NAMES)]
    encode_mp4(SAMPLES_DIR / "no_audio.mp4", scenes, duration, NO_AUDIO_SIZE, NO_AUDIO_FPS, None)
    return {
        "duration_s": duration,
        "has_audio": False,
        "language": None,
        "width": NO_AUDIO_SIZE[0],
        "height": NO_AUDIO_SIZE[1],
        "fps": NO_AUDIO_FPS,
        "audio_sample_rate": None,
        "sentences": [],
        "scenes": [{"label": n, "start_s": a, "end_s": b} for n, a, b in scenes],
    }


def music_only() -> dict:
    """Chords (saw-ish pads) plus a plucked sine melody; no speech.  One scene per chord."""
    duration = MUSIC_CHORD_S * len(MUSIC_CHORDS)
    track = np.zeros(int(round(duration * AUDIO_RATE)), dtype=np.float64)
    for k, (root, intervals) in enumerate(MUSIC_CHORDS):
        i0 = int(round(k * MUSIC_CHORD_S * AUDIO_RATE))
        for iv in intervals:
            note = tone(midi_hz(root + iv), MUSIC_CHORD_S, harmonics=8, attack=0.08, release=3.0)
            track[i0 : i0 + len(note)] += 0.12 * note
    for k, midi in enumerate(MUSIC_MELODY):
        i0 = int(round(k * MUSIC_NOTE_S * AUDIO_RATE))
        note = tone(midi_hz(midi), MUSIC_NOTE_S, harmonics=2, attack=0.01, release=0.25)
        track[i0 : i0 + len(note)] += 0.25 * note[: len(track) - i0]
    track *= 0.7 / np.max(np.abs(track))
    scenes = [(n, k * MUSIC_CHORD_S, (k + 1) * MUSIC_CHORD_S) for k, n in enumerate(MUSIC_SCENE_NAMES)]
    encode_mp4(SAMPLES_DIR / "music_only.mp4", scenes, duration, MUSIC_SIZE, MUSIC_FPS, track.astype(np.float32))
    return {
        "duration_s": duration,
        "has_audio": True,
        "language": None,
        "width": MUSIC_SIZE[0],
        "height": MUSIC_SIZE[1],
        "fps": MUSIC_FPS,
        "audio_sample_rate": AUDIO_RATE,
        "sentences": [],
        "scenes": [{"label": n, "start_s": a, "end_s": b} for n, a, b in scenes],
    }


# --------------------------------------------------------------------------------------------
# Speech fixtures and transcript import fixtures
# --------------------------------------------------------------------------------------------


def _ts(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def srt_text(cues: list[tuple[float, float, str]]) -> str:
    blocks = [f"{i}\n{_ts(a, ',')} --> {_ts(b, ',')}\n{text}\n" for i, (a, b, text) in enumerate(cues, 1)]
    return "\n".join(blocks)


def vtt_text(cues: list[tuple[float, float, str]], header: str = "WEBVTT") -> str:
    blocks = [f"{_ts(a, '.')} --> {_ts(b, '.')}\n{text}\n" for a, b, text in cues]
    return header + "\n\n" + "\n".join(blocks)


def auto_caption_cues(sentences: list[dict]) -> list[tuple[float, float, str]]:
    """YouTube auto-caption style: lower case, no punctuation, a few words per cue.  Cue times
    inside a sentence are split in proportion to character counts (approximate word timing)."""
    cues = []
    for s in sentences:
        words = "".join(c for c in s["text"].lower() if c.isalnum() or c in " '").split()
        chunks = [words[i : i + AUTO_CAPTION_WORDS_PER_CUE] for i in range(0, len(words), AUTO_CAPTION_WORDS_PER_CUE)]
        total = sum(len(" ".join(c)) for c in chunks)
        t = s["start_s"]
        for chunk in chunks:
            text = " ".join(chunk)
            dt = (s["end_s"] - s["start_s"]) * len(text) / total
            cues.append((t, t + dt, text))
            t += dt
    return [(round(a, 3), round(b, 3), text) for a, b, text in cues]


def speech_fixtures() -> dict:
    out = SPEECH_FIXTURES_DIR
    speeches = [synthesize(s, "en-us") for s in FIXTURE_SENTENCES]
    times = layout_narration(speeches, FIXTURE_FIRST_START_S, [FIXTURE_GAP_S] * (len(speeches) - 1))
    duration = math.ceil((times[-1][1] + FIXTURE_TAIL_S) * 10) / 10
    write_wav(out / "narration_en.wav", mix_track(speeches, times, duration))
    write_wav(out / "silence.wav", np.zeros(int(FIXTURE_SILENCE_S * AUDIO_RATE), np.float32))

    sentences = [{"text": s, "start_s": a, "end_s": b} for s, (a, b) in zip(FIXTURE_SENTENCES, times)]
    meta = {
        "audio": "narration_en.wav",
        "sample_rate": AUDIO_RATE,
        "duration_s": duration,
        "language": "en",
        "sentences": sentences,
        "silence": {"audio": "silence.wav", "duration_s": FIXTURE_SILENCE_S},
        "imports": {
            "narration_en.srt": "SRT, one cue per sentence",
            "narration_en.vtt": "WebVTT, one cue per sentence",
            "narration_en_transcript.json": "JSON list of {text, start, end} (seconds)",
            "narration_en_auto.vtt": "auto-caption style WebVTT: lower case, no punctuation, "
            f"{AUTO_CAPTION_WORDS_PER_CUE} words per cue, cue times "
            "within a sentence approximate; pauses between sentences "
            f"{FIXTURE_GAP_S} s",
            "malformed.srt": "SRT whose second cue has a bad timestamp line",
            "malformed.vtt": "WebVTT whose second cue has a bad timestamp line",
        },
    }
    write_json(out / "narration_en.json", meta)

    cues = [(s["start_s"], s["end_s"], s["text"]) for s in sentences]
    write_text(out / "narration_en.srt", srt_text(cues))
    write_text(out / "narration_en.vtt", vtt_text(cues))
    write_json(out / "narration_en_transcript.json", [{"text": t, "start": a, "end": b} for a, b, t in cues])
    write_text(
        out / "narration_en_auto.vtt",
        vtt_text(auto_caption_cues(sentences), header="WEBVTT\nKind: captions\nLanguage: en"),
    )

    bad_srt = srt_text(cues).splitlines()
    bad_vtt = vtt_text(cues).splitlines()
    bad_srt[bad_srt.index(f"{_ts(cues[1][0], ',')} --> {_ts(cues[1][1], ',')}")] = "00:00:07,5OO -> 00:00:1O,000"
    bad_vtt[bad_vtt.index(f"{_ts(cues[1][0], '.')} --> {_ts(cues[1][1], '.')}")] = "00:07.500 --> 00:xx:10.000"
    write_text(out / "malformed.srt", "\n".join(bad_srt) + "\n")
    write_text(out / "malformed.vtt", "\n".join(bad_vtt) + "\n")
    return meta


# --------------------------------------------------------------------------------------------


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def main() -> None:
    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng is needed to regenerate the samples: apt-get install espeak-ng")
    SAMPLES_DIR.mkdir(exist_ok=True)
    SPEECH_FIXTURES_DIR.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)

    videos = {
        "cooking_pasta.mp4": cooking_pasta(rng),
        "cooking_salad.mp4": cooking_salad(rng),
        "cooking_spanish.mp4": cooking_spanish(rng),
        "no_audio.mp4": no_audio(),
        "music_only.mp4": music_only(),
        **recipes(),
    }
    write_recipe_splits()
    write_json(
        SAMPLES_DIR / "narration.json",
        {
            "generator": "scripts/make_samples.py",
            "espeak_ng": espeak_version(),
            "note": "sentence times: espeak-ng speech placed at start_s, end_s = start_s + speech "
            "length with espeak's trailing silence trimmed; scenes: the visual step shown",
            "videos": videos,
        },
    )
    # the Spanish video ships no captions: the multilingual Whisper detects its language, and align
    # keeps no text from it (tests/test_asr.py and tests/test_pipeline_e2e.py check both)
    speech_fixtures()
    for name, v in videos.items():
        print(
            f"{name}: {v['duration_s']:.2f} s, audio={v['has_audio']}, lang={v['language']}, "
            f"{len(v['sentences'])} sentences"
        )


if __name__ == "__main__":
    main()
