import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import storage
from pipeline.config import load_config
from pipeline.engine.manifest import ManifestError, build_manifest, make_video_id, write_manifest


def _touch(path, data=b"x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_folder_is_searched_recursively_with_sidecar_transcripts(tmp_path):
    _touch(tmp_path / "a" / "one.mp4")
    _touch(tmp_path / "a" / "one.vtt")
    _touch(tmp_path / "b" / "c" / "two.MKV")
    _touch(tmp_path / "notes.txt")
    table = build_manifest(load_config(None, ["shards.videos_per_shard=1"]), tmp_path)
    rows = table.to_pylist()
    assert len(rows) == 2
    by_name = {row["uri"].rsplit("/", 1)[1]: row for row in rows}
    assert by_name["one.mp4"]["transcript_uri"].endswith("one.vtt")
    assert by_name["two.MKV"]["transcript_uri"] is None
    assert sorted(row["shard"] for row in rows) == [0, 1]
    assert by_name["one.mp4"]["bytes"] == 1
    # stable across runs
    assert build_manifest(load_config(None, ["shards.videos_per_shard=1"]), tmp_path).equals(table)


def test_video_ids_are_unique_and_safe_file_names():
    paths = [
        "dir/My Vidéo (1).mp4",
        "dir/My Vidéo (1).mkv",
        "../../etc/passwd.mp4",
        "a\x00b\nc.mp4",
        "日本語/料理.mp4",
        "x" * 500 + ".mp4",
    ]
    ids = [make_video_id(p) for p in paths]
    assert len(set(ids)) == len(ids)
    for video_id in ids:
        assert "/" not in video_id and "\\" not in video_id and ".." not in video_id
        assert all(c.isascii() and (c.isalnum() or c in "_-.") for c in video_id)
        assert 0 < len(video_id) <= 80
    assert make_video_id("dir/My Vidéo (1).mp4") == ids[0]


def test_lists_txt_csv_parquet_with_duplicates_once(tmp_path):
    video = _touch(tmp_path / "v" / "clip one.mp4")
    _touch(tmp_path / "v" / "sub.srt")
    (tmp_path / "list.txt").write_text(f"# videos\n{video}\nv/clip one.mp4\n\n")
    (tmp_path / "list.csv").write_text("path,transcript\nv/clip one.mp4,v/sub.srt\nv/missing.mp4,\n")
    pq.write_table(pa.table({"uri": [str(video)], "transcript_uri": [None]}), tmp_path / "list.parquet")
    cfg = load_config(None)
    assert build_manifest(cfg, tmp_path / "list.txt").num_rows == 1
    rows = build_manifest(cfg, tmp_path / "list.csv").to_pylist()
    assert len(rows) == 2
    listed = {row["uri"].rsplit("/", 1)[1]: row for row in rows}
    assert listed["clip one.mp4"]["transcript_uri"].endswith("sub.srt")
    assert listed["missing.mp4"]["bytes"] is None  # decode reports it as an error row
    assert build_manifest(cfg, tmp_path / "list.parquet").num_rows == 1


def test_unreadable_or_wrong_lists_are_clear_errors(tmp_path):
    cfg = load_config(None)
    with pytest.raises(ManifestError, match="does not exist"):
        build_manifest(cfg, tmp_path / "nope.txt")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ManifestError, match="cannot read the video list"):
        build_manifest(cfg, tmp_path / "bad.parquet")
    (tmp_path / "cols.csv").write_text("name\nx.mp4\n")
    with pytest.raises(ManifestError, match="'path'"):
        build_manifest(cfg, tmp_path / "cols.csv")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(ManifestError, match="cannot read the video list"):
        build_manifest(cfg, tmp_path / "binary.txt")


def test_manifest_records_the_folder_transcripts_are_confined_to(tmp_path):
    """A folder input confines transcripts to itself, a list to the list's folder; symlinks resolved."""
    videos = tmp_path / "real"
    _touch(videos / "one.mp4")
    (videos / "list.csv").write_text("path\none.mp4\n")
    (tmp_path / "link").symlink_to(videos, target_is_directory=True)
    cfg = load_config(None)
    for input_path in (tmp_path / "link", tmp_path / "link" / "list.csv"):
        path, _, _ = write_manifest(cfg, input_path, tmp_path / "work")
        assert storage.read_metadata(path).transcript_root == str(videos.resolve())


