"""shots: the boundary table of a shard. The boundaries come out of the visual pass (the features stage's,
or the decode stage's run alone: stages/decode/run.py runs the detector of stages/shots/detect.py on every
frame it decodes) and are written as this stage's outputs with this stage's completion record. Run alone
(`videobert shots`: its settings changed while the clips stay as they were), the stage reads every video
once more on CPUs, without S3D, and writes the boundaries only."""

from __future__ import annotations

from pipeline.contract import ShardContext, ShardResult
from stages.decode.run import read_videos
from stages.shots.detect import shard_result


def run_shard(ctx: ShardContext) -> ShardResult:
    *_, shot_rows = read_videos(ctx)
    return shard_result(shot_rows)
