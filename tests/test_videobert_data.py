"""videobert.data: shard streaming, example building and masking, on small hand-made align shards."""

from __future__ import annotations

from collections import Counter
from io import BytesIO
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from work_factory import write_manifest_rows, write_part

import schemas
from pipeline import storage
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir
from schemas.metadata import Provenance
from videobert import data
from videobert import stream as streaming
from videobert.data import (
    ALIGNED,
    IGNORE,
    NOT_ALIGNED,
    TEXT,
    TEXT_VIDEO,
    VIDEO,
    DataParams,
    Plan,
    ShardDataset,
    VocabLayout,
)

LAYOUT = VocabLayout(text_vocab_size=2000, num_visual=50, cls_id=101, sep_id=102, mask_id=103, pad_id=0)
TEXT_REPLACEMENTS = np.arange(1000, 2000)
WORDS_PER_VIDEO = 50 // 10  # video v's segments use visual words 5v .. 5v+4 (so a word names its video)


def params(**changes) -> DataParams:
    base = dict(
        max_len=64,
        mask_prob=0.15,
        regime_weights=(1.0, 1.0, 1.0),
        regime_mix="exact",
        negative_prob=0.5,
        negative_same_video_share=0.5,
        negative_min_gap=20,
        concat_prob=0.5,
        max_concat=3,
        max_subsample_step=5,
        text_insert_prob=0.0,
        text_span_mask_prob=0.0,
        text_context_noise_prob=0.0,
        text_end_drop_prob=0.0,
        visual_crop_prob=0.0,
        shuffle_buffer=16,
    )
    return DataParams(**dict(base, **changes))


