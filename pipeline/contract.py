"""The light contract between a stage and everything that runs it: the `Stage` record (what pipeline/registry.py
orders), `PreflightError`, `resolve`; what a stage's code sees and returns (`ShardContext`, `ShardResult`,
error rows); and what its validate checks see (`Part`, `Invalid`).

It imports nothing heavy and nothing of the layers above it, not even for a type hint (RunConfig,
WorkDirectory, LineageCheck name what those layers hand over), so a stage's `__init__.py` can import it
while pipeline.config imports the stages' sections: no stage can make a circle."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schemas.metadata import Provenance

if TYPE_CHECKING:
    import pyarrow as pa

    import schemas

# What the engine hands a stage's code, made by layers above this one: named here for what they are, typed
# where they are made, so that no import (a type hint's included) points up from the contract
RunConfig = Any  # the run's config: pipeline.config.Config, its sections as attributes (cfg.decode.fps)
WorkDirectory = Any  # pipeline.engine.workdir.WorkDir: every path of the work dir
LineageCheck = Any  # pipeline.engine.lineage.Lineage: what is current, and each input verified


class PreflightError(ValueError):
    """What a stage needs is not there (a model, weights, a resource no node has): one line naming the config
    value and the fix. Raised by a stage's preflight check and by an executor before the first task."""


# the fields of a record that name code or a class, as "module:name" (or give it as an object)
CODE_FIELDS = ("run", "identities", "preflight", "split", "section_type", "status_line", "validate")


@dataclass(frozen=True)
class Option:
    """A command-line option of a whole-collection stage: `--name`, a flag or (takes_value) one value."""

    flag: str
    help: str
    takes_value: bool = False
    required: bool = False

    @property
    def name(self) -> str:  # argparse's attribute name
        return self.flag.lstrip("-").replace("-", "_")


@dataclass
class CollectionRun:
    """What a whole-collection stage's run is given: the config, the work dir, its own options by name, and
    from the command: an executor (a stage with `workers`) and a way to ask the person at the terminal
    (None off a terminal, where asking is refusing)."""

    cfg: RunConfig
    work_dir: object
    options: dict
    quiet: bool = False
    executor: object = None
    confirm: Callable[[str], bool] | None = None


@dataclass
class CollectionResult:
    """What it did: one phrase for `run`'s table, the lines the command prints, and whether it made
    outputs (else the config it ran with is not remembered as theirs)."""

    outcome: str
    lines: list[str] = field(default_factory=list)
    made_outputs: bool = True


@dataclass(frozen=True)
class Stage:
    name: str
    summary: str  # what it does, for --help
    reads: tuple[str, ...]  # the stages whose outputs it reads
    config_sections: tuple[str, ...]  # the config sections whose values shape its outputs
    per_shard: bool  # True: runs once per manifest shard; False: once per collection
    writes: str  # what it writes, for --help
    # per-shard stages: table name -> schema; "" is the stage's main table
    tables: dict[str, schemas.Schema] = field(default_factory=dict)
    run: str | Callable = ""  # "module:function": run_shard(ctx) for per-shard stages
    identities: str | Callable = ""  # "module:function": (cfg, videos) -> {name: identity} of what
    # else shapes the output (model weights, tokenizer, transcripts)
    # keys of config_sections that do not change what is made (how long to train, where, how often to
    # log): a change of them does not make an output stale
    operational_keys: tuple[str, ...] = ()
    max_parallel_shards: int = 0  # > 0: at most this many shards at once on one machine
    # the config section the stage owns: its name (a top-level key of the YAML) and its dataclass
    # ("module:Class"), whose fields carry their bounds and rules (pipeline/config_fields.py)
    section: str = ""
    section_type: str | type = ""
    # GPU use: a Slurm array task of the stage gets executor.slurm_gpus GPUs; `device_keys` are the config
    # keys naming the devices its models or decoders run on, checked against this machine's GPUs at load
    uses_gpu: bool = False
    device_keys: tuple[str, ...] = ()
    # Ray: role -> the default resources of one task (num_cpus, num_gpus, memory_gb); the config's
    # executor.ray_resources overrides them key by key and names no other role
    ray_roles: dict[str, dict[str, float]] = field(default_factory=dict)
    # "module:function": (cfg, work_dir or None) -> None, what the stage needs before its first shard
    # (PreflightError naming the config value and the fix)
    preflight: str | Callable = ""
    # validate: table -> "module:function"s, each (Part) -> None raising Invalid: the values and
    # invariants of one part beyond its schema
    checks: dict[str, tuple[str | Callable, ...]] = field(default_factory=dict)
    # the dataset card: table -> the name of its config (a data folder `load_dataset` finds); "default"
    # is the training shards
    card_configs: dict[str, str] = field(default_factory=dict)
    # per-shard stages whose outputs this stage makes in the same pass (their tables come back in its
    # ShardResult.also): the runner writes them as those stages' shards, with their own records
    also_makes: tuple[str, ...] = ()
    # "module:attribute": the stage's pipeline.engine.split.Split (a CPU producer and a device encoder), which
    # executors may run apart (the Ray executor: producer tasks feeding encoder actors)
    split: str = ""
    # bump when a change of the stage's code alters what it makes from the same inputs and config: its
    # outputs made before become stale (recorded from 2 on, so a bump redoes this stage and what follows)
    version: int = 1
    # whole-collection stages: `run` is "module:function" (CollectionRun) -> CollectionResult; `options` its
    # own command-line options; `workers`, for a stage that fans its work out over an executor (kmeans: its
    # subtrees), what --workers counts (it then takes --executor, --workers and --ray-address)
    options: tuple[Option, ...] = ()
    workers: str = ""
    # `run` and `submit pipeline` include the stage (train: False; `submit pipeline --with-train` adds it)
    in_run: bool = True
    # runs as one process per GPU under torchrun, on executor.slurm_nodes nodes in a batch job (train)
    distributed: bool = False
    # what a batch job adds to the stage's command so that a requeued job continues (train: --resume)
    batch_arguments: tuple[str, ...] = ()
    # whole-collection stages: "module:function" (lineage, {stage: {shard: State}} of the per-shard stages
    # before it) -> its line in `status`; and (work, lineage) -> the problems `validate` finds in its outputs
    status_line: str | Callable = ""
    validate: str | Callable = ""

    def function(self, which: str = "run") -> Callable:
        """The code (or class) a "module:name" field names: a function, the `split` record or the
        `section_type` dataclass; a field given as an object is that object."""
        return resolve(getattr(self, which))

    def run_preflight(self, cfg: RunConfig, work_dir=None) -> None:
        """What the stage needs before its first shard (its `preflight`); raises PreflightError. With the
        work dir, the stage may judge what this run needs (asr: no model where every video has a transcript)."""
        if self.preflight:
            self.function("preflight")(cfg, work_dir)


