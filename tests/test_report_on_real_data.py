"""The report and the gallery on what real data brings: long error messages, held-out videos, losses above
chance, closed sets of a few words, thumbnails that say where they are from, grids that fit the page."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import gallery_factory as factory
import numpy as np
import pytest

from pipeline.config import load_config
from pipeline.engine.workdir import WorkDir
from reports import report, training, videos
from reports.cells import SHOWN_MESSAGE, counted, number
from reports.gallery import write_gallery


def _video_row(video_id: str, errors: list[str]) -> dict:
    return {
        "video_id": video_id,
        "shard": 0,
        "status": "ok",
        "duration_s": 6.0,
        "clips": 4,
        "asr_status": "ok",
        "language": "en",
        "language_prob": 0.99,
        "sentences_kept": 2,
        "sentences_rejected": 0,
        "rejected_by_reason": {},
        "text_segments": 2,
        "video_only_segments": 0,
        "errors": errors,
    }


def test_a_long_error_message_is_folded_and_held_out_videos_are_marked():
    long = "decode: " + "invalid NAL unit size " * 40
    page = videos.videos_html(
        {"rows": [_video_row("kitchen", [long]), _video_row("garden", [])], "videos": 2, "not_listed": 0},
        held_out=["garden"],
    )
    assert "<details><summary>decode: invalid NAL unit size" in page
    summary = re.search(r"<summary>(.*?)</summary>", page).group(1)
    assert len(summary) <= SHOWN_MESSAGE and summary.endswith("…")
    assert long in page  # in full, folded
    assert 'garden <span class="held-out">(held out)</span>' in page
    assert "kitchen <span" not in page
    assert "one of the 1 video training keeps for validation" in page
    assert "table.videos td:last-child { white-space: normal" in report.REPORT_STYLE


def test_losses_are_shown_against_their_uniform_baseline(tmp_path):
    work = WorkDir(tmp_path)
    work.codebook_sidecar.parent.mkdir(parents=True)
    work.codebook_sidecar.write_text('{"k": 6, "depth": 2}')
    uniform = training.uniform_losses(load_config(Path(__file__).parents[1] / "configs/demo.yaml"), tmp_path)
    assert uniform["visual_words"] == 36 and uniform["vocabulary"] == uniform["text_vocabulary"] + 37
    assert uniform["mlm"] == round(math.log(uniform["vocabulary"]), 4)
    assert uniform["alignment"] == round(math.log(2), 4)
    records = [
        {
            "step": 5,
            "loss": 12.0,
            "mlm_text_loss": 9.0,
            "mlm_text_acc": 0.1,
            "mlm_video_loss": 13.7,
            "mlm_video_acc": 0.0,
            "alignment_loss": 0.6,
            "alignment_acc": 0.7,
        }
    ]
    page = training.train_html(records, [dict(records[0], videos=1)], {"validation_videos": ["v1"]}, uniform)
    assert "<th>uniform baseline</th>" in page
    assert f"ln V = {uniform['mlm']:.2f}" in page and "ln 2 = 0.69" in page and "confidently wrong" in page
    row = re.search(r"<tr><td[^>]*>mlm_video</td>(.*?)</tr>", page).group(1)
    assert re.findall(r">([^<]+)</td>", row)[:2] == [number(uniform["mlm"]), number(13.7)]
    assert training.uniform_losses(load_config(), tmp_path / "none") is None  # no codebook: no baseline


def test_closed_set_probabilities_are_over_the_closed_set():
    from videobert.eval.zero_shot_scoring import _top

    # a closed set of three words whose text-vocabulary probabilities are tiny
    scores = np.log(np.array([[1e-6, 2e-6, 1e-6, 0.5, 0.4]], dtype=np.float64))
    closed = np.array([0, 1, 2])
    ((words, found),) = _top(scores, ["a", "b", "c", "d", "e"], closed)
    assert words == ["b", "a", "c"]
    assert sum(math.exp(score) for score in found) == pytest.approx(1.0)
    assert math.exp(found[0]) == pytest.approx(0.5)
    ((words, found),) = _top(scores, ["a", "b", "c", "d", "e"])  # open vocabulary: as scored
    assert words[:2] == ["d", "e"] and math.exp(found[0]) == pytest.approx(0.5)


# ---------------------------------------------------------------- the gallery


@pytest.fixture(scope="module")
def gallery_page(tmp_path_factory) -> str:
    work = factory.make_work_dir(tmp_path_factory.mktemp("gallery"))
    cfg = load_config(None, [f"decode.thumbnail_size={factory.THUMBNAIL_SIZE}"])
    paths = write_gallery(cfg, work, level=1, clusters=12, per_cluster=12, quiet=True)
    return paths[0].read_text()


def test_every_thumbnail_says_its_video_and_time(gallery_page):
    captions = re.findall(r'<figcaption title="([^"]*)">(.*?)</figcaption>', gallery_page)
    assert captions
    for title, caption in captions:
        video, start = re.match(r"(.*) clip \d+ at ([\d.]+)s", title).groups()
        assert caption.startswith(f"{video}<br>{float(start):.1f} s &middot; d ")


def test_a_row_of_thumbnails_fits_the_page_and_counts_read_right(gallery_page):
    # a grid of one row per node whose columns shrink below the thumbnails' size: nothing wraps at 1400 px
    assert (
        re.findall(
            r'<div class="thumbs" style="grid-template-columns: repeat\((\d+), minmax\(0, max-content\)\)"',
            gallery_page,
        )
        and ".thumbs { display: grid;" in gallery_page
    )
    assert "flex-wrap: wrap" not in gallery_page.split(".thumbs {")[1].split("}")[0]
    assert counted(1, "training member") == "1 training member" and counted(2, "clip") == "2 clips"
    assert counted(1200, "clip") == "1,200 clips"
    assert not re.search(r"\b1 training members\b|\b1 clips\b", gallery_page)


def test_a_node_one_video_fills_is_named_with_its_decode_status_and_shown_last(tmp_path):
    # on real data the two clips of a corrupted video's colour bars took 2 of 6 level-1 nodes: such a node
    # is one video's look, not a visual word videos share
    work = factory.make_work_dir(tmp_path, alone="v0")
    cfg = load_config(None, [f"decode.thumbnail_size={factory.THUMBNAIL_SIZE}"])
    paths = write_gallery(cfg, work, level=1, clusters=12, per_cluster=12, quiet=True)
    page, sidecar = paths[0].read_text(), json.loads((WorkDir(work).gallery / "gallery.json").read_text())
    level_one = {node["node"]: node for node in sidecar["nodes"] if node["level"] == 1}
    assert [level_one[node]["training_members"] for node in (0, 1, 2)] == [12, 11, 8]  # v0's node is the largest
    assert {node: (entry["videos"], entry["only_video"]) for node, entry in level_one.items()} == {
        0: (1, "v0"),
        1: (2, None),
        2: (2, None),
    }
    # after the nodes several videos fill (by training members), and said so
    assert _clusters(page) == [1, 2, 0] == sidecar["shown"]
    labels = re.findall(r'<div class="label">(.*?)</div>', page)
    assert '<span class="warning">one video only: v0 (decode status partial)</span>' in labels[2]
    assert "<br>2 videos<br>" in labels[0] and "<br>2 videos<br>" in labels[1]
    note = re.search(r'<p class="warning">([^<]*)</p>', page).group(1)
    assert note.startswith(
        "1 of 3 nodes shown holds the clips of one video only (v0 (decode status partial): 1 node)."
    ) and note.endswith("Shown last.")
    # ids asked for keep their order; the label still says it
    page = write_gallery(cfg, work, level=1, node_ids=[0, 2], per_cluster=4, quiet=True)[0].read_text()
    assert _clusters(page) == [0, 2] and "one video only: v0" in page and "Shown last." not in page
    # no such node: no note
    assert (
        '<p class="warning">'
        not in write_gallery(cfg, factory.make_work_dir(tmp_path / "spread"), level=1, quiet=True)[0].read_text()
    )


def test_distinct_videos_per_node_are_counted_up_to_a_bound():
    from reports.gallery import videos_label
    from reports.nearest import VIDEOS_COUNTED, NodeClips

    entry = NodeClips(level=1, node=0, keep=3)
    entry.count_videos(["a", "a"])
    assert entry.only_video == "a" and videos_label(entry, {"a": "ok"}) == "one video only: a"
    entry.count_videos(["b"])
    assert entry.only_video is None and videos_label(entry, {}) == "2 videos"
    entry.count_videos([f"v{index}" for index in range(2 * VIDEOS_COUNTED)])
    assert len(entry.videos) == VIDEOS_COUNTED and videos_label(entry, {}) == f"{VIDEOS_COUNTED:,}+ videos"


def _clusters(page: str) -> list[int]:
    return [int(node) for node in re.findall(r'<section class="cluster(?: empty)?" id="node-\d+-(\d+)"', page)]


def _css_px(style: str, selector: str, prop: str, em_px: float = 14.0) -> float:
    """The pixels of `prop` in the first rule of `style` for `selector` (px or em)."""
    rule = re.search(r"(?m)^" + re.escape(selector) + r" \{([^}]*)\}", style).group(1)
    value = re.search(rf"(?:^|;)\s*{prop}:\s*([^;]+)", rule).group(1).split()
    size = value[-1] if prop == "flex" else value[0]
    return float(size[:-2]) * em_px if size.endswith("em") else float(size.removesuffix("px"))


def test_at_1400_px_a_row_of_twelve_thumbnails_stays_one_row_at_near_full_size(gallery_page):
    from reports.contact_sheet import LABEL_WIDTH_PX, contact_sheet
    from reports.nearest import NodeClips
    from reports.page import PAGE_STYLE

    # the page's row: body margins, the label column, the gap to the grid, then 12 columns and their 11 gaps
    margins = 2 * _css_px(PAGE_STYLE, "body", "margin")
    label, label_gap = _css_px(PAGE_STYLE, ".cluster .label", "flex"), _css_px(PAGE_STYLE, ".cluster", "gap")
    column_gap = _css_px(PAGE_STYLE, ".thumbs", "gap")
    columns = {
        int(n) for n in re.findall(r"grid-template-columns: repeat\((\d+), minmax\(0, max-content\)\)", gallery_page)
    }
    assert columns == {12}
    rows = re.findall(r'<div class="thumbs"[^>]*>(.*?)</div></section>', gallery_page)
    assert rows and max(row.count("<figure>") for row in rows) == 12  # every thumbnail has a column of row 1
    assert "wrap" not in re.search(r"(?m)^\.cluster \{([^}]*)\}", PAGE_STYLE).group(1)  # the label stays beside
    thumbnail = load_config().decode.thumbnail_size
    width = (1400 - margins - label - label_gap - 11 * column_gap) / 12
    assert 0.95 * thumbnail <= width <= thumbnail, width  # 92.7 px of 96: shrunk a little, never wrapped
    # the contact sheet of 12 thumbnails at the default size fits a 1400 px page too
    entries = [NodeClips(level=1, node=node, keep=12) for node in range(factory.K)]
    sheet = contact_sheet(factory.make_codebook(), entries, {}, thumbnail, 12)
    assert sheet.width == LABEL_WIDTH_PX + 12 * (thumbnail + 2) <= 1400


def test_counts_in_the_report_and_gallery_take_the_right_number(tmp_path):
    from reports.codebook import visual_words_html
    from reports.stage_table import stages_html

    assert counted(1, "leaf", "leaves") == "1 leaf" and counted(36, "leaf", "leaves") == "36 leaves"
    run = {
        "shards": 1,
        "stages": {},
        "errors": {"decode": {"VideoDecodeError": 1}},
        "failed_videos": 1,
        "failures_by_type": {"VideoDecodeError": {"videos": 1, "stages": ["decode"]}},
    }
    assert "<p>1 failed video</p>" in stages_html({"summary": run, "stages": {}, "error_examples": []})
    records = [{"step": 5, "loss": 1.0, "mlm_text_loss": 1.0, "mlm_text_acc": 0.5}]
    assert " at 1 step; " in training.train_html(records, [dict(records[0], videos=2)], {"validation_videos": []})
    words = {
        "depth": 1,
        "k": 2,
        "leaves": 2,
        "sample_size": 1,
        "codebook_sha256": "ab",
        "weights": "random",
        "empty_leaves": 1,
        "clips_quantized": 1,
        "distinct_tokens": 1,
        "perplexity": 1.0,
        "top_token_share": 1.0,
        "unreached_nonempty_leaves": 1,
        "frequency_by_rank": [1],
        "levels": [{"level": 1, "nodes": 2, "empty": 1, "size_bins": {"0": 1, "1": 1}}],
    }
    page = visual_words_html(words)
    assert "fit on 1 clip;" in page and "<p>1 clip quantized into 1 distinct token;" in page
    assert "1 non-empty leaf reached by no clip" in page
    work = factory.make_work_dir(tmp_path)
    cfg = load_config(None, [f"decode.thumbnail_size={factory.THUMBNAIL_SIZE}"])
    page = write_gallery(cfg, work, level=1, per_cluster=1, quiet=True)[0].read_text()
    assert "up to 1 clip nearest each node" in page
    assert "4 videos in 2 shards." in report.write_report(cfg, work).read_text()


def test_the_report_names_the_level_one_nodes_one_video_fills(tmp_path):
    cfg = load_config(None, [])
    work = factory.make_work_dir(tmp_path / "alone", alone="v0")
    page = report.write_report(cfg, work).read_text()
    words = json.loads((work / "report.json").read_text())["visual_words"]
    assert words["level_one"] == [
        {"node": 0, "clips": 12, "videos": 1, "only_video": "v0"},
        {"node": 1, "clips": 11, "videos": 2, "only_video": None},
        {"node": 2, "clips": 8, "videos": 2, "only_video": None},
    ]
    section = page[page.index("<h2>Visual words</h2>") : page.index("<h2>Text</h2>")]
    assert (
        '<p class="warning">1 of the 3 level-1 nodes holds the clips of one video only (v0 (decode status '
        "partial): 1 node). Such a node is that video&#x27;s look"
    ) in section
    spread = factory.make_work_dir(tmp_path / "spread")
    assert "one video only" not in report.write_report(cfg, spread).read_text()
    assert all(
        node["videos"] > 1 for node in json.loads((spread / "report.json").read_text())["visual_words"]["level_one"]
    )
