"""The stages, in run order: one record each, the one place a stage is described. The runner, the CLI, the
config (a stage's own section and its Ray roles), the executors (Ray resources, Slurm GPUs), the device
checks, lineage, status, validate and the dataset card read it; none of them lists the stages.

A stage is either per shard (a function of (config, one manifest shard) to one output file per table)
or whole-collection (one run: the manifest, the k-means codebook, training). Code and config sections are
named by "module:name" and imported only when used, so reading the registry stays cheap; a record made
outside this file (a test's stage) may give them as objects instead. `register` adds a stage for a while."""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from typing import Callable, Iterator

import schemas


class PreflightError(ValueError):
    """What a stage needs is not there (a model, weights, a resource no node has): one line naming the config
    value and the fix. Raised by a stage's preflight check and by an executor before the first task."""


@dataclass(frozen=True)
class Option:
    """A command-line option of a whole-collection stage: `--name`, a flag or (takes_value) one value."""
    flag: str
    help: str
    takes_value: bool = False
    required: bool = False

    @property
    def name(self) -> str:   # argparse's attribute name
        return self.flag.lstrip("-").replace("-", "_")


@dataclass
class CollectionRun:
    """What a whole-collection stage's run is given: the config, the work dir, its own options by name, and
    from the command: an executor (a stage with `workers`) and a way to ask the person at the terminal
    (None off a terminal, where asking is refusing)."""
    cfg: object
    work_dir: object
    options: dict
    quiet: bool = False
    executor: object = None
    confirm: Callable[[str], bool] | None = None


@dataclass
class CollectionResult:
    """What it did: one phrase for `run`'s table, the lines the command prints, and whether it made
    outputs (else the config it ran with is not remembered as theirs)."""
    outcome: str
    lines: list[str] = field(default_factory=list)
    made_outputs: bool = True


@dataclass(frozen=True)
class Stage:
    name: str
    summary: str                         # what it does, for --help
    reads: tuple[str, ...]               # the stages whose outputs it reads
    config_sections: tuple[str, ...]     # the config sections whose values shape its outputs
    per_shard: bool                      # True: runs once per manifest shard; False: once per collection
    writes: str                          # what it writes, for --help
    # per-shard stages: table name -> schema; "" is the stage's main table
    tables: dict[str, schemas.Schema] = field(default_factory=dict)
    run: str | Callable = ""             # "module:function": run_shard(ctx) for per-shard stages
    identities: str | Callable = ""      # "module:function": (cfg, videos) -> {name: identity} of what
                                         # else shapes the output (model weights, tokenizer, transcripts)
    # keys of config_sections that do not change what is made (how long to train, where, how often to
    # log): a change of them does not make an output stale
    operational_keys: tuple[str, ...] = ()
    max_parallel_shards: int = 0         # > 0: at most this many shards at once on one machine
    # the config section the stage owns: its name (a top-level key of the YAML) and its dataclass
    # ("module:Class"), whose fields carry their bounds and rules (pipeline/config_fields.py)
    section: str = ""
    section_type: str | type = ""
    # GPU use: a Slurm array task of the stage gets executor.slurm_gpus GPUs; `device_keys` are the config
    # keys naming the devices its models or decoders run on, checked against this machine's GPUs at load
    uses_gpu: bool = False
    device_keys: tuple[str, ...] = ()
    # Ray: role -> the default resources of one task (num_cpus, num_gpus, memory_gb); the config's
    # executor.ray_resources overrides them key by key and names no other role
    ray_roles: dict[str, dict[str, float]] = field(default_factory=dict)
    # "module:function": (cfg, speech_needed) -> None, what the stage needs before its first shard
    # (pipeline.preflight.PreflightError naming the config value and the fix)
    preflight: str | Callable = ""
    # validate: table -> "module:function"s, each (reports.validate.Part) -> None raising
    # reports.validate.Invalid: the values and invariants of one part beyond its schema
    checks: dict[str, tuple[str | Callable, ...]] = field(default_factory=dict)
    # the dataset card: table -> the name of its config (a data folder `load_dataset` finds); "default"
    # is the training shards
    card_configs: dict[str, str] = field(default_factory=dict)
    # per-shard stages whose outputs this stage makes in the same pass (their tables come back in its
    # ShardResult.also): the runner writes them as those stages' shards, with their own records
    also_makes: tuple[str, ...] = ()
    # "module:attribute": the stage's pipeline.engine.split.Split (a CPU producer and a device encoder), which
    # executors may run apart (the Ray executor: producer tasks feeding encoder actors)
    split: str = ""
    # bump when a change of the stage's code alters what it makes from the same inputs and config: its
    # outputs made before become stale (recorded from 2 on, so a bump redoes this stage and what follows)
    version: int = 1
    # whole-collection stages: `run` is "module:function" (CollectionRun) -> CollectionResult; `options` its
    # own command-line options; `workers`, for a stage that fans its work out over an executor (kmeans: its
    # subtrees), what --workers counts (it then takes --executor, --workers and --ray-address)
    options: tuple[Option, ...] = ()
    workers: str = ""
    # `run` and `submit pipeline` include the stage (train: False; `submit pipeline --with-train` adds it)
    in_run: bool = True
    # runs as one process per GPU under torchrun, on executor.slurm_nodes nodes in a batch job (train)
    distributed: bool = False
    # what a batch job adds to the stage's command so that a requeued job continues (train: --resume)
    batch_arguments: tuple[str, ...] = ()

    def function(self, which: str = "run") -> Callable:
        """The code (or class) a "module:name" field names: a function, the `split` record or the
        `section_type` dataclass; a field given as an object is that object."""
        return resolve(getattr(self, which))


