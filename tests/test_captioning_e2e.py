"""eval captioning and eval forecast on a synthetic work dir with a tiny trained VideoBERT: the outputs,
their provenance, and the command line."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from test_videobert import TOKENIZER_SPEC, config
from test_youcook2 import annotations_file, entry, synthetic_quantize
from work_factory import write_part

import schemas
from pipeline import cli, storage
from pipeline.engine.workdir import WorkDir
from pipeline.tokenizer import load_tokenizer
from videobert.eval import captioning, forecast
from videobert.synthetic import write_synthetic
from videobert.train import train

pytestmark = pytest.mark.slow

CAPTIONS = ["cut the onion", "mix the egg", "fry the sauce"]
TINY_CAPTION = [
    "caption.steps=150",
    "caption.batch_size=8",
    "caption.lr=3e-3",
    "caption.hidden=16",
    "caption.heads=2",
    "caption.feedforward=32",
    "caption.dropout=0.1",
    "caption.num_threads=1",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Six videos of three annotated segments (one per caption, planted visual words and S3D features),
    four for training and two for validation, and a VideoBERT trained for a few steps."""
    work = tmp_path_factory.mktemp("captioning")
    tokenizer = load_tokenizer(TOKENIZER_SPEC)
    write_synthetic(work, tokenizer, videos=8, videos_per_shard=2)
    codebook_sha = json.loads((work / "kmeans" / "codebook.json").read_text())["sha256"]
    rng = np.random.default_rng(0)
    prototypes = rng.standard_normal((len(CAPTIONS), schemas.FEATURE_DIM)) * 2
    clips, features, database = {}, [], {}
    for v in range(6):
        video_id = f"synthetic{v:04d}"
        clips[video_id] = [w for c in range(len(CAPTIONS)) for w in (c, c + 4)]  # two clips per segment
        for i in range(2 * len(CAPTIONS)):
            vector = prototypes[i // 2] + rng.standard_normal(schemas.FEATURE_DIM)
            features.append(
                {
                    "video_id": video_id,
                    "clip_index": i,
                    "start_s": 1.5 * i,
                    "end_s": 1.5 * i + 1.5,
                    "feature": vector.astype(np.float16),
                }
            )
        database[video_id] = entry(
            "training" if v < 4 else "validation", [(3.0 * c, 3.0 * c + 3.0, text) for c, text in enumerate(CAPTIONS)]
        )
    synthetic_quantize(work, codebook_sha, clips)
    write_part(
        work,
        "features",
        0,
        pa.Table.from_pylist(features, schema=schemas.FEATURES.arrow),
        schemas.FEATURES,
        record={"clips": len(features)},
        weights="random(seed=0) - NOT pretrained",
    )
    annotations = annotations_file(work / "annotations.json", database)
    cfg = config(work, f"eval.segments={annotations}", *TINY_CAPTION)
    train(cfg, work, quiet=True)
    return work, cfg, annotations


def test_captioning_writes_the_table_predictions_and_provenance(trained, capsys):
    work, cfg, _ = trained
    report = captioning.run_captioning(cfg, work, quiet=True, use_java=False)  # Java: the CLI test
    assert (report["train_segments"], report["test_segments"]) == (12, 6)
    assert list(report["rows"]) == ["s3d", "videobert", "videobert_s3d"]
    for row in report["rows"].values():
        assert set(row["scores"]) >= {"BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr", "METEOR"}
        assert row["losses"][-1][1] < row["losses"][0][1]
    # the planted S3D directions name each segment's caption: the S3D rows decode them
    assert report["rows"]["s3d"]["scores"]["ROUGE-L"] > 0.9
    assert report["rows"]["videobert_s3d"]["feature_dim"] == 2 * 64 + schemas.FEATURE_DIM
    assert any("NOT the Kinetics-pretrained" in note for note in report["notes"])
    assert report["paper"]["videobert_s3d"]["BLEU-4"] == 4.33
    saved = json.loads((WorkDir(work).eval_folder / "captioning.json").read_text())
    assert saved["rows"]["s3d"]["scores"] == report["rows"]["s3d"]["scores"]
    predictions = storage.read_table(WorkDir(work).eval_folder / "captioning_predictions.parquet").to_pylist()
    assert len(predictions) == 3 * 6
    assert {p["reference"] for p in predictions} == set(CAPTIONS)
    s3d = [p for p in predictions if p["row"] == "s3d"]
    assert sum(p["prediction"] == p["reference"] for p in s3d) >= 5
    meta = storage.read_metadata(WorkDir(work).eval_folder / "captioning_predictions.parquet")
    assert meta.codebook_sha256 and "caption" in meta.extra["caption_config"]
    table = capsys.readouterr().out
    assert "VideoBERT + S3D" in table and "paper: VideoBERT + S3D" in table and "4.33" in table
    # how many captions, which steps and weights made the table; the paper's other rows apart, for comparison
    assert "scored on 6 validation captions of 2 videos, trained on 12 training captions of 4 videos" in table
    assert "captioner 150 steps of batch 8" in table and "S3D weights random" in table
    assert f"VideoBERT step {report['made_by']['videobert_step']} from " in table
    mine, comparison = table.split("for comparison, the paper:")
    assert "paper:" not in mine and "40K steps of batch 128" in comparison
    assert all(
        f"paper: {label}" in comparison
        for label in ("S3D", "VideoBERT", "VideoBERT + S3D", "Zhou et al. 2018", "VideoBERT (video only)")
    )
    assert "0.31" in comparison and "0.49" in comparison and "0.38" in comparison


def test_captioning_needs_an_annotations_file(trained):
    work, _, _ = trained
    with pytest.raises(ValueError, match="annotations"):
        captioning.run_captioning(config(work, *TINY_CAPTION), work, quiet=True, use_java=False)


def test_forecast_names_three_non_empty_words_per_horizon(trained):
    work, cfg, _ = trained
    report = forecast.forecast(cfg, work)
    assert report["steps"] == [1, 2, 4] and len(report["words"]) == cfg.eval.forecast_words
    members = [word["members"] for word in report["words"]]
    assert members == sorted(members, reverse=True) and min(members) > 0
    for word in report["words"]:
        for found in word["forecasts"].values():
            assert len(found) == 3
            assert all(f["leaf"] < 8 for f in found)  # write_synthetic: only leaves 0..7 have clips
            probs = [f["prob"] for f in found]
            assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
    assert json.loads((WorkDir(work).eval_folder / "forecast.json").read_text())["words"] == report["words"]


def test_captioning_and_forecast_through_the_command_line(trained, capsys):
    work, _, annotations = trained
    common = [
        "--work-dir",
        str(work),
        "--quiet",
        "--set",
        f"eval.segments={annotations}",
        *[
            item
            for setting in [s for s in TINY_CAPTION if not s.startswith("caption.steps=")]
            + [
                "train.max_len=48",
                "caption.rows=[s3d]",
                "caption.cv_folds=2",
                "caption.steps=30",  # what the command writes; learning: the test above
                "caption.cv_grid={dropout: [0.1, 0.2]}",
                "caption.cv_metric=ROUGE-L",
            ]
            for item in ("--set", setting)
        ],
    ]
    assert cli.main(["eval", "captioning", *common]) == 0
    assert "S3D" in capsys.readouterr().out
    saved = json.loads((WorkDir(work).eval_folder / "captioning.json").read_text())
    assert list(saved["rows"]) == ["s3d"]
    validation = saved["rows"]["s3d"]["cross_validation"]  # 2 folds of 2 training videos each
    assert validation["folds"] == 2 and [c["params"] for c in validation["candidates"]] == [
        {"dropout": 0.1},
        {"dropout": 0.2},
    ]
    assert saved["rows"]["s3d"]["params"]["dropout"] in (0.1, 0.2)
    if saved["metrics"]["meteor"] is not None:  # with Java: coco-caption's METEOR and PTB
        assert saved["rows"]["s3d"]["scores"]["METEOR"] is not None
        assert saved["metrics"]["tokenizer"].startswith("Stanford PTBTokenizer")
    assert cli.main(["eval", "forecast", *common, "--set", "eval.forecast_words=2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all(" +1 position = 1.5 s to 7.5 s: " in line and line.count("+") == 3 for line in lines)


def test_the_report_shows_each_word_and_its_forecasts_as_thumbnails():
    from reports.forecast import forecast_html, forecast_thumbnails

    clip = {"shard": 0, "video_id": "v", "clip_index": 3, "start_s": 4.5}
    data = {
        "steps": [1, 2],
        "words": [
            {
                "leaf": 5,
                "members": 9,
                "forecasts": {
                    "1": [{"leaf": 5, "prob": 0.5}, {"leaf": 7, "prob": 0.25}, {"leaf": 2, "prob": 0.125}],
                    "2": [{"leaf": 7, "prob": 0.4}, {"leaf": 5, "prob": 0.3}, {"leaf": 2, "prob": 0.2}],
                },
            }
        ],
        "nearest": {"2": [], "5": [clip], "7": [dict(clip, clip_index=4)]},
    }
    assert forecast_thumbnails(data) == [(0, "v", 3), (0, "v", 4)]
    page = forecast_html(data, {(0, "v", 3): b"\xff\xd8jpeg", (0, "v", 4): b"\xff\xd8jpeg"})
    assert "<h2>Forecasting</h2>" in page and "v5 (given)" in page
    assert "+1: v7 0.25" in page and "+2: v2 0.20" in page
    assert page.count("<img") == 1 + 2 + 2 and "no clip" in page  # leaf 2 has no clip of this run
    assert forecast_html(None, {}) == ""
