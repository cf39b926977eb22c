"""The work dir remembers its config: every command that writes a work dir records the resolved config it
ran with (DIR/_state/config.json, every key, so it is also a config file: JSON is YAML), and a later
command without --config starts from it instead of the built-in defaults, its --set values applied on
top. So a `--set kmeans.depth=2` given to kmeans holds for quantize after it, and leaving out --config
never silently switches a run to the paper's values.

A --config or --set that differs from the remembered config is named, key by key, with the stages whose
outputs it would redo (the stages whose config sections hold the keys, and every stage reading theirs),
before the command runs."""

from __future__ import annotations

import json
import time

from pipeline import registry, storage
from pipeline.config import Config, ConfigError, load_config
from pipeline.engine.lineage import changed_keys, flatten
from pipeline.engine.records import CorruptFile, read_json
from pipeline.engine.workdir import WorkDir

SHOWN_KEYS = 4  # keys named in the one-line notice; more are counted


def remembered(work_dir) -> dict | None:
    """The config the work dir remembers (a full config mapping), or None when it remembers none."""
    if work_dir is None:
        return None
    try:
        record = read_json(WorkDir(work_dir).remembered_config)
    except (CorruptFile, OSError):
        return None  # an unreadable record is no memory: the command's own config is used and recorded anew
    config = (record or {}).get("config")
    return config if isinstance(config, dict) else None


HISTORY_KEPT = 100  # configs kept in the history (the oldest beyond are dropped)


def history_path(work_dir):
    """The configs commands that succeeded here ran with, oldest first, one entry per change."""
    return WorkDir(work_dir).state / "config_history.json"


