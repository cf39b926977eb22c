"""Lineage and integrity: what every output was made from, and whether it is still what its inputs make now.

A completion record (JSON under DIR/_state/done, written last and atomically) says of one shard of one stage,
or of a whole-collection stage (manifest, kmeans):
- `lineage`: the config sections that shape the output, the output schemas, the digest of the shard's
  manifest rows, the digest of every upstream output it read (by content: the sha256 of the files), and
  the identities of whatever else shapes it (S3D weights, the speech model, the tokenizer, transcripts);
- `outputs`: every file it wrote, relative to the work dir, with its sha256, size and row count;
- the shard's counts for status and summary (top-level keys).

A shard is *current* when it has a record, the record's lineage equals the lineage its inputs and config
give now, and its inputs are current too (followed along the same shard; a whole-collection input such as
the codebook counts by its record's digest). Otherwise it is *missing*, *stale* (with the reason: which
config key, input or identity changed) or *corrupt* (a file's bytes no longer match its record, or the
record itself is unreadable). Stages redo what is not current; readers use only what is.

Without a config (`status`, `validate DIR`), config values and identities are taken from the records
themselves: what is checked is that the chain is consistent (every record made from the upstream outputs
that exist now). Reading a record and checking the files it lists: pipeline/engine/records.py."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import registry, storage
from pipeline.contract import Stage
from pipeline.engine.records import CorruptFile, parquet_rows, read_record, relative, verify_file, verify_outputs
from pipeline.engine.workdir import STATE, WorkDir

VERSION = 1  # bump when a code change alters what a stage makes from the same inputs
EXTERNAL = "external"  # lineage of parts made outside the stages (synthetic training data, tests)


class InputNotReady(Exception):
    """A stage cannot run (yet): an input it reads is missing, stale or corrupt. One line, with the fix."""


# ---------------------------------------------------------------- files and digests


def text_digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def rows_digest(rows: list[dict]) -> str:
    """The identity of a shard's videos: their ids (paths relative to the input), sizes and content tags
    (a file rewritten in place with the same size has a new modification time or ETag). Not their
    absolute URIs: moving the input folder redoes nothing; a transcript is identified by its content in
    the asr stage's identities."""
    return text_digest(
        sorted(
            (
                {
                    "video_id": row["video_id"],
                    "bytes": row["bytes"],
                    **({"content_tag": row["content_tag"]} if row.get("content_tag") else {}),
                }
                for row in rows
            ),
            key=lambda row: row["video_id"],
        )
    )


def output_entry(work: WorkDir, path: Path, rows: int | None = None, written: dict | None = None) -> dict:
    """What a record says of one file it wrote (`written`: its {"sha256", "bytes"} as the writer saw them;
    else read back)."""
    entry = dict(written) if written else {"sha256": storage.file_sha256(path), "bytes": path.stat().st_size}
    if rows is not None:
        entry["rows"] = rows
    return {relative(work, path): entry}


def data_digest(record: dict) -> str:
    """The identity of what a stage wrote for its readers: the digest of its data files' sha256s (the
    per-video error tables are state, not data)."""
    outputs = record.get("outputs", {})
    return text_digest({name: entry["sha256"] for name, entry in outputs.items() if not name.startswith(STATE + "/")})


# ---------------------------------------------------------------- states


@dataclass
class State:
    status: str  # current | missing | stale | corrupt
    reason: str = ""  # why it is not current, one line
    record: dict | None = None

    @property
    def current(self) -> bool:
        return self.status == "current"


def flatten(value, prefix: str = "", *, keep_empty: bool = False) -> dict[str, object]:
    """A nested mapping as {"section.key": value}; `keep_empty`: an empty mapping is a value of its own."""
    if isinstance(value, dict) and (value or not keep_empty):
        flat = {}
        for key, inner in value.items():
            flat.update(flatten(inner, f"{prefix}{key}.", keep_empty=keep_empty))
        return flat
    return {prefix.rstrip("."): value}


