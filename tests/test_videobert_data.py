"""videobert.data: shard streaming, example building and masking, on small hand-made align shards."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from work_factory import write_manifest_rows, write_part

import schemas
from pipeline import storage
from pipeline.lineage import Lineage
from pipeline.workdir import WorkDir
from schemas.metadata import Provenance
from videobert import data
from videobert.data import (ALIGNED, IGNORE, NOT_ALIGNED, TEXT, TEXT_VIDEO, VIDEO, DataParams, Plan, Segment,
                            ShardDataset, VocabLayout)

LAYOUT = VocabLayout(text_vocab_size=2000, num_visual=50, cls_id=101, sep_id=102, mask_id=103, pad_id=0)
TEXT_REPLACEMENTS = np.arange(1000, 2000)
WORDS_PER_VIDEO = 50 // 10   # video v's segments use visual words 5v .. 5v+4 (so a word names its video)


def params(**changes) -> DataParams:
    base = dict(max_len=64, mask_prob=0.15, regime_weights=(1.0, 1.0, 1.0), negative_prob=0.5, concat_prob=0.5,
                max_concat=3, max_subsample_step=5, shuffle_buffer=16)
    return DataParams(**dict(base, **changes))


def write_shards(work_dir: Path, shards: int = 4, videos_per_shard: int = 2, segments: int = 5,
                 done: bool = True) -> list[Path]:
    """Align shards in which video v's text ids are 1000 + 10v + segment and its visual ids 5v .. 5v+4."""
    paths = []
    for shard in range(shards):
        rows = []
        for local in range(videos_per_shard):
            video = shard * videos_per_shard + local
            for segment in range(segments):
                has_text = segment % 4 != 3
                rows.append({"video_id": f"v{video:02d}", "segment_index": segment, "start_s": 3.0 * segment,
                             "end_s": 3.0 * segment + 3, "kind": "text_video" if has_text else "video_only",
                             "text": "words" if has_text else None,
                             "text_ids": [1000 + 10 * video + segment] * 3 if has_text else [],
                             "visual_ids": [WORDS_PER_VIDEO * video + (segment + i) % WORDS_PER_VIDEO
                                            for i in range(4)],
                             "language": "en"})
        write_part(work_dir, "align", shard, pa.Table.from_pylist(rows), schemas.ALIGN,
                   record={"rows": len(rows)} if done else None)
        paths.append(WorkDir(work_dir).part("align", shard))
    write_manifest_rows(work_dir, [{"video_id": f"v{video:02d}", "uri": f"/v{video:02d}.mp4", "bytes": 1,
                                    "transcript_uri": None, "shard": video // videos_per_shard}
                                   for video in range(shards * videos_per_shard)])
    return paths


def video_of_visual(visual_ids) -> set[int]:
    return {int(v) // WORDS_PER_VIDEO for v in visual_ids}


def test_only_complete_non_empty_shards_are_read(tmp_path):
    paths = write_shards(tmp_path, shards=3)
    WorkDir(tmp_path).record("align", 1).unlink()         # shard 1 is incomplete
    assert [path for _, path in Lineage(tmp_path).current_parts("align")] == [paths[0], paths[2]]
    empty = tmp_path / "empty.parquet"
    storage.write_parquet(empty, schemas.empty(schemas.ALIGN), Provenance(stage="align"))
    assert data.training_shards([paths[0], empty, paths[2]]) == [paths[0], paths[2]]
    with pytest.raises(ValueError, match="hold no segments"):
        data.training_shards([empty])


def test_streams_split_shards_without_duplicates():
    shards = [Path(f"part-{i:05d}.parquet") for i in range(10)]
    orders = []
    for epoch in range(3):
        dealt = [data.stream_shards(shards, 7, epoch, stream, 4) for stream in range(4)]
        flat = [path for part in dealt for path in part]
        assert sorted(flat) == shards and len(set(flat)) == len(flat)     # every shard once per epoch
        orders.append(flat)
    assert orders[0] != orders[1]                                         # reshuffled every epoch
    # ranks and workers compute the same deal: stream g of G always gets the same list for (seed, epoch)
    assert data.stream_shards(shards, 7, 1, 2, 4) == data.stream_shards(shards, 7, 1, 2, 4)
    assert data.streams_per_rank(10, 2, 4) == 4 and data.streams_per_rank(3, 2, 4) == 1
    assert data.streams_per_rank(4, 1, 0) == 1
    with pytest.raises(ValueError, match="cannot feed 4 ranks"):
        data.streams_per_rank(3, 4, 1)


def test_each_stream_reads_only_its_own_shards(tmp_path, monkeypatch):
    shards = write_shards(tmp_path, shards=4)
    opened: dict[int, list[Path]] = {0: [], 1: []}
    real_read = data.read_segments
    current = {"stream": 0}

    def recording_read(path, layout, columns=()):
        opened[current["stream"]].append(path)
        return real_read(path, layout, columns)

    monkeypatch.setattr(data, "read_segments", recording_read)
    for stream in (0, 1):
        current["stream"] = stream
        plans = data.plan_stream(shards, LAYOUT, params(shuffle_buffer=1), 3, stream, 2)
        for _ in range(40):        # 40 segments per stream and epoch: this reaches into epoch 2
            next(plans)
    epoch0 = [set(data.stream_shards(shards, 3, 0, stream, 2)) for stream in (0, 1)]
    assert set(opened[0][:2]) == epoch0[0] and set(opened[1][:2]) == epoch0[1]
    assert not epoch0[0] & epoch0[1]


def test_batches_are_seeded_and_resume_skips_exactly(tmp_path):
    shards = write_shards(tmp_path)

    def first_batches(seed, start_batch=0, n=4):
        dataset = ShardDataset(shards, LAYOUT, TEXT_REPLACEMENTS, params(), 8, seed, start_batch=start_batch)
        stream = iter(dataset)
        return [next(stream) for _ in range(n)]

    a, b, other = first_batches(1), first_batches(1), first_batches(2)
    for x, y in zip(a, b):
        assert all(torch.equal(x[key], y[key]) for key in x)
    assert [x["input_ids"].tolist() for x in a] != [y["input_ids"].tolist() for y in other]
    resumed = first_batches(1, start_batch=2, n=2)
    for x, y in zip(a[2:], resumed):
        assert all(torch.equal(x[key], y[key]) for key in x)


def test_batch_tensors_follow_the_input_format(tmp_path):
    shards = write_shards(tmp_path)
    batch = next(iter(ShardDataset(shards, LAYOUT, TEXT_REPLACEMENTS, params(mask_prob=0.01), 32, 0)))
    assert set(batch["regimes"].tolist()) == {TEXT, VIDEO, TEXT_VIDEO}
    for row in range(32):
        length = int(batch["attention_mask"][row].sum())
        ids = batch["input_ids"][row, :length]
        types = batch["token_type_ids"][row, :length]
        labels = batch["labels"][row, :length]
        original = torch.where(labels != IGNORE, labels, ids)
        regime = int(batch["regimes"][row])
        assert original[0] == LAYOUT.cls_id and original[-1] == LAYOUT.sep_id
        has_separator = bool((original == LAYOUT.visual_sep_id).any())
        is_visual = (original >= LAYOUT.visual_offset) & (original < LAYOUT.visual_sep_id)
        assert has_separator == (regime == TEXT_VIDEO)
        assert bool(is_visual.any()) == (regime != TEXT)
        assert (batch["alignment_labels"][row] == IGNORE) == (regime != TEXT_VIDEO)
        assert torch.equal(types.bool()[1:-1], is_visual[1:-1])          # visual tokens are segment B
        assert (batch["input_ids"][row, length:] == LAYOUT.pad_id).all()


def test_masking_is_bert_style_and_keeps_kinds():
    rng = np.random.default_rng(0)
    text = np.arange(1000, 1040)
    visual = np.arange(40) % LAYOUT.num_visual
    ids, _ = data.assemble(LAYOUT, text, visual, with_separator=True)
    kinds = Counter()
    chosen_total = 0
    for _ in range(300):
        masked, labels = data.mask_tokens(ids, LAYOUT, 0.15, TEXT_REPLACEMENTS, rng)
        chosen = np.flatnonzero(labels != IGNORE)
        assert len(chosen) == round(0.15 * 80)                            # 15% of the 80 text+visual tokens
        assert np.array_equal(labels[chosen], ids[chosen])
        # [CLS], [>] and [SEP] are never predicted nor changed
        for special in (0, 41, len(ids) - 1):
            assert special not in chosen and masked[special] == ids[special]
        assert np.array_equal(masked[labels == IGNORE], ids[labels == IGNORE])
        for position in chosen:
            was_visual = ids[position] >= LAYOUT.visual_offset
            if masked[position] == LAYOUT.mask_id:
                kinds["mask"] += 1
            elif masked[position] == ids[position]:
                kinds["kept"] += 1
            else:
                kinds["random"] += 1
                now_visual = LAYOUT.visual_offset <= masked[position] < LAYOUT.visual_sep_id
                assert now_visual == was_visual                          # replaced by a token of its kind
        chosen_total += len(chosen)
    assert abs(kinds["mask"] / chosen_total - 0.8) < 0.04
    assert abs(kinds["random"] / chosen_total - 0.1) < 0.03
    assert kinds["kept"] > 0.05 * chosen_total      # kept as is ~10% (plus random draws of the same token)


def test_truncation_keeps_text_and_video_in_balance():
    assert data.balance(10, 20, 61) == (10, 20)
    assert data.balance(100, 100, 61) == (30, 31)
    assert data.balance(5, 100, 61) == (5, 56)
    assert data.balance(100, 7, 61) == (54, 7)
    rng = np.random.default_rng(0)
    plan = Plan(TEXT_VIDEO, np.arange(1000, 1100), np.arange(100) % 50, ALIGNED)
    ids, types, labels = data.build_example(plan, LAYOUT, params(max_subsample_step=1), TEXT_REPLACEMENTS, rng)
    original = np.where(labels != IGNORE, labels, ids)
    assert len(ids) == 64
    assert (original == LAYOUT.visual_sep_id).sum() == 1
    n_text = int(np.flatnonzero(original == LAYOUT.visual_sep_id)[0]) - 1
    assert (n_text, 64 - 3 - n_text) == (30, 31)
    assert np.array_equal(original[1:1 + n_text], np.arange(1000, 1030))  # the head of the text is kept


def test_visual_tokens_are_subsampled_at_steps_1_to_5():
    rng = np.random.default_rng(0)
    plan = Plan(VIDEO, np.zeros(0, dtype=np.int64), np.arange(40), IGNORE)
    steps = set()
    for _ in range(200):
        ids, _, labels = data.build_example(plan, LAYOUT, params(max_len=128), TEXT_REPLACEMENTS, rng)
        visual = np.where(labels != IGNORE, labels, ids)[1:-1] - LAYOUT.visual_offset
        gaps = set(np.diff(visual).tolist())
        assert len(gaps) <= 1
        steps |= gaps
    assert steps == {1, 2, 3, 4, 5}


def test_concatenation_joins_neighbours_of_one_video_only():
    segments = [Segment(f"v{v}", np.array([10 * v + s]), np.array([10 * v + s, 10 * v + s])) for v in range(3)
                for s in range(4)]
    units = list(data._units(iter(segments), np.random.default_rng(0), 1.0, 3))
    assert sum(len(u.text_ids) for u in units) == 12
    assert any(len(u.text_ids) > 1 for u in units)
    for unit in units:
        assert len({int(t) // 10 for t in unit.text_ids}) == 1            # one video per unit
        assert len(unit.text_ids) <= 3
        # text with text, video with video, in order, so they stay aligned
        assert np.array_equal(np.repeat(unit.text_ids, 2), unit.visual_ids)
        assert np.all(np.diff(unit.text_ids) == 1)
    assert len(list(data._units(iter(segments), np.random.default_rng(0), 0.0, 3))) == 12


def test_negatives_pair_text_with_another_videos_tokens(tmp_path):
    shards = write_shards(tmp_path)
    plans = data.plan_stream(shards, LAYOUT, params(regime_weights=(0.0, 0.0, 1.0), concat_prob=0.0), 0, 0, 1)
    labels = Counter()
    for _ in range(300):
        plan = next(plans)
        assert plan.regime == TEXT_VIDEO
        text_video = {(int(plan.text_ids[0]) - 1000) // 10}
        same = video_of_visual(plan.visual_ids) == text_video
        assert same == (plan.alignment_label == ALIGNED)
        labels[plan.alignment_label] += 1
    assert 0.4 < labels[NOT_ALIGNED] / 300 < 0.6


def test_regimes_are_mixed_by_weight(tmp_path):
    shards = write_shards(tmp_path)
    plans = data.plan_stream(shards, LAYOUT, params(regime_weights=(1.0, 0.0, 3.0), concat_prob=0.0), 0, 0, 1)
    counts = Counter(next(plans).regime for _ in range(800))
    assert counts[VIDEO] == 0
    # video_only segments (1 in 5) can only be video examples: with video off they are left out
    assert 0.18 < counts[TEXT] / 800 < 0.32


def test_ids_outside_the_vocabulary_name_the_video(tmp_path):
    write_shards(tmp_path, shards=1)
    small = VocabLayout(text_vocab_size=2000, num_visual=6, cls_id=101, sep_id=102, mask_id=103, pad_id=0)
    with pytest.raises(ValueError, match=r"video 'v01' has visual id \d+ outside \[0, 6\)"):
        list(data.read_segments(WorkDir(tmp_path).part("align", 0), small))
