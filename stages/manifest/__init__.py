"""manifest: the input videos listed and assigned to shards (a whole-collection stage: one run). Its listing and
writing code is pipeline/engine/manifest.py, beside the reading every stage and the trainer use."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config_fields import setting
from pipeline.contract import Stage


@dataclass
class ShardsConfig:
    videos_per_shard: int = setting(64, gt=0, le=1_000_000)   # manifest videos per output shard (one file each)


STAGE = Stage("manifest", "list the input videos and assign them to shards", reads=(),
              config_sections=("shards",), per_shard=False, writes="manifest/manifest.parquet",
              section="shards", section_type="stages.manifest:ShardsConfig")