def resolve(named: str | Callable) -> Callable:
    """The object "module:name" names; an object is itself."""
    if not isinstance(named, str):
        return named
    module, name = named.split(":")
    return getattr(importlib.import_module(module), name)


CLIP_CHECKS = ("reports.validate:clips_in_order",)   # clip rows: times in order, each clip once

STAGES: tuple[Stage, ...] = (
    Stage("manifest", "list the input videos and assign them to shards", reads=(),
          config_sections=("shards",), per_shard=False, writes="manifest/manifest.parquet",
          section="shards", section_type="pipeline.config:ShardsConfig", run="stages.manifest_run:run",
          options=(Option("--input", "a folder (searched recursively) or a .txt/.csv/.parquet list of videos, local "
                                     "or on object storage (s3://, gs://, hf://)", takes_value=True, required=True),
                   Option("--force", "assign every video a shard anew (default: listed videos keep theirs)"),
                   Option("--allow-removal", "go on when the input no longer lists videos with finished outputs "
                                             "(asked on a terminal, refused off one); their outputs move to "
                                             "DIR/_state/replaced/"))),
    # made by the features stage's pass (one read of each video); run alone, the same files on CPUs only
    Stage("decode", "the clip index (20 fps, 30-frame clips), a thumbnail per clip, per-video metadata "
          "(the features stage makes them in its pass; alone: without S3D)",
          reads=("manifest",), config_sections=("decode",), per_shard=True,
          writes="decode/part-*.parquet (clips), videos (per video)",
          tables={"": schemas.DECODE_CLIPS, "videos": schemas.DECODE_VIDEOS}, run="stages.decode:run_shard",
          section="decode", section_type="pipeline.config:DecodeConfig", device_keys=("decode.device",),
          ray_roles={"decode": {"num_cpus": 1}}, checks={"": CLIP_CHECKS},
          card_configs={"": "clips", "videos": "videos"},
          version=2),   # 2: the video stream decoded is the default one, else the longest (not the first)
    Stage("features", "one 1024-d S3D vector per clip, and the decode stage's outputs from the same read",
          reads=("manifest",), config_sections=("decode", "features"), per_shard=True,
          writes="features/part-*.parquet, and decode's decode/ and videos/ parts",
          tables={"": schemas.FEATURES}, run="stages.features:run_shard",
          identities="stages.features:identities", also_makes=("decode",), split="stages.features:SPLIT",
          operational_keys=("features.device", "features.batch_size", "features.decode_workers",
                            "features.num_threads"),
          # one shard at a time already uses every core (decode workers + torch threads)
          max_parallel_shards=1, section="features", section_type="pipeline.config:FeaturesConfig",
          uses_gpu=True, device_keys=("features.device", "decode.device"),
          # features_decode / features_model: the split's producer tasks and encoder actors
          # (executor.ray_feature_models)
          ray_roles={"features": {"num_cpus": 2}, "features_decode": {"num_cpus": 1},
                     "features_model": {"num_cpus": 1, "num_gpus": 1}},
          preflight="pipeline.preflight:check_features", checks={"": CLIP_CHECKS},
          card_configs={"": "features"},
          version=2),   # 2: the clips of the chosen video stream (see decode)
    Stage("kmeans", "fit the visual-word codebook (hierarchical k-means) on a sample of the features",
          reads=("features",), config_sections=("kmeans",), per_shard=False,
          writes="kmeans/codebook.safetensors + codebook.json", section="kmeans",
          section_type="pipeline.config:KmeansConfig", ray_roles={"kmeans": {"num_cpus": 1}},
          run="stages.kmeans_run:run", options=(Option("--force", "refit even when the codebook is current"),),
          workers="processes fitting subtrees (default: kmeans.workers)"),
    Stage("quantize", "each clip's visual word (the codebook leaf its feature descends to)",
          reads=("features", "kmeans"), config_sections=("kmeans",), per_shard=True,
          writes="quantize/part-*.parquet", tables={"": schemas.QUANTIZE}, run="stages.quantize:run_shard",
          ray_roles={"quantize": {"num_cpus": 1}},
          checks={"": CLIP_CHECKS + ("reports.validate:features_tokenised_once",)},
          card_configs={"": "quantize"}),
    Stage("asr", "speech as sentences with word times (Whisper), or imported transcripts", reads=("manifest",),
          config_sections=("asr",), per_shard=True, writes="asr/part-*.parquet", tables={"": schemas.ASR},
          run="stages.asr:run_shard", identities="stages.asr:identities",
          max_parallel_shards=1,   # the backend already uses every core it is given
          section="asr", section_type="pipeline.config:AsrConfig", uses_gpu=True, device_keys=("asr.device",),
          ray_roles={"asr": {"num_cpus": 2}}, preflight="pipeline.preflight:check_asr",
          checks={"": ("reports.validate:speech_in_order",)}, card_configs={"": "asr"},
          version=2),   # 2: a run-on's split prefers a boundary Whisper capitalised (speech/sentences.py)
    Stage("align", "the training shards: each sentence with the visual words of its span",
          reads=("quantize", "asr"), config_sections=("align",), per_shard=True, writes="align/part-*.parquet",
          tables={"": schemas.ALIGN}, run="stages.align:run_shard", identities="stages.align:identities",
          section="align", section_type="pipeline.config:AlignConfig", ray_roles={"align": {"num_cpus": 1}},
          preflight="pipeline.preflight:check_align", checks={"": ("reports.validate:segments",)},
          card_configs={"": "default"}),
    Stage("train", "pre-train the bundled VideoBERT on the align shards", reads=("align", "kmeans"),
          config_sections=("train",), per_shard=False, writes="train/checkpoints, train/log.jsonl",
          identities="videobert.train:identities", section="train", section_type="pipeline.config:TrainConfig",
          run="stages.train_run:run", in_run=False, distributed=True, batch_arguments=("--resume",),
          options=(Option("--resume", "continue from the latest checkpoint"),
                   Option("--restart", "move the existing checkpoints aside and train anew")),
          uses_gpu=True, device_keys=("train.device",), preflight="pipeline.preflight:check_train",
          operational_keys=("train.max_steps", "train.steps_per_run", "train.log_every", "train.checkpoint_every",
                            "train.keep_checkpoints", "train.num_threads", "train.device", "train.precision")),
)


