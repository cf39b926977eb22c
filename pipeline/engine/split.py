"""Stages whose work on a shard splits into a producer and an encoder, so that executors can run each
part where it fits (a stage's record names its `Split` in its `split` field):

- the producer (CPU work: decoding) turns a list of manifest rows into batches: `{"meta": small
  picklable dict, "payload": a uint8 tensor or None}`. It cuts its batches itself, so a stream of
  videos gives the same batches whichever process or machine runs it;
- the encoder (a model on a device) turns a payload into an array, one row per payload row;
- `finish` turns the metas and the encoder's arrays, batch by batch in the same order, into the shard's
  `ShardResult` (the stage's tables and those of stages it makes in the same pass).

`Split.run_local` is the one-machine way: the producer's streams run in DataLoader worker processes (the
payloads in pinned memory when the encoder is on a GPU) and the encoder in this process, one batch on
the device while the next is copied. The Ray executor runs producers as CPU tasks feeding encoder
actors. Neither names a stage."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class Encoder:
    """What `Split.encoder` returns: `submit(payload)` queues a batch on the device and returns a handle
    whose `result()` is its array; `describe()` says where and how it runs (for the stats)."""

    device: torch.device

    def submit(self, payload: torch.Tensor):
        raise NotImplementedError

    def describe(self) -> dict:
        return {"device": str(self.device)}


class Split:
    """A stage's producer and encoder; a subclass gives `produce`, `encoder` and `finish`, and the sizes
    its producers and encoders work from. Instances are stateless and picklable: executors hand them to
    the processes and machines they start."""

    # the resource roles (executor.ray_resources) of a producer task and of an encoder actor
    roles: tuple[str, str]

    def settle(self, cfg, device: torch.device):
        """`cfg` with the stage's automatic sizes (batch size, producer streams) settled for an encoder on
        `device`: producers and encoders then work from the same values."""
        return cfg

    def streams(self, cfg) -> int:
        """Producer streams for one shard (0: in the encoder's process); the executors start no more than
        the shard has videos."""
        return 0

    def actors(self, cfg) -> int:
        """Encoder actors for executors to start for this config (0: run each shard whole, in one task)."""
        return 0

    def start_method(self, cfg) -> str | None:
        """How local producer processes start: None (the platform's default, fork on Linux) or "spawn" (a
        fresh process, which reads LD_LIBRARY_PATH and such anew)."""
        return None

    def produce(self, cfg, videos: list[dict]) -> Iterator[dict]:
        """The batches of these videos: `{"meta": dict, "payload": Tensor | None}`."""
        raise NotImplementedError

    def encoder(self, cfg) -> Encoder:
        """The encoder, loaded once per process."""
        raise NotImplementedError

    def finish(self, ctx, cfg, metas: list[dict], arrays: list, stats: dict):
        """The shard's ShardResult from the metas and the encoder's arrays, batch by batch in order."""
        raise NotImplementedError

    def run_local(self, ctx, cfg=None):
        """The shard's result with the producer's streams in worker processes feeding the encoder here."""
        cfg = cfg or ctx.cfg
        encoder = self.encoder(cfg)
        cfg = self.settle(cfg, encoder.device)
        workers = min(self.streams(cfg), len(ctx.videos))
        pinned = encoder.device.type == "cuda"
        loader = DataLoader(
            _Streams(self, cfg, ctx.videos),
            batch_size=None,
            num_workers=workers,
            pin_memory=pinned and workers > 0,
            prefetch_factor=4 if workers else None,
            persistent_workers=False,
            multiprocessing_context=self.start_method(cfg) if workers else None,
        )
        metas, arrays = [], []
        queued = None  # (meta, handle) of the batch on the device while the next one is fetched
        with ctx.progress(total=len(ctx.videos)) as progress:
            for batch in _batches(loader, pinned and workers == 0):
                handle = encoder.submit(batch["payload"]) if batch["payload"] is not None else None
                if queued is not None:
                    _collect(queued, metas, arrays, progress)
                queued = (batch["meta"], handle)
            if queued is not None:
                _collect(queued, metas, arrays, progress)
        return self.finish(ctx, cfg, metas, arrays, {**encoder.describe(), "producer_streams": max(workers, 1)})


class _Streams(IterableDataset):
    """Each DataLoader worker runs the producer on every n-th video of the shard."""

    def __init__(self, split: Split, cfg, videos: list[dict]):
        self.split, self.cfg, self.videos = split, cfg, videos

    def __iter__(self):
        worker = get_worker_info()
        videos = self.videos if worker is None else self.videos[worker.id :: worker.num_workers]
        return iter(self.split.produce(self.cfg, videos))


def stream_videos(videos: list[dict], streams: int) -> list[list[dict]]:
    """The videos of each producer stream: every n-th, as the DataLoader's workers take them."""
    streams = max(1, streams)
    return [videos[index::streams] for index in range(streams)]


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
