"""The config's sections that no stage owns: the values of the whole run (seed, licence, the executor) and
those of evaluation and captioning; a stage's own section is in its folder (stages/<name>/__init__.py).
pipeline/config.py assembles them into the Config and loads it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

from pipeline import config_rules as rules
from pipeline import registry
from pipeline.config_fields import (
    FRACTION,
    MAX_WORKERS,
    SEED,
    ConfigError,
    count,
    one_of,
    setting,
)


def _ray_roles(ex, prefix: str) -> None:
    """Every role is one a stage's registry record names; every resource one Ray takes."""
    roles = tuple(registry.ray_resources())
    for role, resources in ex.ray_resources.items():
        one_of(role, roles, f"{prefix}ray_resources.{role}")
        for name, amount in resources.items():
            key = f"{prefix}ray_resources.{role}.{name}"
            one_of(name, ("num_cpus", "num_gpus", "memory_gb"), key)
            if amount < 0:
                raise ConfigError(f"config error: {key} must be >= 0 (got {amount!r})")


@dataclass
class ExecutorConfig:
    # where shards run: local (a process pool here), ray (a Ray cluster, ray_address), slurm (the tasks of `submit`)
    kind: str = setting("local", choices=("local", "ray", "slurm"))
    workers: int = count()  # local process pool size; 0 = the task's CPUs (pipeline/threads.py)
    ray_address: str | None = None  # None starts a local Ray instance; "auto" joins a running cluster
    max_retries: int = setting(2, ge=0, le=100)  # Ray: attempts after the first failure of a shard task
    max_failed_share: float = setting(0.5, **FRACTION)  # a stage whose share of failed videos is larger exits with 3
    # The slurm_* strings are written into #SBATCH lines, so each must look like what sbatch expects
    # (config_rules.SLURM_VALUES): no spaces, quotes or line breaks that could add a directive or a command
    slurm_partition: str | None = setting(
        None, rule=rules.slurm_word("slurm_partition")
    )  # a name, or several, comma-separated
    # minutes, [days-]hours:minutes:seconds, ... or UNLIMITED; quote it in YAML (4:00:00 bare is a number)
    slurm_time: str = setting("04:00:00", rule=rules.slurm_word("slurm_time"))
    # CPUs per array task (#SBATCH --cpus-per-task); the task's stage uses them all (pipeline/threads.py)
    slurm_cpus_per_task: int = setting(4, gt=0, le=MAX_WORKERS)
    slurm_mem: str = setting("16G", rule=rules.slurm_word("slurm_mem"))  # digits with an optional K, M, G or T
    # GPUs per array task for the stages whose registry record says they use one (features, asr, train)
    slurm_gpus: int = setting(0, ge=0)
    slurm_array_parallelism: int | None = setting(None, gt=0)  # at most this many array tasks at once
    # the cluster's MaxArraySize; None: `submit` reads it from `scontrol show config` (Slurm's default 1001,
    # indexes 0..1000, where it cannot): a longer array is submitted as several jobs, each task's index offset
    slurm_max_array_size: int | None = setting(None, ge=1, le=4_000_001)
    # nodes of a `submit train` job; more than one trains data-parallel over all of them (srun starts one
    # torchrun per node, joined by a c10d rendezvous), slurm_gpus processes per node
    slurm_nodes: int = setting(1, ge=1, le=4096)
    slurm_rdzv_port: int = setting(29400, ge=1024, le=65535)  # the rendezvous port on the job's first node
    # extra lines, verbatim: each must start with "#SBATCH " and hold no control character
    slurm_extra: list[str] = setting(factory=list, rule=rules.sbatch_lines)
    # Ray: resources of one task, by role: num_cpus, num_gpus, memory_gb (a scheduling hint). The roles and
    # their defaults are the stages' (registry `ray_roles`); a mapping in the YAML overrides them key by key
    ray_resources: dict[str, dict[str, float]] = setting(factory=registry.ray_resources, rule=_ray_roles)


