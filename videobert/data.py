"""Training data: the plans of videobert/stream.py made into masked VideoBERT examples and batches.

Vocabulary layout: videobert/vocab.py (`VocabLayout`).  What shapes the examples: `stream.DataParams`.

Three kinds of examples, mixed by `train.regime_weights` (`train.regime_mix`, see stream.PlanStream._regime):
    text        [CLS] text [SEP]                          masked LM
    video       [CLS] visual tokens [SEP]                 masked LM
    text_video  [CLS] text [>] visual tokens [SEP]        masked LM + alignment label on [CLS]
A text_video example is a negative (not aligned) with probability `train.negative_prob`: the text with as
many visual tokens as its own span has, from another time: with `train.negative_same_video_share` a window
of the same video at least `train.negative_min_gap` clips away, otherwise a window of another video. Equal
lengths keep the label from showing in the lengths, and same-video negatives make the task "is this the
time the sentence was said?", not "is this the same video?".

A batch of plans becomes tensors: a text-only or video-only example shorter than 1 / mask_prob tokens is
first widened within its video, so that it has a target; a text-video example's text loses its final
". ? !" (`text_end_drop_prob`) and its visual tokens are cut to a random run of 1..n of its n clips
(`visual_crop_prob`); visual tokens subsampled at a random step in 1..max_subsample_step, a text-video
example's text given up to two random word pieces at its edges (`text_insert_prob` each), truncated to
`max_len` keeping text and video in balance, 15% of the text and 15% of the visual tokens masked (80/10/10;
with `text_span_mask_prob`, a text-video example's text as 3 consecutive pieces instead), then, with
`text_context_noise_prob`, half of a text-video example's untargeted text pieces made random ones (the edge
pieces and these drawn from the vocabulary's most common words with `text_noise_words`); without
`negative_mlm` a negative keeps its masked inputs and loses its masked targets. This uses a generator seeded
by (seed, stream, batch index).

Resume: a stream's position (`PlanStream.state()`, bounded by `shuffle_buffer`) rides along with its last
batch before each checkpoint and is saved there, so a resume continues every stream where it stopped
without replaying a single example, and yields exactly the batches an uninterrupted run would have:
DataLoader takes batches from its workers round-robin starting at worker 0, so after a resume at batch b
worker w serves the stream whose turn is b + w."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from videobert.shards import (  # noqa: F401  (re-exported: the data layer's names in one place)
    EMPTY,
    PinnedShards,
    Segment,
    read_segments,
    training_shards,
)
from videobert.stream import (  # noqa: F401  (re-exported)
    ALIGNED,
    IGNORE,
    NOT_ALIGNED,
    REGIMES,
    TEXT,
    TEXT_VIDEO,
    VIDEO,
    DataParams,
    Plan,
    PlanStream,
    Unit,
    Video,
    read_videos,
    runs,
    stream_shards,
)
from videobert.vocab import VocabLayout, replacement_text_ids  # noqa: F401  (re-exported)

# ---------------------------------------------------------------- plans to tensors

MAX_INSERTS = 2  # random word pieces a text-video example's text may get (train.text_insert_prob)
TEXT_SPAN = 3  # word pieces masked together in a text-video example's text (train.text_span_mask_prob): "cut the egg"
CONTEXT_NOISE_SHARE = 0.5  # a noisy-context example's untargeted text pieces replaced (train.text_context_noise_prob)


def balance(n_text: int, n_video: int, budget: int) -> tuple[int, int]:
    """How many text and visual tokens to keep within `budget`: the shorter side is kept whole when it
    fits in half the budget, otherwise both get half."""
    if n_text + n_video <= budget:
        return n_text, n_video
    half = budget // 2
    if n_text <= half:
        return n_text, budget - n_text
    if n_video <= budget - half:
        return budget - n_video, n_video
    return half, budget - half


def assemble(
    layout: VocabLayout, text_ids: np.ndarray, visual_ids: np.ndarray, *, with_separator: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(input ids, token types) of `[CLS] text [>] visual [SEP]`; visual ids are leaf ids (not offset).
    Text and `[>]` are segment A (type 0); visual tokens and the final [SEP] are segment B (type 1);
    without visual tokens everything is segment A, as in BERT's single-sentence input."""
    parts = [[layout.cls_id], text_ids]
    if with_separator:
        parts.append([layout.visual_sep_id])
    n_a = 1 + len(text_ids) + int(with_separator)
    parts += [np.asarray(visual_ids, dtype=np.int64) + layout.visual_offset, [layout.sep_id]]
    ids = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
    types = np.zeros(len(ids), dtype=np.int64)
    if len(visual_ids):
        types[n_a:] = 1
    return ids, types