def _index() -> None:
    """The lookups below, from STAGES."""
    global BY_NAME, NAMES, SHARD_STAGES
    BY_NAME = {stage.name: stage for stage in STAGES}
    NAMES = tuple(BY_NAME)
    SHARD_STAGES = tuple(stage.name for stage in STAGES if stage.per_shard)


BY_NAME: dict[str, Stage] = {}
NAMES: tuple[str, ...] = ()
SHARD_STAGES: tuple[str, ...] = ()
_index()


def stage(name: str) -> Stage:
    if name not in BY_NAME:
        raise KeyError(f"no stage {name!r}; the stages are {', '.join(NAMES)}")
    return BY_NAME[name]


def run_stages(*, with_optional: bool = False) -> tuple[Stage, ...]:
    """The stages a whole run runs, in order: each one not made in another's pass (decode: in features'),
    those with in_run=False (train) only `with_optional`."""
    made_by_others = {name for spec in STAGES for name in spec.also_makes}
    return tuple(spec for spec in STAGES
                 if spec.name not in made_by_others and (spec.in_run or with_optional))


def ray_resources() -> dict[str, dict[str, float]]:
    """The Ray roles of every stage with their default resources: executor.ray_resources's defaults."""
    return {role: dict(resources) for spec in STAGES for role, resources in spec.ray_roles.items()}


@contextlib.contextmanager
def register(*stages: Stage) -> Iterator[None]:
    """The registry with `stages` added after the others, for the `with` block: a stage defined outside
    this file (a test's) runs through the runner, status, validate and lineage like any other. In this
    process only: a spawned worker (more than one local worker, Ray, Slurm) knows only the records above."""
    global STAGES
    for new in stages:
        if new.name in BY_NAME:
            raise ValueError(f"a stage named {new.name!r} exists already")
    before = STAGES
    STAGES = before + tuple(stages)
    _index()
    try:
        yield
    finally:
        STAGES = before
        _index()
