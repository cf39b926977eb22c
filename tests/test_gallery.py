"""The gallery on a small finished work dir (tests/gallery_factory.py): the right clips, nearest first,
every image embedded and valid, one page per parent, a contact sheet, a sidecar; bad arguments refused."""

import base64
import io
import json
import re

import gallery_factory as factory
import numpy as np
import pytest
from PIL import Image

from pipeline import cli
from pipeline.config import load_config
from reports.contact_sheet import WARNING_BACKGROUND, WARNING_INK
from reports.gallery import write_gallery
from schemas.codebook import node_path

IMG_SRC = re.compile(r'<img src="([^"]+)"')
CLUSTER = re.compile(r'<section class="cluster( empty)?" id="node-(\d+)-(\d+)"')


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return factory.make_work_dir(tmp_path_factory.mktemp("gallery"))


@pytest.fixture(scope="module")
def cfg():
    return load_config(None, [f"decode.thumbnail_size={factory.THUMBNAIL_SIZE}"])


def _images(page: str) -> list[Image.Image]:
    """Every <img> of a page, decoded: each must be an embedded, valid JPEG."""
    images = []
    for src in IMG_SRC.findall(page):
        assert src.startswith("data:image/jpeg;base64,"), src[:40]
        image = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
        image.load()
        images.append(image)
    return images


def _clusters(page: str) -> list[tuple[int, int, bool]]:
    return [(int(level), int(node), bool(empty)) for empty, level, node in CLUSTER.findall(page)]


def test_level_one_shows_every_top_cluster_with_its_nearest_clips_first(work, cfg):
    paths = write_gallery(cfg, work, level=1, clusters=12, per_cluster=5, quiet=True)
    names = [path.name for path in paths]
    assert names == [
        "index.html",
        "contact-level-1.png",
        "node-1-0.html",
        "node-1-1.html",
        "node-1-2.html",
        "gallery.json",
    ]
    assert all(path.exists() for path in paths)
    index = paths[0].read_text()
    assert _clusters(index) == [(1, 0, False), (1, 1, False), (1, 2, False)]  # largest first: 13, 11, 7
    assert len(_images(index)) == 3 * 5
    assert "http" not in index.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched
    for node in range(factory.K):  # a link to each cluster's children page, which exists
        assert f'href="node-1-{node}.html"' in index

    sidecar = json.loads(paths[-1].read_text())
    nodes = {(entry["level"], entry["node"]): entry for entry in sidecar["nodes"]}
    codebook = factory.make_codebook()
    for node, (video_id, clip_index) in factory.EXACT_CLIP.items():
        nearest = nodes[(1, node)]["nearest"]
        # the clip placed on the centroid comes first, then the others by distance
        assert (nearest[0]["video_id"], nearest[0]["clip_index"], nearest[0]["distance"]) == (video_id, clip_index, 0.0)
        assert [clip["distance"] for clip in nearest] == sorted(clip["distance"] for clip in nearest)
        assert nodes[(1, node)]["training_members"] == int(codebook.counts[0][node])
        assert nodes[(1, node)]["clips"] == int(codebook.counts[0][node])
    assert sidecar["missing_thumbnails"] == 0 and sidecar["codebook_sha256"]


def test_children_pages_show_each_child_and_mark_the_empty_one(work, cfg):
    write_gallery(cfg, work, level=1, per_cluster=4, quiet=True)
    page = (work / "gallery" / "node-1-2.html").read_text()
    # the parent's own row, then its k children; leaf 8 has no member
    assert _clusters(page) == [(1, 2, False), (2, 6, False), (2, 7, False), (2, 8, True)]
    assert 'href="index.html"' in page
    rows = page.split('<section class="cluster')
    leaf_7 = next(row for row in rows if 'id="node-2-7"' in row)
    # every thumbnail of a leaf row is that leaf's colour: its clips really are its members
    for image in _images(leaf_7):
        assert np.abs(np.asarray(image.convert("RGB"), dtype=int) - factory.leaf_colour(7)).max() < 12
    assert len(_images(leaf_7)) == 3  # leaf 7 has 3 clips, fewer than per_cluster


