"""The training log, DIR/train/log.jsonl, written by rank 0 alone: one JSON record a line (a `start` or
`resume` record, `train` records every train.log_every steps, `validation` records, a `stopped` record when a
run diverges), with train.tensorboard the same records as TensorBoard events (videobert/tensorboard_log.py).
`[train]` lines on stderr say the same for people, unless quiet."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from pipeline import threads
from videobert import tensorboard_log
from videobert.model import count_parameters


class TrainLog:
    """Rank 0's log file and stderr; on other ranks (`file` None) it writes and prints nothing."""

    def __init__(self, file, quiet: bool):
        self.file, self.quiet = file, quiet

    @property
    def open(self) -> bool:
        return self.file is not None

    def say(self, line: str) -> None:
        if self.file is not None and not self.quiet:
            print(f"[train] {line}", file=sys.stderr)

    def write(self, record: dict, line: str | None = None) -> None:
        """`record` into the log, and `line` (its words for people) on stderr."""
        if self.file is None:
            return
        self.file.write(json.dumps(record) + "\n")
        if line is not None:
            self.say(line)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def say(quiet: bool, line: str) -> None:
    """A `[train]` line before the log is open (on rank 0 only: the caller checks)."""
    if not quiet:
        print(f"[train] {line}", file=sys.stderr)


def open_log(session, start_step: int, shards: list[Path], resumed: bool, extra: dict) -> TrainLog:
    """A training session's log (writing nothing off rank 0), its start or resume record (with `extra`)
    written; with train.tensorboard its records go to DIR/train/tensorboard/ too."""
    s, runtime = session, session.runtime
    if not runtime.main:
        return TrainLog(None, s.quiet)
    total_params, trainable_params = count_parameters(s.model)
    header = {
        "event": "resume" if resumed else "start",
        "step": start_step,
        "time": time.time(),
        "notes": s.notes,
        "parameters": total_params,
        "trainable_parameters": trainable_params,
        "device": str(runtime.device),
        "threads": threads.describe(s.cfg.train.num_threads),
        "shards": len(shards),
        **s.data_shape,
        "config": json.loads(s.cfg.section_json("train")),
        **extra,
    }
    s.files.train_log.parent.mkdir(parents=True, exist_ok=True)
    file = open(s.files.train_log, "a", buffering=1)
    file.write(json.dumps(header) + "\n")
    for note in s.notes:
        say(s.quiet, note)
    shape = s.data_shape
    say(
        s.quiet,
        f"{total_params:,} parameters ({trainable_params:,} trainable), {len(shards)} shards, "
        f"{runtime.world_size} rank(s) x {shape['streams_per_rank']} data stream(s), micro-batch "
        f"{shape['micro_batch']}, device {runtime.device}",
    )
    return TrainLog(tensorboard_log.tee(s.cfg, s.files, file), s.quiet)


def write_stopped(log_path: Path, step: int, reason: str, checkpoint: Path | None) -> None:
    """The `stopped` record of a run that diverged, naming the checkpoint it keeps."""
    with open(log_path, "a") as log_file:
        log_file.write(
            json.dumps(
                {
                    "event": "stopped",
                    "step": step,
                    "time": time.time(),
                    "reason": reason,
                    "checkpoint": str(checkpoint) if checkpoint else None,
                }
            )
            + "\n"
        )