def history(work_dir) -> list[dict]:
    try:
        found = read_json(history_path(work_dir))
    except (CorruptFile, OSError):
        return []
    entries = (found or {}).get("entries")
    return [entry for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else []


def record(work_dir, cfg: Config, command: str) -> None:
    """Remember `cfg` as the work dir's config (after its command succeeded, or, for a stage, made at least
    one shard with it); a config other than the last one recorded is added to the history."""
    now = time.time()
    config = cfg.to_dict()
    storage.atomic_write_json(WorkDir(work_dir).remembered_config, {"config": config, "written_by": command, "at": now})
    entries = history(work_dir)
    if entries and entries[-1].get("config") == config:
        return
    entries.append({"config": config, "written_by": command, "at": now})
    storage.atomic_write_json(history_path(work_dir), {"entries": entries[-HISTORY_KEPT:]})


def _when(at) -> str:
    from pipeline.progress import timestamp

    return timestamp(at) if isinstance(at, (int, float)) else "?"


def show(work_dir) -> str | None:
    """The remembered config as YAML (a config file: `--config` takes it), under a comment saying which
    command recorded it and when; None when the work dir remembers none."""
    import yaml

    try:
        found = read_json(WorkDir(work_dir).remembered_config)
    except (CorruptFile, OSError):
        found = None
    config = (found or {}).get("config")
    if not isinstance(config, dict):
        return None
    head = (
        f"# the config {WorkDir(work_dir).remembered_config} remembers: recorded by "
        f"{found.get('written_by', '?')} at {_when(found.get('at'))}"
    )
    return head + "\n" + yaml.safe_dump(config, sort_keys=False).rstrip()


def _differences(old: dict, new: dict) -> list[str]:
    old_flat, new_flat = flatten(old, keep_empty=True), flatten(new, keep_empty=True)
    return [f"{key}: {_value(old_flat, key)} -> {_value(new_flat, key)}" for key in changed_keys(old_flat, new_flat)]


def diff_text(work_dir, cfg: Config | None) -> str | None:
    """`cfg` against the remembered config, key by key, with the stages it would redo; without `cfg`, the
    remembered config against the one before it in the history. None when nothing is remembered."""
    old = remembered(work_dir)
    if old is None:
        return None
    if cfg is None:
        entries = history(work_dir)
        if len(entries) < 2:
            return "no earlier config in the history: the remembered config is the only one used here"
        before, after = entries[-2], entries[-1]
        lines = _differences(before["config"], after["config"])
        head = (
            f"the remembered config ({after.get('written_by', '?')}, {_when(after.get('at'))}) against the "
            f"one before it ({before.get('written_by', '?')}, {_when(before.get('at'))}):"
        )
        return "\n".join([head, *(f"  {line}" for line in lines)])
    lines = _differences(old, cfg.to_dict())
    if not lines:
        return "the config given is the one this work dir remembers: no differences"
    keys = changed_keys(flatten(old, keep_empty=True), flatten(cfg.to_dict(), keep_empty=True))
    work = WorkDir(work_dir)
    made = [stage for stage in stages_redone(keys) if _made(work, stage)]
    redo = f"a run with it redoes {', '.join(made)}" if made else "no output made so far depends on them"
    return "\n".join(
        [
            f"the config given against the one this work dir remembers ({len(lines)} key"
            f"{'s' if len(lines) != 1 else ''}; {redo}):",
            *(f"  {line}" for line in lines),
        ]
    )


def history_text(work_dir) -> str | None:
    """One line per config recorded here, oldest first: when, by which command, what changed."""
    entries = history(work_dir)
    if not entries:
        return None
    lines = []
    for index, entry in enumerate(entries):
        if index == 0:
            what = "first config"
        else:
            changed = changed_keys(
                flatten(entries[index - 1]["config"], keep_empty=True), flatten(entry["config"], keep_empty=True)
            )
            what = ", ".join(changed[:SHOWN_KEYS]) + (
                f" and {len(changed) - SHOWN_KEYS} more" if len(changed) > SHOWN_KEYS else ""
            )
        lines.append(f"{index + 1:>3}  {_when(entry.get('at'))}  {entry.get('written_by', '?'):<10} {what}")
    return "\n".join(lines)


def stages_redone(keys: list[str]) -> list[str]:
    """The stages, in run order, whose outputs a change of these keys makes stale: those whose config
    sections hold a key that shapes what they make (not an operational one), and every stage downstream."""
    redone: set[str] = set()
    for stage in registry.STAGES:
        for key in keys:
            if key.split(".")[0] in stage.config_sections and key not in stage.operational_keys:
                redone.add(stage.name)
        if any(upstream in redone for upstream in stage.reads):
            redone.add(stage.name)
        if any(other in redone for other in stage.also_makes):  # features makes decode's files too
            redone.add(stage.name)
    return [name for name in registry.NAMES if name in redone]


def _made(work: WorkDir, stage: str) -> bool:
    """Whether the work dir holds outputs of this stage (any completion record)."""
    spec = registry.stage(stage)
    if spec.per_shard:
        return any(True for _ in work.records_folder(stage).glob("part-*.json"))
    # a whole-collection stage: its completion record, or its folder (training keeps checkpoints, no record)
    return work.record(stage).exists() or (work.root / stage).exists()


def _value(flat: dict, key: str) -> str:
    return json.dumps(flat.get(key), default=str) if key in flat else "(absent)"


DIFFERS = "config: differs"  # how the note that the config differs from the remembered one begins


def difference_line(work_dir, old: dict, cfg: Config) -> str | None:
    """One line naming the keys in which `cfg` differs from the remembered config and what it redoes."""
    old_flat, new_flat = flatten(old, keep_empty=True), flatten(cfg.to_dict(), keep_empty=True)
    keys = changed_keys(old_flat, new_flat)
    if not keys:
        return None
    shown = ", ".join(f"{key} {_value(old_flat, key)} -> {_value(new_flat, key)}" for key in keys[:SHOWN_KEYS])
    more = f" and {len(keys) - SHOWN_KEYS} more" if len(keys) > SHOWN_KEYS else ""
    work = WorkDir(work_dir)
    made = [stage for stage in stages_redone(keys) if _made(work, stage)]
    redo = f"a run with it redoes {', '.join(made)}" if made else "no output made so far depends on them"
    return f"{DIFFERS} from the one this work dir remembers ({work.remembered_config}) in {shown}{more}; {redo}"


def resolve(args, writes: bool) -> tuple[Config, list[str]]:
    """The command's config and the notes to print about it. Without --config, the work dir's remembered
    config is the base (its --set values on top); the defaults only where it remembers none."""
    old = remembered(getattr(args, "work_dir", None)) if args.config is not None or args.set or writes else None
    if args.config is None and old is not None:
        try:  # the remembered config alone (a version that renamed a key may not read it)
            load_config(None, [], base=old)
        except ConfigError as error:
            raise ConfigError(
                f"{error} (in the config {WorkDir(args.work_dir).remembered_config} remembers; "
                f"give --config to use another)"
            ) from None
        cfg = load_config(None, args.set, base=old)
        notes = [
            f"config: this work dir's ({WorkDir(args.work_dir).remembered_config}, the last one used here; "
            f"--config FILE to use another)"
        ]
    else:
        cfg = load_config(args.config, args.set)
        notes = []
    if old is not None:
        line = difference_line(args.work_dir, old, cfg)
        if line:
            notes.append(line)
    return cfg, notes
