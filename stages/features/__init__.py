"""features: one 1024-d S3D vector per clip, and the decode stage's outputs from the same read. The network is
s3d/ (its weights and their identity, the encoder on its device); the run code run.py; the check of the
weights before the first shard preflight.py (it loads S3D)."""

from __future__ import annotations

from dataclasses import dataclass

import schemas
from pipeline import config_rules as rules
from pipeline.config_fields import ConfigError, count, setting
from pipeline.contract import Stage


def s3d_weights(f, prefix: str) -> None:
    if f.weights not in ("kinetics400", "random") and not f.weights.endswith((".pth", ".pt")):
        raise ConfigError(
            f"config error: {prefix}weights must be kinetics400, random or a .pth/.pt path (got {f.weights!r})"
        )


@dataclass
class FeaturesConfig:
    # kinetics400 (torchvision download) | random | /path/to/s3d.pth
    weights: str = setting("kinetics400", rule=s3d_weights)
    device: str = setting("auto", rule=rules.device_of_model)  # auto | cpu | cuda | cuda:N
    # auto (bf16 autocast) | float32 | bfloat16 | float16
    precision: str = setting("auto", choices=("auto", "float32", "bfloat16", "float16"))
    batch_size: int = setting(0, ge=0, le=1024)  # clips per forward pass; 0 = 8 on a CPU, 128 on a GPU
    # processes decoding clips; 0 = in the main one; null = 1 on a CPU, every core but one feeding a GPU
    decode_workers: int | None = count(None)
    num_threads: int = count()  # torch intra-op threads; 0 = the task's CPUs (pipeline/threads.py)
    # Ray: > 0 runs this many S3D model actors (one GPU each by default) fed by CPU decode tasks, so a GPU never
    # waits on decoding; 0 runs each features shard whole in one task
    ray_models: int = setting(0, ge=0)


STAGE = Stage(
    "features",
    "one 1024-d S3D vector per clip, and the decode stage's outputs from the same read",
    reads=("manifest",),
    config_sections=("decode", "features"),
    per_shard=True,
    writes="features/part-*.parquet, and decode's decode/ and videos/ parts",
    tables={"": schemas.FEATURES},
    run="stages.features.run:run_shard",
    identities="stages.features.run:identities",
    also_makes=("decode", "shots"),
    split="stages.features.run:SPLIT",
    operational_keys=(
        "features.device",
        "features.batch_size",
        "features.decode_workers",
        "features.num_threads",
        "features.ray_models",
    ),
    # one shard at a time already uses every core (decode workers + torch threads)
    max_parallel_shards=1,
    section="features",
    section_type="stages.features:FeaturesConfig",
    uses_gpu=True,
    device_keys=("features.device", "decode.device"),
    # features_decode / features_model: the split's producer tasks and encoder actors (features.ray_models)
    ray_roles={
        "features": {"num_cpus": 2},
        "features_decode": {"num_cpus": 1},
        "features_model": {"num_cpus": 1, "num_gpus": 1},
    },
    preflight="stages.features.preflight:check_features",
    checks={"": ("pipeline.table_checks:clips_in_order",)},
    card_configs={"": "features"},
    version=3,
)  # 2: the clips of the chosen video stream (see decode); 3: made with decode's version 3