@dataclass
class EvalConfig:
    # the sentence zero-shot scores beside each segment's visual words: its two [MASK] are the verb and the noun
    zero_shot_template: str = setting(
        "now let me show you how to [MASK] the [MASK]",
        rule=rules.masks(2, "two [MASK] (verb, noun)", "zero_shot_template"),
    )
    # more such sentences: each candidate's probability at a slot is the mean over these and
    # zero_shot_template (prompt ensembling), so the answer leans less on one wording
    zero_shot_ensemble: list[str] = setting(
        factory=list, rule=rules.masks(2, "two [MASK] (verb, noun)", "zero_shot_ensemble", each=True)
    )
    # each template's scores less its scores with no visual words (`[CLS] template [>] [SEP]`), before the
    # ensemble's mean: the template's own lean towards a word is taken out, so the video decides (contextual
    # calibration with a content-free input, Zhao et al. 2021). Not the paper's; off
    zero_shot_calibrate: bool = False
    # the text beside a segment's visual words whose outputs make its VideoBERT features (the probe, captioning)
    features_template: str = setting(
        "now let's [MASK] the [MASK] to the [MASK], and then [MASK] the [MASK].",
        rule=rules.masks(0, "a [MASK]", "features_template"),
    )
    verbs: str | None = None  # text file, one verb per line
    nouns: str | None = None  # text file, one noun per line
    # CSV/Parquet: video_id, segment_index, verb, noun; a segment may have several verbs and nouns (words
    # separated by | in a cell, a list column, or several rows): a prediction is right if it is any of them
    labels: str | None = None
    # zero-shot rankings reported, the first being the headline: open (every word of the vocabulary competes,
    # as in the paper) and closed (only the eval.verbs / eval.nouns words)
    rankings: list[str] = setting(
        factory=lambda: ["open", "closed"],
        each=True,
        choices=("open", "closed"),
        rule=rules.named_once("rankings", "ranking", ("open", "closed")),
    )
    # the segments evaluated: align (the align shards' segments) or a YouCook II annotations JSON (segments
    # at its annotated times, their visual tokens from the quantize stage)
    segments: str = setting("align", rule=rules.segments_source)
    subsets: list[str] = field(default_factory=lambda: ["validation"])  # annotations: the subsets evaluated
    # youcook2-labels: the most frequent verb and noun lemmas of these subsets' captions (the paper: 45
    # verbs and 100 nouns from the validation captions)
    list_verbs: int = setting(45, gt=0)
    # nouns listed, as list_verbs verbs
    list_nouns: int = setting(100, gt=0)
    # the annotations' subsets whose captions the lists are counted in
    list_subsets: list[str] = field(default_factory=lambda: ["validation"])
    # linear probe (the paper's supervised S3D row): trained on probe_train_subsets' segments (annotations),
    # or on the videos not held out (align segments: probe_test_share of the videos, drawn by probe_seed)
    probe_train_subsets: list[str] = field(default_factory=lambda: ["training"])
    # align segments: the share of videos the probe is tested on
    probe_test_share: float = setting(0.2, gt=0, lt=1)
    probe_c: float = setting(1.0, gt=0)  # inverse L2 regularisation of the logistic regression
    # the draw of the probe's test videos
    probe_seed: int = setting(0, **SEED)
    # segments per forward pass of the evaluations
    batch_size: int = setting(32, gt=0)
    # visual-token positions left for the video a sentence predicts (predict-video)
    predict_video_tokens: int = setting(8, gt=0)
    # all | validation: the segments of the checkpoint's held-out videos only (train.validation_videos) |
    # test: those of its test videos (train.splits)
    videos: str = setting("all", choices=("all", "validation", "test"))
    # eval forecast: the most frequent non-empty visual words forecast, and the horizons in clips at which
    # their top-3 later visual words are read
    forecast_words: int = setting(8, gt=0)
    # horizons, in clips, at which forecast reads each word's top-3 later visual words
    forecast_steps: list[int] = setting(factory=lambda: [1, 2, 4], each=True, ge=1, le=510, rule=rules.some_horizon)


