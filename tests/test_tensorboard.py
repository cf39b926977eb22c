"""train.tensorboard: the training log's scalars and the validation records as TensorBoard event files,
read back with TensorBoard's own reader."""

from __future__ import annotations

import json

import pytest
from test_videobert import TOKENIZER_SPEC, config

from pipeline.config import ConfigError
from pipeline.engine.workdir import WorkDir
from pipeline.tokenizer import load_tokenizer
from videobert import tensorboard_log
from videobert.synthetic import write_synthetic
from videobert.train import train


def test_the_event_files_hold_the_logs_scalars_and_validation_records(tmp_path):
    pytest.importorskip("tensorboard")
    write_synthetic(tmp_path, load_tokenizer(TOKENIZER_SPEC), videos=8, videos_per_shard=2)
    cfg = config(tmp_path, "train.tensorboard=true", "train.validation_videos=2", "train.validation_every=3")
    train(cfg, tmp_path, quiet=True)
    records = [json.loads(line) for line in WorkDir(tmp_path).train_log.read_text().splitlines()]
    events = tensorboard_log.read_scalars(WorkDir(tmp_path).train_folder / tensorboard_log.FOLDER)
    expected: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for tag, value in tensorboard_log.scalars(record).items():
            expected.setdefault(tag, []).append((record["step"], value))
    assert {"train/loss", "train/lr", "train/mlm_text_loss", "validation/alignment_auc"} <= set(expected)
    assert set(events) == set(expected)
    for tag, values in expected.items():
        assert [step for step, _ in events[tag]] == [step for step, _ in values], tag
        assert [value for _, value in events[tag]] == pytest.approx([value for _, value in values], rel=1e-6), tag
    assert [step for step, _ in events["train/loss"]] == list(range(1, 7))  # train.log_every=1, 6 steps
    assert [step for step, _ in events["validation/alignment_auc"]] == [3, 6]


def test_off_by_default_and_a_missing_package_is_said(tmp_path, monkeypatch):
    write_synthetic(tmp_path, load_tokenizer(TOKENIZER_SPEC), videos=4, videos_per_shard=2)
    assert config(tmp_path).train.tensorboard is False
    train(config(tmp_path, "train.max_steps=2"), tmp_path, quiet=True)
    assert not (WorkDir(tmp_path).train_folder / tensorboard_log.FOLDER).exists()

    def missing(folder):
        raise tensorboard_log.TensorBoardUnavailable("train.tensorboard: true needs the tensorboard package")

    monkeypatch.setattr(tensorboard_log, "summary_writer", missing)
    with pytest.raises(ImportError, match="train.tensorboard: true needs the tensorboard package"):
        train(config(tmp_path, "train.max_steps=4", "train.tensorboard=true"), tmp_path, restart=True, quiet=True)
    with pytest.raises(ConfigError, match="train.tensorboard"):
        config(tmp_path, "train.tensorboard=maybe")
