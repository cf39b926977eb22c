"""A per-shard stage is its function, its schema and its registry record with its config section: this
module defines one (`sizes`: each video's size in kilobytes, rounded to a step its section sets) and runs it
through the config, the runner (local executor), lineage, status and validate without any other file
knowing it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from work_factory import write_manifest_rows

import schemas
import schemas.metadata
from pipeline import registry
from pipeline.config import ConfigError, load_config
from pipeline.config_fields import ConfigError as FieldError
from pipeline.config_fields import setting
from pipeline.contract import Invalid, Part, ShardResult, Stage
from pipeline.engine.lineage import Lineage
from pipeline.engine.runner import prepare_stage
from pipeline.engine.workdir import WorkDir
from pipeline.executors.local import LocalExecutor
from reports.status import status_text
from reports.validate import validate_work_dir

SIZES = schemas.Schema(
    "sizes",
    1,
    pa.schema(
        [
            pa.field("video_id", pa.string(), nullable=False),
            pa.field("kilobytes", pa.int64(), nullable=False),
        ]
    ),
)


def whole_steps(section, prefix: str) -> None:
    if section.step_kb % section.round_to:
        raise FieldError(
            f"config error: {prefix}step_kb must be a multiple of {prefix}round_to "
            f"(got {section.step_kb} and {section.round_to})"
        )


@dataclass
class SizesConfig:
    step_kb: int = setting(4, gt=0, le=1024)  # sizes are rounded up to a multiple of this
    round_to: int = setting(1, ge=1, le="step_kb", rule=whole_steps)


def run_shard(ctx) -> ShardResult:
    step = ctx.cfg.sizes.step_kb
    rows = [
        {"video_id": video["video_id"], "kilobytes": -(-video["bytes"] // (1024 * step)) * step} for video in ctx.videos
    ]
    return ShardResult(tables={"": pa.Table.from_pylist(rows, schema=SIZES.arrow)})


def sizes_not_negative(part: Part) -> None:
    for row_number, row in enumerate(pq.read_table(part.path).to_pylist()):
        if row["kilobytes"] < 0:
            raise Invalid(f"{part.path}: row {row_number}: {row['kilobytes']} kilobytes")


def never_valid(part: Part) -> None:
    raise Invalid(f"{part.path}: refused by the stage's own check")


SIZES_STAGE = Stage(
    "sizes",
    "each video's size in kilobytes",
    reads=("manifest",),
    config_sections=("sizes",),
    per_shard=True,
    writes="sizes/part-*.parquet",
    tables={"": SIZES},
    run=run_shard,
    section="sizes",
    section_type=SizesConfig,
    ray_roles={"sizes": {"num_cpus": 1}},
    checks={"": (sizes_not_negative,)},
)


@pytest.fixture
def sizes_stage():
    with registry.register(SIZES_STAGE):
        yield SIZES_STAGE


def test_a_registered_stage_owns_its_config_section(sizes_stage):
    cfg = load_config(None, ["sizes.step_kb=8"])
    assert cfg.sizes == SizesConfig(step_kb=8)
    assert "sizes" in cfg.executor.ray_resources  # its Ray role, with its defaults
    with pytest.raises(ConfigError, match=r"^config error: sizes.step_kb must be > 0 and <= 1024 \(got 0\)$"):
        load_config(None, ["sizes.step_kb=0"])
    with pytest.raises(ConfigError, match=r"^config error: sizes.round_to must be >= 1 and <= 4 \(got 5\)$"):
        load_config(None, ["sizes.round_to=5"])
    with pytest.raises(ConfigError, match=r"^config error: sizes.step_kb must be a multiple of sizes.round_to"):
        load_config(None, ["sizes.round_to=3"])
    with pytest.raises(ConfigError, match="unknown key sizes.step; did you mean sizes.step_kb?"):
        load_config(None, ["sizes.step=8"])


def test_outside_the_block_the_stage_and_its_section_are_gone():
    with registry.register(SIZES_STAGE):
        assert registry.stage("sizes") is SIZES_STAGE and "sizes" in registry.SHARD_STAGES
        with pytest.raises(ValueError, match="a stage named 'sizes' exists already"):
            with registry.register(SIZES_STAGE):
                pass
    assert "sizes" not in registry.NAMES and "sizes" not in registry.ray_resources()
    with pytest.raises(ConfigError, match="unknown key sizes"):
        load_config(None, ["sizes.step_kb=8"])
    assert not hasattr(load_config(None), "sizes")


def _run(cfg, work) -> list[dict]:
    prepare_stage(cfg, work, "sizes")
    shards = Lineage(WorkDir(work), cfg).manifest_shards()
    return LocalExecutor(cfg, workers=1).run_shards(work, "sizes", shards, quiet=True)


def test_a_registered_stage_runs_skips_goes_stale_and_validates(sizes_stage, tmp_path):
    work = tmp_path / "work"
    write_manifest_rows(
        work,
        [
            {"video_id": "v0", "uri": "/videos/v0.mp4", "bytes": 10_000, "transcript_uri": None, "shard": 0},
            {"video_id": "v1", "uri": "/videos/v1.mp4", "bytes": 100_000, "transcript_uri": None, "shard": 0},
            {"video_id": "v2", "uri": "/videos/v2.mp4", "bytes": 1, "transcript_uri": None, "shard": 1},
        ],
    )
    cfg = load_config(None, ["sizes.step_kb=4", "executor.workers=1"])

    first = _run(cfg, work)
    assert [stats.get("skipped", False) for stats in first] == [False, False]
    table = pq.read_table(WorkDir(work).part("sizes", 0))
    assert table.to_pylist() == [{"video_id": "v0", "kilobytes": 12}, {"video_id": "v1", "kilobytes": 100}]
    assert schemas.metadata.read(table.schema).schema == "sizes:1"

    assert [stats.get("skipped") for stats in _run(cfg, work)] == [True, True]  # current: skipped
    checker = Lineage(WorkDir(work), cfg)
    assert checker.state("sizes", 0, verify=True).current

    status = status_text(work)
    assert any(line.startswith("sizes") and "2/2" in line for line in status.splitlines()), status
    assert validate_work_dir(work, cfg) == []

    changed = load_config(None, ["sizes.step_kb=8", "executor.workers=1"])  # its own section changed
    assert Lineage(WorkDir(work), changed).state("sizes", 0, verify=True).status == "stale"
    assert any("sizes part 00000 is stale" in problem for problem in validate_work_dir(work, changed))
    redone = _run(changed, work)
    assert all("redone" in stats for stats in redone)
    assert pq.read_table(WorkDir(work).part("sizes", 0)).column("kilobytes").to_pylist() == [16, 104]
    assert validate_work_dir(work, changed) == []

    # another stage's section is not this stage's config: a change of it leaves the shards current
    other = load_config(None, ["sizes.step_kb=8", "decode.fps=25", "executor.workers=1"])
    assert [stats.get("skipped") for stats in _run(other, work)] == [True, True]


def test_a_new_version_of_a_stages_code_makes_its_outputs_stale(tmp_path):
    work = tmp_path / "work"
    write_manifest_rows(
        work, [{"video_id": "v0", "uri": "/videos/v0.mp4", "bytes": 10_000, "transcript_uri": None, "shard": 0}]
    )
    with registry.register(SIZES_STAGE):
        _run(load_config(None, ["executor.workers=1"]), work)
    with registry.register(dataclasses.replace(SIZES_STAGE, version=2)):
        cfg = load_config(None, ["executor.workers=1"])
        state = Lineage(WorkDir(work), cfg).state("sizes", 0, verify=True)
        assert state.status == "stale" and "version 1 of the stage's code, now 2" in state.reason
        assert "redone" in _run(cfg, work)[0]
        assert Lineage(WorkDir(work), cfg).state("sizes", 0, verify=True).current


def test_validate_runs_the_checks_a_record_names(tmp_path):
    work = tmp_path / "work"
    write_manifest_rows(
        work, [{"video_id": "v0", "uri": "/videos/v0.mp4", "bytes": 1, "transcript_uri": None, "shard": 0}]
    )
    strict = dataclasses.replace(SIZES_STAGE, checks={"": (sizes_not_negative, never_valid)})
    with registry.register(strict):
        cfg = load_config(None, ["executor.workers=1"])
        _run(cfg, work)
        assert validate_work_dir(work, cfg) == [f"{WorkDir(work).part('sizes', 0)}: refused by the stage's own check"]
