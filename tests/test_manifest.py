import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import storage
from pipeline.config import load_config
from pipeline.manifest import ManifestError, build_manifest, make_video_id, write_manifest


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
    paths = ["dir/My Vidéo (1).mp4", "dir/My Vidéo (1).mkv", "../../etc/passwd.mp4", "a\x00b\nc.mp4",
             "日本語/料理.mp4", "x" * 500 + ".mp4"]
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
    assert listed["missing.mp4"]["bytes"] is None   # decode reports it as an error row
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
    from pipeline.lineage import Lineage
    videos = tmp_path / "videos"
    _touch(videos / "a.mp4")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    write_manifest(load_config(None, []), videos, ".")
    checker = Lineage(".")
    assert checker.manifest_shards() == [0]
    assert checker.verified("manifest", None, checker.work.manifest) == checker.work.manifest   # its sha256 matches
    assert storage.relative_name(".", "manifest/manifest.parquet") == "manifest/manifest.parquet"
