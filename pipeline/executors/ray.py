"""The Ray executor (`--executor ray [--ray-address auto]`): a stage's shards as Ray tasks on a cluster.

Every shard task runs `runner.run_one_shard`, the code the local executor runs, so the files are
byte-identical to a local run and just as atomic and idempotent. The work dir must be a folder that every
node sees at the same path (NFS, Lustre, a mounted bucket), and every node needs this package installed.

- Resources per task come from `executor.ray_resources` (per stage: num_cpus, num_gpus, memory_gb); a task's
  default thread counts are its num_cpus (pipeline/threads.py). A stage asking for more than any node of the
  cluster has fails before its first task, naming the setting (Ray itself would wait for such a node forever).
- A failed task is retried `executor.max_retries` times, whether it raised or its worker died. Each
  attempt's log lines and traceback are appended to DIR/_state/logs/<stage>/part-NNNNN.log; a shard that keeps
  failing comes back as {"failed": True, "error", "traceback" (the log's tail)} and the finished shards
  stay complete, so the run ends non-zero naming the failed shards and a rerun does only those.
- Progress across the cluster: shards done/total and clips/s, from the shards' completion stats.
- `map(fn, items)` runs a global stage's parts (k-means subtree fits) as Ray tasks.

A stage that declares a split (pipeline/engine/split.py: a producer and an encoder, named in its registry record)
and asks for encoder actors (`Split.actors(cfg)`, a value of its config) runs
its producers as CPU tasks that stream batches through the object store to a pool of encoder actors (one
GPU each by default), so a GPU never waits on a decode and decoding scales over CPU nodes. Producers cut
their batches themselves, exactly as in the local run, so the outputs are byte-identical to it. The
executor knows no stage by name: the roles of the tasks and actors (executor.ray_resources) come from the
stage's split."""

from __future__ import annotations

import collections
import itertools
import logging
import math
import os
import socket
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline import registry, storage, threads
from pipeline.config import Config
from pipeline.contract import PreflightError, ShardContext, ShardResult
from pipeline.engine import runner
from pipeline.engine.lineage import InputNotReady, Lineage
from pipeline.engine.records import CorruptFile
from pipeline.engine.workdir import WorkDir
from pipeline.progress import Progress

if TYPE_CHECKING:
    from pipeline.engine.split import Split

log = logging.getLogger("pipeline.ray")

LOG_TAIL_LINES = 30  # of a failed shard's log, in its failure report
ENCODER_BATCHES_IN_FLIGHT = 4  # per shard of a split stage: batches sent to the encoder actors, not yet back
SHARDS_PER_ACTOR = 2  # shards producing at once per encoder actor, at least
ATTEMPT_STARTED, ATTEMPT_FAILED = ": attempt on ", ": attempt failed"  # markers in the shard logs


def task_options(cfg: Config, role: str) -> dict:
    """Ray options for one task of `role` (a stage, or a split stage's producer / encoder role): the config's
    resources (merged over the built-in defaults key by key at load)."""
    resources = cfg.executor.ray_resources.get(role, {})
    options = {"num_cpus": resources.get("num_cpus", 1), "num_gpus": resources.get("num_gpus", 0)}
    if resources.get("memory_gb"):
        options["memory"] = int(resources["memory_gb"] * 2**30)
    return options


def infeasible(role: str, options: dict, nodes: list[dict]) -> str | None:
    """Why no alive node among `nodes` (ray.nodes()) can run a task of `role` with these Ray options; None
    when one can. Nodes an autoscaler has not started yet are not among them."""
    wanted = {"CPU": options.get("num_cpus", 0), "GPU": options.get("num_gpus", 0), "memory": options.get("memory", 0)}
    alive = [node.get("Resources", {}) for node in nodes if node.get("Alive")]
    if any(all(resources.get(key, 0) >= value for key, value in wanted.items() if value) for resources in alive):
        return None
    # named: what no node has enough of; all of it where each alone fits some node, but not together
    short = {
        key: value
        for key, value in wanted.items()
        if value and not any(resources.get(key, 0) >= value for resources in alive)
    }
    asked = ", ".join(
        f"{value / 2**30:g} GB of memory" if key == "memory" else f"{value:g} {key}(s)"
        for key, value in (short or {k: v for k, v in wanted.items() if v}).items()
    )
    most = {key: max((resources.get(key, 0) for resources in alive), default=0) for key in wanted}
    return (
        f"executor.ray_resources.{role} asks for {asked} per task, but no node of the Ray cluster has that "
        f"(its {len(alive)} node(s) have at most {most['CPU']:g} CPUs, {most['GPU']:g} GPUs, "
        f"{most['memory'] / 2**30:.1f} GB of memory): lower it, or add such a node"
    )


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _run_shard_task(
    cfg: Config,
    work_dir: Path,
    stage: str,
    shard_index: int,
    force: bool,
    split: Split | None,
    actors: list | None,
    encoder_info: dict | None,
) -> dict:
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
        import ray

        log.info(
            "%s part %d%s%s (Ray node %s, pid %d, %s)",
            stage,
            shard_index,
            ATTEMPT_STARTED,
            socket.gethostname(),
            ray.get_runtime_context().get_node_id(),
            os.getpid(),
            threads.describe(),
        )
        compute = partial(split_with_actors, split=split, actors=actors, info=encoder_info) if actors else None
        stats = runner.run_one_shard(cfg, work_dir, stage, shard_index, force=force, quiet=True, compute=compute)
        log.info(
            "%s part %d: done (%s)",
            stage,
            shard_index,
            "already current" if stats.get("skipped") else f"{stats.get('seconds', 0):.1f} s",
        )
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
    failure = runner.record_failure(
        work,
        stage,
        shard_index,
        f"{cause_line(error)} (after {attempts} attempt(s))",
        f"log {path}, last lines:\n{log_tail(path)}",
    )
    return {**failure, "attempts": attempts, "log": str(path)}


