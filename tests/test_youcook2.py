"""The YouCook II kit (videobert/eval/youcook2.py, and videobert/youcook2.py reading the annotations and keeping
the evaluation videos out of pre-training) and the supervised S3D linear probe (videobert/eval/probe.py): the
manifest from an annotations file in the official format with local clips named by YouTube id, evaluation
segments cut at the annotated times, verb/noun lists and labels from the captions by the POS tagger, zero-shot
on the annotated segments, and the probe on planted features."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from test_videobert import TOKENIZER_SPEC, config
from work_factory import write_manifest_rows, write_part

import schemas
from pipeline import cli, storage
from pipeline.config import load_config
from pipeline.engine.lineage import Lineage
from pipeline.engine.manifest import ManifestError
from pipeline.engine.workdir import WorkDir
from pipeline.tokenizer import load_tokenizer
from videobert import youcook2 as kept_apart
from videobert.data import VocabLayout
from videobert.eval import probe, verb_noun_labels, youcook2, zero_shot
from videobert.synthetic import NOUNS, VERBS, write_synthetic
from videobert.train import train

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "samples" / "youcook2" / "annotations.json"


def annotations_file(path: Path, database: dict) -> Path:
    path.write_text(json.dumps({"database": database}))
    return path


def entry(subset: str, segments: list[tuple[float, float, str]], recipe_type: str = "113") -> dict:
    return {
        "duration": 24.4,
        "subset": subset,
        "recipe_type": recipe_type,
        "annotations": [
            {"segment": [start, end], "id": index, "sentence": sentence}
            for index, (start, end, sentence) in enumerate(segments)
        ],
        "video_url": "https://www.youtube.com/watch?v=xxxxxxxxxxx",
    }


# ---------------------------------------------------------------- manifest


def test_manifest_from_the_annotations_and_a_folder_of_videos_by_youtube_id(tmp_path, capsys):
    # the download script's layout: raw_videos/<subset>/<recipe_type>/<YouTube id>.mp4
    videos = tmp_path / "raw_videos"
    for subset, recipe, name, sample in (
        ("validation", "201", "GLGjiXtlyzE", "cooking_pasta.mp4"),
        ("training", "113", "sHmR-4Yb_N0", "no_audio.mp4"),
    ):
        (videos / subset / recipe).mkdir(parents=True)
        shutil.copy(REPO / "samples" / sample, videos / subset / recipe / f"{name}.mp4")
    (videos / "training" / "113" / "sHmR-4Yb_N0.vtt").write_text("WEBVTT\n\n00:00.000 --> 00:02.000\nhello\n")
    annotations = annotations_file(
        tmp_path / "youcookii_annotations_trainval.json",
        {
            "GLGjiXtlyzE": entry("validation", [(6, 10, "fill a pot with water"), (11, 14, "chop the onion")], "201"),
            "sHmR-4Yb_N0": entry("training", [(0, 4, "boil the water")]),
            "Zz9-missing1": entry("validation", [(0, 5, "cut the bread")]),
        },
    )
    cfg = load_config(None, ["shards.videos_per_shard=1"])
    work = tmp_path / "work"
    path, table, found = youcook2.write_manifest(cfg, annotations, videos, work)
    rows = table.to_pylist()
    assert [row["video_id"] for row in rows] == ["GLGjiXtlyzE", "sHmR-4Yb_N0"]  # YouTube ids
    assert rows[0]["uri"] == str((videos / "validation" / "201" / "GLGjiXtlyzE.mp4").resolve())
    assert rows[0]["bytes"] == (REPO / "samples" / "cooking_pasta.mp4").stat().st_size
    assert rows[1]["transcript_uri"].endswith("sHmR-4Yb_N0.vtt") and rows[0]["transcript_uri"] is None
    assert [row["shard"] for row in rows] == [0, 1]
    assert found == {"missing": ["Zz9-missing1"], "annotated": 3}
    metadata = storage.read_metadata(path)
    assert metadata.extra["annotations_sha256"] == storage.file_sha256(annotations)
    assert metadata.transcript_root == str(videos.resolve())
    # one subset only; a listed video keeps its shard
    _, validation, _ = youcook2.write_manifest(cfg, annotations, videos, work, subsets=["validation"])
    assert validation.to_pylist()[0]["video_id"] == "GLGjiXtlyzE" and validation.num_rows == 1
    # through the command line, then the decode stage reads the manifest as it reads any other
    assert (
        cli.main(
            [
                "youcook2-manifest",
                "--work-dir",
                str(work),
                "--annotations",
                str(annotations),
                "--videos",
                str(videos),
                "--set",
                "shards.videos_per_shard=1",
                "--quiet",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "2 of 3 annotated videos in 2 shard(s)" in err and "1 not in" in err and "Zz9-missing1" in err
    # mistakes in the file name the video and the field
    bad = annotations_file(tmp_path / "bad.json", {"GLGjiXtlyzE": entry("train", [(0, 1, "x")])})
    with pytest.raises(ManifestError, match="video 'GLGjiXtlyzE': subset must be one of"):
        youcook2.write_manifest(cfg, bad, videos, work)
    bad = annotations_file(tmp_path / "bad.json", {"GLGjiXtlyzE": entry("training", [(5, 1, "x")])})
    with pytest.raises(ManifestError, match=r"annotation 0 needs 'segment': \[start, end\]"):
        youcook2.write_manifest(cfg, bad, videos, work)
    assert (
        cli.main(
            [
                "youcook2-manifest",
                "--work-dir",
                str(work),
                "--annotations",
                str(annotations),
                "--videos",
                str(tmp_path / "empty"),
                "--quiet",
            ]
        )
        == 1
    )


def test_the_bundled_sample_names_the_sample_videos():
    annotations = kept_apart.read_annotations(SAMPLE)
    assert set(youcook2.find_videos(REPO / "samples", annotations)) == set(annotations)
    assert {video.subset for video in annotations.values()} == {"training", "validation"}
    for video in annotations.values():
        assert video.annotations and all(a.end_s <= video.duration + 1 for a in video.annotations)


# ---------------------------------------------------------------- labels


def test_lists_and_labels_from_the_captions_with_the_pos_tagger(tmp_path):
    # lower-case imperatives, as YouCook II writes them: the leading verb is a verb, plurals become lemmas
    words = youcook2.caption_words(
        [
            "grate parmesan over the pasta",
            "bake in the oven for 20 minutes",
            "peel the potatoes and slice them thinly",
            "add the tofu and parsley to the pan",
        ]
    )
    assert words == [
        (["grate"], ["parmesan", "pasta"]),
        (["bake"], ["oven", "minute"]),
        (["peel", "slice"], ["potato"]),
        (["add"], ["tofu", "parsley", "pan"]),
    ]
    cfg = load_config(None, ["eval.list_verbs=3", "eval.list_nouns=4"])
    summary = youcook2.write_labels(cfg, SAMPLE, tmp_path)
    # from the validation captions only (cooking_pasta, no_audio): "add" twice, "water" three times
    assert list(summary["verbs"]) == ["add", "boil", "bring"] and summary["verbs"]["add"] == 2
    assert list(summary["nouns"])[0] == "water" and summary["nouns"]["water"] == 3 and len(summary["nouns"]) == 4
    assert (tmp_path / "verbs.txt").read_text().split() == ["add", "boil", "bring"]
    assert "wash" not in summary["verbs"]  # a training caption's verb
    assert "en_core_web_sm" in summary["tagger"] and summary["segments"] == 16
    with open(tmp_path / "labels.csv", newline="") as handle:
        rows = {(row["video_id"], int(row["segment_index"])): row for row in csv.DictReader(handle)}
    assert len(rows) == 16 and rows[("no_audio", 1)]["verb"] == "cut" and rows[("no_audio", 1)]["noun"] == "vegetable"
    assert rows[("cooking_salad", 2)]["verb"] == "slice|add" and rows[("cooking_salad", 2)]["subset"] == "training"
    # several labels per segment, read back as any-of labels
    labels = verb_noun_labels.read_labels(str(tmp_path / "labels.csv"))
    assert labels[("cooking_pasta", 0)][0] == ("fill", "bring")
    # the paper's sizes are the defaults; a small caption set gives shorter lists
    full = youcook2.write_labels(load_config(None, []), SAMPLE, tmp_path / "full")
    assert (load_config(None, []).eval.list_verbs, load_config(None, []).eval.list_nouns) == (45, 100)
    assert len(full["verbs"]) == 9 and len(full["nouns"]) == 12
    # through the command line: into DIR/eval/youcook2
    assert (
        cli.main(
            [
                "youcook2-labels",
                "--work-dir",
                str(tmp_path / "work"),
                "--annotations",
                str(SAMPLE),
                "--set",
                "eval.list_verbs=3",
                "--quiet",
            ]
        )
        == 0
    )
    assert (youcook2.labels_folder(tmp_path / "work") / "verbs.txt").read_text().split() == ["add", "boil", "bring"]


# ---------------------------------------------------------------- annotated segments and zero-shot


def synthetic_quantize(work_dir: Path, codebook_sha: str, clips: dict[str, list[int]]) -> None:
    """quantize parts for the synthetic videos: clip i of a video spans [1.5 i, 1.5 i + 1.5)."""
    rows = [
        {"video_id": video, "clip_index": i, "start_s": 1.5 * i, "end_s": 1.5 * i + 1.5, "token": token}
        for video, tokens in sorted(clips.items())
        for i, token in enumerate(tokens)
    ]
    write_part(
        work_dir,
        "quantize",
        0,
        pa.Table.from_pylist(rows, schema=schemas.QUANTIZE.arrow),
        schemas.QUANTIZE,
        record={"clips": len(rows)},
        codebook_sha256=codebook_sha,
    )


def test_zero_shot_on_segments_cut_at_the_annotated_times(tmp_path):
    tokenizer = load_tokenizer(TOKENIZER_SPEC)
    write_synthetic(tmp_path, tokenizer, videos=8, videos_per_shard=2)
    codebook_sha = json.loads((tmp_path / "kmeans" / "codebook.json").read_text())["sha256"]
    # two annotated videos: tokens per clip; the spans take clips by their overlap (at least half a clip)
    synthetic_quantize(
        tmp_path, codebook_sha, {"synthetic0000": [0, 4, 0, 4, 1, 5, 1, 5, 2, 6], "synthetic0001": [3, 7, 3, 7, 3, 7]}
    )
    annotations = annotations_file(
        tmp_path / "annotations.json",
        {
            "synthetic0000": entry(
                "validation", [(0, 6, "cut the onion"), (6.7, 12, "mix the egg"), (12, 15, "pour it")]
            ),
            "synthetic0001": entry("validation", [(1, 5, "fry the sauce")]),
            "synthetic0002": entry("training", [(0, 3, "cut the rice")]),
            "synthetic0009": entry("validation", [(0, 3, "a video that was never quantized")]),
        },
    )
    labels = tmp_path / "labels.csv"
    labels.write_text(
        "video_id,segment_index,verb,noun\nsynthetic0000,0,cut,onion\nsynthetic0000,1,mix|stir,egg\n"
        "synthetic0001,0,fry,sauce\n"
    )
    cfg = config(tmp_path, f"eval.segments={annotations}", f"eval.labels={labels}")
    layout = VocabLayout.from_tokenizer(tokenizer, 25)
    segments = list(youcook2.annotated_segments(cfg, tmp_path, layout, codebook_sha))
    assert [(s.video_id, x["segment_index"], s.visual_ids.tolist()) for s, x in segments] == [
        ("synthetic0000", 0, [0, 4, 0, 4]),  # clips 0-3 lie inside [0, 6]
        ("synthetic0000", 1, [1, 5, 1, 5]),  # clip 4 [6, 7.5] overlaps [6.7, 12] by 0.8 >= 0.75
        ("synthetic0000", 2, [2, 6]),
        ("synthetic0001", 0, [7, 3]),  # [1, 5]: clips 0 and 3 overlap it by 0.5 only
        ("synthetic0009", 0, []),
    ]  # not quantized: no visual tokens
    assert segments[0][1]["kind"] == "annotated" and segments[0][1]["sentence"] == "cut the onion"
    with pytest.raises(ValueError, match="made from codebook"):
        list(youcook2.annotated_segments(cfg, tmp_path, layout, "0" * 64))

    train(cfg, tmp_path, quiet=True)
    report = zero_shot.zero_shot(cfg, tmp_path, quiet=True)
    assert report["segment_source"] == str(annotations) and report["segments"] == 3
    for mode in ("open", "closed"):
        assert set(report["results"][mode]) >= {"videobert", "text_only_prior", "initial_bert_prior"}
        assert report["results"][mode]["videobert"]["verb"]["n"] == 3
    predictions = storage.read_table(Path(report["predictions"])).to_pylist()
    assert [(r["video_id"], r["segment_index"], r["verbs"]) for r in predictions] == [
        ("synthetic0000", 0, ["cut"]),
        ("synthetic0000", 1, ["mix", "stir"]),
        ("synthetic0001", 0, ["fry"]),
    ]
    assert predictions[1]["start_s"] == 6.7 and set(predictions[0]["verb_top5_closed"]) == set(VERBS)


# ---------------------------------------------------------------- the linear probe


def planted_work_dir(work_dir: Path, *, signal: float, seed: int = 0) -> tuple[Path, list[str], list[str]]:
    """Features parts whose clips carry their segment's verb and noun as two planted directions (plus noise),
    an annotations file (30 training and 10 validation videos of 4 segments) and their labels."""
    rng = np.random.default_rng(seed)
    verbs, nouns = list(VERBS), list(NOUNS)
    prototypes = rng.standard_normal((len(verbs) + len(nouns), schemas.FEATURE_DIM)).astype(np.float32)
    database, labels, features = {}, [], []
    for v in range(40):
        video_id = f"video{v:03d}"
        segments = []
        for s in range(4):
            verb, noun = int(rng.integers(len(verbs))), int(rng.integers(len(nouns)))
            segments.append((6.0 * s, 6.0 * s + 6.0, f"{verbs[verb]} the {nouns[noun]}"))
            labels.append({"video_id": video_id, "segment_index": s, "verb": verbs[verb], "noun": nouns[noun]})
            for c in range(4):
                vector = signal * (prototypes[verb] + prototypes[len(verbs) + noun]) + rng.standard_normal(
                    schemas.FEATURE_DIM
                )
                features.append(
                    {
                        "video_id": video_id,
                        "clip_index": 4 * s + c,
                        "start_s": 6.0 * s + 1.5 * c,
                        "end_s": 6.0 * s + 1.5 * c + 1.5,
                        "feature": vector.astype(np.float16),
                    }
                )
        database[video_id] = entry("training" if v < 30 else "validation", segments)
    write_manifest_rows(
        work_dir,
        [
            {"video_id": video, "uri": f"/videos/{video}.mp4", "bytes": 1, "transcript_uri": None, "shard": 0}
            for video in sorted(database)
        ],
    )
    write_part(
        work_dir,
        "features",
        0,
        pa.Table.from_pylist(features, schema=schemas.FEATURES.arrow),
        schemas.FEATURES,
        record={"clips": len(features)},
        weights="random(seed=0) - NOT pretrained",
    )
    annotations = annotations_file(work_dir / "annotations.json", database)
    with open(work_dir / "labels.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["video_id", "segment_index", "verb", "noun"])
        writer.writeheader()
        writer.writerows(labels)
    (work_dir / "verbs.txt").write_text("\n".join(verbs) + "\n")
    (work_dir / "nouns.txt").write_text("\n".join(nouns) + "\n")
    return annotations, verbs, nouns


def probe_config(work_dir: Path, annotations) -> object:
    return load_config(
        None,
        [
            f"eval.segments={annotations}",
            f"eval.labels={work_dir / 'labels.csv'}",
            f"eval.verbs={work_dir / 'verbs.txt'}",
            f"eval.nouns={work_dir / 'nouns.txt'}",
        ],
    )


def test_linear_probe_recovers_planted_classes(tmp_path):
    annotations, _, _ = planted_work_dir(tmp_path / "planted", signal=0.2)
    report = probe.linear_probe(probe_config(tmp_path / "planted", annotations), tmp_path / "planted", quiet=True)
    assert report["segments"] == {"train": 120, "test": 40}
    for part in ("verb", "noun"):
        assert report["results"]["s3d_linear_probe"][part]["top1"] >= 0.9
        assert report["results"]["s3d_linear_probe"][part]["n"] == 40
    assert report["classes"]["verb"] == sorted(VERBS)
    assert any("random weights" in note for note in report["notes"])
    saved = json.loads((WorkDir(tmp_path / "planted").eval_folder / "linear_probe.json").read_text())
    assert saved["results"] == report["results"]
    assert "S3D linear probe (supervised)" in probe.format_probe(report)
    # no signal in the features: about chance (1 in 4)
    annotations, _, _ = planted_work_dir(tmp_path / "noise", signal=0.0)
    noise = probe.linear_probe(probe_config(tmp_path / "noise", annotations), tmp_path / "noise", quiet=True)
    for part in ("verb", "noun"):
        assert noise["results"]["s3d_linear_probe"][part]["top1"] < 0.5


def test_linear_probe_on_align_segments_holds_out_a_seeded_share_of_the_videos(tmp_path):
    write_synthetic(tmp_path, load_tokenizer(TOKENIZER_SPEC), videos=8, videos_per_shard=2)
    spans, train_keys, test_keys = probe._split(load_config(None, ["eval.probe_test_share=0.25"]), tmp_path)
    assert len(spans) == 8 and len(train_keys) + len(test_keys) == 8 * 6 and not train_keys & test_keys
    assert len({video for video, _ in test_keys}) == 2
    assert not {video for video, _ in test_keys} & {video for video, _ in train_keys}
    again = probe._split(load_config(None, ["eval.probe_test_share=0.25"]), tmp_path)
    other = probe._split(load_config(None, ["eval.probe_test_share=0.25", "eval.probe_seed=3"]), tmp_path)
    assert again[2] == test_keys and other[2] != test_keys


def test_linear_probe_through_the_command_line(tmp_path, capsys):
    annotations, _, _ = planted_work_dir(tmp_path, signal=0.2)
    overrides = [
        item
        for key, value in (
            ("segments", annotations),
            ("labels", tmp_path / "labels.csv"),
            ("verbs", tmp_path / "verbs.txt"),
            ("nouns", tmp_path / "nouns.txt"),
        )
        for item in ("--set", f"eval.{key}={value}")
    ]
    assert cli.main(["eval", "linear-probe", "--work-dir", str(tmp_path), *overrides]) == 0
    assert "S3D linear probe (supervised)" in capsys.readouterr().err


# ---------------------------------------------------------------- kept apart from pre-training


def spy_on_training_shards(monkeypatch) -> list[Path]:
    """The shards the training run streams (the ones its model, data and log are set up with)."""
    import videobert.train as train_module

    seen: list[Path] = []
    setup = train_module.setup

    def spying(session, shards, *args, **kwargs):
        seen.extend(shards)
        return setup(session, shards, *args, **kwargs)

    monkeypatch.setattr(train_module, "setup", spying)
    return seen


def trained_video_ids(shards: list[Path]) -> set[str]:
    return {v for path in shards for v in storage.read_table(path, columns=["video_id"])["video_id"].to_pylist()}


def test_pre_training_leaves_out_the_videos_of_the_evaluation_subsets(tmp_path, monkeypatch):
    write_synthetic(tmp_path, load_tokenizer(TOKENIZER_SPEC), videos=8, videos_per_shard=2)
    annotations = annotations_file(
        tmp_path / "annotations.json",
        {
            "synthetic0001": entry("validation", [(0, 3, "cut the onion")]),
            "synthetic0002": entry("testing", [(0, 3, "mix the egg")]),
            "synthetic0003": entry("training", [(0, 3, "fry the sauce")]),
            "not_in_the_shards": entry("validation", [(0, 3, "pour it")]),
        },
    )
    seen = spy_on_training_shards(monkeypatch)
    train(config(tmp_path, f"train.youcook2_annotations={annotations}"), tmp_path, quiet=True)
    assert seen and all(path.parent.name == kept_apart.KEPT_APART_FOLDER for path in seen)
    assert trained_video_ids(seen) == {f"synthetic{v:04d}" for v in range(8)} - {"synthetic0001", "synthetic0002"}
    record = json.loads((WorkDir(tmp_path).train_folder / kept_apart.KEPT_APART_FOLDER / "videos.json").read_text())
    assert record["videos_left_out"] == ["synthetic0001", "synthetic0002"]
    assert record["annotations_sha256"] == storage.file_sha256(annotations)
    # opted out: every video trained on (an empty list), and the setting is part of the run's lineage
    seen.clear()
    train(
        config(tmp_path / "all", f"train.youcook2_annotations={annotations}", "train.youcook2_excluded_subsets=[]"),
        tmp_path,
        restart=True,
        quiet=True,
    )
    assert trained_video_ids(seen) == {f"synthetic{v:04d}" for v in range(8)}
    # a subset name that YouCook II does not have stops at load, naming the key
    with pytest.raises(Exception, match="train.youcook2_excluded_subsets"):
        config(tmp_path, "train.youcook2_excluded_subsets=[val]")
    # an annotations file naming every video leaves nothing to train on: said so
    everything = annotations_file(
        tmp_path / "everything.json",
        {f"synthetic{v:04d}": entry("validation", [(0, 3, "cut the onion")]) for v in range(8)},
    )
    with pytest.raises(ValueError, match="nothing is left to pre-train on"):
        kept_apart.keep_apart(
            config(tmp_path, f"train.youcook2_annotations={everything}"),
            tmp_path,
            sorted((tmp_path / "align").glob("part-*.parquet")),
            write=False,
        )


def test_make_youcook2_never_pretrains_on_a_validation_segment(tmp_path, monkeypatch):
    """The flow of `make youcook2` on the bundled sample (every stage on the sample videos, demo settings):
    every video quantized with the one codebook, no validation video in the training shards, zero-shot
    scored on the validation segments. What this checks depends neither on the frames per clip nor on the
    pool: the fewest frames S3D takes (14) at a quarter of the demo's frame rate (2.8 s clips, half of S3D's
    work at half its rate), and the shards in this process (a pool of 2 would load S3D and Whisper again in
    each worker of each stage)."""
    work = tmp_path / "work"
    run = [
        "--config",
        str(REPO / "configs" / "demo.yaml"),
        "--work-dir",
        str(work),
        "--quiet",
        "--set",
        "decode.fps=5",
        "--set",
        "decode.clip_frames=14",
        "--set",
        "decode.min_clip_frames=7",
        "--set",
        "executor.workers=1",
    ]
    assert cli.main(["youcook2-manifest", *run, "--annotations", str(SAMPLE), "--videos", str(REPO / "samples")]) == 0
    for stage in ("features", "quality", "dedup", "kmeans", "quantize", "asr", "align"):
        assert cli.main([stage, *run]) == 0, stage
    annotations = kept_apart.read_annotations(SAMPLE)
    validation = {v for v, video in annotations.items() if video.subset == "validation"}
    assert validation and validation < set(annotations)
    # one codebook for all: the validation videos are quantized (and aligned) like the others
    quantized = {
        v
        for _, path in Lineage(WorkDir(work)).current_parts("quantize")
        for v in storage.read_table(path, columns=["video_id"])["video_id"].to_pylist()
    }
    assert quantized == set(annotations)
    seen = spy_on_training_shards(monkeypatch)
    assert cli.main(["train", *run, "--resume", "--set", "train.max_steps=4", "--set", "train.validation_every=2"]) == 0
    assert seen and not trained_video_ids(seen) & validation
    assert trained_video_ids(seen) <= {v for v, video in annotations.items() if video.subset == "training"}
    # nor does the held-out set of train.validation_videos take one of them
    log = [json.loads(line) for line in (work / "train" / "log.jsonl").read_text().splitlines()]
    assert not set(log[0]["validation_videos"]) & validation
    # zero-shot scores the validation segments
    labels = youcook2.labels_folder(work)
    assert cli.main(["youcook2-labels", *run, "--annotations", str(SAMPLE)]) == 0
    evaluation = [
        f"eval.segments={SAMPLE}",
        f"eval.verbs={labels / 'verbs.txt'}",
        f"eval.nouns={labels / 'nouns.txt'}",
        f"eval.labels={labels / 'labels.csv'}",
    ]
    assert cli.main(["eval", "zero-shot", *run, *[x for item in evaluation for x in ("--set", item)]]) == 0
    predictions = storage.read_table(work / "eval" / "zero_shot_predictions.parquet").to_pylist()
    assert predictions and {row["video_id"] for row in predictions} <= validation
    # the export's card names the videos kept out
    assert cli.main(["export", "--work-dir", str(work), "--quiet", str(tmp_path / "export")]) == 0
    card = json.loads((tmp_path / "export" / "videobert.json").read_text())
    assert set(card["training"]["youcook2_kept_apart"]["videos"]) == validation