CAPTION_ROWS = ("s3d", "videobert", "videobert_s3d")
YOUCOOK2_SUBSETS = ("training", "validation", "testing")


@dataclass
class CaptionConfig:
    # eval captioning (videobert/eval/captioning.py): the paper's YouCook II transfer setup (Zhou et al. 2018's
    # encoder-decoder); the defaults are the paper's values
    rows: list[str] = setting(
        factory=lambda: list(CAPTION_ROWS),
        each=True,
        choices=CAPTION_ROWS,
        rule=rules.named_once("rows", "row", CAPTION_ROWS),
    )
    # the YouCook II subsets the captioner is trained on
    train_subsets: list[str] = setting(
        factory=lambda: ["training"], each=True, choices=YOUCOOK2_SUBSETS, rule=rules.some_subset("train_subsets")
    )
    # the subsets it is scored on, apart from the training ones
    test_subsets: list[str] = setting(
        factory=lambda: ["validation"], each=True, choices=YOUCOOK2_SUBSETS, rule=rules.subsets_apart
    )
    layers: int = setting(2, gt=0)  # encoder and decoder layers each
    hidden: int = setting(128, gt=0)  # a multiple of heads
    # attention heads
    heads: int = setting(8, gt=0, rule=rules.multiple_of("hidden", "heads"))
    # feed-forward width of each layer
    feedforward: int = setting(512, gt=0)
    # dropout of encoder and decoder
    dropout: float = setting(0.4, ge=0, lt=1)
    lr: float = setting(1.0e-3, gt=0)  # Adam, decayed linearly to 0 over steps
    # captions per step
    batch_size: int = setting(128, gt=0)
    # training steps
    steps: int = setting(40000, gt=0)
    max_words: int = setting(20, gt=0)  # captions are cut there for training; decoding stops there
    min_word_count: int = setting(1, gt=0)  # rarer training-caption words become <unk>
    # the captioner's initialisation and data order
    seed: int = setting(0, **SEED)
    num_threads: int = count()  # torch threads; 0 = train.num_threads / the task's CPUs
    # >= 2 with a cv_grid: each row's hyper-parameters chosen by cv_folds-fold cross-validation on the
    # training segments (folds of whole videos), by cv_metric; 0 = the values above (the paper: 5 folds)
    cv_folds: int = setting(0, rule=rules.folds)
    # key (layers, hidden, dropout, lr, ...) -> values
    cv_grid: dict[str, list[float]] = setting(factory=dict, rule=rules.grid)
    # the metric the cross-validation chooses by
    cv_metric: str = setting("CIDEr", choices=("BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr"))


class Sections:
    """What every Config is: its sections as one dict, and the canonical JSON and hash of some of them."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def section_json(self, *sections: str) -> str:
        """Canonical JSON of some sections: recorded in outputs and hashed into their config hash."""
        full = self.to_dict()
        return json.dumps({name: full[name] for name in sections}, sort_keys=True, separators=(",", ":"))

    def section_hash(self, *sections: str) -> str:
        return hashlib.sha256(self.section_json(*sections).encode()).hexdigest()[:16]


# the sections no single stage owns: first the values of the whole run, last those of eval and captioning
LEADING_SECTIONS = (
    # random S3D weights, the ASR backends' sampling
    ("seed", int, setting(0, **SEED)),
    # the input videos' licence, as the dataset card's `license:` (an identifier: cc-by-4.0, apache-2.0,
    # other, ...); shapes no output, so changing it redoes nothing
    ("license", str, setting("unknown", rule=rules.licence)),
    ("executor", ExecutorConfig, field(default_factory=ExecutorConfig)),
)
TRAILING_SECTIONS = (
    ("eval", EvalConfig, field(default_factory=EvalConfig)),
    ("caption", CaptionConfig, field(default_factory=CaptionConfig)),
)