def mask_tokens(
    ids: np.ndarray,
    layout: VocabLayout,
    mask_prob: float,
    text_replacements: np.ndarray,
    rng: np.random.Generator,
    text_span: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """BERT masking, per modality: of n text (or visual) tokens, mask_prob * n rounded at random (down, or up
    with the fraction's probability) are predicted, so that every token is predicted with probability exactly
    `mask_prob` whatever the example's length (a floor of one target would predict a third of a 3-token
    visual sentence); of those 80% become [MASK], 10% a random token of the same kind, 10% stay. With
    `text_span` > 0 the text's targets are instead that many consecutive pieces (all of a shorter text)."""
    is_visual = (ids >= layout.visual_offset) & (ids < layout.visual_sep_id)
    is_text = (ids < layout.text_vocab_size) & (ids != layout.cls_id) & (ids != layout.sep_id) & (ids != layout.pad_id)
    labels = np.full(len(ids), IGNORE, dtype=np.int64)
    chosen = []
    for positions, span in ((np.flatnonzero(is_text), text_span), (np.flatnonzero(is_visual), 0)):
        if span and positions.size:
            start = int(rng.integers(max(1, positions.size - span + 1)))
            chosen.append(positions[start : start + span])
            continue
        expected = mask_prob * positions.size
        count = int(expected) + int(rng.random() < expected - int(expected))
        chosen.append(positions[rng.random(positions.size).argsort()[:count]])  # `count` distinct positions
    chosen = np.concatenate(chosen)
    if chosen.size == 0:
        return ids, labels
    labels[chosen] = ids[chosen]
    ids = ids.copy()
    draw = rng.random(chosen.size)
    ids[chosen[draw < 0.8]] = layout.mask_id
    random_positions = chosen[(draw >= 0.8) & (draw < 0.9)]
    visual_positions = random_positions[is_visual[random_positions]]
    text_positions = random_positions[~is_visual[random_positions]]
    ids[visual_positions] = rng.integers(layout.visual_offset, layout.visual_sep_id, size=visual_positions.size)
    ids[text_positions] = rng.choice(text_replacements, size=text_positions.size)
    return ids, labels


def _widened(plan: Plan, step: int, params: DataParams) -> tuple[np.ndarray, np.ndarray]:
    """(text, visual ids) of a text-only or video-only plan, widened within its video to at least
    `params.min_tokens` tokens (after subsampling at `step`): whole neighbouring segments for text, neighbouring
    clips for video. Without it a short speech segment would be a video example of 1-2 tokens with no target
    at the unbiased masking rate, a batch row that teaches nothing (text-video rows keep their alignment
    target, and stay as they are)."""
    unit, need = plan.unit, min(params.min_tokens, params.max_len - 2)
    video = unit.video if unit is not None else None
    if plan.regime == TEXT and video is not None and len(plan.text_ids) < need:
        bounds = video.text_bounds
        last = min(video.segments, int(np.searchsorted(bounds, bounds[unit.first] + need)))
        first = max(0, min(unit.first, int(np.searchsorted(bounds, bounds[last] - need, side="right")) - 1))
        return video.text[bounds[first] : bounds[last]], plan.visual_ids
    if plan.regime == VIDEO and video is not None and len(plan.visual_ids) < need * step:
        end = min(len(video.clips), unit.span[0] + need * step)
        return plan.text_ids, video.clips[max(0, end - need * step) : end]
    return plan.text_ids, plan.visual_ids


def build_example(
    plan: Plan, layout: VocabLayout, params: DataParams, text_replacements: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input ids, token types, MLM labels) of one plan."""
    step = int(rng.integers(1, params.max_subsample_step + 1)) if params.max_subsample_step > 1 else 1
    text, visual = _widened(plan, step, params)
    if plan.regime == TEXT_VIDEO and params.text_end_drop_prob and rng.random() < params.text_end_drop_prob:
        text = without_sentence_end(text, params.sentence_end_ids)
    crop = params.visual_crop_prob and len(visual) > 1
    if plan.regime == TEXT_VIDEO and crop and rng.random() < params.visual_crop_prob:
        # a negative's window is as long as the text's own span and is cut alike: the length tells nothing
        length = int(rng.integers(1, len(visual) + 1))
        start = int(rng.integers(len(visual) - length + 1))
        visual = visual[start : start + length]
    # the random pieces the trainer writes into a text: the common words (train.text_noise_words) or any piece
    noise_ids = text_replacements if params.noise_text_ids is None else params.noise_text_ids
    if plan.regime == TEXT_VIDEO and params.text_insert_prob:
        text = insert_word_pieces(text, params.text_insert_prob, noise_ids, rng)
    if visual.size and step > 1:
        # the offset stays inside short segments, so that no visual sentence comes out empty
        visual = visual[int(rng.integers(min(step, len(visual)))) :][::step]
    if plan.regime == TEXT_VIDEO:
        n_text, n_video = balance(len(text), len(visual), params.max_len - 3)
        text, visual = text[:n_text], visual[:n_video]
    else:
        text, visual = text[: params.max_len - 2], visual[: params.max_len - 2]
    ids, types = assemble(layout, text, visual, with_separator=plan.regime == TEXT_VIDEO)
    span = plan.regime == TEXT_VIDEO and params.text_span_mask_prob and rng.random() < params.text_span_mask_prob
    ids, labels = mask_tokens(ids, layout, params.mask_prob, text_replacements, rng, TEXT_SPAN if span else 0)
    if plan.regime == TEXT_VIDEO and params.text_context_noise_prob and rng.random() < params.text_context_noise_prob:
        ids = noise_context(ids, labels, len(text), noise_ids, rng)
    if plan.alignment_label == NOT_ALIGNED and not params.negative_mlm:
        # masked as any example (the alignment head sees the same inputs either way), but nothing to predict
        labels = np.full_like(labels, IGNORE)
    return ids, types, labels


def without_sentence_end(text_ids: np.ndarray, end_ids: tuple[int, ...]) -> np.ndarray:
    """`text_ids` without the sentence-end pieces (". ? !") at its end; a text of nothing else stays whole."""
    keep = len(text_ids)
    while keep > 1 and int(text_ids[keep - 1]) in end_ids:
        keep -= 1
    return text_ids[:keep]


def noise_context(
    ids: np.ndarray, labels: np.ndarray, n_text: int, text_replacements: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """`ids` with each of its n_text text pieces (after [CLS]) that is not a masked target replaced by a random
    word piece with probability CONTEXT_NOISE_SHARE; the targets, [>], the visual tokens and the label stay.
    Why: with a few wordings a small model learns to use the video only after the words its own sentences put
    around a verb and a noun, and answers a question worded otherwise (a zero-shot template) from the text
    alone; with the words around its targets unreliable, the video is what stays (docs/training-data.md)."""
    text = np.arange(1, 1 + n_text)
    text = text[labels[text] == IGNORE]
    replaced = text[rng.random(text.size) < CONTEXT_NOISE_SHARE]
    ids = ids.copy()
    ids[replaced] = rng.choice(text_replacements, size=replaced.size)
    return ids


def insert_word_pieces(
    text_ids: np.ndarray, insert_prob: float, text_replacements: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """`text_ids` with up to MAX_INSERTS random word pieces, each with probability `insert_prob`, at its start
    or its end (half each); masking then treats them as any other piece. Why: sentences that always put their
    nouns at the same distance before `[>]` teach the model to read that position, not the word. Why at the
    edges: inside the sentence they split the very phrases ("cut the egg") that zero-shot's templates ask
    about (docs/training-data.md, where the words stand)."""
    for _ in range(int(rng.binomial(MAX_INSERTS, insert_prob))):
        at_start = rng.random() < 0.5
        piece = [text_replacements[int(rng.integers(len(text_replacements)))]]
        text_ids = np.concatenate([piece, text_ids] if at_start else [text_ids, piece]).astype(
            text_ids.dtype, copy=False
        )
    return text_ids


def pad_examples(examples: list[tuple[np.ndarray, ...]], pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids, token_type_ids, attention_mask) of (ids, types, ...) examples, padded to the longest one
    (not max_len: short batches cost less)."""
    length = max(len(example[0]) for example in examples)
    input_ids = np.full((len(examples), length), pad_id, dtype=np.int64)
    token_types = np.zeros((len(examples), length), dtype=np.int64)
    attention = np.zeros((len(examples), length), dtype=np.int64)
    for row, (ids, types, *_) in enumerate(examples):
        input_ids[row, : len(ids)] = ids
        token_types[row, : len(ids)] = types
        attention[row, : len(ids)] = 1
    return input_ids, token_types, attention


def collate(
    examples: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    regimes: list[int],
    alignment_labels: list[int],
    pad_id: int,
) -> dict[str, torch.Tensor]:
    """The training batch of (ids, types, labels) examples, padded to the longest."""
    input_ids, token_types, attention = pad_examples(examples, pad_id)
    labels = np.full(input_ids.shape, IGNORE, dtype=np.int64)
    for row, (_, _, example_labels) in enumerate(examples):
        labels[row, : len(example_labels)] = example_labels
    return {
        "input_ids": torch.from_numpy(input_ids),
        "token_type_ids": torch.from_numpy(token_types),
        "attention_mask": torch.from_numpy(attention),
        "labels": torch.from_numpy(labels),
        "alignment_labels": torch.tensor(alignment_labels, dtype=torch.int64),
        "regimes": torch.tensor(regimes, dtype=torch.int64),
    }


# ---------------------------------------------------------------- the dataset


class ShardDataset(IterableDataset):
    """Endless batches (dicts of tensors) of this rank's share of the shards; use with
    `DataLoader(dataset, batch_size=None, num_workers=streams_per_rank or 0)`.

    `start_batch` is the number of batches this rank has already consumed (resume) and `plan_states` the
    saved states of its streams (by stream id; a stream without one replays its plans from the start). The
    last batch of each stream before a checkpoint (every `checkpoint_every` batches, and at `stop_batch`)
    carries the stream's state as "plan_state" (a dict with its "stream" and next "batch")."""

    def __init__(
        self,
        shards: list[Path],
        layout: VocabLayout,
        text_replacements: np.ndarray,
        params: DataParams,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        start_batch: int = 0,
        plan_states: dict[int, dict] | None = None,
        checkpoint_every: int = 0,
        stop_batch: int = 0,
    ):
        # pinned shards stay `PinnedShards`: those on object storage are checked at each open (shards.pin_shards)
        self.shards = shards if isinstance(shards, PinnedShards) else list(shards)
        self.layout, self.text_replacements = layout, text_replacements
        self.params, self.batch_size, self.seed = params, batch_size, seed
        self.rank, self.world_size, self.start_batch = rank, world_size, start_batch
        self.plan_states, self.checkpoint_every, self.stop_batch = plan_states or {}, checkpoint_every, stop_batch

    def _checkpoint_after(self, index: int, workers: int) -> bool:
        """Whether batch `index` is its stream's last before a checkpoint (the next `workers` are others')."""
        every = self.checkpoint_every
        return (
            every > 0 and (index // every + 1) * every <= index + workers
        ) or index < self.stop_batch <= index + workers

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        # stream `slot` makes this rank's batches slot, slot + workers, ...; the loader asks worker w for
        # batch start_batch + w first
        slot, first = (self.start_batch + worker) % workers, (self.start_batch + worker) // workers
        stream = self.rank * workers + slot
        state = self.plan_states.get(stream)
        plans = PlanStream(self.shards, self.layout, self.params, self.seed, stream, self.world_size * workers, state)
        if state is None:
            for _ in range(first * self.batch_size):
                next(plans)
        elif state["batch"] != first:
            raise ValueError(f"data stream {stream} was saved before its batch {state['batch']}, not {first}")
        for local_batch in itertools.count(first):
            batch_plans = [next(plans) for _ in range(self.batch_size)]
            rng = np.random.default_rng([self.seed, 3, stream, local_batch])
            examples = [
                build_example(plan, self.layout, self.params, self.text_replacements, rng) for plan in batch_plans
            ]
            batch = collate(
                examples, [p.regime for p in batch_plans], [p.alignment_label for p in batch_plans], self.layout.pad_id
            )
            if self._checkpoint_after(local_batch * workers + slot, workers):
                batch["plan_state"] = dict(plans.state(), stream=stream, batch=local_batch + 1)
            yield batch


def streams_per_rank(num_shards: int, world_size: int, num_workers: int) -> int:
    """Streams (DataLoader workers, or 1 in-process) per rank: every stream needs a shard of its own."""
    if num_shards < world_size:
        raise ValueError(
            f"{num_shards} non-empty align shard(s) cannot feed {world_size} ranks: "
            f"make more shards (shards.videos_per_shard) or use fewer ranks"
        )
    return max(1, min(max(num_workers, 1), num_shards // world_size))
