"""One training run as every part of the trainer sees it: the `Session` (videobert/train.py runs it; what it
reads, videobert/train_inputs.py; its model, optimiser and data, videobert/train_setup.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from pipeline.config import Config
from pipeline.engine.workdir import WorkDir
from videobert import train_log
from videobert.model import VideoBert
from videobert.runtime import Runtime
from videobert.train_log import TrainLog


@dataclass
class Session:
    """One training run, what every helper below works with: its config, where it runs (rank, device), the
    work dir and `files`, the work dir whose train/ it writes (the work dir itself, or a local mirror of a
    remote one); once set up (`setup`), the model and its DDP wrapper, optimiser, scheduler, data and log."""

    cfg: Config
    runtime: Runtime
    work: WorkDir
    files: WorkDir
    quiet: bool
    model: VideoBert | None = None
    wrapped: torch.nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
    batches: Iterator[dict] | None = None
    info: dict = field(default_factory=dict)  # how the model was made (saved with every checkpoint)
    notes: list[str] = field(default_factory=list)
    data_shape: dict = field(default_factory=dict)  # ranks, streams and micro-batch: a resume must keep them
    examples: torch.Tensor | None = None  # this rank's examples per regime so far (the realised mix)
    plan_states: dict = field(default_factory=dict)  # this rank's data streams' latest saved positions, by stream
    log: TrainLog | None = None

    def say(self, line: str) -> None:
        """A `[train]` line on stderr, from rank 0 unless quiet."""
        if self.runtime.main:
            train_log.say(self.quiet, line)
