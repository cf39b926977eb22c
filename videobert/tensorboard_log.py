"""TensorBoard event files beside the training log (`train.tensorboard: true`; off by default; needs the
optional `tensorboard` package: pip install "videobert-pipeline[tensorboard]").

Every record the trainer writes to DIR/train/log.jsonl also goes to DIR/train/tensorboard/ as scalars at its
step: a `train` record's numbers as `train/<key>` (losses, accuracies, regime shares, lr, tokens/s), a
`validation` record's as `validation/<key>`; the start record's train config as text. Values that are not
numbers (None where a regime had no example, lists, notes) are left out. The JSON log stays the record; the
event files are a view of it for the tools researchers already use."""

from __future__ import annotations

import json
import math

FOLDER = "tensorboard"
SKIPPED = ("event", "step", "time")


class TensorBoardUnavailable(ImportError):
    pass


def summary_writer(folder):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise TensorBoardUnavailable(
            "train.tensorboard: true needs the tensorboard package: "
            'pip install "videobert-pipeline[tensorboard]" (or set train.tensorboard: false)'
        ) from None
    return SummaryWriter(log_dir=str(folder))


def scalars(record: dict) -> dict[str, float]:
    """The `<event>/<key>` scalars of one log record (train and validation records only)."""
    event = record.get("event")
    if event not in ("train", "validation"):
        return {}
    found = {}
    for key, value in record.items():
        if key in SKIPPED or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            found[f"{event}/{key}"] = float(value)
    return found


class TeeLog:
    """The training log file, each record also written to the event files."""

    def __init__(self, log_file, writer):
        self.log_file, self.writer = log_file, writer

    def write(self, text: str) -> int:
        written = self.log_file.write(text)
        for line in text.splitlines():
            if line.strip():
                record = json.loads(line)
                for tag, value in scalars(record).items():
                    self.writer.add_scalar(tag, value, int(record["step"]))
        return written

    def flush(self) -> None:
        self.log_file.flush()
        self.writer.flush()

    def close(self) -> None:
        try:
            self.log_file.close()
        finally:
            self.writer.close()


def tee(cfg, files, log_file):
    """`log_file` itself without train.tensorboard (or on a rank that writes no log), else a TeeLog writing
    DIR/train/tensorboard/ too, the run's train config as text."""
    if log_file is None or not getattr(cfg.train, "tensorboard", False):
        return log_file
    try:
        writer = summary_writer(files.train_folder / FOLDER)
    except TensorBoardUnavailable:
        log_file.close()
        raise
    writer.add_text("config/train", "```\n" + json.dumps(json.loads(cfg.section_json("train")), indent=1) + "\n```")
    return TeeLog(log_file, writer)


def read_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] of every event file in `folder`, read back with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[str, list[tuple[int, float]]] = {}
    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    accumulator.Reload()
    for tag in accumulator.Tags()["scalars"]:
        found[tag] = [(event.step, event.value) for event in accumulator.Scalars(tag)]
    return found
