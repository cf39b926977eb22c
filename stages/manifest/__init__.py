"""manifest: the input videos listed and assigned to shards (a whole-collection stage: one run). Its listing and
writing code is pipeline/engine/manifest.py, beside the reading every stage and the trainer use."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config_fields import setting
from pipeline.contract import Option, Stage


@dataclass
class ShardsConfig:
    videos_per_shard: int = setting(64, gt=0, le=1_000_000)  # manifest videos per output shard (one file each)


STAGE = Stage(
    "manifest",
    "list the input videos and assign them to shards",
    reads=(),
    config_sections=("shards",),
    per_shard=False,
    writes="manifest/manifest.parquet",
    section="shards",
    section_type="stages.manifest:ShardsConfig",
    run="stages.manifest.run:run_collection",
    options=(
        Option(
            "--input",
            "a folder (searched recursively) or a .txt/.csv/.parquet list of videos, "
            "local or on object storage (s3://, gs://, hf://)",
            takes_value=True,
            required=True,
        ),
        Option("--force", "assign every video a shard anew (default: listed videos keep theirs)"),
        Option(
            "--allow-removal",
            "go on when the input no longer lists videos with finished "
            "outputs (asked on a terminal, refused off one); their outputs "
            "move to DIR/_state/replaced/",
        ),
    ),
)
