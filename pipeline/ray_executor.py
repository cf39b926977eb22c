"""The Ray executor (`--executor ray [--ray-address auto]`): a stage's shards as Ray tasks on a cluster.

Every shard task runs `runner.run_one_shard`, the code the local executor runs, so the files are
byte-identical to a local run and just as atomic and idempotent. The work dir must be a folder that every
node sees at the same path (NFS, Lustre, a mounted bucket), and every node needs this package installed.

- Resources per task come from `executor.ray_resources` (per stage: num_cpus, num_gpus, memory_gb).
- A failed task is retried `executor.max_retries` times, whether it raised or its worker died. Each
  attempt's log lines and traceback are appended to DIR/_state/logs/<stage>/part-NNNNN.log; a shard that keeps
  failing comes back as {"failed": True, "error", "traceback" (the log's tail)} and the finished shards
  stay complete, so the run ends non-zero naming the failed shards and a rerun does only those.
- Progress across the cluster: shards done/total and clips/s, from the shards' completion stats.
- `map(fn, items)` runs a global stage's parts (k-means subtree fits) as Ray tasks.

features with `executor.ray_feature_models` > 0: decoding runs in CPU tasks that stream batches of clips
through the object store to a pool of S3D model actors (one GPU each by default), so a GPU never waits on
a decode and decoding scales over CPU nodes. The batches are cut exactly as the local stage's DataLoader
cuts them (the same clip streams, the same batch size), so the vectors are bit-identical to a local run."""

from __future__ import annotations

import collections
import itertools
import logging
import math
import os
import socket
import traceback
import warnings
from functools import partial
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from pipeline import runner, storage
from pipeline.config import Config
from pipeline.lineage import CorruptFile, InputNotReady, Lineage
from pipeline.progress import Progress
from pipeline.workdir import WorkDir

log = logging.getLogger("pipeline.ray")

LOG_TAIL_LINES = 30              # of a failed shard's log, in its failure report
MODEL_BATCHES_IN_FLIGHT = 4      # per features shard: batches sent to the model actors and not yet back
SHARDS_PER_MODEL = 2             # features shards decoding at once per model actor, at least
ATTEMPT_STARTED, ATTEMPT_FAILED = ": attempt on ", ": attempt failed"   # markers in the shard logs