def test_contact_sheet_has_a_row_per_cluster_in_thumbnail_colours(work, cfg):
    paths = write_gallery(cfg, work, level=2, node_ids=[7, 0], per_cluster=3, quiet=True)
    assert [path.name for path in paths] == ["level-2.html", "contact-level-2.png", "gallery.json"]
    assert _clusters(paths[0].read_text()) == [(2, 7, False), (2, 0, False)]  # ids in the order asked
    sheet = Image.open(paths[1]).convert("RGB")
    cell = factory.THUMBNAIL_SIZE
    assert sheet.size[0] == 190 + 3 * (cell + 2)
    row_height = max(cell, 56) + 4
    band = sheet.size[1] - 2 * row_height  # the NOT-pretrained warning across the top
    assert band > 0
    centre = np.asarray(sheet.getpixel((190 + cell // 2, band + 2 + cell // 2)))  # first thumbnail of row 1
    assert np.abs(centre - factory.leaf_colour(7)).max() < 12


def _warning_ink(image: Image.Image, top: int, bottom: int) -> int:
    """Pixels of the warning's ink colour between two rows."""
    pixels = np.asarray(image.convert("RGB"), dtype=int)[top:bottom]
    return int((np.abs(pixels - WARNING_INK).max(axis=2) < 40).sum())


def test_the_contact_sheet_of_random_weights_says_not_pretrained_and_the_index_links_it(work, cfg, tmp_path):
    paths = write_gallery(cfg, work, level=1, per_cluster=3, quiet=True)
    index, sheet_path = paths[0].read_text(), paths[1]
    assert 'href="contact-level-1.png"' in index and sheet_path.name == "contact-level-1.png"
    sheet = Image.open(sheet_path)
    assert "NOT pretrained" in sheet.text["Warning"]  # in its metadata ...
    band = sheet.size[1] - 3 * (max(factory.THUMBNAIL_SIZE, 56) + 4)
    assert band > 0 and _warning_ink(sheet, 0, band) > 100  # ... and drawn across its top
    assert _warning_ink(sheet, band, sheet.size[1]) == 0
    assert np.asarray(sheet.convert("RGB"))[1, -2].tolist() == list(WARNING_BACKGROUND)

    # the same gallery of pretrained weights: no band, no warning
    pretrained = factory.make_work_dir(tmp_path)
    info_path = pretrained / "kmeans" / "codebook.json"
    info = json.loads(info_path.read_text())
    info["feature_provenance"]["weights"] = "kinetics400 (sha256 0123)"
    info_path.write_text(json.dumps(info))
    paths = write_gallery(cfg, pretrained, level=1, per_cluster=3, quiet=True)
    sheet = Image.open(paths[1])
    assert "Warning" not in sheet.text and sheet.size[1] == 3 * (max(factory.THUMBNAIL_SIZE, 56) + 4)
    assert _warning_ink(sheet, 0, sheet.size[1]) == 0 and "not semantic" not in paths[0].read_text()


def test_pages_are_deterministic(work, cfg):
    first = {path.name: path.read_bytes() for path in write_gallery(cfg, work, per_cluster=3, quiet=True)}
    second = {path.name: path.read_bytes() for path in write_gallery(cfg, work, per_cluster=3, quiet=True)}
    assert first == second


def test_bad_arguments_are_refused_with_the_reason(work, cfg):
    with pytest.raises(ValueError, match=r"--level must be in 1\.\.2"):
        write_gallery(cfg, work, level=3)
    with pytest.raises(ValueError, match=r"node id 9 is not in 0\.\.8"):
        write_gallery(cfg, work, level=2, node_ids=[1, 9])
    with pytest.raises(ValueError, match="--per-cluster must be >= 1"):
        write_gallery(cfg, work, per_cluster=0)


def test_features_from_another_feature_space_are_refused(tmp_path, cfg):
    work = factory.make_work_dir(tmp_path)
    info_path = work / "kmeans" / "codebook.json"
    info = json.loads(info_path.read_text())
    info["feature_provenance_hash"] = "0000000000000000"
    info_path.write_text(json.dumps(info))
    with pytest.raises(ValueError, match="feature provenance feedfacecafebeef"):
        write_gallery(cfg, work)


def test_missing_stage_outputs_name_the_stage_to_run(tmp_path, cfg):
    work = factory.make_work_dir(tmp_path, stages=("features", "kmeans"))
    with pytest.raises(FileNotFoundError, match="run it first"):  # thumbnails come from decode
        write_gallery(cfg, work, quiet=True)


def test_cli_prints_the_paths_it_wrote(work, capsys):
    assert (
        cli.main(
            [
                "gallery",
                "--work-dir",
                str(work),
                "--per-cluster",
                "2",
                "--quiet",
                "--set",
                f"decode.thumbnail_size={factory.THUMBNAIL_SIZE}",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out.split()
    assert printed[0].endswith("gallery/index.html") and len(printed) == 6


def test_node_path_is_the_base_k_digits_from_the_root():
    assert node_path(12, 1, 5) == [5]
    assert node_path(12, 3, 5 * 144 + 7 * 12 + 11) == [5, 7, 11]