# ------------------------------------------------------------------ split stages: producer tasks -> encoder actors


def _produce(split: Split, cfg: Config, videos: list[dict]) -> Iterator:
    """A Ray streaming task: one producer stream of a shard. Yields each batch's meta (with `has_payload`),
    then its payload as a NumPy array when it has one."""
    for batch in split.produce(cfg, videos):
        payload = batch["payload"]
        yield {**batch["meta"], "has_payload": payload is not None}
        if payload is not None:
            yield payload.cpu().numpy()


class EncoderActor:
    """A Ray actor holding a split stage's encoder on its device (the GPU Ray gave it, when it asked for one)."""

    def __init__(self, split: Split, cfg: Config):
        self.encoder = split.encoder(cfg)
        # payloads arrive as read-only views of the object store; the encoder only reads them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

    def encode(self, payload: np.ndarray) -> np.ndarray:
        import torch

        return self.encoder.submit(torch.from_numpy(payload)).result()

    def describe(self) -> dict:
        return self.encoder.describe()


def split_with_actors(ctx: ShardContext, split: Split, actors: list, info: dict) -> ShardResult:
    """A split stage's result for one shard, computed by producer tasks feeding `actors` (EncoderActor,
    which `info` describes: they all run alike).
    The producer streams split the videos as the local DataLoader's workers do (every n-th), and each cuts
    its own batches, so the encoder sees the same batches and the files come out byte-identical."""
    import ray

    # imported here: it loads torch, which a driver that runs no split stage does without
    from pipeline.engine.split import stream_videos

    cfg = split.settle(ctx.cfg, _device(info["device"]))
    n_streams = max(1, min(split.streams(cfg), len(ctx.videos)))
    produce = ray.remote(_produce).options(
        num_returns="streaming",
        max_retries=0,  # a failed stream fails the shard task, which is retried
        _generator_backpressure_num_objects=2 * ENCODER_BATCHES_IN_FLIGHT,
        **task_options(cfg, split.roles[0]),
    )
    streams = [produce.remote(split, cfg, videos) for videos in stream_videos(ctx.videos, n_streams)]
    first = ctx.shard_index % len(actors)  # shards start their round-robin on different actors
    actor_cycle = itertools.cycle(actors[first:] + actors[:first])
    metas, array_refs, in_flight = [], [], []
    active = list(streams)
    while active:
        ready, _ = ray.wait(active, num_returns=1)
        stream = ready[0]
        try:
            meta = ray.get(next(stream))
        except StopIteration:
            active.remove(stream)
            continue
        metas.append(meta)
        if not meta.pop("has_payload"):
            array_refs.append(None)
            continue
        if len(in_flight) >= ENCODER_BATCHES_IN_FLIGHT:
            # memory stays bounded: produced batches wait in their tasks, not in the object store
            _, in_flight = ray.wait(in_flight, num_returns=len(in_flight) - ENCODER_BATCHES_IN_FLIGHT + 1)
        array = next(actor_cycle).encode.remote(next(stream))
        array_refs.append(array)
        in_flight.append(array)
    arrays = [ray.get(ref) if ref is not None else None for ref in array_refs]
    return split.finish(ctx, cfg, metas, arrays, {**info, "encoder_actors": len(actors), "producer_streams": n_streams})


