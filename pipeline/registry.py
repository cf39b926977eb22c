"""The stages, in run order: one record each, read by the runner, the CLI, the executors, lineage, status
and validate. Nothing else lists the stages or what they read and write.

A stage is either per shard (a function of (config, one manifest shard) to one output file per table)
or whole-collection (one run: the manifest, the k-means codebook, training). Code is named by
"module:function" and imported only when the stage runs, so reading the registry stays cheap."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

import schemas


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
    run: str = ""                        # "module:function": run_shard(ctx) for per-shard stages
    identities: str = ""                 # "module:function": (cfg, videos) -> {name: identity} of what
                                         # else shapes the output (model weights, tokenizer, transcripts)
    # keys of config_sections that do not change what is made (how long to train, where, how often to
    # log): a change of them does not make an output stale
    operational_keys: tuple[str, ...] = ()
    max_parallel_shards: int = 0         # > 0: at most this many shards at once on one machine
    uses_gpu: bool = False
    # per-shard stages whose outputs this stage makes in the same pass (their tables come back in its
    # ShardResult.also): the runner writes them as those stages' shards, with their own records
    also_makes: tuple[str, ...] = ()
    # "module:attribute": the stage's pipeline.engine.split.Split (a CPU producer and a device encoder), which
    # executors may run apart (the Ray executor: producer tasks feeding encoder actors)
    split: str = ""

    def function(self, which: str = "run") -> Callable:
        """The code a "module:name" field names (a function, or for `split` the Split record)."""
        module, name = getattr(self, which).split(":")
        return getattr(importlib.import_module(module), name)


STAGES: tuple[Stage, ...] = (
    Stage("manifest", "list the input videos and assign them to shards", reads=(),
          config_sections=("shards",), per_shard=False, writes="manifest/manifest.parquet"),
    # made by the features stage's pass (one read of each video); run alone, the same files on CPUs only
    Stage("decode", "the clip index (20 fps, 30-frame clips), a thumbnail per clip, per-video metadata "
          "(the features stage makes them in its pass; alone: without S3D)",
          reads=("manifest",), config_sections=("decode",), per_shard=True,
          writes="decode/part-*.parquet (clips), videos (per video)",
          tables={"": schemas.DECODE_CLIPS, "videos": schemas.DECODE_VIDEOS}, run="stages.decode:run_shard"),
    Stage("features", "one 1024-d S3D vector per clip, and the decode stage's outputs from the same read",
          reads=("manifest",), config_sections=("decode", "features"), per_shard=True,
          writes="features/part-*.parquet, and decode's decode/ and videos/ parts",
          tables={"": schemas.FEATURES}, run="stages.features:run_shard",
          identities="stages.features:identities", also_makes=("decode",), split="stages.features:SPLIT",
          operational_keys=("features.device", "features.batch_size", "features.decode_workers",
                            "features.num_threads"),
          # one shard at a time already uses every core (decode workers + torch threads)
          max_parallel_shards=1, uses_gpu=True),
    Stage("kmeans", "fit the visual-word codebook (hierarchical k-means) on a sample of the features",
          reads=("features",), config_sections=("kmeans",), per_shard=False,
          writes="kmeans/codebook.safetensors + codebook.json"),
    Stage("quantize", "each clip's visual word (the codebook leaf its feature descends to)",
          reads=("features", "kmeans"), config_sections=("kmeans",), per_shard=True,
          writes="quantize/part-*.parquet", tables={"": schemas.QUANTIZE}, run="stages.quantize:run_shard"),
    Stage("asr", "speech as sentences with word times (Whisper), or imported transcripts", reads=("manifest",),
          config_sections=("asr",), per_shard=True, writes="asr/part-*.parquet", tables={"": schemas.ASR},
          run="stages.asr:run_shard", identities="stages.asr:identities",
          max_parallel_shards=1, uses_gpu=True),   # the backend already uses every core it is given
    Stage("align", "the training shards: each sentence with the visual words of its span",
          reads=("quantize", "asr"), config_sections=("align",), per_shard=True, writes="align/part-*.parquet",
          tables={"": schemas.ALIGN}, run="stages.align:run_shard", identities="stages.align:identities"),
    Stage("train", "pre-train the bundled VideoBERT on the align shards", reads=("align", "kmeans"),
          config_sections=("train",), per_shard=False, writes="train/checkpoints, train/log.jsonl",
          identities="videobert.train:identities", uses_gpu=True,
          operational_keys=("train.max_steps", "train.steps_per_run", "train.log_every", "train.checkpoint_every",
                            "train.keep_checkpoints", "train.num_threads", "train.device", "train.precision")),
)

BY_NAME: dict[str, Stage] = {stage.name: stage for stage in STAGES}
NAMES: tuple[str, ...] = tuple(BY_NAME)
SHARD_STAGES: tuple[str, ...] = tuple(stage.name for stage in STAGES if stage.per_shard)


def stage(name: str) -> Stage:
    if name not in BY_NAME:
        raise KeyError(f"no stage {name!r}; the stages are {', '.join(NAMES)}")
    return BY_NAME[name]
