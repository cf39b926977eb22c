"""Stages whose work on a shard splits into a producer and an encoder, so that executors can run each
part where it fits (pipeline/registry.py names a stage's `Split` in its `split` field):

- the producer (CPU work: decoding) turns a list of manifest rows into batches: `{"meta": small
  picklable dict, "payload": a uint8 tensor or None}`. It cuts its batches itself, so a stream of
  videos gives the same batches whichever process or machine runs it;
- the encoder (a model on a device) turns a payload into an array, one row per payload row;
- `finish` turns the metas and the encoder's arrays, batch by batch in the same order, into the shard's
  `ShardResult` (the stage's tables and those of stages it makes in the same pass).

`run_local` is the one-machine way: the producer's streams run in DataLoader worker processes (the
payloads in pinned memory when the encoder is on a GPU) and the encoder in this process, one batch on
the device while the next is copied. The Ray executor runs producers as CPU tasks feeding encoder
actors. Neither names a stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


@dataclass(frozen=True)
class Split:
    # (cfg, device) -> cfg with the stage's automatic sizes (batch size, producer streams) settled for an
    # encoder on `device`: producers and encoders then work from the same values
    settle: Callable
    streams: Callable        # (cfg) -> producer streams for one shard (0: in the encoder's process); the
                             # executors start no more than the shard has videos
    produce: Callable        # (cfg, videos) -> Iterator[{"meta": dict, "payload": Tensor | None}]
    encoder: Callable        # (cfg) -> an Encoder (below), loaded once per process
    finish: Callable         # (ctx, cfg, metas, arrays, stats) -> ShardResult
    # executors: encoder actors to start for this config (0: run each shard whole, in one task), and the
    # resource roles (executor.ray_resources) of a producer task and of an encoder actor
    actors: Callable         # (cfg) -> int
    roles: tuple[str, str]
    # (cfg) -> how local producer processes start: None (the platform's default, fork on Linux) or
    # "spawn" (a fresh process, which reads LD_LIBRARY_PATH and such anew)
    start_method: Callable | None = None     # None: the platform's default for every config


class Encoder:
    """What `Split.encoder` returns: `submit(payload)` queues a batch on the device and returns a handle
    whose `result()` is its array; `describe()` says where and how it runs (for the stats)."""
    device: torch.device

    def submit(self, payload: torch.Tensor):
        raise NotImplementedError

    def describe(self) -> dict:
        return {"device": str(self.device)}


class _Streams(IterableDataset):
    """Each DataLoader worker runs the producer on every n-th video of the shard."""

    def __init__(self, split: Split, cfg, videos: list[dict]):
        self.split, self.cfg, self.videos = split, cfg, videos

    def __iter__(self):
        worker = get_worker_info()
        videos = self.videos if worker is None else self.videos[worker.id::worker.num_workers]
        return iter(self.split.produce(self.cfg, videos))


def stream_videos(videos: list[dict], streams: int) -> list[list[dict]]:
    """The videos of each producer stream: every n-th, as the DataLoader's workers take them."""
    streams = max(1, streams)
    return [videos[index::streams] for index in range(streams)]


def run_local(ctx, split: Split, cfg=None):
    """The shard's result with the producer's streams in worker processes feeding the encoder here."""
    cfg = cfg or ctx.cfg
    encoder = split.encoder(cfg)
    cfg = split.settle(cfg, encoder.device)
    workers = min(split.streams(cfg), len(ctx.videos))
    pinned = encoder.device.type == "cuda"
    loader = DataLoader(_Streams(split, cfg, ctx.videos), batch_size=None, num_workers=workers,
                        pin_memory=pinned and workers > 0, prefetch_factor=4 if workers else None,
                        persistent_workers=False,
                        multiprocessing_context=split.start_method(cfg) if workers and split.start_method else None)
    metas, arrays = [], []
    queued = None     # (meta, handle) of the batch on the device while the next one is fetched
    with ctx.progress(total=len(ctx.videos)) as progress:
        for batch in _batches(loader, pinned and workers == 0):
            handle = encoder.submit(batch["payload"]) if batch["payload"] is not None else None
            if queued is not None:
                _collect(queued, metas, arrays, progress)
            queued = (batch["meta"], handle)
        if queued is not None:
            _collect(queued, metas, arrays, progress)
    return split.finish(ctx, cfg, metas, arrays, {**encoder.describe(), "producer_streams": max(workers, 1)})


def _batches(loader, pin_here: bool) -> Iterator[dict]:
    for batch in loader:
        if pin_here and batch["payload"] is not None and batch["payload"].device.type == "cpu":
            batch["payload"] = batch["payload"].pin_memory()
        yield batch


def _collect(queued, metas: list, arrays: list, progress) -> None:
    meta, handle = queued
    metas.append(meta)
    arrays.append(handle.result() if handle is not None else None)
    progress.update(meta.get("videos_done", 0), clips=meta.get("items", 0))


def concatenate(arrays: list[np.ndarray | None], width: int, dtype=np.float32) -> np.ndarray:
    present = [array for array in arrays if array is not None]
    return np.concatenate(present) if present else np.zeros((0, width), dtype)
