"""A re-listing that drops videos with finished outputs: asked first, refused in a batch job, and what it
replaces kept under DIR/_state/replaced/ until `restore` puts it back."""

import io
import sys

import pyarrow.parquet as pq
from media_factory import one_clip_videos

from pipeline import cli
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir

SETTINGS = ["--set", "shards.videos_per_shard=2", "--set", "executor.workers=1"]


def run(capsys, *args) -> tuple[int, str]:
    code = cli.main([str(arg) for arg in args])
    return code, capsys.readouterr().err


def decoded(work) -> set[str]:
    return {
        video
        for _, path in Lineage(work).current_parts("decode")
        for video in pq.read_table(path, columns=["video_id"])["video_id"].to_pylist()
    }


def on_a_terminal(monkeypatch, answer: str) -> None:
    """stdin and stderr as a terminal's, the user typing `answer`."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal(answer))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)


def test_a_relisting_that_drops_finished_videos_is_refused_then_kept_aside_and_restored(tmp_path, capsys, monkeypatch):
    videos = one_clip_videos(tmp_path / "videos", 4)
    work = tmp_path / "work"
    assert run(capsys, "manifest", "--work-dir", work, "--input", videos, *SETTINGS)[0] == 0
    assert run(capsys, "decode", "--work-dir", work, "--quiet", *SETTINGS)[0] == 0
    before = decoded(work)
    manifest_bytes = WorkDir(work).manifest.read_bytes()
    part_bytes = WorkDir(work).part("decode", 1).read_bytes()

    # a wrong path (another folder holding one v0.mp4): off a terminal, refused in one line, nothing touched
    typo = one_clip_videos(tmp_path / "typo", 1)
    code, err = run(capsys, "manifest", "--work-dir", work, "--input", typo, *SETTINGS)
    refusal = [line for line in err.splitlines() if line.startswith("manifest:")]
    assert code == 1 and len(refusal) == 1 and refusal[0].endswith("give --allow-removal to go on")
    assert "no longer lists 3 video(s) with finished outputs" in refusal[0]
    assert WorkDir(work).manifest.read_bytes() == manifest_bytes and decoded(work) == before

    # on a terminal the user is asked; "n" keeps everything
    on_a_terminal(monkeypatch, "n\n")
    code, err = run(capsys, "manifest", "--work-dir", work, "--input", typo, *SETTINGS)
    assert code != 0 and "would move to" in err and "Go on? [y/N]" in err
    assert WorkDir(work).manifest.read_bytes() == manifest_bytes
    monkeypatch.undo()

    # agreed to: the old outputs move aside (not deleted); status lists them; decode redoes the new listing
    code, err = run(capsys, "manifest", "--work-dir", work, "--input", typo, "--allow-removal", *SETTINGS)
    assert code == 0 and "_state/replaced/manifest-" in err
    assert not WorkDir(work).part("decode", 1).exists()
    code, out = cli.main(["status", "--work-dir", str(work)]), capsys.readouterr().out
    assert code == 0 and "moved aside" in out and "manifest-" in out and "shard(s) 0, 1" in out
    assert run(capsys, "decode", "--work-dir", work, "--quiet", *SETTINGS)[0] == 0
    assert len(decoded(work)) == 1

    # one command puts the old run back, byte for byte; decode then finds every shard current
    code, err = run(capsys, "restore", "--work-dir", work)
    assert code == 0 and "put back" in err
    assert WorkDir(work).manifest.read_bytes() == manifest_bytes
    assert WorkDir(work).part("decode", 1).read_bytes() == part_bytes
    code, err = run(capsys, "decode", "--work-dir", work, "--quiet", *SETTINGS)
    assert code == 0 and "0 shard(s) run" in err and decoded(work) == before


def test_a_relisting_that_only_adds_videos_asks_nothing(tmp_path, capsys):
    videos = one_clip_videos(tmp_path / "videos", 2)
    work = tmp_path / "work"
    assert run(capsys, "manifest", "--work-dir", work, "--input", videos, *SETTINGS)[0] == 0
    assert run(capsys, "decode", "--work-dir", work, "--quiet", *SETTINGS)[0] == 0
    one_clip_videos(videos / "more", 1)
    code, err = run(capsys, "manifest", "--work-dir", work, "--input", videos, *SETTINGS)
    assert code == 0 and "1 new, 0 removed" in err and "replaced" not in err
    code, err = run(capsys, "restore", "--work-dir", work)
    assert code == 1 and "nothing to restore" in err
