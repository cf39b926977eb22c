"""Put on PYTHONPATH of a Slurm job by tests/test_slurm_cluster.py: with VIDEOBERT_HOLD_DECODE=FILE set, the
decode stage runs its first shard, then waits before every later one until FILE exists. The requeue test
needs its task to be running, between shards, when it requeues it; decode alone takes a tenth of a second."""

import os

HOLD = os.environ.get("VIDEOBERT_HOLD_DECODE")
if HOLD:
    import time

    import stages.decode.run

    run_shard = stages.decode.run.run_shard

    def held_run_shard(ctx):
        if ctx.shard_index > 0:
            while not os.path.exists(HOLD):
                time.sleep(0.05)
        return run_shard(ctx)

    stages.decode.run.run_shard = held_run_shard
