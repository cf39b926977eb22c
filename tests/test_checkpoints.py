"""Checkpoints that are never trained on when damaged, runs that stop on a non-finite loss without losing
the good checkpoints, one run per work dir, and a `--restart` that moves nothing until the new run can
start; on the tiny synthetic shards of test_videobert.py."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from test_videobert import config, settings, tiny_checkpoint, train_records

from pipeline import cli
from pipeline.config import ConfigError
from pipeline.engine.workdir import WorkDir
from reports import validate
from videobert import checkpoints, train_setup
from videobert import train as train_module
from videobert.checkpoints import CorruptCheckpoint, TrainingDiverged, TrainingLocked, latest_checkpoint
from videobert.eval import evaluate
from videobert.synthetic import write_synthetic
from videobert.train import train

REPO = Path(__file__).resolve().parents[1]
QUERY = "bert.encoder.layer.0.attention.self.query.weight"


def run_cli(capsys, work_dir: Path, *arguments: str, extra: tuple[str, ...] = ()) -> tuple[int, list[str]]:
    """`python -m pipeline train ...` in this process: (exit code, its stderr lines)."""
    capsys.readouterr()
    sets = [item for key in settings(work_dir, *extra) for item in ("--set", key)]
    code = cli.main(["train", "--work-dir", str(work_dir), "--quiet", *arguments, *sets])
    return code, capsys.readouterr().err.strip().splitlines()


def flip_exponent_bits(weights: Path, tensor: str, count: int, *, finite: bool) -> None:
    """Set the exponent bits of the first `count` float32 values of one tensor: to the largest finite
    exponent (values near +-2**127) or to all ones (inf or NaN)."""
    data = bytearray(weights.read_bytes())
    header_size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + header_size])
    start = 8 + header_size + header[tensor]["data_offsets"][0]
    for index in range(count):
        low, high = start + 4 * index + 2, start + 4 * index + 3  # little-endian: the sign and exponent
        data[high] |= 0x7F
        data[low] = data[low] & 0x7F if finite else data[low] | 0x80
    weights.write_bytes(bytes(data))


@pytest.fixture
def two_checkpoints(tmp_path, tokenizer):
    """A finished run of 6 steps with checkpoints at steps 3 and 6."""
    write_synthetic(tmp_path, tokenizer, videos=8, videos_per_shard=2)
    train(config(tmp_path), tmp_path, quiet=True)
    folders = sorted(WorkDir(tmp_path).checkpoints.glob("step-*"))
    assert [path.name for path in folders] == ["step-00000003", "step-00000006"]
    return tmp_path, folders


# ---------------------------------------------------------------- checksums


def test_every_checkpoint_file_has_its_sha256(two_checkpoints):
    _, folders = two_checkpoints
    for folder in folders:
        record = json.loads((folder / checkpoints.CHECKSUMS_NAME).read_text())
        assert sorted(record["files"]) == ["model.json", "model.safetensors", "trainer.pt"]
        for name, entry in record["files"].items():
            assert entry["bytes"] == (folder / name).stat().st_size
        assert checkpoints.problem_of(folder) is None and not checkpoints.unverified(folder)


def test_flipped_bits_are_refused_by_resume_and_eval(two_checkpoints, capsys):
    work_dir, (earlier, newest) = two_checkpoints
    log_before = (work_dir / "train" / "log.jsonl").read_text()
    flip_exponent_bits(newest / "model.safetensors", QUERY, 16, finite=False)
    with pytest.raises(
        CorruptCheckpoint,
        match=rf"checkpoint step-00000006 is damaged: .*model.safetensors does "
        rf"not match the sha256.*previous complete, verified checkpoint is "
        rf"{earlier}.*train --resume",
    ):
        train(config(work_dir, "train.max_steps=9"), work_dir, resume=True, quiet=True)
    # nothing was trained on it and nothing was lost
    assert (work_dir / "train" / "log.jsonl").read_text() == log_before
    assert sorted(WorkDir(work_dir).checkpoints.glob("step-*")) == [earlier, newest]
    code, lines = run_cli(capsys, work_dir, "--resume", extra=("train.max_steps=9",))
    assert code == 1 and len(lines) == 1 and "step-00000006 is damaged" in lines[0], lines
    # eval opens the newest too: refused, offering the earlier one by --checkpoint
    with pytest.raises(CorruptCheckpoint, match=rf"pass --checkpoint {earlier}"):
        evaluate.Evaluator(config(work_dir), work_dir, None)
    assert evaluate.Evaluator(config(work_dir), work_dir, earlier).info["step"] == 3
    # and `validate` names it
    assert any(
        problem.startswith(f"{newest}: {newest / 'model.safetensors'} does not match the sha256")
        for problem in validate.validate_work_dir(work_dir)
    )
    # with the damaged folder moved aside, as the message says, the run continues from step 3
    newest.rename(work_dir / "damaged-step-6")
    assert train(config(work_dir, "train.max_steps=9"), work_dir, resume=True, quiet=True)["step"] == 9


def test_a_truncated_trainer_state_is_one_line(two_checkpoints, capsys):
    work_dir, (earlier, newest) = two_checkpoints
    state = newest / "trainer.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    code, lines = run_cli(capsys, work_dir, "--resume", extra=("train.max_steps=9",))
    assert code == 1 and len(lines) == 1, lines
    assert "trainer.pt is truncated or overwritten" in lines[0] and str(earlier) in lines[0]
    # a checkpoint of an earlier version (no checksums record) is not verified, but a truncated file is
    # still refused in one line rather than a traceback
    (newest / checkpoints.CHECKSUMS_NAME).unlink()
    code, lines = run_cli(capsys, work_dir, "--resume", extra=("train.max_steps=9",))
    assert code == 1 and len(lines) == 1, lines
    assert "trainer.pt cannot be loaded" in lines[0] and str(earlier) in lines[0]


def test_a_checkpoint_without_checksums_is_accepted_with_a_note(two_checkpoints, capsys):
    work_dir, (_, newest) = two_checkpoints
    (newest / checkpoints.CHECKSUMS_NAME).unlink()
    capsys.readouterr()
    summary = train(config(work_dir, "train.max_steps=9"), work_dir, resume=True)
    assert summary["step"] == 9
    assert f"{newest} has no checksums.json (written by an earlier version)" in capsys.readouterr().err
    # the checkpoints it writes now have the record
    assert not checkpoints.unverified(latest_checkpoint(work_dir))


# ---------------------------------------------------------------- non-finite losses


def test_non_finite_weights_of_an_unverified_checkpoint_stop_at_the_first_step(two_checkpoints):
    work_dir, (earlier, newest) = two_checkpoints
    # huge but finite weights: they load, and the first forward pass overflows
    (newest / checkpoints.CHECKSUMS_NAME).unlink()
    flip_exponent_bits(newest / "model.safetensors", QUERY, 64 * 64, finite=True)
    with pytest.raises(
        TrainingDiverged,
        match=r"stopped at step 7: the (loss|gradient norm) is (nan|inf).*newest "
        r"checkpoint step-00000006 is kept",
    ):
        train(
            config(work_dir, "train.max_steps=9", "train.checkpoint_every=1", "train.keep_checkpoints=1"),
            work_dir,
            resume=True,
            quiet=True,
        )
    assert sorted(WorkDir(work_dir).checkpoints.glob("step-*")) == [earlier, newest]
    records = [json.loads(line) for line in (work_dir / "train" / "log.jsonl").read_text().splitlines()]
    assert records[-1]["event"] == "stopped" and records[-1]["step"] == 7 and records[-1]["checkpoint"] == str(newest)
    assert all(math.isfinite(r["loss"]) for r in records if r["event"] == "train")
    # bits that make NaN are refused when the checkpoint is opened
    flip_exponent_bits(newest / "model.safetensors", QUERY, 4, finite=False)
    with pytest.raises(CorruptCheckpoint, match=rf"non-finite weights \({QUERY}\).*{earlier}"):
        train(config(work_dir, "train.max_steps=9"), work_dir, resume=True, quiet=True)


def test_a_nan_learning_rate_stops_without_saving(tmp_path, tokenizer, monkeypatch):
    write_synthetic(tmp_path, tokenizer, videos=8, videos_per_shard=2)
    cfg = config(tmp_path, "train.grad_clip=0")  # the gradient norm measured without clipping
    cfg.train.lr = float("inf")  # past the config's rules (lr in (0, 1]), as a bad override would be
    with pytest.raises(
        TrainingDiverged,
        match=r"stopped at step 2: the loss is nan .*learning rate inf.*nothing "
        r"was saved",
    ):
        train(cfg, tmp_path, quiet=True)
    assert latest_checkpoint(tmp_path) is None
    # a schedule that gives NaN, with a checkpoint due at step 1: the NaN weights of the update are not saved
    monkeypatch.setattr(train_setup, "_lr_factor", lambda warmup_steps, max_steps: lambda step: float("nan"))
    with pytest.raises(TrainingDiverged, match=r"stopped at step 1: the weights hold non-finite values"):
        train(config(tmp_path, "train.checkpoint_every=1"), tmp_path, restart=True, quiet=True)
    assert latest_checkpoint(tmp_path) is None
    stopped = [json.loads(line) for line in (tmp_path / "train" / "log.jsonl").read_text().splitlines()][-1]
    assert stopped["event"] == "stopped" and stopped["step"] == 1 and stopped["checkpoint"] is None


def test_a_nan_init_checkpoint_stops_at_step_one(tmp_path, tokenizer):
    write_synthetic(tmp_path, tokenizer, videos=8, videos_per_shard=2)
    init = tiny_checkpoint(tmp_path / "init", tokenizer, heads=True)
    weights = init / "model.safetensors"
    flip_exponent_bits(weights, QUERY, 8, finite=False)
    with pytest.raises(TrainingDiverged, match=r"stopped at step 1: the loss is nan"):
        train(config(tmp_path, f"train.init_checkpoint={init}"), tmp_path, quiet=True)
    assert latest_checkpoint(tmp_path) is None


def test_a_nan_loss_mid_run_stops_it_and_keeps_the_newest_checkpoint(tmp_path, tokenizer, monkeypatch, capsys):
    write_synthetic(tmp_path, tokenizer, videos=8, videos_per_shard=2)
    real = train_module.compute_losses
    calls = []

    def nan_at_step_5(model, batch, weights):
        # the fifth step's loss made NaN, as a batch of bad data would make it
        loss, metrics = real(model, batch, weights)
        calls.append(1)
        return (loss * float("nan") if len(calls) == 5 else loss), metrics

    monkeypatch.setattr(train_module, "compute_losses", nan_at_step_5)
    code, lines = run_cli(capsys, tmp_path, extra=("train.keep_checkpoints=1",))
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith("train: stopped at step 5: the loss is nan") and "step-00000003 is kept" in lines[0]
    # the step-3 checkpoint stays whatever keep_checkpoints says; the log never holds a NaN loss
    assert [path.name for path in WorkDir(tmp_path).checkpoints.glob("step-*")] == ["step-00000003"]
    assert sorted(train_records(tmp_path)) == [1, 2, 3, 4]
    monkeypatch.setattr(train_module, "compute_losses", real)
    assert train(config(tmp_path, "train.keep_checkpoints=1"), tmp_path, resume=True, quiet=True)["step"] == 6


# ---------------------------------------------------------------- one run per work dir


def test_a_second_train_on_the_same_work_dir_is_refused(tmp_path, tokenizer, capsys):
    write_synthetic(tmp_path, tokenizer, videos=8, videos_per_shard=2)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pipeline.engine.workdir import WorkDir\nfrom videobert.checkpoints import train_lock\n"
            "with train_lock(WorkDir(sys.argv[1])):\n    print('locked', flush=True)\n    time.sleep(120)\n",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(TrainingLocked, match=rf"another train is running on {tmp_path} \(pid {holder.pid} on "):
            train(config(tmp_path), tmp_path, quiet=True)
        code, lines = run_cli(capsys, tmp_path)
        assert code == 1 and len(lines) == 1 and lines[0].startswith("train: another train is running"), lines
        assert not (tmp_path / "train").exists()
    finally:
        holder.kill()
        holder.wait()
    # the lock of a process that ended is taken over; the run writes each step once
    lock = checkpoints.lock_path(WorkDir(tmp_path))
    assert f"pid {holder.pid}" in lock.read_text()
    assert train(config(tmp_path), tmp_path, quiet=True)["step"] == 6
    steps = [
        json.loads(line)["step"]
        for line in (tmp_path / "train" / "log.jsonl").read_text().splitlines()
        if json.loads(line)["event"] == "train"
    ]
    assert steps == [1, 2, 3, 4, 5, 6]


# ---------------------------------------------------------------- restart


def test_restart_with_a_bad_init_checkpoint_keeps_the_run(two_checkpoints, capsys):
    work_dir, folders = two_checkpoints
    # a folder that holds no BERT checkpoint: refused when the model is built, before anything moves
    missing = work_dir / "no-such-bert"
    missing.mkdir()
    code, lines = run_cli(capsys, work_dir, "--restart", extra=(f"train.init_checkpoint={missing}",))
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"train: config error: train.init_checkpoint '{missing}': cannot load a BERT checkpoint")
    assert "::" not in lines[0]
    assert sorted(WorkDir(work_dir).checkpoints.glob("step-*")) == folders
    # a path that does not exist: refused by the preflight, before anything moves
    missing.rmdir()
    code, lines = run_cli(capsys, work_dir, "--restart", extra=(f"train.init_checkpoint={missing}",))
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"train: cannot start: train.init_checkpoint: {missing} not found"), lines
    assert sorted(WorkDir(work_dir).checkpoints.glob("step-*")) == folders
    assert not (WorkDir(work_dir).state / "replaced").exists()
    # a subset larger than the videos there are: a config error too, found before anything moves
    with pytest.raises(ConfigError, match="config error: train.subset_videos 20 exceeds the 8 videos"):
        train(config(work_dir, "train.subset_videos=20"), work_dir, restart=True, quiet=True)
    assert sorted(WorkDir(work_dir).checkpoints.glob("step-*")) == folders
    # a good restart moves the old run aside and trains anew
    assert train(config(work_dir, "train.max_steps=3"), work_dir, restart=True, quiet=True)["step"] == 3
    moved = list((WorkDir(work_dir).state / "replaced").glob("train-*"))
    assert len(moved) == 1 and (moved[0] / "checkpoints" / "step-00000006").is_dir()


def test_a_rotation_killed_while_deleting_leaves_no_half_checkpoint_under_a_step_name(tmp_path, monkeypatch):
    import shutil

    from pipeline import storage

    root = tmp_path / "train" / "checkpoints"
    for step in (2, 4, 6):
        (root / f"step-{step:08d}").mkdir(parents=True)
        for name in ("model.safetensors", "model.json", "trainer.pt", "checksums.json"):
            (root / f"step-{step:08d}" / name).write_text(name)
    delete = shutil.rmtree

    def killed_midway(folder, *args, **kwargs):  # one file gone, then the process dies (its time limit)
        next(Path(folder).iterdir()).unlink()
        raise SystemExit(143)

    monkeypatch.setattr(shutil, "rmtree", killed_midway)
    with pytest.raises(SystemExit):
        checkpoints.rotate(root, keep=2)
    monkeypatch.setattr(shutil, "rmtree", delete)
    # what passes for a checkpoint is whole; the half-deleted one is a temporary, out of every step-* glob
    assert [p.name for p in sorted(root.glob("step-*"))] == ["step-00000004", "step-00000006"]
    assert all(len(list(p.iterdir())) == 4 for p in root.glob("step-*"))
    (leftover,) = [p for p in root.iterdir() if p.name.startswith(storage.TEMPORARY_PREFIX)]
    assert leftover.name.endswith("step-00000002" + storage.TEMPORARY_SUFFIX)
    assert latest_checkpoint(tmp_path).name == "step-00000006"
