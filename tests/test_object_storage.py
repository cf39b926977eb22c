"""Inputs and the work dir on object storage: the whole pipeline against an S3-compatible server started
here on 127.0.0.1 (moto's server mode), endpoint and credentials from the standard AWS environment, writes
the same shards as a run on the local disk, and trains reading its shards from the store."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from media_factory import make_video

from pipeline import cli

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
# one clip a video (the fewest frames S3D takes, at 5 fps): the shards are compared, whatever they hold
SETTINGS = [
    "features.weights=random",
    "decode.fps=5",
    "decode.clip_frames=14",
    "decode.min_clip_frames=7",
    "kmeans.depth=1",
    "kmeans.k=2",
    "shards.videos_per_shard=1",
    "features.decode_workers=0",
    "executor.workers=1",
    "kmeans.workers=1",
    # a.mp4's 2 s is under one whole clip of 2.8 s: the default would flag it too short
    "quality.min_clips=0.5",
]
TRAIN = [
    "train.init_checkpoint=random:tiny",
    "train.batch_size=4",
    "train.max_steps=4",
    "train.num_workers=0",
    "train.checkpoint_every=2",
    "train.max_len=32",
    "train.num_threads=1",
]
STAGES = ("decode", "features", "quality", "dedup", "kmeans", "quantize", "asr", "align")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_moto(port: int, env: dict | None = None) -> subprocess.Popen:
    """A moto S3 server on 127.0.0.1:`port` (with `env` added to its environment), once it accepts connections."""
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    return server


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """An S3-compatible server for this module, and the environment that points every client at it."""
    pytest.importorskip("moto")
    pytest.importorskip("s3fs")
    port = _free_port()
    server = start_moto(port)
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.mkdir("videobert")
    yield fs, env
    server.terminate()
    server.wait(timeout=30)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _cli(capsys, *args) -> str:
    """A command run in this process (its stderr returned); the environment already points at the server."""
    code = cli.main([str(arg) for arg in args])
    err = capsys.readouterr().err
    assert code == 0, f"{args[0]} failed:\n{err[-3000:]}"
    return err


def _settings(extra=()):
    """--set options, each key once (the command line refuses a key given twice): a later one replaces."""
    by_key = {setting.split("=", 1)[0]: setting for setting in [*SETTINGS, *extra]}
    return [part for setting in by_key.values() for part in ("--set", setting)]


def test_the_pipeline_on_object_storage_writes_the_shards_of_a_local_run(s3, tmp_path, capsys):
    fs, _ = s3
    videos = tmp_path / "videos"
    videos.mkdir()
    make_video(videos / "a.mp4", duration_s=2.0)
    make_video(videos / "b.mp4", duration_s=3.1, audio=True)
    (videos / "a.vtt").write_text("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nChop the onion.\n")
    for path in videos.iterdir():
        fs.put_file(str(path), f"videobert/videos/{path.name}")

    local, remote = tmp_path / "local", "s3://videobert/run"
    for work, source in ((local, videos), (remote, "s3://videobert/videos")):
        _cli(capsys, "manifest", "--work-dir", work, "--input", source, *_settings(), "--quiet")
        for stage in STAGES:
            _cli(capsys, stage, "--work-dir", work, *_settings(), "--quiet")
    assert "valid:" in _cli(capsys, "validate", "--work-dir", remote)

    # every data file: byte for byte, but for the columns that name where a video was read from
    local_files = sorted(
        str(path.relative_to(local))
        for path in local.rglob("*.parquet")
        if not path.relative_to(local).parts[0].startswith("_")
    )
    remote_files = sorted(
        name[len("videobert/run/") :]
        for name in fs.find("videobert/run")
        if name.endswith(".parquet") and not name.startswith("videobert/run/_")
    )
    assert local_files == remote_files and any(name.startswith("align/") for name in local_files)
    for name in local_files:
        remote_bytes = fs.cat_file(f"videobert/run/{name}")
        if name.startswith(("manifest/", "videos/")):
            # and how a change of its bytes shows: a local file's mtime, an object's ETag
            where = ["uri", "transcript_uri"] + (["content_tag"] if name.startswith("manifest/") else [])
            local_table, remote_table = pq.read_table(local / name), pq.read_table(pa.BufferReader(remote_bytes))
            keep = [column for column in local_table.column_names if column not in where]
            assert local_table.select(keep).equals(remote_table.select(keep)), name
        else:
            assert (local / name).read_bytes() == remote_bytes, name
    # completion records name the same content: the same sha256 for every data file
    for stage in ("align", "quantize"):
        for shard in (0, 1):
            local_record = json.loads((local / "_state" / "done" / stage / f"part-{shard:05d}.json").read_text())
            remote_record = json.loads(fs.cat_file(f"videobert/run/_state/done/{stage}/part-{shard:05d}.json"))
            assert local_record["outputs"] == remote_record["outputs"]
    # a second run finds every shard current on the store
    assert "0 shard(s) run, 2 already current" in _cli(capsys, "align", "--work-dir", remote, *_settings())

    # training reads its shards from the store, and its checkpoints go there (trainer.pt last)
    _cli(capsys, "train", "--work-dir", remote, *_settings(TRAIN), "--quiet")
    names = fs.find("videobert/run/train")
    assert {"videobert/run/train/checkpoints/step-00000004/trainer.pt", "videobert/run/train/log.jsonl"} <= set(names)
    shutil.rmtree(Path.home() / ".cache" / "videobert" / "train-mirrors", ignore_errors=True)  # a fresh machine
    resumed = _cli(capsys, "train", "--work-dir", remote, *_settings([*TRAIN, "train.max_steps=6"]), "--resume")
    assert '"step": 6' in resumed and '"steps_this_run": 2' in resumed
    assert "videobert/run/train/checkpoints/step-00000006/trainer.pt" in fs.find("videobert/run/train")


@pytest.mark.parametrize("command", [["status"], ["decode"], ["validate"], ["manifest", "--input", "VIDEOS"]])
def test_an_unreachable_endpoint_is_one_line_naming_the_bucket(tmp_path, command):
    """AWS_ENDPOINT_URL at a port where nothing listens: one line naming the bucket and the endpoint, no
    traceback (one attempt per request here, AWS_MAX_ATTEMPTS: the test stays short)."""
    pytest.importorskip("s3fs")
    endpoint = f"http://127.0.0.1:{_free_port()}"  # bound and closed again: nothing listens there
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_MAX_ATTEMPTS": "1",
    }
    if command[0] == "manifest":  # the input on the store, the work dir local
        args = ["manifest", "--input", "s3://no-such-store/videos", "--work-dir", str(tmp_path / "w")]
        bucket = "bucket no-such-store (s3://no-such-store/videos)"
    else:
        args = [*command, "--work-dir", "s3://no-such-store/run1"]
        bucket = "bucket no-such-store (s3://no-such-store/run1)"
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=300
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.startswith(
        f"{args[0]}: error: object storage: {bucket} at {endpoint}: "
        f"EndpointConnectionError: Could not connect to the endpoint URL"
    ), result.stderr


def test_a_missing_bucket_is_one_line_naming_it(s3, capsys):
    for command in (["decode"], ["manifest", "--input", str(REPO / "samples")]):
        code = cli.main([*command, "--work-dir", "s3://no-such-bucket/run1", "--quiet"])
        err = capsys.readouterr().err
        assert (
            code == 1
            and err
            == f"{command[0]}: error: The specified bucket does not exist (object storage: bucket no-such-bucket)\n"
        ), err
