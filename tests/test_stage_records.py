"""The real stage records (pipeline/registry.py's run order of stages/<name>/): every "module:name" string
resolves to the kind of object its field promises, every per-shard stage has tables and a run function, every
section is the Config's, and reading the records and the config imports no stage's heavy code."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import schemas
from pipeline import registry
from pipeline.config import Config
from pipeline.contract import CODE_FIELDS, Stage, resolve
from pipeline.engine.split import Split

REPO = Path(__file__).resolve().parent.parent
STAGES = registry.STAGES
IDS = [stage.name for stage in STAGES]


def _strings(stage: Stage) -> list[tuple[str, str]]:
    """(field, "module:name") for every string the record names code or a class by."""
    named = [(which, getattr(stage, which)) for which in CODE_FIELDS]
    named += [(f"checks[{table!r}]", check) for table, checks in stage.checks.items() for check in checks]
    return [(which, value) for which, value in named if isinstance(value, str) and value]


def test_the_run_order_is_the_stage_folders_and_their_records_name_them():
    folders = sorted(path.parent.name for path in (REPO / "stages").glob("*/__init__.py"))
    assert sorted(registry.ORDER) == folders
    assert [stage.name for stage in STAGES] == list(registry.ORDER)
    for stage in STAGES:
        assert sys.modules[f"stages.{stage.name}"].STAGE is stage


@pytest.mark.parametrize("stage", STAGES, ids=IDS)
def test_every_string_of_a_record_resolves_to_an_object_of_its_kind(stage):
    for which, named in _strings(stage):
        assert named.count(":") == 1, f"{stage.name}.{which} = {named!r} is not module:name"
        target = resolve(named)
        if which == "section_type":
            assert isinstance(target, type) and dataclasses.is_dataclass(target), f"{stage.name}.{which}"
        elif which == "split":
            assert isinstance(target, Split), f"{stage.name}.{which} = {named!r} is no Split"
        else:
            assert callable(target) and not isinstance(target, type), f"{stage.name}.{which} = {named!r}"


@pytest.mark.parametrize("stage", STAGES, ids=IDS)
def test_a_per_shard_stage_has_tables_and_a_run_function(stage):
    assert stage.run and callable(stage.function("run"))
    if not stage.per_shard:  # whole-collection: one run, its own options; no shard tables
        assert not stage.tables and not stage.also_makes and not stage.split
        assert len({option.name for option in stage.options}) == len(stage.options)
        return
    assert not stage.options and not stage.workers, f"{stage.name}: a per-shard stage takes the shard options"
    assert "" in stage.tables and all(isinstance(schema, schemas.Schema) for schema in stage.tables.values())
    assert stage.run and callable(stage.function("run"))
    assert set(stage.checks) <= set(stage.tables), f"{stage.name} checks a table it does not make"
    assert set(stage.card_configs) <= set(stage.tables)
    for other in stage.also_makes:
        # a stage made in another's pass is per shard and reads nothing its maker does not have: the pass
        # has every input the other's own run would read (shots runs after features, whose pass makes it)
        made = registry.stage(other)
        assert made.per_shard and set(made.reads) <= set(stage.reads) | {"manifest"}
        assert set(made.tables) and not made.also_makes or set(made.also_makes) <= set(stage.also_makes)


@pytest.mark.parametrize("stage", STAGES, ids=IDS)
def test_sections_and_keys_name_the_configs_and_reads_name_earlier_stages(stage):
    hints = typing.get_type_hints(Config)
    cfg = Config()
    if stage.section:
        assert hints[stage.section] is stage.function("section_type")
        assert isinstance(getattr(cfg, stage.section), stage.function("section_type"))
    else:
        assert not stage.section_type
    for section in stage.config_sections:
        assert section in hints and dataclasses.is_dataclass(hints[section]), f"{stage.name}: no section {section}"
    for key in stage.operational_keys + stage.device_keys:
        section, name = key.split(".")
        assert hasattr(getattr(cfg, section), name), f"{stage.name}: no config key {key}"
    for key in stage.operational_keys:
        assert key.split(".")[0] in stage.config_sections
    earlier = IDS[: IDS.index(stage.name)]
    assert all(upstream in earlier for upstream in stage.reads), f"{stage.name} reads {stage.reads}"


def test_ray_roles_belong_to_one_stage_each():
    roles = [role for stage in STAGES for role in stage.ray_roles]
    assert len(roles) == len(set(roles)) and set(registry.ray_resources()) == set(roles)


def test_reading_the_records_and_the_config_imports_no_stage_code_and_no_torch():
    """A stage folder's __init__.py is its record, section and checks: the registry and the config import
    them (every command does) without torch or the stage's run code."""
    script = (
        "import json, sys\nimport pipeline.registry, pipeline.config\n"
        "pipeline.config.load_config()\n"
        "print(json.dumps(sorted(name for name in sys.modules if name.split('.')[0] in "
        "('torch', 'stages', 'speech', 'videobert', 'reports'))))"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    imported = json.loads(done.stdout)
    assert [name for name in imported if not name.startswith("stages")] == []
    assert sorted(imported) == sorted(["stages", *(f"stages.{name}" for name in registry.ORDER)])
