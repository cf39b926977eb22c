"""eval forecast's numbers: horizons labelled with training's subsampling, top-k accuracy of the visual word
s positions ahead on held-out videos beside a frequency prior and the last word repeated, and a note when the
forecast ignores its context."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_videobert import TOKENIZER_SPEC, config
from test_youcook2 import synthetic_quantize

from pipeline.engine.workdir import WorkDir
from pipeline.tokenizer import load_tokenizer
from videobert import checkpoints
from videobert.eval import forecast
from videobert.model import VideoBert
from videobert.synthetic import write_synthetic
from videobert.train import train

VIDEOS = [f"synthetic{v:04d}" for v in range(8)]


def sequence(v: int) -> list[int]:
    """Video v's visual word per clip: a cycle over the used words 0..7 (steps of 1 or 2), with repeats."""
    return [(v + (1 + v % 2) * (i // 2)) % 8 for i in range(14)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    work = tmp_path_factory.mktemp("forecast")
    write_synthetic(work, load_tokenizer(TOKENIZER_SPEC), videos=8, videos_per_shard=2)
    codebook_sha = json.loads((work / "kmeans" / "codebook.json").read_text())["sha256"]
    synthetic_quantize(work, codebook_sha, {video: sequence(v) for v, video in enumerate(VIDEOS)})
    cfg = config(work, "train.validation_videos=2", "train.max_subsample_step=2", "eval.forecast_steps=[1, 3]")
    train(cfg, work, quiet=True)
    return work, cfg


def expected_pairs(videos: list[str], step: int, rate: int) -> list[tuple[list[int], int]]:
    pairs = []
    for video in videos:
        tokens = sequence(VIDEOS.index(video))
        for last in range(len(tokens) - step * rate):
            first = max(last % rate, last - (forecast.CONTEXT - 1) * rate)
            pairs.append((tokens[first : last + 1 : rate], tokens[last + step * rate]))
    return pairs


def test_horizons_are_labelled_with_the_subsampling_of_training(trained):
    work, cfg = trained
    report = forecast.forecast(cfg, work)
    assert report["horizons"]["1"] == {"positions": 1, "seconds": [1.5, 3.0], "label": "1 position = 1.5 s to 3 s"}
    assert report["horizons"]["3"]["label"] == "3 positions = 4.5 s to 9 s"
    assert report["subsample_steps"] == [1, 2] and "training drew 1..2" in report["position"]
    assert forecast.horizon_label(2, 1.5, 1)["label"] == "2 positions = 3 s"


def test_top_k_accuracy_on_held_out_videos_beside_a_frequency_prior(trained):
    work, cfg = trained
    report = forecast.forecast(cfg, work)
    held_out = checkpoints.load_model(
        checkpoints.latest_checkpoint(checkpoints.local_files(WorkDir(work))), torch.device("cpu"), resuming=False
    )[1]["validation_videos"]
    assert len(held_out) == 2
    training = [t for v, video in enumerate(VIDEOS) if video not in held_out for t in sequence(v)]
    most_frequent = int(np.argmax(np.bincount(training, minlength=8)))
    assert set(report["accuracy"]) == {"1@1", "1@2", "3@1", "3@2"}
    for row in report["accuracy"].values():
        pairs = expected_pairs(held_out, row["positions"], row["subsample_step"])
        assert row["contexts"] == len(pairs) and row["videos"] == 2
        assert row["seconds"] == 1.5 * row["positions"] * row["subsample_step"]
        assert row["frequency_prior_top1"] == pytest.approx(np.mean([t == most_frequent for _, t in pairs]))
        assert row["repeat_last_top1"] == pytest.approx(np.mean([t == c[-1] for c, t in pairs]))
        assert 0 <= row["top1"] <= row["top5"] <= 1 and 1 <= row["distinct_top1"] <= 8
    saved = json.loads((WorkDir(work).eval_folder / "forecast.json").read_text())
    assert saved["accuracy"] == report["accuracy"]
    table = forecast.format_accuracy(report)
    assert "forecast accuracy on held-out videos" in table and "prior1" in table and len(table.splitlines()) >= 6


def test_a_forecast_that_ignores_its_context_is_said(trained, tmp_path):
    work, cfg = trained
    latest = checkpoints.latest_checkpoint(checkpoints.local_files(WorkDir(work)))
    model, info = VideoBert.load(latest)
    with torch.no_grad():  # the output layer reads nothing: one word wins everywhere
        model.mlm_decoder.weight.zero_()
        model.mlm_decoder.bias.copy_(torch.arange(model.mlm_decoder.bias.numel(), dtype=torch.float32))
    constant = tmp_path / "step-00000006"
    model.save(constant, info)
    report = forecast.forecast(cfg, work, checkpoint=constant)
    assert any(
        "does not depend on its context: one top-1 visual word" in note and "4 of 4 positions@step" in note
        for note in report["notes"]
    )
    assert any("all" in note and "visual words of the figure" in note for note in report["notes"])
    assert all(row["distinct_top1"] == 1 for row in report["accuracy"].values())
    # a note exactly where one word takes SAME_SHARE of the contexts
    for checked in (report, forecast.forecast(cfg, work)):
        for row in checked["accuracy"].values():
            key = f"{row['positions']}@{row['subsample_step']} ("
            named = any("one top-1 visual word" in note and key in note for note in checked["notes"])
            assert named == (row["most_common_top1_share"] >= forecast.SAME_SHARE)


def test_without_held_out_videos_there_is_no_number_and_it_says_why(tmp_path):
    write_synthetic(tmp_path, load_tokenizer(TOKENIZER_SPEC), videos=4, videos_per_shard=2)
    codebook_sha = json.loads((tmp_path / "kmeans" / "codebook.json").read_text())["sha256"]
    synthetic_quantize(tmp_path, codebook_sha, {video: sequence(v) for v, video in enumerate(VIDEOS[:4])})
    cfg = config(tmp_path, "train.max_steps=2")
    train(cfg, tmp_path, quiet=True)
    report = forecast.forecast(cfg, tmp_path)
    assert report["accuracy"] is None and any("no held-out videos" in note for note in report["notes"])


def test_the_report_labels_the_horizons_and_shows_the_accuracy(trained):
    from reports.forecast import forecast_html

    work, cfg = trained
    report = forecast.forecast(cfg, work)
    page = forecast_html(dict(report, nearest={}), {})
    assert "1 position = 1.5 s to 3 s: v" in page and "3 positions = 4.5 s to 9 s: v" in page
    assert "next visual word on held-out videos" in page and "prior top-1" in page
    assert page.count("<tr>") == 1 + len(report["accuracy"])
    assert "One position = one visual token: 1.5 s x the subsampling step (training drew 1..2)." in page