def example(plan: Plan, rng: np.random.Generator, **settings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`data.build_example` of `plan` with LAYOUT, no subsampling and `settings` over `params()`."""
    return data.build_example(plan, LAYOUT, params(max_subsample_step=1, **settings), TEXT_REPLACEMENTS, rng)


def unmasked(ids: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """An example's ids before masking: a target's label is the piece it replaced."""
    return np.where(labels != IGNORE, labels, ids)


def write_shards(
    work_dir: Path, shards: int = 4, videos_per_shard: int = 2, segments: int = 5, done: bool = True
) -> list[Path]:
    """Align shards in which video v's text ids are 1000 + 10v + segment and its visual ids 5v .. 5v+4."""
    paths = []
    for shard in range(shards):
        rows = []
        for local in range(videos_per_shard):
            video = shard * videos_per_shard + local
            for segment in range(segments):
                has_text = segment % 4 != 3
                rows.append(
                    {
                        "video_id": f"v{video:02d}",
                        "segment_index": segment,
                        "start_s": 3.0 * segment,
                        "end_s": 3.0 * segment + 3,
                        "kind": "text_video" if has_text else "video_only",
                        "text": "words" if has_text else None,
                        "text_ids": [1000 + 10 * video + segment] * 3 if has_text else [],
                        "visual_ids": [WORDS_PER_VIDEO * video + (segment + i) % WORDS_PER_VIDEO for i in range(4)],
                        "language": "en",
                    }
                )
        write_part(
            work_dir,
            "align",
            shard,
            pa.Table.from_pylist(rows),
            schemas.ALIGN,
            record={"rows": len(rows)} if done else None,
        )
        paths.append(WorkDir(work_dir).part("align", shard))
    write_manifest_rows(
        work_dir,
        [
            {
                "video_id": f"v{video:02d}",
                "uri": f"/v{video:02d}.mp4",
                "bytes": 1,
                "transcript_uri": None,
                "shard": video // videos_per_shard,
            }
            for video in range(shards * videos_per_shard)
        ],
    )
    return paths


def video_of_visual(visual_ids) -> set[int]:
    return {int(v) // WORDS_PER_VIDEO for v in visual_ids}


# shards shaped like real ones: visual id 1000 * video + clip position, so a token tells where it came from
REAL = VocabLayout(text_vocab_size=2000, num_visual=1000 * 100, cls_id=101, sep_id=102, mask_id=103, pad_id=0)


def write_realistic_shards(
    work_dir: Path, *, shards: int = 4, videos_per_shard: int = 10, text_share: float = 1.0, seed: int = 0
) -> list[Path]:
    """Align shards with the lengths the align stage gives on real videos: 80-240 clips a video; in the
    videos with text (`text_share` of every ten; the others are like non-English ones) sentences of 3-20
    words (a word is one or two word pieces) over 1-8 clips, with silent stretches of 1-40 clips between
    some of them; clips without text are cut every 16."""
    rng = np.random.default_rng(seed)
    paths = []
    for shard in range(shards):
        rows = []
        for video in range(shard * videos_per_shard, (shard + 1) * videos_per_shard):
            has_text = video % 10 < round(10 * text_share)
            clips, position, spans = int(rng.integers(80, 241)), 0, []  # (start, end, text ids or None)
            while position < clips:
                if has_text:
                    end = min(clips, position + int(rng.integers(1, 9)))
                    words = int(rng.integers(3, 21))
                    spans.append((position, end, rng.integers(1000, 2000, words + rng.binomial(words, 0.2)).tolist()))
                    position = end
                silent_end = (
                    min(clips, position + int(rng.integers(1, 41))) if not has_text or rng.random() < 0.4 else position
                )
                if not has_text:
                    silent_end = clips
                spans += [(start, min(start + 16, silent_end), None) for start in range(position, silent_end, 16)]
                position = silent_end
            for index, (start, end, text) in enumerate(spans):
                rows.append(
                    {
                        "video_id": f"v{video:03d}",
                        "segment_index": index,
                        "start_s": 1.5 * start,
                        "end_s": 1.5 * end,
                        "kind": "text_video" if text else "video_only",
                        "text": "words" if text else None,
                        "text_ids": text or [],
                        "visual_ids": list(range(1000 * video + start, 1000 * video + end)),
                        "language": "en" if has_text else "de",
                    }
                )
        write_part(work_dir, "align", shard, pa.Table.from_pylist(rows), schemas.ALIGN, record={"rows": len(rows)})
        paths.append(WorkDir(work_dir).part("align", shard))
    write_manifest_rows(
        work_dir,
        [
            {
                "video_id": f"v{video:03d}",
                "uri": f"/v{video:03d}.mp4",
                "bytes": 1,
                "transcript_uri": None,
                "shard": video // videos_per_shard,
            }
            for video in range(shards * videos_per_shard)
        ],
    )
    return paths


def lookup_accuracy(keys: list, labels: list) -> float:
    """Fit a lookup table key -> majority label on the even examples, score it on the odd ones."""
    table: dict = {}
    for key, label in zip(keys[0::2], labels[0::2]):
        table.setdefault(key, Counter())[label] += 1
    fallback = Counter(labels[0::2]).most_common(1)[0][0]
    predicted = [table[key].most_common(1)[0][0] if key in table else fallback for key in keys[1::2]]
    return float(np.mean([p == label for p, label in zip(predicted, labels[1::2])]))


def test_only_complete_non_empty_shards_are_read(tmp_path):
    paths = write_shards(tmp_path, shards=3)
    WorkDir(tmp_path).record("align", 1).unlink()  # shard 1 is incomplete
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
        assert sorted(flat) == shards and len(set(flat)) == len(flat)  # every shard once per epoch
        orders.append(flat)
    assert orders[0] != orders[1]  # reshuffled every epoch
    # ranks and workers compute the same deal: stream g of G always gets the same list for (seed, epoch)
    assert data.stream_shards(shards, 7, 1, 2, 4) == data.stream_shards(shards, 7, 1, 2, 4)
    assert data.streams_per_rank(10, 2, 4) == 4 and data.streams_per_rank(3, 2, 4) == 1
    assert data.streams_per_rank(4, 1, 0) == 1
    with pytest.raises(ValueError, match="cannot feed 4 ranks"):
        data.streams_per_rank(3, 4, 1)


def test_each_stream_reads_only_its_own_shards(tmp_path, monkeypatch):
    shards = write_shards(tmp_path, shards=4)
    opened: dict[int, list[Path]] = {0: [], 1: []}
    real_read = streaming.read_segments
    current = {"stream": 0}

    def recording_read(path, layout, columns=(), start_row=0):
        opened[current["stream"]].append(path)
        return real_read(path, layout, columns, start_row)

    monkeypatch.setattr(streaming, "read_segments", recording_read)
    for stream in (0, 1):
        current["stream"] = stream
        plans = data.PlanStream(shards, LAYOUT, params(shuffle_buffer=1), 3, stream, 2)
        for _ in range(40):  # 40 segments per stream and epoch: this reaches into epoch 2
            next(plans)
    epoch0 = [set(data.stream_shards(shards, 3, 0, stream, 2)) for stream in (0, 1)]
    assert set(opened[0][:2]) == epoch0[0] and set(opened[1][:2]) == epoch0[1]
    assert not epoch0[0] & epoch0[1]


def test_data_smaller_than_the_buffer_is_read_once_and_streams_the_same(tmp_path, monkeypatch):
    # 2 shards of 6 segments under a 1,000-unit buffer: the buffer holds each unit many times over
    shards = write_shards(tmp_path, shards=2, videos_per_shard=1, segments=6)
    opened = []
    real_read = streaming.read_segments

    def recording_read(path, layout, columns=(), start_row=0):
        opened.append(path)
        return real_read(path, layout, columns, start_row)

    monkeypatch.setattr(streaming, "read_segments", recording_read)
    kept = data.PlanStream(shards, LAYOUT, params(shuffle_buffer=1000), 5, 0, 1)
    plans = [signature(next(kept)) for _ in range(200)]
    assert kept.rows_read > 1000 and sorted(opened) == sorted(shards)  # many epochs, each shard opened once

    # the same plans as a stream that reads the files every time
    monkeypatch.setattr(
        data.PlanStream, "_open", lambda self, path, start_row: streaming.read_videos(path, self.layout, start_row)
    )
    opened.clear()
    read = data.PlanStream(shards, LAYOUT, params(shuffle_buffer=1000), 5, 0, 1)
    assert [signature(next(read)) for _ in range(200)] == plans and len(opened) > 100

    # more rows than the buffer: nothing is kept, every epoch reads the files
    monkeypatch.undo()
    monkeypatch.setattr(streaming, "read_segments", recording_read)
    opened.clear()
    small = data.PlanStream(shards, LAYOUT, params(shuffle_buffer=4), 5, 0, 1)
    while small.rows_read < 60:
        next(small)
    assert len(opened) >= 9 and not small._kept


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


def signature(plan: Plan) -> tuple:
    return (plan.regime, plan.text_ids.tolist(), plan.visual_ids.tolist(), plan.alignment_label, plan.same_video)


def test_a_stream_resumes_from_its_state_without_replaying(tmp_path):
    shards = write_realistic_shards(tmp_path, text_share=0.4)
    stream = data.PlanStream(shards, REAL, params(shuffle_buffer=200), 0, 0, 1)
    resume_reads = []
    for position in (100, 20_000):  # early, and many epochs later
        while stream.rows_read < position:
            next(stream)
        # through a checkpoint: tensors, lists and numbers that torch.load reads with weights_only
        saved = BytesIO()
        torch.save(stream.state(), saved)
        saved.seek(0)
        state = torch.load(saved, weights_only=True)
        assert len(state["units"]["units"]) <= 200 + 240  # the buffer and one video's units at most
        resumed = data.PlanStream(shards, REAL, params(shuffle_buffer=200), 0, 0, 1, state)
        rows_before = stream.rows_read
        for _ in range(300):
            assert signature(next(resumed)) == signature(next(stream))
        # the resumed stream read exactly the rows the uninterrupted one read for these 300 plans: no replay
        assert resumed.rows_read == stream.rows_read - rows_before
        resume_reads.append(resumed.rows_read)
    assert stream.rows_read > 20_000 and max(resume_reads) < 2_000  # the skip does not grow with the position


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_loader_workers_resume_exactly(tmp_path):
    shards = write_realistic_shards(tmp_path, shards=6, videos_per_shard=2)

    def loader(start_batch=0, plan_states=None, stop_batch=0):
        dataset = ShardDataset(
            shards,
            REAL,
            TEXT_REPLACEMENTS,
            params(),
            4,
            0,
            start_batch=start_batch,
            plan_states=plan_states,
            checkpoint_every=4,
            stop_batch=stop_batch,
        )
        return iter(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=3, generator=torch.Generator()))

    whole = loader()
    expected = [next(whole) for _ in range(12)]
    first, states = loader(stop_batch=7), {}
    for _ in range(7):  # stopped after batch 7 of 3 streams
        batch = next(first)
        if "plan_state" in batch:
            state = batch.pop("plan_state")
            states[state["stream"]] = state
    assert sorted(states) == [0, 1, 2] and {s["batch"] for s in states.values()} == {2, 3}
    resumed = loader(start_batch=7, plan_states=states)
    for want in expected[7:]:
        got = next(resumed)
        got.pop("plan_state", None)
        want.pop("plan_state", None)
        assert all(torch.equal(got[key], want[key]) for key in want)


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
        assert torch.equal(types.bool()[1:-1], is_visual[1:-1])  # visual tokens are segment B
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
        assert len(chosen) == round(0.15 * 80)  # 15% of the 80 text+visual tokens
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
                assert now_visual == was_visual  # replaced by a token of its kind
        chosen_total += len(chosen)
    assert abs(kinds["mask"] / chosen_total - 0.8) < 0.04
    assert abs(kinds["random"] / chosen_total - 0.1) < 0.03
    assert kinds["kept"] > 0.05 * chosen_total  # kept as is ~10% (plus random draws of the same token)


def test_masking_predicts_the_configured_share_of_each_modality(tmp_path):
    shards = write_realistic_shards(tmp_path, text_share=0.4)
    dataset = ShardDataset(shards, REAL, TEXT_REPLACEMENTS, params(max_len=128, shuffle_buffer=200), 128, 0)
    counts = Counter()
    for batch, _ in zip(dataset, range(40)):
        labels, attended = batch["labels"], batch["attention_mask"].bool()
        original = torch.where(labels != IGNORE, labels, batch["input_ids"])
        predicted = labels != IGNORE
        visual = (original >= REAL.visual_offset) & (original < REAL.visual_sep_id)
        text = attended & (original < REAL.text_vocab_size) & (original != REAL.cls_id) & (original != REAL.sep_id)
        for name, tokens in (("text", text), ("visual", visual)):
            counts[name] += int(tokens.sum())
            counts[f"{name} predicted"] += int((tokens & predicted).sum())
        # no row without a target: text-video rows have their alignment label, and text-only and video-only
        # rows were widened to at least 1 / 0.15 tokens, of which masking always predicts one or more
        assert (predicted.any(dim=1) | (batch["alignment_labels"] != IGNORE)).all()
        regimes = batch["regimes"]
        assert (text.sum(dim=1)[regimes == TEXT] >= 7).all() and (visual.sum(dim=1)[regimes == VIDEO] >= 7).all()
        counts["rows"] += len(regimes)
    for name in ("text", "visual"):
        assert abs(counts[f"{name} predicted"] / counts[name] - 0.15) < 0.01, (name, counts)


def test_short_examples_are_widened_within_their_video(tmp_path):
    shards = write_realistic_shards(tmp_path, shards=1, videos_per_shard=1)
    video = next(data.read_videos(shards[0], REAL))[1]
    p, rng = params(max_len=128, max_subsample_step=1), np.random.default_rng(0)
    short = next(
        index for index in range(video.segments) if 0 < video.clip_bounds[index + 1] - video.clip_bounds[index] < 7
    )
    unit = data.Unit(video, short, short + 1)
    ids, _, labels = data.build_example(
        Plan(VIDEO, data.EMPTY, unit.visual_ids, IGNORE, unit=unit), REAL, p, TEXT_REPLACEMENTS, rng
    )
    clips = unmasked(ids, labels)[1:-1] - REAL.visual_offset
    start = unit.span[0]
    assert np.array_equal(
        clips,
        np.arange(start, start + 7)
        if start + 7 <= len(video.clips)
        else np.arange(len(video.clips) - 7, len(video.clips)),
    )
    assert (labels != IGNORE).sum() == 1  # 15% of 7 tokens, rounded at random
    # text: whole neighbouring sentences are joined on
    short = next(
        index for index in range(video.segments) if 0 < video.text_bounds[index + 1] - video.text_bounds[index] < 7
    )
    unit = data.Unit(video, short, short + 1)
    ids, _, labels = data.build_example(
        Plan(TEXT, unit.text_ids, data.EMPTY, IGNORE, unit=unit), REAL, p, TEXT_REPLACEMENTS, rng
    )
    text = unmasked(ids, labels)[1:-1]
    assert len(text) >= 7 and text[: len(unit.text_ids)].tolist() == unit.text_ids.tolist()


def test_truncation_keeps_text_and_video_in_balance():
    assert data.balance(10, 20, 61) == (10, 20)
    assert data.balance(100, 100, 61) == (30, 31)
    assert data.balance(5, 100, 61) == (5, 56)
    assert data.balance(100, 7, 61) == (54, 7)
    rng = np.random.default_rng(0)
    plan = Plan(TEXT_VIDEO, np.arange(1000, 1100), np.arange(100) % 50, ALIGNED)
    ids, types, labels = example(plan, rng)
    original = unmasked(ids, labels)
    assert len(ids) == 64
    assert (original == LAYOUT.visual_sep_id).sum() == 1
    n_text = int(np.flatnonzero(original == LAYOUT.visual_sep_id)[0]) - 1
    assert (n_text, 64 - 3 - n_text) == (30, 31)
    assert np.array_equal(original[1 : 1 + n_text], np.arange(1000, 1030))  # the head of the text is kept


def test_inserted_word_pieces_stand_at_the_edges_of_text_video_texts_only():
    text = np.arange(500, 506)  # outside TEXT_REPLACEMENTS, so that an inserted piece is told apart
    counts, edges, targets = [], Counter(), 0
    rng = np.random.default_rng(0)
    for _ in range(400):
        ids, types, labels = data.build_example(
            Plan(TEXT_VIDEO, text, np.arange(8), ALIGNED), LAYOUT, params(text_insert_prob=0.5), TEXT_REPLACEMENTS, rng
        )
        original = unmasked(ids, labels)
        said = original[1 : int(np.flatnonzero(original == LAYOUT.visual_sep_id)[0])].tolist()
        # the sentence whole and in order, ordinary word pieces before or after it
        at = said.index(500)
        assert said[at : at + len(text)] == text.tolist()
        extra = said[:at] + said[at + len(text) :]
        assert set(extra) <= set(TEXT_REPLACEMENTS.tolist())
        counts.append(len(extra))
        targets += int((labels[1 : 1 + len(said)] != IGNORE).sum())
        edges.update(start=at, end=len(said) - at - len(text))
    # two draws at 0.5 each: 0, 1 or 2 pieces, one on average, as often before the sentence as after it
    assert set(counts) == {0, 1, 2} and abs(np.mean(counts) - 1.0) < 0.15
    assert abs(edges["start"] - edges["end"]) < 0.2 * sum(counts)
    # masked like the sentence's own pieces: 15% of all
    assert abs(targets / (400 * len(text) + sum(counts)) - 0.15) < 0.02
    # text-only and video-only examples, and text-video ones at 0, keep their text as it is
    for plan, changes in (
        (Plan(TEXT, text, data.EMPTY, IGNORE), {"text_insert_prob": 1.0}),
        (Plan(VIDEO, data.EMPTY, np.arange(8), IGNORE), {"text_insert_prob": 1.0}),
        (Plan(TEXT_VIDEO, text, np.arange(8), ALIGNED), {}),
    ):
        ids, _, labels = example(plan, rng, **changes)
        assert len(ids) == 2 + len(plan.text_ids) + len(plan.visual_ids) + (plan.regime == TEXT_VIDEO)


def test_a_noisy_context_replaces_half_the_untargeted_text_of_text_video_examples_only():
    text = np.arange(500, 520)  # outside TEXT_REPLACEMENTS, so that a replaced piece is told apart
    visual = np.arange(8)
    rng = np.random.default_rng(0)
    noisy, replaced, untargeted = 0, 0, 0
    for _ in range(400):
        ids, types, labels = example(Plan(TEXT_VIDEO, text, visual, ALIGNED), rng, text_context_noise_prob=0.5)
        said, said_labels = ids[1 : 1 + len(text)], labels[1 : 1 + len(text)]
        targets = said_labels != IGNORE
        # the targets keep their labels (and BERT's 80/10/10 input), [>] and the visual tokens stay whole
        assert (said_labels[targets] == text[targets]).all()
        assert ids[1 + len(text)] == LAYOUT.visual_sep_id
        kept_visual = ids[2 + len(text) : -1] == visual + LAYOUT.visual_offset
        assert (kept_visual | (labels[2 + len(text) : -1] != IGNORE)).all()
        changed = (said != text) & ~targets
        assert set(said[changed].tolist()) <= set(TEXT_REPLACEMENTS.tolist())
        if changed.any():
            noisy += 1
            replaced += int(changed.sum())
            untargeted += int((~targets).sum())
    # half the examples, and in those about half their untargeted pieces (a random piece may equal none of
    # the sentence's: TEXT_REPLACEMENTS lie outside it)
    assert abs(noisy / 400 - 0.5) < 0.08
    assert abs(replaced / untargeted - data.CONTEXT_NOISE_SHARE) < 0.05
    # text-only examples keep their text
    for _ in range(50):
        ids, _, labels = example(Plan(TEXT, text, data.EMPTY, IGNORE), rng, text_context_noise_prob=1.0)
        kept = labels[1 : 1 + len(text)] == IGNORE
        assert (ids[1 : 1 + len(text)][kept] == text[kept]).all()


def test_a_dropped_sentence_end_leaves_the_rest_of_a_text_video_text_as_it_was():
    period, question = 1012, 1029
    text = np.r_[np.arange(500, 506), period]
    rng = np.random.default_rng(0)
    ends = (period, question)
    dropped = 0
    for _ in range(400):
        ids, _, labels = example(
            Plan(TEXT_VIDEO, text, np.arange(8), ALIGNED), rng, text_end_drop_prob=0.5, sentence_end_ids=ends
        )
        said = unmasked(ids, labels)[1 : list(ids).index(LAYOUT.visual_sep_id)]
        assert np.array_equal(said, text) or np.array_equal(said, text[:-1])
        dropped += len(said) < len(text)
    assert abs(dropped / 400 - 0.5) < 0.08
    # every end mark at the end goes, one in the middle stays; a text of end marks alone stays whole
    marked = np.array([500, period, 501, question, period])
    assert data.without_sentence_end(marked, ends).tolist() == [500, period, 501]
    assert data.without_sentence_end(np.array([period]), (period,)).tolist() == [period]
    # a text-only example keeps its end
    for _ in range(20):
        ids, _, labels = example(
            Plan(TEXT, text, data.EMPTY, IGNORE), rng, text_end_drop_prob=1.0, sentence_end_ids=ends
        )
        assert (unmasked(ids, labels)[1:-1] == text).all()


def test_the_sentence_ends_come_from_the_tokenizer_which_the_setting_needs(tokenizer):
    from pipeline.config import load_config
    from videobert.vocab import sentence_end_ids

    ends = sentence_end_ids(tokenizer)
    assert sorted(tokenizer.convert_ids_to_tokens(list(ends))) == ["!", ".", "?"]
    train = load_config(None, ["train.text_end_drop_prob=0.5"]).train
    assert DataParams.from_config(train, tokenizer).sentence_end_ids == ends
    with pytest.raises(ValueError, match="train.text_end_drop_prob"):
        DataParams.from_config(train)


def test_common_words_draw_the_edge_pieces_and_the_noisy_context_and_nothing_else():
    text, visual = np.arange(500, 520), np.arange(8)
    common = np.arange(1500, 1510)  # a pool inside TEXT_REPLACEMENTS: a piece from elsewhere would show
    rng = np.random.default_rng(0)
    drawn = Counter()
    for _ in range(300):
        ids, _, labels = example(
            Plan(TEXT_VIDEO, text, visual, ALIGNED),
            rng,
            text_insert_prob=0.5,
            text_context_noise_prob=1.0,
            noise_text_ids=common,
        )
        said = ids[1 : list(ids).index(LAYOUT.visual_sep_id)]
        untargeted = said[labels[1 : 1 + len(said)] == IGNORE]
        written = untargeted[~np.isin(untargeted, text)]
        assert set(written.tolist()) <= set(common.tolist())
        drawn.update(written.tolist())
    assert len(drawn) == len(common)  # every word of the pool comes up
    # BERT's 10% random replacement of a target still draws from every word piece
    replaced = Counter()
    for _ in range(300):
        ids, _, labels = example(Plan(TEXT_VIDEO, text, visual, ALIGNED), rng, noise_text_ids=common)
        said, targets = ids[1 : 1 + len(text)], labels[1 : 1 + len(text)] != IGNORE
        kept_or_masked = np.isin(said, text) | (said == LAYOUT.mask_id)
        replaced.update(said[targets & ~kept_or_masked].tolist())
    assert set(replaced) - set(common.tolist())


def test_the_common_words_are_the_tokenizers_most_frequent_whole_words_which_the_setting_needs(tokenizer):
    from pipeline.config import load_config
    from videobert.vocab import common_word_ids

    words = tokenizer.convert_ids_to_tokens(common_word_ids(tokenizer, 5000).tolist())
    assert words[:5] == ["the", "of", "and", "in", "to"] and len(set(words)) == 5000
    assert all(word.isascii() and word.isalpha() and len(word) > 1 for word in words)
    # the words a question is put in are there; the sets' rare nouns are not
    assert {"so", "we", "watch", "me", "will", "here", "you"} <= set(words)
    assert not {"onion", "dough", "tomato"} & set(words)
    train = load_config(None, ["train.text_noise_words=5000"]).train
    assert DataParams.from_config(train, tokenizer).noise_text_ids.tolist() == common_word_ids(tokenizer, 5000).tolist()
    with pytest.raises(ValueError, match="train.text_noise_words"):
        DataParams.from_config(train)
    with pytest.raises(ValueError, match="train.text_noise_words"):
        common_word_ids(tokenizer, 10**6)
    # without the setting, the pool is every word piece, as before
    assert DataParams.from_config(load_config(None, []).train, tokenizer).noise_text_ids is None


def test_a_cropped_visual_sentence_is_a_run_of_its_own_clips_of_any_length():
    text, visual = np.arange(500, 506), np.arange(8)
    rng = np.random.default_rng(0)
    lengths = Counter()
    for _ in range(800):
        ids, types, labels = example(Plan(TEXT_VIDEO, text, visual, ALIGNED), rng, visual_crop_prob=0.5)
        seen = unmasked(ids, labels)
        said, clips = seen[1 : 1 + len(text)], seen[types == 1][:-1] - LAYOUT.visual_offset
        assert (said == text).all()
        assert (np.diff(clips) == 1).all() and set(clips.tolist()) <= set(visual.tolist())
        lengths[len(clips)] += 1
    # half whole; the other half 1..8 clips, each about as often
    assert abs(lengths[8] / 800 - (0.5 + 0.5 / 8)) < 0.06
    assert all(abs(lengths[n] / 800 - 0.5 / 8) < 0.03 for n in range(1, 8))
    # a video-only example keeps its clips
    for _ in range(20):
        ids, types, labels = example(Plan(VIDEO, data.EMPTY, visual, IGNORE), rng, visual_crop_prob=1.0)
        assert (unmasked(ids, labels)[1:-1] - LAYOUT.visual_offset == visual).all()


def test_without_negative_mlm_a_negative_is_masked_alike_and_has_no_targets():
    from pipeline.config import load_config

    text, visual = np.arange(500, 508), np.arange(8)
    for seed in range(50):
        for label in (ALIGNED, NOT_ALIGNED):
            plan = Plan(TEXT_VIDEO, text, visual, label)
            kept = example(plan, np.random.default_rng(seed), text_context_noise_prob=0.5)
            ids, types, labels = example(
                plan, np.random.default_rng(seed), text_context_noise_prob=0.5, negative_mlm=False
            )
            # the same draws: the inputs the alignment head sees are the same either way
            assert (ids == kept[0]).all() and (types == kept[1]).all()
            if label == ALIGNED:
                assert (labels == kept[2]).all()
            else:
                assert (labels == IGNORE).all() and (kept[2] != IGNORE).any()
    # the setting comes from the train section, on by default
    assert DataParams.from_config(load_config(None, []).train).negative_mlm is True
    assert DataParams.from_config(load_config(None, ["train.negative_mlm=false"]).train).negative_mlm is False


def test_a_masked_span_hides_three_consecutive_pieces_of_text_video_texts_only():
    text = np.arange(500, 507)
    rng = np.random.default_rng(0)
    starts, spans = Counter(), 0
    for _ in range(400):
        ids, _, labels = example(Plan(TEXT_VIDEO, text, np.arange(8), ALIGNED), rng, text_span_mask_prob=0.5)
        targets = np.flatnonzero(labels[1 : 1 + len(text)] != IGNORE)
        if len(targets) == data.TEXT_SPAN and np.all(np.diff(targets) == 1):
            spans += 1
            starts[int(targets[0])] += 1
            # the visual tokens are masked as always: 15% of 8 rounds to 1 or 2
            assert 1 <= int((labels[2 + len(text) :] != IGNORE).sum()) <= 2
    # about half the examples: the span (3 consecutive pieces of a 7-piece text, 15% per piece otherwise rounds
    # to 1 or 2 targets, never 3), starting anywhere it fits
    assert abs(spans / 400 - 0.5) < 0.08
    assert set(starts) == set(range(len(text) - data.TEXT_SPAN + 1))
    # a text shorter than the span is masked whole; text-only examples keep the per-piece draw
    ids, _, labels = example(Plan(TEXT_VIDEO, text[:2], np.arange(8), ALIGNED), rng, text_span_mask_prob=1.0)
    assert (labels[1:3] == text[:2]).all()
    texts_only = [
        int(
            (
                data.build_example(
                    Plan(TEXT, text, data.EMPTY, IGNORE),
                    LAYOUT,
                    params(text_span_mask_prob=1.0),
                    TEXT_REPLACEMENTS,
                    rng,
                )[2]
                != IGNORE
            ).sum()
        )
        for _ in range(200)
    ]
    assert set(texts_only) <= {1, 2}


def test_visual_tokens_are_subsampled_at_steps_1_to_5():
    rng = np.random.default_rng(0)
    plan = Plan(VIDEO, np.zeros(0, dtype=np.int64), np.arange(40), IGNORE)
    steps = set()
    for _ in range(200):
        ids, _, labels = data.build_example(plan, LAYOUT, params(max_len=128), TEXT_REPLACEMENTS, rng)
        visual = unmasked(ids, labels)[1:-1] - LAYOUT.visual_offset
        gaps = set(np.diff(visual).tolist())
        assert len(gaps) <= 1
        steps |= gaps
    assert steps == {1, 2, 3, 4, 5}


def test_concatenation_joins_neighbours_of_one_video_only(tmp_path):
    shards = write_shards(tmp_path, shards=1, videos_per_shard=3, segments=4)
    videos = [video for _, video in data.read_videos(shards[0], LAYOUT)]
    assert [video.video_id for video in videos] == ["v00", "v01", "v02"]
    rng = np.random.default_rng(0)
    units = [data.Unit(video, first, last) for video in videos for first, last in data.runs(4, rng, 1.0, 3)]
    assert sum(unit.last - unit.first for unit in units) == 12 and any(unit.last - unit.first > 1 for unit in units)
    for unit in units:
        assert unit.last - unit.first <= 3
        video = int(unit.video.video_id[1:])
        # text with text, video with video, in order, so they stay aligned
        segments = range(unit.first, unit.last)
        assert unit.text_ids.tolist() == [1000 + 10 * video + s for s in segments if s % 4 != 3 for _ in range(3)]
        assert unit.visual_ids.tolist() == [
            WORDS_PER_VIDEO * video + (s + i) % WORDS_PER_VIDEO for s in segments for i in range(4)
        ]
    assert data.runs(4, rng, 0.0, 3) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    # a stream resumes inside a shard: the rows before `start_row` are not part of what it reads
    assert [video.video_id for _, video in data.read_videos(shards[0], LAYOUT, start_row=4)] == ["v01", "v02"]


def test_negatives_are_of_another_time_and_as_long_as_the_text_span(tmp_path):
    shards = write_realistic_shards(tmp_path)
    gap = 20
    stream = data.PlanStream(
        shards, REAL, params(regime_weights=(0.0, 0.0, 1.0), negative_min_gap=gap, shuffle_buffer=200), 0, 0, 1
    )
    kinds = Counter()
    for _ in range(4000):
        plan = next(stream)
        assert plan.regime == TEXT_VIDEO
        video, (start, end) = int(plan.unit.video.video_id[1:]), plan.unit.span
        origin, position = plan.visual_ids // 1000, plan.visual_ids % 1000
        assert len(plan.visual_ids) == end - start  # as long as the text's own span
        assert np.all(np.diff(position) == 1)  # a window of consecutive clips
        if plan.alignment_label == ALIGNED:
            kinds["aligned"] += 1
            assert (origin == video).all() and position[0] == start
        elif plan.same_video:
            kinds["same video"] += 1
            assert (origin == video).all()
            assert position[-1] < start - gap or position[0] >= end + gap  # at least `gap` clips away
        else:
            kinds["other video"] += 1
            assert len(set(origin.tolist())) == 1 and origin[0] != video
    negatives = kinds["same video"] + kinds["other video"]
    assert 0.45 < negatives / 4000 < 0.55
    assert abs(kinds["same video"] / negatives - 0.5) < 0.05  # train.negative_same_video_share
    only_other = data.PlanStream(
        shards, REAL, params(regime_weights=(0.0, 0.0, 1.0), negative_same_video_share=0.0, shuffle_buffer=200), 0, 0, 1
    )
    assert not any(next(only_other).same_video for _ in range(500))


def test_alignment_labels_cannot_be_told_from_lengths(tmp_path):
    shards = write_realistic_shards(tmp_path, text_share=0.7)
    p = params(regime_weights=(0.0, 0.0, 1.0), max_len=128, shuffle_buffer=200)

    def key(ids, types) -> tuple[int, int]:
        """(text length in bins of 8, visual length) of a built example: what the model sees."""
        visual = int(types.sum()) - 1  # segment B: visual tokens, [SEP]
        return (len(ids) - visual - 3) // 8, visual

    keys, labels = [], []
    for batch, _ in zip(ShardDataset(shards, REAL, TEXT_REPLACEMENTS, p, 250, 0), range(80)):
        for row, length in enumerate(batch["attention_mask"].sum(dim=1).tolist()):
            keys.append(key(batch["input_ids"][row, :length], batch["token_type_ids"][row, :length]))
        labels += batch["alignment_labels"].tolist()
    assert 0.48 < np.mean(labels) < 0.52
    accuracy = lookup_accuracy(keys, labels)
    assert abs(accuracy - 0.5) < 0.03, accuracy
    # the same lookup tells negatives made from any other unit's visual tokens (16-clip silent stretches,
    # joined runs): there the lengths give the label away
    units = [
        data.Unit(video, first, last)
        for path in shards
        for _, video in data.read_videos(path, REAL)
        for first, last in data.runs(video.segments, np.random.default_rng(0), 0.5, 3)
    ]
    rng = np.random.default_rng(1)
    keys, labels = [], []
    for unit in units * 80:
        if unit.text_ids.size:
            negative = rng.random() < 0.5
            visual = units[rng.integers(len(units))].visual_ids if negative else unit.visual_ids
            plan = Plan(TEXT_VIDEO, unit.text_ids, visual, NOT_ALIGNED if negative else ALIGNED)
            keys.append(key(*data.build_example(plan, REAL, p, TEXT_REPLACEMENTS, rng)[:2]))
            labels.append(plan.alignment_label)
    assert lookup_accuracy(keys, labels) > 0.57  # about 0.59


def test_regimes_are_mixed_by_weight(tmp_path):
    shards = write_shards(tmp_path)
    plans = data.PlanStream(shards, LAYOUT, params(regime_weights=(1.0, 0.0, 3.0), concat_prob=0.0), 0, 0, 1)
    counts = Counter(next(plans).regime for _ in range(800))
    assert counts[VIDEO] == 0
    # video_only segments (1 in 5) can only be video examples: with video off they are left out
    assert 0.18 < counts[TEXT] / 800 < 0.32


def test_exact_mix_follows_the_weights_when_few_videos_have_text(tmp_path):
    # 40% of the videos have text (English), and they have silent stretches too
    shards = write_realistic_shards(tmp_path, text_share=0.4)

    def shares(weights, mix, n=6000) -> list[float]:
        stream = data.PlanStream(
            shards, REAL, params(regime_weights=weights, regime_mix=mix, shuffle_buffer=200), 0, 0, 1
        )
        counts = Counter(next(stream).regime for _ in range(n))
        return [counts[regime] / n for regime in (TEXT, VIDEO, TEXT_VIDEO)]

    assert all(abs(share - 1 / 3) < 0.03 for share in shares((1.0, 1.0, 1.0), "exact")), shares(
        (1.0, 1.0, 1.0), "exact"
    )
    assert all(
        abs(share - expected) < 0.03 for share, expected in zip(shares((1.0, 2.0, 1.0), "exact"), (0.25, 0.5, 0.25))
    )
    natural = shares((1.0, 1.0, 1.0), "natural")
    assert natural[VIDEO] > 0.5 and natural[TEXT] < 0.25  # units without text make video examples only
    # where units with text are plentiful (about 2/3 of them here, more than the text and text-video weights'
    # 1/2), they make video examples too
    rich = write_realistic_shards(tmp_path / "rich", text_share=1.0, seed=1)
    stream = data.PlanStream(rich, REAL, params(regime_weights=(1.0, 2.0, 1.0), shuffle_buffer=200), 0, 0, 1)
    plans = [next(stream) for _ in range(6000)]
    counts = Counter(plan.regime for plan in plans)
    assert all(
        abs(counts[regime] / 6000 - expected) < 0.03
        for regime, expected in ((TEXT, 0.25), (VIDEO, 0.5), (TEXT_VIDEO, 0.25))
    )
    assert sum(plan.regime == VIDEO and plan.unit.text_ids.size > 0 for plan in plans) > 1000


def test_ids_outside_the_vocabulary_name_the_video(tmp_path):
    write_shards(tmp_path, shards=1)
    small = VocabLayout(text_vocab_size=2000, num_visual=6, cls_id=101, sep_id=102, mask_id=103, pad_id=0)
    with pytest.raises(ValueError, match=r"video 'v01' has visual id \d+ outside \[0, 6\)"):
        list(data.read_segments(WorkDir(tmp_path).part("align", 0), small))