def changed_keys(old_flat: dict, new_flat: dict) -> list[str]:
    """The keys, sorted, whose values differ between two flattened mappings (absent counts as a value)."""
    return [key for key in sorted(set(old_flat) | set(new_flat)) if old_flat.get(key) != new_flat.get(key)]


def explain(old: dict | None, new: dict) -> str:
    """Why a record's lineage differs from the one its inputs and config give now, in one line."""
    if not old or old.get("version") != new.get("version"):
        return "made by an earlier version of the pipeline"
    was, now = (lineage.get("stage_version", 1) for lineage in (old, new))  # absent: version 1
    if was != now:
        return f"made by version {was} of the stage's code, now {now}"
    reasons = []
    old_config, new_config = flatten(old.get("config", {})), flatten(new.get("config", {}))
    changed = changed_keys(old_config, new_config)
    if changed:
        reasons.append(
            "config "
            + ", ".join(f"{key} {old_config.get(key)!r} -> {new_config.get(key)!r}" for key in changed[:3])
            + (" ..." if len(changed) > 3 else "")
        )
    if old.get("manifest") != new.get("manifest"):
        reasons.append("its videos in the manifest changed")
    for name in sorted(set(old.get("inputs", {})) | set(new.get("inputs", {}))):
        if old.get("inputs", {}).get(name) != new.get("inputs", {}).get(name):
            reasons.append(f"its {name} input changed")
    for name in sorted(set(old.get("identities", {})) | set(new.get("identities", {}))):
        if old.get("identities", {}).get(name) != new.get("identities", {}).get(name):
            reasons.append(f"{name} changed")
    if old.get("schemas") != new.get("schemas"):
        reasons.append("its output schema changed")
    return "; ".join(reasons) or "its lineage changed"


def shard_label(stage: str, shard: int | None) -> str:
    return stage if shard is None else f"{stage} part {shard:05d}"


# ---------------------------------------------------------------- the checker