def task_options(cfg: Config, role: str) -> dict:
    """Ray options for one task of `role` (a stage, or features_decode / features_model): the config's
    resources (merged over the built-in defaults key by key at load)."""
    resources = cfg.executor.ray_resources.get(role, {})
    options = {"num_cpus": resources.get("num_cpus", 1), "num_gpus": resources.get("num_gpus", 0)}
    if resources.get("memory_gb"):
        options["memory"] = int(resources["memory_gb"] * 2**30)
    return options


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _run_shard_task(cfg: Config, work_dir: Path, stage: str, shard_index: int, force: bool,
                    feature_models: list | None) -> dict:
    """One attempt at one shard, in a Ray worker. Its log lines and any traceback go to the shard's log."""
    path = WorkDir(work_dir).shard_log(stage, shard_index)
    # on object storage nothing appends: the attempt logs to a local file, added to the shard's log after
    written = storage.local_temporary(path.name) if storage.is_remote(path) else path
    written.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(written, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    previous_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        log.info("%s part %d%s%s (pid %d)", stage, shard_index, ATTEMPT_STARTED, socket.gethostname(), os.getpid())
        compute = partial(features_with_model_actors, models=feature_models) if feature_models else None
        stats = runner.run_one_shard(cfg, work_dir, stage, shard_index, force=force, quiet=True, compute=compute)
        log.info("%s part %d: done (%s)", stage, shard_index, "already current" if stats.get("skipped") else
                 f"{stats.get('seconds', 0):.1f} s")
        return stats
    except (InputNotReady, CorruptFile) as error:
        # not a failure to retry: an input is missing or stale until its own stage runs
        log.error("%s part %d: cannot run: %s", stage, shard_index, error)
        return {"stage": stage, "shard": shard_index, "blocked": True, "error": str(error)}
    except BaseException:
        log.error("%s part %d%s\n%s", stage, shard_index, ATTEMPT_FAILED, traceback.format_exc())
        raise
    finally:
        root.removeHandler(handler)
        root.setLevel(previous_level)
        handler.close()
        if written != path:
            path.write_bytes((path.read_bytes() if path.exists() else b"") + written.read_bytes())
            written.unlink(missing_ok=True)


def cause_line(error: BaseException) -> str:
    """`Type: first line` of what made a Ray task fail (a RayTaskError wraps the task's own exception;
    a lost worker or node is a RayError of its own)."""
    cause = getattr(error, "cause", None) or error
    message = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    return f"{type(cause).__name__}: {message}"


def _failure(work_dir: Path, stage: str, shard_index: int, error: BaseException, attempts: int) -> dict:
    """The report of a shard whose every attempt failed: the cause and the tail of its log."""
    work = WorkDir(work_dir)
    path = work.shard_log(stage, shard_index)
    failure = runner.record_failure(work, stage, shard_index, f"{cause_line(error)} (after {attempts} attempt(s))",
                                    f"log {path}, last lines:\n{log_tail(path)}")
    return {**failure, "attempts": attempts, "log": str(path)}


# ------------------------------------------------------------------ features: decode tasks -> model actors

def clip_batches(videos: list[dict], cfg: Config) -> Iterator:
    """A Ray streaming task: one clip stream of a features shard, cut into batches of
    `features.batch_size` stream items exactly as the local stage's DataLoader cuts it. Yields each batch's
    description (clip keys, error rows, videos done, has_frames), then its frames if it has clips."""
    from stages import features

    stream = iter(features.ClipStream(videos, cfg))
    while items := list(itertools.islice(stream, cfg.features.batch_size)):
        batch = features.collate_clips(items)
        frames = batch.pop("frames")
        batch["has_frames"] = frames is not None
        yield batch
        if frames is not None:
            yield frames.numpy()


class S3DModel:
    """A Ray actor holding the S3D encoder on its device (the GPU Ray gave it, when it asked for one)."""

    def __init__(self, cfg: Config):
        import torch

        from stages import features
        if cfg.features.num_threads:
            torch.set_num_threads(cfg.features.num_threads)
        self.encoder = features.S3DEncoder(cfg)
        # frames arrive as read-only views of the object store; the encoder only reads them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

    def encode(self, frames: np.ndarray) -> np.ndarray:
        import torch
        return self.encoder(torch.from_numpy(frames)).numpy()

    def describe(self) -> dict:
        return {"device": str(self.encoder.device), "precision": str(self.encoder.dtype or "float32")}


def features_with_model_actors(ctx: runner.ShardContext, models: list) -> runner.ShardResult:
    """The features stage's result for one shard, computed by decode tasks feeding `models` (S3DModel
    actors). As in stages.features.run_shard, `features.decode_workers` clip streams split the videos
    (every n-th), and the model sees the same batches, so the vectors come out bit-identical."""
    import ray

    from stages import features

    cfg = ctx.cfg
    n_streams = max(1, min(cfg.features.decode_workers, len(ctx.videos)))
    decode = ray.remote(clip_batches).options(
        num_returns="streaming", max_retries=0,   # a failed stream fails the shard task, which is retried
        _generator_backpressure_num_objects=2 * MODEL_BATCHES_IN_FLIGHT, **task_options(cfg, "features_decode"))
    streams = [decode.remote(ctx.videos[worker::n_streams], cfg) for worker in range(n_streams)]
    first = ctx.shard_index % len(models)   # shards start their round-robin on different actors
    model_cycle = itertools.cycle(models[first:] + models[:first])
    rows, vector_refs, errors, in_flight = [], [], [], []
    active = list(streams)
    while active:
        ready, _ = ray.wait(active, num_returns=1)
        stream = ready[0]
        try:
            batch = ray.get(next(stream))
        except StopIteration:
            active.remove(stream)
            continue
        errors += batch["errors"]
        if not batch["has_frames"]:
            continue
        if len(in_flight) >= MODEL_BATCHES_IN_FLIGHT:
            # memory stays bounded: decoded batches wait in their tasks, not in the object store
            _, in_flight = ray.wait(in_flight, num_returns=len(in_flight) - MODEL_BATCHES_IN_FLIGHT + 1)
        vectors = next(model_cycle).encode.remote(next(stream))
        rows += batch["clips"]
        vector_refs.append(vectors)
        in_flight.append(vectors)
    model = ray.get(models[0].describe.remote())
    return features.shard_result(cfg, rows, ray.get(vector_refs), errors,
                                 {**model, "model_actors": len(models), "decode_streams": n_streams})


# ------------------------------------------------------------------ the executor

class RayExecutor:
    """Joins the cluster at `address` ("auto": the running one), or starts a local Ray instance with
    `executor.workers` CPUs (0: all), unless this process is already connected to one."""

    def __init__(self, cfg: Config, address: str | None = None):
        import ray

        self.cfg = cfg
        if not ray.is_initialized():
            if address:
                ray.init(address=address)
            else:
                ray.init(num_cpus=cfg.executor.workers or None, include_dashboard=False)
        self._ray = ray
        self._shard_task = ray.remote(_run_shard_task)

    def describe(self) -> str:
        resources = self._ray.cluster_resources()
        return (f"ray: {len(self._ray.nodes())} node(s), {resources.get('CPU', 0):g} CPUs, "
                f"{resources.get('GPU', 0):g} GPUs")

    def _feature_models(self) -> list:
        ex = self.cfg.executor
        actor = self._ray.remote(S3DModel).options(
            max_restarts=ex.max_retries, max_task_retries=ex.max_retries, **task_options(self.cfg, "features_model"))
        return [actor.remote(self.cfg) for _ in range(ex.ray_feature_models)]

    def _feature_shards_in_flight(self, n_models: int) -> int:
        """Shards decoding at once: enough decode tasks to fill the cluster's CPUs (a GPU eats clips far
        faster than one CPU decodes them), and at least SHARDS_PER_MODEL per model actor."""
        cpus = self._ray.cluster_resources().get("CPU", 1.0)
        cpus_per_shard = max(1, self.cfg.features.decode_workers) * \
            max(task_options(self.cfg, "features_decode")["num_cpus"], 0.01)
        return max(SHARDS_PER_MODEL * n_models, math.ceil(cpus / cpus_per_shard))

    def run_shards(self, work_dir: Path, stage: str, shards: list[int], *, force: bool = False,
                   quiet: bool = False) -> list[dict]:
        ray, cfg = self._ray, self.cfg
        work_dir = WorkDir(work_dir).root
        work_dir = work_dir if storage.is_remote(work_dir) else Path(work_dir).resolve()
        attempts = cfg.executor.max_retries + 1
        results: dict[int, dict] = {}
        # complete shards are answered here: no task, no model actor for a finished stage
        checker = Lineage(work_dir, cfg)
        pending = [s for s in shards if force or not checker.state(stage, s, verify=True).current]
        split_features = stage == "features" and cfg.executor.ray_feature_models > 0 and bool(pending)
        models = self._feature_models() if split_features else None
        if split_features:
            options = {"num_cpus": 0}   # the shard task only coordinates: decode tasks and models do the work
            max_in_flight = self._feature_shards_in_flight(len(models))
        else:
            options = task_options(cfg, stage)
            max_in_flight = len(pending)
        task = self._shard_task.options(max_retries=cfg.executor.max_retries, retry_exceptions=True, **options)
        log.info("%s: %d of %d shard(s) to run on %s", stage, len(pending), len(shards), self.describe())
        with Progress(total=len(shards), unit="shards", desc=f"{stage} on ray", quiet=quiet) as progress:
            def finish(shard_index: int, stats: dict) -> None:
                results[shard_index] = stats
                progress.update(1, clips=stats.get("clips", 0) if not stats.get("skipped") else 0)

            for shard_index in sorted(set(shards) - set(pending)):
                finish(shard_index, dict(checker.state(stage, shard_index).record, skipped=True))
            queue, in_flight = collections.deque(pending), {}
            while queue or in_flight:
                while queue and len(in_flight) < max_in_flight:
                    shard_index = queue.popleft()
                    in_flight[task.remote(cfg, work_dir, stage, shard_index, force, models)] = shard_index
                # block for one, then take every other one that is done too
                ready, waiting = ray.wait(list(in_flight), num_returns=1)
                if waiting:
                    ready += ray.wait(waiting, num_returns=len(waiting), timeout=0)[0]
                for ref in ready:
                    shard_index = in_flight.pop(ref)
                    try:
                        stats = ray.get(ref)
                    except ray.exceptions.RayError as error:
                        stats = _failure(work_dir, stage, shard_index, error, attempts)
                    finish(shard_index, stats)
        for model in models or ():
            ray.kill(model)
        return [results[s] for s in shards]

    def map(self, fn: Callable, items: Iterable) -> list:
        """`[fn(item) for item in items]` as Ray tasks (resources of `executor.ray_resources.kmeans`,
        retried like shards); a part that keeps failing raises, naming it. `fn` may be any picklable
        callable (a function, a functools.partial), as for the local executor's process pool."""
        ray, cfg = self._ray, self.cfg
        remote = ray.remote(_apply).options(max_retries=cfg.executor.max_retries, retry_exceptions=True,
                                            **task_options(cfg, "kmeans"))
        shared_fn = ray.put(fn)
        refs = [remote.remote(shared_fn, item) for item in items]
        results = []
        for index, ref in enumerate(refs):
            try:
                results.append(ray.get(ref))
            except ray.exceptions.RayError as error:
                raise RuntimeError(f"{getattr(fn, '__name__', fn)} failed on part {index} after "
                                   f"{cfg.executor.max_retries + 1} attempt(s): {cause_line(error)}") from error
        return results


def _apply(fn: Callable, item):
    return fn(item)
