"""The report and the gallery on what real data brings: long error messages, held-out videos, losses above
chance, closed sets of a few words, thumbnails that say where they are from, grids that fit the page."""

from __future__ import annotations

import math
import re

import gallery_factory as factory
import numpy as np
import pytest

from pipeline.config import load_config
from pipeline.engine.workdir import WorkDir
from reports import report
from reports.gallery import counted, write_gallery


def _video_row(video_id: str, errors: list[str]) -> dict:
    return {"video_id": video_id, "shard": 0, "status": "ok", "duration_s": 6.0, "clips": 4, "asr_status": "ok",
            "language": "en", "language_prob": 0.99, "sentences_kept": 2, "sentences_rejected": 0,
            "rejected_by_reason": {}, "text_segments": 2, "video_only_segments": 0, "errors": errors}


def test_a_long_error_message_is_folded_and_held_out_videos_are_marked():
    long = "decode: " + "invalid NAL unit size " * 40
    page = report._videos_html({"rows": [_video_row("kitchen", [long]), _video_row("garden", [])], "videos": 2,
                                "not_listed": 0}, held_out=["garden"])
    assert "<details><summary>decode: invalid NAL unit size" in page
    summary = re.search(r"<summary>(.*?)</summary>", page).group(1)
    assert len(summary) <= report.SHOWN_MESSAGE and summary.endswith("…")
    assert long in page   # in full, folded
    assert 'garden <span class="held-out">(held out)</span>' in page
    assert "kitchen <span" not in page
    assert "one of the 1 video training keeps for validation" in page
    assert "table.videos td:last-child { white-space: normal" in report.REPORT_STYLE


def test_losses_are_shown_against_their_uniform_baseline(tmp_path):
    work = WorkDir(tmp_path)
    work.codebook_sidecar.parent.mkdir(parents=True)
    work.codebook_sidecar.write_text('{"k": 6, "depth": 2}')
    uniform = report.uniform_losses(load_config(report.Path(__file__).parents[1] / "configs/demo.yaml"), tmp_path)
    assert uniform["visual_words"] == 36 and uniform["vocabulary"] == uniform["text_vocabulary"] + 37
    assert uniform["mlm"] == round(math.log(uniform["vocabulary"]), 4)
    assert uniform["alignment"] == round(math.log(2), 4)
    records = [{"step": 5, "loss": 12.0, "mlm_text_loss": 9.0, "mlm_text_acc": 0.1, "mlm_video_loss": 13.7,
                "mlm_video_acc": 0.0, "alignment_loss": 0.6, "alignment_acc": 0.7}]
    page = report._train_html(records, [dict(records[0], videos=1)], {"validation_videos": ["v1"]}, uniform)
    assert "<th>uniform baseline</th>" in page
    assert f"ln V = {uniform['mlm']:.2f}" in page and "ln 2 = 0.69" in page and "confidently wrong" in page
    row = re.search(r"<tr><td[^>]*>mlm_video</td>(.*?)</tr>", page).group(1)
    assert re.findall(r">([^<]+)</td>", row)[:2] == [report._number(uniform["mlm"]), report._number(13.7)]
    assert report.uniform_losses(load_config(), tmp_path / "none") is None   # no codebook: no baseline


def test_closed_set_probabilities_are_over_the_closed_set():
    from videobert.eval.zero_shot import _top
    # a closed set of three words whose text-vocabulary probabilities are tiny
    scores = np.log(np.array([[1e-6, 2e-6, 1e-6, 0.5, 0.4]], dtype=np.float64))
    closed = np.array([0, 1, 2])
    (words, found), = _top(scores, ["a", "b", "c", "d", "e"], closed)
    assert words == ["b", "a", "c"]
    assert sum(math.exp(score) for score in found) == pytest.approx(1.0)
    assert math.exp(found[0]) == pytest.approx(0.5)
    (words, found), = _top(scores, ["a", "b", "c", "d", "e"])   # open vocabulary: as scored
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
    assert re.findall(r'<div class="thumbs" style="grid-template-columns: repeat\((\d+), minmax\(0, max-content\)\)"',
                      gallery_page) and ".thumbs { display: grid;" in gallery_page
    assert "flex-wrap: wrap" not in gallery_page.split(".thumbs {")[1].split("}")[0]
    assert counted(1, "training member") == "1 training member" and counted(2, "clip") == "2 clips"
    assert counted(1200, "clip") == "1,200 clips"
    assert not re.search(r"\b1 training members\b|\b1 clips\b", gallery_page)