def test_the_current_folder_as_work_dir(tmp_path, monkeypatch):
    """`--work-dir .`: records name their files inside the work dir whatever way its root is spelled."""
    from pipeline.engine.lineage import Lineage

    videos = tmp_path / "videos"
    _touch(videos / "a.mp4")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    write_manifest(load_config(None, []), videos, ".")
    checker = Lineage(".")
    assert checker.manifest_shards() == [0]
    assert checker.verified("manifest", None, checker.work.manifest) == checker.work.manifest  # its sha256 matches
    assert storage.relative_name(".", "manifest/manifest.parquet") == "manifest/manifest.parquet"


def _decode_and_asr(cfg, work):
    from pipeline.engine import runner

    for stage in ("decode", "asr"):
        runner.run_one_shard(cfg, work, stage, 0, quiet=True)


def _sentences(work):
    from pipeline.engine.workdir import WorkDir

    return [s["text"] for row in pq.read_table(WorkDir(work).part("asr", 0)).to_pylist() for s in row["sentences"]]


def test_a_transcript_added_or_removed_beside_a_listed_video_redoes_asr_but_not_decode(tmp_path):
    from media_factory import make_video

    from pipeline.engine.lineage import Lineage
    from pipeline.engine.workdir import WorkDir

    folder, work = tmp_path / "videos", tmp_path / "work"
    folder.mkdir()
    make_video(folder / "one.mp4", duration_s=1.0)
    captions = folder / "one.vtt"
    captions.write_text("WEBVTT\n\n00:00:00.000 --> 00:00:00.900\nfirst words here.\n")
    cfg = load_config(None, ["asr.language=en"])
    write_manifest(cfg, folder, work)
    _decode_and_asr(cfg, work)
    assert _sentences(work) == ["first words here."]
    decode_record = WorkDir(work).record("decode", 0).read_bytes()

    captions.unlink()
    _, table, changes = write_manifest(cfg, folder, work)
    assert not changes.get("unchanged") and changes["updated_shards"] == [0] and changes["changed_shards"] == []
    assert table["transcript_uri"].to_pylist() == [None]
    assert storage.read_table(WorkDir(work).manifest)["transcript_uri"].to_pylist() == [None]
    checker = Lineage(work, cfg)
    assert checker.state("decode", 0).current
    assert checker.state("asr", 0).status == "stale"

    captions.write_text("WEBVTT\n\n00:00:00.000 --> 00:00:00.900\ncaptions that came later.\n")
    _, table, changes = write_manifest(cfg, folder, work)
    assert not changes.get("unchanged") and table["transcript_uri"].to_pylist() == [str(captions)]
    assert Lineage(work, cfg).state("asr", 0).status == "stale"
    _decode_and_asr(cfg, work)
    assert _sentences(work) == ["captions that came later."]
    assert WorkDir(work).record("decode", 0).read_bytes() == decode_record  # decode was not redone
    assert write_manifest(cfg, folder, work)[2].get("unchanged")


def test_a_moved_input_folder_rewrites_the_paths_and_redoes_nothing(tmp_path):
    from media_factory import make_video

    from pipeline.engine.lineage import Lineage
    from pipeline.engine.manifest import recorded_transcript_root
    from pipeline.engine.workdir import WorkDir

    old, new, work = tmp_path / "old", tmp_path / "new", tmp_path / "work"
    old.mkdir()
    make_video(old / "one.mp4", duration_s=1.0)
    (old / "one.vtt").write_text("WEBVTT\n\n00:00:00.000 --> 00:00:00.900\nsome words.\n")
    cfg = load_config(None, ["asr.language=en"])
    write_manifest(cfg, old, work)
    _decode_and_asr(cfg, work)
    old.rename(new)  # a move keeps the files' modification times
    _, table, changes = write_manifest(cfg, new, work)
    assert not changes.get("unchanged") and changes["changed_shards"] == []
    assert table["uri"].to_pylist() == [str(new / "one.mp4")]
    assert table["transcript_uri"].to_pylist() == [str(new / "one.vtt")]
    assert recorded_transcript_root(work) == str(new)
    checker = Lineage(work, cfg)
    assert checker.state("decode", 0).current and checker.state("asr", 0).current
    assert storage.read_table(WorkDir(work).manifest)["uri"].to_pylist() == [str(new / "one.mp4")]