@dataclass
class Lineage:
    """Lineage checks in one work dir, for one config (None: check consistency only)."""

    work: WorkDir
    cfg: object = None
    _videos: dict[int, list[dict]] = field(default_factory=dict)
    _records: dict[str, dict | None] = field(default_factory=dict)

    def __post_init__(self):
        self.work = WorkDir(self.work)

    # ------------------------------------------------ records

    def record(self, stage: str, shard: int | None = None) -> dict | None:
        if not storage.is_remote(self.work.root):
            return read_record(self.work.record(stage, shard), stage)  # parsed once per mtime and size
        # on object storage every read is a request: a check reads each record once
        key = f"{stage}:{shard}"
        if key not in self._records:
            self._records[key] = read_record(self.work.record(stage, shard), stage)
        return self._records[key]

    def manifest_record(self) -> dict:
        record = self.record("manifest")
        if record is None:
            raise InputNotReady(f"{self.work.manifest} has no completion record: run the manifest stage first")
        return record

    def manifest_shards(self) -> list[int]:
        return sorted(int(shard) for shard in self.manifest_record()["shards"])

    def shard_videos(self, shard: int) -> list[dict]:
        """This shard's manifest rows (read through the row groups' statistics, not the whole manifest),
        checked against the digest the manifest's record holds for them."""
        if shard not in self._videos:
            expected = self.manifest_record()["shards"].get(str(shard))
            if expected is None:
                raise InputNotReady(f"shard {shard} is not in the manifest ({self.work.manifest})")
            try:
                table = storage.read_table(self.work.manifest, filters=[("shard", "=", shard)])
            except (OSError, ValueError) as error:  # storage.UnreadableFile is a ValueError
                raise CorruptFile(f"cannot read {self.work.manifest}: {error}") from None
            rows = sorted(table.to_pylist(), key=lambda row: row["video_id"])
            if rows_digest(rows) != expected:
                raise CorruptFile(
                    f"{self.work.manifest}: the rows of shard {shard} do not match its record: "
                    f"the manifest was changed or is corrupt; rerun the manifest stage"
                )
            self._videos = {shard: rows}  # one shard at a time: memory stays bounded
        return self._videos[shard]

    # ------------------------------------------------ expected lineage

    def identities(self, stage: Stage, shard: int | None) -> dict:
        if not stage.identities:
            return {}
        # a stage's function hashes model files once per process (they are the same for every shard);
        # per-video parts (transcripts) depend on the shard's rows
        return stage.function("identities")(self.cfg, self.shard_videos(shard) if shard is not None else [])

    def expected(self, stage_name: str, shard: int | None = None, *, record: dict | None = None) -> dict:
        """The lineage an output of `stage_name` (one shard, or the whole stage) made now would have.
        Raises InputNotReady when an input it reads is not current. Without a config, the config values
        and identities are those of `record` (consistency only)."""
        stage = registry.stage(stage_name)
        lineage = {"version": VERSION, "schemas": {name: schema.tag for name, schema in stage.tables.items()}}
        if stage.version != 1:
            lineage["stage_version"] = stage.version
        if self.cfg is not None:
            config = json.loads(self.cfg.section_json(*stage.config_sections))
            for key in stage.operational_keys:
                section, name = key.split(".")
                config[section].pop(name, None)
            lineage["config"] = config
        else:
            lineage["config"] = (record or {}).get("lineage", {}).get("config", {})
        inputs = {}
        for upstream in stage.reads:
            if upstream == "manifest":
                continue
            if registry.stage(upstream).per_shard and shard is not None:
                inputs[upstream] = self._current_digest(upstream, shard, stage_name, shard)
            elif registry.stage(upstream).per_shard:
                inputs[upstream] = {
                    str(s): self._current_digest(upstream, s, stage_name, None) for s in self.manifest_shards()
                }
            else:
                inputs[upstream] = self._global_digest(upstream, stage_name, shard)
        lineage["inputs"] = inputs
        if shard is not None:
            lineage["manifest"] = self._manifest_digest(shard, stage_name)
        if self.cfg is not None:
            lineage["identities"] = self.identities(stage, shard)
        else:
            lineage["identities"] = (record or {}).get("lineage", {}).get("identities", {})
        return lineage

    def _manifest_digest(self, shard: int, reader: str) -> str:
        digest = self.manifest_record()["shards"].get(str(shard))
        if digest is None:
            raise InputNotReady(f"{reader} part {shard:05d}: shard {shard} is not in the manifest")
        return digest

    def _current_digest(self, stage: str, shard: int, reader: str, reader_shard: int | None) -> str:
        state = self.state(stage, shard)
        if not state.current:
            raise InputNotReady(
                f"{shard_label(reader, reader_shard)} needs {shard_label(stage, shard)}, "
                f"which is {state.status}{f' ({state.reason})' if state.reason else ''}: "
                f"run the {stage} stage first"
            )
        return data_digest(state.record)

    def _global_digest(self, stage: str, reader: str, reader_shard: int | None) -> str:
        try:
            record = self.record(stage)
        except CorruptFile as error:
            raise InputNotReady(
                f"{shard_label(reader, reader_shard)} needs the {stage} stage's output: {error}; run the {stage} stage"
            ) from None
        if record is None:
            raise InputNotReady(
                f"{shard_label(reader, reader_shard)} needs the {stage} stage's output, "
                f"which is missing: run the {stage} stage first"
            )
        return data_digest(record)

    # ------------------------------------------------ states

    def state(self, stage: str, shard: int | None = None, *, verify: bool | str = False) -> State:
        """Where one shard (or a whole-collection stage) stands. `verify` also re-hashes its files;
        "size" only compares their sizes (cheap enough for `status` on a large run)."""
        where = self.work.record(stage, shard)
        try:
            record = self.record(stage, shard)
        except CorruptFile as error:
            return State("corrupt", str(error))
        if record is None:
            return State("missing")
        own = record.get("lineage") or {}
        if own.get(EXTERNAL):
            pass  # made outside the stages: nothing to recompute, only its files to verify
        elif stage == "manifest":
            if self.cfg is not None and own.get("config") != json.loads(self.cfg.section_json("shards")):
                return State(
                    "stale", explain(own, {**own, "config": json.loads(self.cfg.section_json("shards"))}), record
                )
        else:
            try:
                expected = self.expected(stage, shard, record=record)
            except InputNotReady as error:
                return State("stale", f"an input is not current: {error}", record)
            except CorruptFile as error:
                return State("stale", str(error), record)
            if own != expected:
                return State("stale", explain(own, expected), record)
        if verify:
            problem = verify_outputs(self.work, record, str(where), hashes=verify is True)
            if problem:
                return State("corrupt", problem, record)
        return State("current", "", record)

    def current(self, stage: str, shard: int | None = None) -> bool:
        return self.state(stage, shard).current

    def stage_states(self, stage: str, *, verify: bool | str = False) -> dict[int, State]:
        """The state of every manifest shard of a per-shard stage."""
        return {shard: self.state(stage, shard, verify=verify) for shard in self.manifest_shards()}

    def require_current(self, stage: str, reader: str) -> dict[int, dict]:
        """Every manifest shard of `stage` must be current for a whole-collection `reader` (kmeans, train):
        shard -> record. Otherwise InputNotReady naming the first shard that is not, and how many."""
        states = self.stage_states(stage)
        behind = {shard: state for shard, state in states.items() if not state.current}
        if behind:
            shard, state = next(iter(behind.items()))
            more = f" (and {len(behind) - 1} more of {len(states)} shards)" if len(behind) > 1 else ""
            raise InputNotReady(
                f"{reader} needs every {stage} shard current: {stage} part {shard:05d} is "
                f"{state.status}{f' ({state.reason})' if state.reason else ''}{more}; "
                f"run the {stage} stage first"
            )
        return {shard: state.record for shard, state in states.items()}

    def current_parts(self, stage: str, table: str = "") -> list[tuple[int, Path]]:
        """(shard, path) of the current outputs of a per-shard stage, in shard order: what readers use
        (a killed run's file without a record, or a stale one, does not count)."""
        return [(shard, self.work.part(stage, shard, table)) for shard in self.current_records(stage)]

    def current_records(self, stage: str) -> dict[int, dict]:
        """shard -> record of the current shards of a per-shard stage (for status, summary, report)."""
        try:
            shards = self.manifest_shards()
        except InputNotReady:
            return {}
        states = {shard: self.state(stage, shard) for shard in shards}
        return {shard: state.record for shard, state in states.items() if state.current}

    def verified(self, stage: str, shard: int | None, path: Path) -> Path:
        """`path`, an output of a current record, after checking its bytes against the record."""
        record = self.record(stage, shard)
        if record is None:
            raise InputNotReady(f"{path} has no completion record: run the {stage} stage first")
        verify_file(self.work, record, path, str(self.work.record(stage, shard)))
        return path


