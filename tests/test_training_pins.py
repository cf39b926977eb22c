"""Training reads the align shards it verified at its start: a rewrite during training (`align --force`
renames new parts over the old) never mixes into its epochs, and the checkpoint names the bytes it read."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import storage
from pipeline.config import load_config
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir
from videobert import shards, stream
from videobert.checkpoints import latest_checkpoint
from videobert.synthetic import write_synthetic
from videobert.train import train
from videobert.train_inputs import training_inputs


def config(work_dir, *overrides):
    return load_config(
        None,
        [
            "train.init_checkpoint=random:tiny",
            "train.batch_size=4",
            "train.max_steps=4",
            "train.log_every=1",
            "train.checkpoint_every=2",
            "train.shuffle_buffer=4",
            "train.num_workers=0",
            "train.num_threads=1",
            "train.max_len=32",
            *overrides,
        ],
    )


def rewrite_like_align_force(path) -> None:
    """What a rerun of align does to a part: a new file renamed over the old (here: every video renamed)."""
    table = pq.read_table(path)
    table = table.set_column(
        table.schema.get_field_index("video_id"),
        "video_id",
        pa.array([f"rewritten-{video}" for video in table["video_id"].to_pylist()]),
    )
    temporary = path.with_name(f".{path.name}.new")
    pq.write_table(table.replace_schema_metadata(pq.read_schema(path).metadata), temporary)
    os.replace(temporary, path)


def recorded_sha256(work: WorkDir) -> dict[str, str]:
    checker = Lineage(work)
    return {
        work.part("align", shard).name: checker.record("align", shard)["outputs"][
            f"align/{work.part('align', shard).name}"
        ]["sha256"]
        for shard in checker.manifest_shards()
    }


def test_a_rewrite_during_training_is_never_read_and_the_checkpoint_names_what_was(tmp_path, tokenizer, monkeypatch):
    write_synthetic(tmp_path, tokenizer, videos=8, videos_per_shard=2)
    work = WorkDir(tmp_path)
    before = recorded_sha256(work)
    # a killed run's pins: removed by the next run
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftover = (
        work.state
        / "pinned"
        / f".tmp_{int(gone.stdout)}_{os.uname().nodename.replace('_', '-')}_0badc0de_train-pins.partial"
    )
    leftover.mkdir(parents=True)

    seen, real_read = [], stream.read_videos

    def read_during_a_rewrite(path, layout, start_row=0):
        if not seen:  # the first read of the run: align --force rewrites every part now
            for shard in Lineage(work).manifest_shards():
                rewrite_like_align_force(work.part("align", shard))
        for row, video in real_read(path, layout, start_row):
            seen.append(video.video_id)
            yield row, video

    monkeypatch.setattr(stream, "read_videos", read_during_a_rewrite)
    assert train(config(tmp_path), tmp_path, quiet=True)["step"] == 4
    assert seen and not [video for video in seen if video.startswith("rewritten-")]
    assert not leftover.exists()
    info = json.loads((latest_checkpoint(work) / "model.json").read_text())
    assert info["align_sha256"] == before
    assert recorded_sha256(work) == before  # the records were not rewritten: only the parts were
    assert all(
        storage.file_sha256(work.part("align", shard)) != before[work.part("align", shard).name]
        for shard in Lineage(work).manifest_shards()
    )


def test_a_rewrite_between_pinning_and_verifying_stops_the_start_in_one_line(tmp_path, tokenizer, monkeypatch):
    write_synthetic(tmp_path, tokenizer, videos=4, videos_per_shard=2)
    work = WorkDir(tmp_path)
    real_pin = shards.pin_shards

    def pin_then_rewrite(paths, temporaries):
        pinned = real_pin(paths, temporaries)
        rewrite_like_align_force(paths[0])
        return pinned

    import videobert.train_inputs as train_inputs

    monkeypatch.setattr(train_inputs, "pin_shards", pin_then_rewrite)
    with pytest.raises(Exception) as raised:
        training_inputs(config(tmp_path), work)
    assert len(str(raised.value).splitlines()) == 1 and "part-00000.parquet" in str(raised.value)
