"""The stages in run order: each is a folder, stages/<name>/, whose `__init__.py` holds its record
(`STAGE`, a pipeline.contract.Stage: the one place a stage is described). The runner, the CLI, the config
(a stage's own section and its Ray roles), the executors (Ray resources, Slurm GPUs), the device checks,
lineage, status, validate and the dataset card read the records; none of them lists the stages.

A stage is either per shard (a function of (config, one manifest shard) to one output file per table)
or whole-collection (one run: the manifest, the k-means codebook, training). Code and config sections are
named by "module:name" and imported only when used, so reading the registry stays cheap; a record made
outside stages/ (a test's stage) may give them as objects instead. `register` adds a stage for a while."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

from pipeline.contract import Stage

# the run order: a stage reads only the outputs of stages before it
ORDER = (
    "manifest",
    "decode",
    "features",
    "shots",
    "quality",
    "dedup",
    "kmeans",
    "quantize",
    "asr",
    "align",
    "train",
)

STAGES: tuple[Stage, ...] = tuple(importlib.import_module(f"stages.{name}").STAGE for name in ORDER)


def _index() -> None:
    """The lookups below, from STAGES."""
    global BY_NAME, NAMES, SHARD_STAGES
    BY_NAME = {stage.name: stage for stage in STAGES}
    NAMES = tuple(BY_NAME)
    SHARD_STAGES = tuple(stage.name for stage in STAGES if stage.per_shard)


BY_NAME: dict[str, Stage] = {}
NAMES: tuple[str, ...] = ()
SHARD_STAGES: tuple[str, ...] = ()
_index()


def stage(name: str) -> Stage:
    if name not in BY_NAME:
        raise KeyError(f"no stage {name!r}; the stages are {', '.join(NAMES)}")
    return BY_NAME[name]


def made_by() -> dict[str, str]:
    """Stage -> the stage whose pass makes its outputs too (decode -> features), for those another makes."""
    return {made: spec.name for spec in STAGES for made in spec.also_makes}


def run_stages(*, with_optional: bool = False) -> tuple[Stage, ...]:
    """The stages a whole run runs, in order, those with in_run=False (train) only `with_optional`. A stage
    made in another's pass is left to that pass (decode: in features') unless settings its maker's outputs
    do not depend on shape its own (shots: its detector's): it then runs after its maker, skipping what the
    pass made current, redoing what a change of those settings left stale."""
    makers = made_by()

    def left_to_maker(spec: Stage) -> bool:
        maker = makers.get(spec.name)
        return maker is not None and set(spec.config_sections) <= set(BY_NAME[maker].config_sections)

    return tuple(spec for spec in STAGES if not left_to_maker(spec) and (spec.in_run or with_optional))


def ray_resources() -> dict[str, dict[str, float]]:
    """The Ray roles of every stage with their default resources: executor.ray_resources's defaults."""
    return {role: dict(resources) for spec in STAGES for role, resources in spec.ray_roles.items()}


@contextlib.contextmanager
def register(*stages: Stage) -> Iterator[None]:
    """The registry with `stages` added after the others, for the `with` block: a stage defined outside
    stages/ (a test's) runs through the runner, status, validate and lineage like any other. In this
    process only: a spawned worker (more than one local worker, Ray, Slurm) knows only the stages of ORDER."""
    global STAGES
    for new in stages:
        if new.name in BY_NAME:
            raise ValueError(f"a stage named {new.name!r} exists already")
    before = STAGES
    STAGES = before + tuple(stages)
    _index()
    try:
        yield
    finally:
        STAGES = before
        _index()
