"""Inputs that would make a stage wait forever: a FIFO, a device or a socket listed as a video is refused
without being opened, by every stage that reads videos (decode, features and asr)."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bad_input_corpus import make_speech_video
from pipeline import io, media, runner
from pipeline.config import load_config
from pipeline.media import ClipReader, NotARegularFile
from stages import asr

REPO = Path(__file__).resolve().parent.parent
# the smallest clips S3D takes, random weights, decoding in the stage's own process
SETTINGS = ["features.weights=random", "decode.clip_frames=14", "decode.min_clip_frames=7",
            "features.batch_size=1", "features.decode_workers=0"]

# manifest, then decode, features and asr on shard 0, in a child process: a stage that opened a FIFO would
# block forever, and the test's time limit turns that into a failure instead of a hung test run
STAGES_IN_A_CHILD = """
import sys
from pathlib import Path
from pipeline import runner
from pipeline.config import load_config
from pipeline.manifest import write_manifest
work, listing, *overrides = sys.argv[1:]
cfg = load_config(None, overrides)
write_manifest(cfg, listing, Path(work))
for stage in ("decode", "features", "asr"):
    runner.run_one_shard(cfg, Path(work), stage, 0, quiet=True)
"""


def _run_stages_in_a_child(work: Path, listing: Path, settings: list[str], limit_s: float) -> None:
    subprocess.run([sys.executable, "-c", STAGES_IN_A_CHILD, str(work), str(listing), *settings], cwd=REPO,
                   check=True, timeout=limit_s)


def _errors(work: Path, stage: str) -> dict[str, dict]:
    return {row["video_id"]: row for row in pq.read_table(io.error_output(work, stage, 0)).to_pylist()}


def test_fifo_and_devices_in_a_shard_become_error_rows_in_every_stage(tmp_path):
    good = make_speech_video(tmp_path / "good.mp4")
    fifo = tmp_path / "pipe.mp4"
    os.mkfifo(fifo)
    listing = tmp_path / "videos.txt"
    listing.write_text(f"{good}\n{fifo}\n/dev/zero\n/dev/urandom\n")
    work = tmp_path / "work"
    _run_stages_in_a_child(work, listing, SETTINGS, limit_s=600)
    ids = {row["uri"]: row["video_id"] for row in runner.read_manifest(work).to_pylist()}
    kinds = {str(fifo): "is a named pipe (FIFO)", "/dev/zero": "is a character device",
             "/dev/urandom": "is a character device"}
    for stage in ("decode", "features", "asr"):
        assert runner.completion_record_ok(work, stage, 0), stage
        errors = _errors(work, stage)
        assert set(errors) == {ids[uri] for uri in kinds}, stage
        for uri, kind in kinds.items():
            assert errors[ids[uri]]["error_type"] == "NotARegularFile", (stage, uri)
            assert errors[ids[uri]]["message"] == f"{uri} {kind}, not a regular file: not opened", (stage, uri)
    videos = {row["video_id"]: row for row in pq.read_table(io.stage_output(work, "decode", 0, "videos")).to_pylist()}
    assert videos[ids[str(good)]]["status"] == "ok" and videos[ids[str(good)]]["n_clips"] == 1
    assert {videos[ids[uri]]["status"] for uri in kinds} == {"error"}
    features = pq.read_table(io.stage_output(work, "features", 0)).to_pylist()
    assert [row["video_id"] for row in features] == [ids[str(good)]]
    transcribed = pq.read_table(io.stage_output(work, "asr", 0)).to_pylist()
    assert [row["video_id"] for row in transcribed] == [ids[str(good)]] and transcribed[0]["sentences"]


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
        for open_it in (media.open_input, lambda uri: ClipReader(uri, load_config(None).decode), asr.decode_audio):
            with pytest.raises(NotARegularFile, match=re.escape(f"{uri} is {kind}, not a regular file")):
                open_it(uri)
