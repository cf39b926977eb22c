"""Executors decide where a shard runs, and nothing else: the stage code is the same under all of them.

- local: the shards in a process pool on this machine (pipeline/executors/local.py);
- slurm: this array task's shards (`--shard/--num-shards`, defaulting to SLURM_ARRAY_TASK_ID/COUNT), run locally;
- ray:   shards as Ray tasks on a cluster (pipeline/executors/ray.py).

Every executor also offers `map(fn, items)` for a global stage's parallel parts (k-means subtrees)."""

from __future__ import annotations

import os

from pipeline.config import Config
from pipeline.executors.local import LocalExecutor


def shard_problem(shard: int | None, num_shards: int | None) -> str | None:
    """What is wrong with a --shard/--num-shards pair (both None: every shard), in one line; None if nothing."""
    if (shard is None) != (num_shards is None):
        return "--shard and --num-shards go together"
    if shard is not None and not 0 <= shard < num_shards:
        return f"--shard must be in 0..{num_shards - 1} for --num-shards {num_shards} (got {shard})"
    return None


def env_int(name: str, default: int | None = None, minimum: int = 0) -> int | None:
    """An integer the scheduler (Slurm, torchrun) sets in the environment; ConfigError (exit 2) naming the
    variable when it is not one: a job script that exports a wrong value must not run the wrong shards."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip()) if len(raw) <= 20 else None
    except ValueError:
        value = None
    if value is None or value < minimum:
        from pipeline.config_fields import ConfigError, shown_value

        raise ConfigError(
            f"environment error: {name} must be an integer >= {minimum} (got {shown_value(raw)}): "
            f"fix or unset it in the job's environment"
        )
    return value


def select_shards(all_shards: list[int], shard: int | None, num_shards: int | None) -> list[int]:
    """Task `shard` of `num_shards` takes manifest shards s with s % num_shards == shard."""
    if shard is None and num_shards is None:
        env_id, env_count = env_int("SLURM_ARRAY_TASK_ID"), env_int("SLURM_ARRAY_TASK_COUNT", minimum=1)
        if env_id is not None and env_count is not None:
            if env_id >= env_count:
                from pipeline.config_fields import ConfigError

                raise ConfigError(
                    f"environment error: SLURM_ARRAY_TASK_ID={env_id} must be below SLURM_ARRAY_TASK_COUNT={env_count}"
                )
            shard, num_shards = env_id, env_count
    problem = shard_problem(shard, num_shards)
    if problem:
        raise ValueError(problem)
    if shard is None:
        return list(all_shards)
    return [s for s in all_shards if s % num_shards == shard]


def make_executor(cfg: Config, kind: str | None = None, workers: int | None = None, ray_address: str | None = None):
    kind = kind or cfg.executor.kind
    if kind == "ray":
        from pipeline.executors.ray import RayExecutor  # imports Ray: only when chosen

        return RayExecutor(cfg, address=ray_address or cfg.executor.ray_address)
    # under a Slurm array each task runs its own shards locally
    return LocalExecutor(cfg, workers)