def resolve(named: str | Callable) -> Callable:
    """The object "module:name" names; an object is itself."""
    if not isinstance(named, str):
        return named
    module, name = named.split(":")
    return getattr(importlib.import_module(module), name)


@dataclass
class ShardResult:
    tables: dict[str, pa.Table]  # "" -> main output; other names -> extra tables
    errors: list[dict] = field(default_factory=list)  # {video_id, error_type, message}
    stats: dict = field(default_factory=dict)  # counts for status/summary (videos, clips, ...)
    provenance: Provenance = field(default_factory=Provenance)  # what shaped it (hashes of inputs ...)
    row_group_size: int | None = None  # Parquet row groups (None: pyarrow's default)
    # other stages' results made in the same pass (its record's `also_makes`): written as those stages'
    # outputs of this shard, with their own completion records, unless they are current already
    also: dict[str, ShardResult] = field(default_factory=dict)


@dataclass
class ShardContext:
    cfg: RunConfig
    work: WorkDirectory
    stage: str
    shard_index: int
    videos: list[dict]  # this shard's manifest rows
    lineage: LineageCheck
    quiet: bool = False

    def read_input(self, stage: str, table_name: str = "", columns: list[str] | None = None) -> pa.Table:
        """This shard's output of an earlier stage, after checking its bytes against the upstream record
        (a bit flip that still parses must not flow on), with Parquet page checksums verified."""
        from pipeline import storage

        path = self.lineage.verified(stage, self.shard_index, self.work.part(stage, self.shard_index, table_name))
        return storage.read_table(path, columns=columns)

    def input_provenance(self, stage: str, table_name: str = "") -> Provenance:
        from pipeline import storage

        return storage.read_metadata(self.work.part(stage, self.shard_index, table_name))

    def progress(self, total: int | None = None, unit: str = "videos", desc: str | None = None):
        from pipeline.progress import Progress

        return Progress(total=total, unit=unit, desc=desc or f"{self.stage} part {self.shard_index}", quiet=self.quiet)


def error_row(video_id: str, error: BaseException | str, error_type: str | None = None) -> dict:
    """An error row: the exception's class is its type; its message is one line."""
    if isinstance(error, BaseException):
        error_type = error_type or type(error).__name__
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    else:
        message = error
    return {"video_id": video_id, "error_type": error_type or "Error", "message": printable(message)}


def printable(text: str) -> str:
    """`text` as valid UTF-8: a file name that is not UTF-8 reaches messages as surrogate escapes, which no
    Parquet string holds; its bytes are shown as `\\xe9`."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


class Invalid(Exception):
    """A part breaks a value or invariant its schema cannot say (one line naming the file)."""


@dataclass(frozen=True)
class Part:
    """One current part, as the per-table checks a stage's record names (`checks`) see it."""

    work: WorkDirectory
    path: Path
    shard_name: str  # "00003.parquet": the same shard's part in another folder
    visual_vocab: int | None  # the codebook's leaves, when there is one

    def sibling(self, stage: str, table: str = "") -> Path:
        """The same shard's part of another stage's table."""
        return self.work.data_folder(stage, table) / f"part-{self.shard_name}"