def write_record(work: WorkDir, stage: str, shard: int | None, lineage: dict, outputs: dict, stats: dict) -> Path:
    """The completion record: written last, atomically; its presence marks the work done."""
    path = WorkDir(work).record(stage, shard)
    storage.atomic_write_json(
        path,
        {
            **stats,
            "stage": stage,
            **({"shard": shard} if shard is not None else {}),
            "lineage": lineage,
            "outputs": outputs,
        },
    )
    return path


def external_lineage(made_by: str) -> dict:
    return {EXTERNAL: made_by, "version": VERSION}


def record_external(work_dir, stage: str, shard: int | None, made_by: str, stats: dict | None = None) -> Path:
    """The completion record of parts written outside the stages (synthetic training data, hand-made test
    inputs): it vouches for the bytes of the stage's files that exist, says who made them, names no inputs."""
    work = WorkDir(work_dir)
    spec = registry.stage(stage)
    outputs = {}
    for table in spec.tables:
        path = work.part(stage, shard, table)
        if path.exists():
            outputs.update(output_entry(work, path, parquet_rows(path)))
    if shard is not None and work.errors(stage, shard).exists():
        outputs.update(output_entry(work, work.errors(stage, shard), parquet_rows(work.errors(stage, shard))))
    return write_record(work, stage, shard, external_lineage(made_by), outputs, stats or {})
