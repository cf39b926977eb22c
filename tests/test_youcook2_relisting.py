"""youcook2-manifest re-listed from an annotations file that drops videos with finished outputs: asked
first, refused off a terminal without --allow-removal, and what it replaces kept under DIR/_state/replaced/
(as for `manifest`, tests/test_relisting.py)."""

from media_factory import one_clip_videos
from test_relisting import SETTINGS, decoded, on_a_terminal, run
from test_youcook2 import annotations_file, entry

from pipeline.engine.workdir import WorkDir


def test_youcook2_manifest_that_drops_finished_videos_is_refused_then_kept_aside(tmp_path, capsys, monkeypatch):
    videos = one_clip_videos(tmp_path / "videos", 4)  # v0.mp4 ... v3.mp4: their "YouTube ids" are v0 ... v3
    every = annotations_file(tmp_path / "every.json", {f"v{i}": entry("training", [(0, 1, "cut")]) for i in range(4)})
    one = annotations_file(tmp_path / "one.json", {"v0": entry("training", [(0, 1, "cut")])})
    work = tmp_path / "work"
    listing = ["youcook2-manifest", "--work-dir", work, "--videos", videos, *SETTINGS]
    assert run(capsys, *listing, "--annotations", every)[0] == 0
    assert run(capsys, "decode", "--work-dir", work, "--quiet", *SETTINGS)[0] == 0
    before, manifest_bytes = decoded(work), WorkDir(work).manifest.read_bytes()
    assert len(before) == 4

    # a file that names fewer videos: off a terminal, refused in one line, nothing touched
    code, err = run(capsys, *listing, "--annotations", one)
    refusal = [line for line in err.splitlines() if line.startswith("youcook2-manifest:")]
    assert code == 1 and len(refusal) == 1 and refusal[0].endswith("give --allow-removal to go on"), err
    assert "no longer lists 3 video(s) with finished outputs" in refusal[0] and "one.json" in refusal[0]
    assert WorkDir(work).manifest.read_bytes() == manifest_bytes and decoded(work) == before

    # on a terminal the user is asked; "n" keeps everything
    on_a_terminal(monkeypatch, "n\n")
    code, err = run(capsys, *listing, "--annotations", one)
    assert code != 0 and "would move to" in err and "Go on? [y/N]" in err
    assert WorkDir(work).manifest.read_bytes() == manifest_bytes
    monkeypatch.undo()

    # agreed to: the old outputs move aside (not deleted); `restore` puts them back byte for byte
    code, err = run(capsys, *listing, "--annotations", one, "--allow-removal")
    assert code == 0 and "_state/replaced/manifest-" in err and not WorkDir(work).part("decode", 1).exists()
    code, err = run(capsys, "restore", "--work-dir", work)
    assert code == 0 and WorkDir(work).manifest.read_bytes() == manifest_bytes and decoded(work) == before