def test_a_video_rewritten_in_place_with_the_same_size_is_redone_and_validate_says_so(tmp_path):
    import os

    from media_factory import make_video

    from pipeline.engine.lineage import Lineage
    from reports.validate import validate_work_dir

    folder, work = tmp_path / "videos", tmp_path / "work"
    folder.mkdir()
    video = make_video(folder / "one.mp4", duration_s=1.0)
    cfg = load_config(None)
    rows = write_manifest(cfg, folder, work)[1].to_pylist()
    assert rows[0]["content_tag"] == f"mtime:{video.stat().st_mtime_ns}"
    from pipeline.engine import runner

    runner.run_one_shard(cfg, work, "decode", 0, quiet=True)
    assert validate_work_dir(work) == []
    data = bytearray(video.read_bytes())
    data[-1] ^= 0xFF
    stamp = video.stat().st_mtime_ns
    video.write_bytes(bytes(data))
    os.utime(video, ns=(stamp + 1_000_000_000, stamp + 1_000_000_000))
    _, _, changes = write_manifest(cfg, folder, work)
    assert changes["changed_shards"] == [0]
    assert Lineage(work, cfg).state("decode", 0).status == "stale"
    assert any("decode part 00000 is stale" in problem for problem in validate_work_dir(work))


def test_object_storage_listings_give_a_content_tag(tmp_path):
    import fsspec

    from pipeline.engine.manifest import list_videos, remote_tag

    fs = fsspec.filesystem("memory")
    fs.pipe("/tagged/one.mp4", b"bytes")
    try:
        rows = list_videos("memory://tagged")
    finally:
        fs.rm("/tagged", recursive=True)
    assert rows[0]["content_tag"] and rows[0]["content_tag"].startswith("mtime:")
    assert remote_tag({"ETag": '"abc"', "LastModified": "2026"}) == "etag:abc"
    assert remote_tag({"size": 3}) is None


def test_a_file_name_that_is_not_utf8_is_listed_by_its_bytes_and_decoded(tmp_path):
    import os

    from media_factory import make_video

    from pipeline.engine import runner
    from pipeline.engine.workdir import WorkDir

    folder, work = tmp_path / "videos", tmp_path / "work"
    folder.mkdir()
    make_video(folder / "plain.mp4", duration_s=1.0)
    (folder / "plain.vtt").write_text("WEBVTT\n\n00:00:00.000 --> 00:00:00.900\nrien.\n")
    make_video(folder / "latin.mp4", duration_s=1.0)
    (folder / "latin.vtt").write_text("WEBVTT\n\n00:00:00.000 --> 00:00:00.900\nbonjour tout le monde.\n")
    raw = os.fsencode(folder) + b"/caf\xe9"  # Latin-1 bytes: not UTF-8
    os.rename(folder / "latin.mp4", raw + b".mp4")
    os.rename(folder / "latin.vtt", raw + b".vtt")
    # and one that is neither a video nor a transcript: error rows that name it, the shard complete
    (folder / "broken.mp4").write_bytes(b"not a video")
    (folder / "broken.vtt").write_text("not WebVTT\n")
    os.rename(folder / "broken.mp4", os.fsencode(folder) + b"/th\xe9.mp4")
    os.rename(folder / "broken.vtt", os.fsencode(folder) + b"/th\xe9.vtt")
    cfg = load_config(None, ["asr.language=fr", "decode.clip_frames=14", "decode.min_clip_frames=7"])
    _, table, _ = write_manifest(cfg, folder, work)
    rows = {row["uri"].rsplit("/", 1)[1]: row for row in table.to_pylist()}
    assert set(rows) == {"plain.mp4", "caf%E9.mp4", "th%E9.mp4"}
    assert rows["caf%E9.mp4"]["uri"] == "file://" + str(folder) + "/caf%E9.mp4"
    assert rows["caf%E9.mp4"]["transcript_uri"] == "file://" + str(folder) + "/caf%E9.vtt"
    for stage in ("decode", "asr"):
        runner.run_one_shard(cfg, work, stage, 0, quiet=True)
    videos = {row["video_id"]: row for row in pq.read_table(WorkDir(work).part("decode", 0, "videos")).to_pylist()}
    assert videos[rows["caf%E9.mp4"]["video_id"]]["status"] == videos[rows["plain.mp4"]["video_id"]]["status"] == "ok"
    imported = {row["video_id"]: row for row in pq.read_table(WorkDir(work).part("asr", 0)).to_pylist()}
    assert imported[rows["caf%E9.mp4"]["video_id"]]["sentences"][0]["text"] == "bonjour tout le monde."
    broken = rows["th%E9.mp4"]["video_id"]
    for stage in ("decode", "asr"):
        errors = {row["video_id"]: row for row in pq.read_table(WorkDir(work).errors(stage, 0)).to_pylist()}
        assert set(errors) == {broken}, stage
    assert "th\\xe9.vtt:1: a WebVTT file starts with 'WEBVTT'" in errors[broken]["message"]