def _device(name: str):
    import torch

    return torch.device(name)


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
                # "local": a Ray of its own, even where a cluster runs on this machine (ray.init without an
                # address would join that one, and refuse num_cpus)
                ray.init(address="local", num_cpus=cfg.executor.workers or None, include_dashboard=False)
        self._ray = ray
        self._shard_task = ray.remote(_run_shard_task)

    def describe(self) -> str:
        resources = self._ray.cluster_resources()
        return (
            f"ray: {len(self._ray.nodes())} node(s), {resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs"
        )

    def require_feasible(self, *roles_options: tuple[str, dict]) -> None:
        """Stop before the first task when a role asks for what no node has (PreflightError, one line)."""
        nodes = self._ray.nodes()
        for role, options in roles_options:
            problem = infeasible(role, options, nodes)
            if problem:
                raise PreflightError(problem)

    def _encoder_actors(self, split: Split | None) -> list:
        """The encoder actors of a split stage that asks for them (none otherwise)."""
        count = split.actors(self.cfg) if split is not None else 0
        if not count:
            return []
        ex = self.cfg.executor
        actor = self._ray.remote(EncoderActor).options(
            max_restarts=ex.max_retries, max_task_retries=ex.max_retries, **task_options(self.cfg, split.roles[1])
        )
        return [actor.remote(split, self.cfg) for _ in range(count)]

    def _shards_in_flight(self, split: Split, n_actors: int, device) -> int:
        """Shards producing at once: enough producer tasks to fill the cluster's CPUs (a GPU eats clips far
        faster than one CPU decodes them), and at least SHARDS_PER_ACTOR per encoder actor on `device`."""
        cpus = self._ray.cluster_resources().get("CPU", 1.0)
        streams = max(1, split.streams(split.settle(self.cfg, device)))
        cpus_per_shard = streams * max(task_options(self.cfg, split.roles[0])["num_cpus"], 0.01)
        return max(SHARDS_PER_ACTOR * n_actors, math.ceil(cpus / cpus_per_shard))

    def run_shards(
        self, work_dir: Path, stage: str, shards: list[int], *, force: bool = False, quiet: bool = False
    ) -> list[dict]:
        ray, cfg = self._ray, self.cfg
        work_dir = WorkDir(work_dir).root
        work_dir = work_dir if storage.is_remote(work_dir) else Path(work_dir).resolve()
        attempts = cfg.executor.max_retries + 1
        results: dict[int, dict] = {}
        # complete shards are answered here: no task, no model actor for a finished stage
        checker = Lineage(work_dir, cfg)
        states = {} if force else {s: checker.state(stage, s, verify=True) for s in shards}
        pending = [s for s in shards if force or not states[s].current]
        spec = registry.stage(stage)  # looked up once: tasks and actors are handed its split
        split = spec.function("split") if spec.split else None
        if pending:
            uses_actors = split is not None and split.actors(cfg) > 0
            self.require_feasible(
                *(
                    [(role, task_options(cfg, role)) for role in split.roles]
                    if uses_actors
                    else [(stage, task_options(cfg, stage))]
                )
            )
        actors = self._encoder_actors(split) if pending else []
        encoder_info = ray.get(actors[0].describe.remote()) if actors else None  # asked once, not per shard
        if actors:
            options = {"num_cpus": 0}  # the shard task only coordinates: producers and encoders do the work
            max_in_flight = self._shards_in_flight(split, len(actors), _device(encoder_info["device"]))
        else:
            options = task_options(cfg, stage)
            max_in_flight = len(pending)
        task = self._shard_task.options(max_retries=cfg.executor.max_retries, retry_exceptions=True, **options)
        log.info("%s: %d of %d shard(s) to run on %s", stage, len(pending), len(shards), self.describe())
        with Progress(total=len(shards), unit="shards", desc=f"{stage} on ray", quiet=quiet) as progress:

            def finish(shard_index: int, stats: dict) -> None:
                results[shard_index] = stats
                if stats.get("failed") or stats.get("blocked"):
                    progress.fail(1)  # a crashed shard is never counted as done
                    return
                progress.update(1, clips=stats.get("clips", 0) if not stats.get("skipped") else 0)

            for shard_index in sorted(set(shards) - set(pending)):
                finish(shard_index, dict(states[shard_index].record, skipped=True))
            queue, in_flight = collections.deque(pending), {}
            while queue or in_flight:
                while queue and len(in_flight) < max_in_flight:
                    shard_index = queue.popleft()
                    in_flight[task.remote(cfg, work_dir, stage, shard_index, force, split, actors, encoder_info)] = (
                        shard_index
                    )
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
        for actor in actors:
            ray.kill(actor)
        return [results[s] for s in shards]

    def map(self, fn: Callable, items: Iterable, role: str) -> list:
        """`[fn(item) for item in items]` as Ray tasks, each with the resources of the stage's Ray `role`
        (`executor.ray_resources.ROLE`), retried like shards; a part that keeps failing raises, naming it.
        `fn` may be any picklable callable (a function, a functools.partial), as for the local executor's
        process pool."""
        ray, cfg = self._ray, self.cfg
        self.require_feasible((role, task_options(cfg, role)))
        remote = ray.remote(_apply).options(
            max_retries=cfg.executor.max_retries, retry_exceptions=True, **task_options(cfg, role)
        )
        shared_fn = ray.put(fn)
        refs = [remote.remote(shared_fn, item) for item in items]
        results = []
        for index, ref in enumerate(refs):
            try:
                results.append(ray.get(ref))
            except ray.exceptions.RayError as error:
                raise RuntimeError(
                    f"{getattr(fn, '__name__', fn)} failed on part {index} after "
                    f"{cfg.executor.max_retries + 1} attempt(s): {cause_line(error)}"
                ) from error
        return results


def _apply(fn: Callable, item):
    return fn(item)
