"""The local executor: a stage's shards in a process pool on this machine (or in-process for one worker).
Under a Slurm array each task runs its own shards with it (pipeline/executors/slurm.py makes the arrays).
It also offers `map(fn, items)` for a global stage's parallel parts (k-means subtrees), as the Ray
executor does."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from pipeline import registry, threads
from pipeline.config import Config
from pipeline.engine import runner
from pipeline.progress import Progress


def default_workers(cfg: Config) -> int:
    """executor.workers, or one per CPU the task was given (pipeline/threads.py), not per core of the machine."""
    return cfg.executor.workers or threads.allocated_cpus()[0]


def die_with_parent(parent_pid: int) -> None:
    """In a worker process: end when the parent ends, however it ends (kill -9 included), instead of living
    on with its share of the machine (Linux: PR_SET_PDEATHSIG; elsewhere a thread watching the parent)."""
    import signal
    import threading

    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGKILL, 0, 0, 0) == 0:  # 1: PR_SET_PDEATHSIG
            if os.getppid() != parent_pid:  # the parent ended before the call
                os._exit(1)
            return
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        import time

        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _worker_start(parent_pid: int, workers: int) -> None:
    """In a pool worker: Ctrl-C is the parent's to handle (it ends the workers, without their tracebacks),
    the worker ends with its parent, and the workers share the allocation's CPUs, so each one's default
    thread count is its share."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent_pid)
    threads.share_among(workers)


def _spawn_pool(workers: int) -> ProcessPoolExecutor:
    # spawn, not fork: torch, faiss and FFmpeg keep threads that a forked child must not inherit
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_start,
        initargs=(os.getpid(), workers),
    )


class LocalExecutor:
    def __init__(self, cfg: Config, workers: int | None = None):
        self.cfg = cfg
        self.workers = workers or default_workers(cfg)

    def run_shards(
        self, work_dir: Path, stage: str, shards: list[int], *, force: bool = False, quiet: bool = False
    ) -> list[dict]:
        limit = registry.stage(stage).max_parallel_shards or self.workers
        workers = min(self.workers, limit, max(len(shards), 1))
        # the whole stage's progress is counted here, in the parent: pool workers run quiet (their bars
        # would overwrite each other), an in-process shard also shows its own bar of videos
        with Progress(total=len(shards), unit="shards", desc=stage, quiet=quiet) as progress:

            def done(stats: dict) -> None:
                if stats.get("failed") or stats.get("blocked"):
                    progress.fail(1)  # a crashed shard is never counted as done
                    return
                ran = not stats.get("skipped")
                progress.update(
                    1, videos=stats.get("videos", 0) if ran else 0, clips=stats.get("clips", 0) if ran else 0
                )

            # the current shards are found here, without a pool: a rerun with nothing to do starts none
            by_shard = {} if force else runner.current_shards(self.cfg, work_dir, stage, shards, workers)
            for stats in by_shard.values():
                done(stats)
            todo = [shard_index for shard_index in shards if shard_index not in by_shard]
            workers = min(workers, max(len(todo), 1))
            if workers <= 1:
                for shard_index in todo:
                    by_shard[shard_index] = runner.run_one_shard_safely(
                        self.cfg, work_dir, stage, shard_index, force=force, quiet=quiet
                    )
                    done(by_shard[shard_index])
                return [by_shard[shard_index] for shard_index in shards]
            with _spawn_pool(workers) as pool:
                futures = {
                    pool.submit(
                        runner.run_one_shard_safely, self.cfg, work_dir, stage, shard_index, force=force, quiet=True
                    ): shard_index
                    for shard_index in todo
                }
                for future in as_completed(futures):
                    by_shard[futures[future]] = future.result()
                    done(by_shard[futures[future]])
            return [by_shard[shard_index] for shard_index in shards]

    def map(self, fn: Callable, items: Iterable, role: str = "") -> list:
        """`[fn(item) for item in items]` in the pool (`role`, the Ray role of the parts, matters only on Ray)."""
        items = list(items)
        if self.workers <= 1 or len(items) <= 1:
            return [fn(item) for item in items]
        with _spawn_pool(min(self.workers, len(items))) as pool:
            return list(pool.map(fn, items))
