"""The dataset card: what the align shards mean, beside them, for readers that never see their footers.

Hugging Face `datasets` (and most loaders) drop a Parquet file's key-value metadata, where each shard
records its tokenizer, visual vocabulary and codebook (schemas/metadata.py). The card carries them into
any loader, at the work dir's root and never inside a data folder (a file in align/ would break
`read_parquet(DIR/align)` in every reader):

- `DIR/README.md`: a Hugging Face dataset card. Its YAML header names the align shards' features and
  `configs` whose `data_files` point at the shards (`default`: align/part-*.parquet; the other stages'
  folders as further configs), so `load_dataset(DIR)` finds them; its text says what the ids mean.
- `DIR/dataset.json`: the same as JSON: schema and version, tokenizer (name, vocabulary size and
  sha256), visual vocabulary size, codebook (sha256, depth, k, and its sidecar's `warnings` as
  `codebook_warnings`), feature provenance (S3D weights, frame rate, clip length; whether the weights are
  pretrained), the align config, and every shard with its rows and sha256.

Both are made from the current align parts' metadata and completion records, and written by
`python -m pipeline card` and at the end of `python -m pipeline summary`; `status` says when a later align
run has left the card behind."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import yaml

import schemas
from pipeline import registry, storage
from pipeline.engine.lineage import Lineage
from pipeline.engine.records import read_json, relative
from pipeline.engine.workdir import WorkDir

FORMAT = "videobert-dataset:1"
# the align parts' metadata (schemas/metadata.Provenance fields) the card carries; JSON text is parsed
CARRIED = (
    "stage",
    "schema",
    "config",
    "config_hash",
    "feature_provenance_hash",
    "codebook_sha256",
    "visual_vocab_size",
    "tokenizer",
    "tokenizer_vocab_sha256",
    "tokenizer_vocab_size",
    "text_languages",
)
PARSED = ("config", "text_languages")
COLUMNS = {
    "video_id": "the video's id: a slug of its path under the input folder and a 10-digit hash of that path "
    "(a YouCook II manifest: the YouTube id); `manifest/manifest.parquet` maps it to the video's `uri`",
    "segment_index": "the segment's place in its video, from 0, in time order",
    "start_s": "text_video: the start of its sentence(s) (the first word); video_only: the start of its first "
    "clip; seconds from the container's start",
    "end_s": "text_video: the end of its sentence(s) (the last word), which need not be a clip boundary; "
    "video_only: the end of its last clip",
    "kind": "text_video (a sentence and the clips of its span) or video_only (clips nobody speaks over)",
    "text": "the sentence(s); null for video_only",
    "text_ids": "WordPiece ids of the text, without [CLS]/[SEP]; empty for video_only",
    "visual_ids": "visual words of the clips, in clip order: codebook leaf ids in [0, visual_vocab_size)",
    "language": "the language detected (or declared by an imported transcript) for the video",
}
HF_DTYPES = {
    pa.string(): "string",
    pa.large_string(): "large_string",
    pa.bool_(): "bool",
    pa.binary(): "binary",
    pa.large_binary(): "large_binary",
    pa.float16(): "float16",
    pa.float32(): "float32",
    pa.float64(): "float64",
    **{
        getattr(pa, name)(): name for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
    },
}
SIZE_CATEGORIES = (
    (1e3, "n<1K"),
    (1e4, "1K<n<10K"),
    (1e5, "10K<n<100K"),
    (1e6, "100K<n<1M"),
    (1e7, "1M<n<10M"),
    (1e8, "10M<n<100M"),
    (1e9, "100M<n<1B"),
)


def card_configs() -> list[tuple[str, str, str]]:
    """(config name, stage, table) of every data folder the stages' registry records name for the card
    (`card_configs`): the training shards ("default") first, then the folders they were made from, nearest
    first (what each stage reads or makes in its pass), then any other in run order."""
    order: list[str] = []
    nearest = [spec.name for spec in registry.STAGES if "default" in spec.card_configs.values()]
    while nearest:
        name = nearest.pop(0)
        if name not in order and name in registry.BY_NAME:
            order.append(name)
            nearest += [*registry.BY_NAME[name].reads, *registry.BY_NAME[name].also_makes]
    order += [name for name in registry.NAMES if name not in order]
    return [(config, name, table) for name in order for table, config in registry.BY_NAME[name].card_configs.items()]


class CardError(ValueError):
    """No card can be written (no current align shard, or shards that disagree on what their ids mean)."""


# ---------------------------------------------------------------- Arrow types as Hugging Face features


def _hf_type(arrow_type: pa.DataType):
    if pa.types.is_fixed_size_list(arrow_type):
        return {"list": _hf_type(arrow_type.value_type), "length": arrow_type.list_size}
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return {"list": _hf_type(arrow_type.value_type)}
    if pa.types.is_struct(arrow_type):
        return {"struct": hf_features(pa.schema(list(arrow_type)))}
    if arrow_type not in HF_DTYPES:
        raise ValueError(f"no Hugging Face dtype for Arrow type {arrow_type}")
    return {"dtype": HF_DTYPES[arrow_type]}


def hf_features(schema: pa.Schema) -> list[dict]:
    """The `features` list of a dataset card's `dataset_info` (the form `datasets` writes): a plain type is
    {name, dtype}, a list {name, list: <its item>}, nested types nest."""
    features = []
    for field in schema:
        feature = _hf_type(field.type)
        item = feature.get("list")
        if isinstance(item, dict) and set(item) == {"dtype"}:
            feature["list"] = item["dtype"]  # a list of a plain type: `list: int32`
        features.append({"name": field.name, **feature})
    return features


# ---------------------------------------------------------------- the content


def _same_everywhere(values: dict[str, object], what: str):
    distinct = {json.dumps(value, sort_keys=True): (part, value) for part, value in values.items()}
    if len(distinct) > 1:
        (part_a, value_a), (part_b, value_b) = list(distinct.values())[:2]
        raise CardError(
            f"the align shards disagree on {what}: {part_a} has {value_a!r}, {part_b} has {value_b!r} "
            f"(rerun the align stage with one config)"
        )
    return next(iter(distinct.values()))[1] if distinct else None


def collect(work_dir, license: str = "unknown") -> dict:
    """The content of DIR/dataset.json, from the current align parts; CardError when there are none or
    they disagree. `license`: the inputs' licence (the config's `license`)."""
    work = WorkDir(work_dir)
    checker = Lineage(work)
    records = checker.current_records("align")
    if not records:
        raise CardError(f"no current align shards in {work.data_folder('align')}: run the align stage first")
    parts = [(shard, work.part("align", shard)) for shard in records]
    carried: dict[str, dict[str, object]] = {name: {} for name in CARRIED}
    files, kinds = [], {}
    for shard, path in parts:
        name = relative(work, path)
        made = storage.read_metadata(path)
        for field in CARRIED:
            value = getattr(made, field)
            if value is not None:
                carried[field][name] = json.loads(value) if field in PARSED else value
        entry = records[shard]["outputs"][name]
        files.append({"path": name, "rows": entry.get("rows"), "sha256": entry["sha256"]})
        counts = pc.value_counts(storage.read_table(path, columns=["kind"])["kind"]).to_pylist()
        for count in counts:
            kinds[count["values"]] = kinds.get(count["values"], 0) + count["counts"]
    data = {field: _same_everywhere(values, field) for field, values in carried.items()}
    schema_name, _, version = (data["schema"] or f"{schemas.ALIGN.tag}").partition(":")
    codebook = read_json(work.codebook_sidecar) or {}
    # the codebook the shards' visual words index, when it is still the one in kmeans/
    same_codebook = bool(data["codebook_sha256"]) and codebook.get("sha256") == data["codebook_sha256"]
    provenance = codebook.get("feature_provenance") if same_codebook else None
    if provenance is not None and codebook.get("feature_provenance_hash") != data["feature_provenance_hash"]:
        provenance = None
    weights = str(provenance.get("weights")) if provenance and provenance.get("weights") is not None else None
    manifest_shards = len(checker.manifest_shards())
    return {
        "format": FORMAT,
        "license": license,
        "description": "VideoBERT training segments: each ASR sentence with the visual words of its time span, "
        "and video-only segments of visual words where nobody speaks",
        "schema": data["schema"],
        "schema_name": schema_name,
        "schema_version": int(version or 0),
        "columns": {field.name: str(field.type) for field in schemas.ALIGN.arrow},
        # the folders that hold parts: the card's configs
        "data_files": {
            config: f"{relative(work, work.data_folder(stage, table))}/part-*.parquet"
            for config, stage, table in card_configs()
            if any(work.data_folder(stage, table).glob("part-*.parquet"))
        },
        "rows": sum(file["rows"] or 0 for file in files),
        "segments_by_kind": dict(sorted(kinds.items())),
        "shards": {"current": len(parts), "in_manifest": manifest_shards},
        "tokenizer": data["tokenizer"],
        "tokenizer_vocab_size": data["tokenizer_vocab_size"],
        "tokenizer_vocab_sha256": data["tokenizer_vocab_sha256"],
        "text_languages": data["text_languages"],
        "visual_vocab_size": data["visual_vocab_size"],
        "codebook_sha256": data["codebook_sha256"],
        "codebook_depth": codebook.get("depth") if same_codebook else None,
        "codebook_k": codebook.get("k") if same_codebook else None,
        "feature_provenance_hash": data["feature_provenance_hash"],
        "feature_provenance": provenance,
        "weights": weights,
        "pretrained": None if weights is None else not weights.startswith("random"),
        # data that cannot teach, said where the shards' readers look (e.g. most visual words never used)
        "codebook_warnings": list(codebook.get("warnings") or []) if same_codebook else [],
        # what curation left out of the shards or found (reports/curation.py): shot boundaries, quality flags,
        # near-duplicate groups (training keeps each group's representative and never splits a group)
        "curation": _curation(work),
        "vocabulary_layout": {
            "text_ids": "WordPiece ids in [0, tokenizer_vocab_size)",
            "visual_ids": "codebook leaf ids in [0, visual_vocab_size): the bundled trainer's vocabulary puts "
            "visual word v at tokenizer_vocab_size + v and [>] at tokenizer_vocab_size + "
            "visual_vocab_size",
        },
        "stage": data["stage"],
        "config": data["config"],
        "config_hash": data["config_hash"],
        "files": files,
    }


def _curation(work: WorkDir) -> dict:
    from reports.curation import curation_stats

    found = curation_stats(work.root)
    quality = found.get("quality")
    if quality:
        quality = {key: value for key, value in quality.items() if key != "examples"}
    return {
        "shots": found.get("shots"),
        "quality": quality,
        "dedup": {key: found["dedup"][key] for key in ("videos", "groups", "copies")} if found.get("dedup") else None,
    }


def _count(value) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"


def _size_category(rows: int) -> str:
    return next((name for limit, name in SIZE_CATEGORIES if rows < limit), "n>1B")


def yaml_header(data: dict) -> dict:
    """The card's YAML metadata: configs whose data_files are the folders that hold parts, the default
    (align) config's features."""
    configs = [
        {
            "config_name": config,
            **({"default": True} if config == "default" else {}),
            "data_files": [{"split": "train", "path": path}],
        }
        for config, path in data["data_files"].items()
    ]
    header = {
        "pretty_name": "VideoBERT training segments",
        "tags": ["video", "videobert", "visual-tokens", "parquet"],
        "size_categories": [_size_category(data["rows"])],
        "license": data.get("license", "unknown"),
    }
    if data["text_languages"]:
        header["language"] = list(data["text_languages"])
    header["configs"] = configs
    header["dataset_info"] = [{"config_name": "default", "features": hf_features(schemas.ALIGN.arrow)}]
    return header


def markdown(data: dict, work: WorkDir) -> str:
    """The card: the YAML header, then what the shards are, how to load them and what their ids mean."""
    root = str(work.root)
    kinds = ", ".join(f"{count:,} {kind}" for kind, count in data["segments_by_kind"].items())
    lines = [
        "---",
        yaml.safe_dump(yaml_header(data), sort_keys=False, allow_unicode=True).rstrip(),
        "---",
        "",
        "# VideoBERT training segments",
        "",
        f"{data['rows']:,} segments ({kinds}) in {data['shards']['current']} Parquet shard(s), "
        f"`{data['data_files']['default']}`, made by the VideoBERT token pipeline (`python -m pipeline`); "
        f"{data['shards']['current']} of the manifest's {data['shards']['in_manifest']} shard(s) were current "
        f"when this card was written. `dataset.json` beside this card holds everything below as JSON, with "
        f"the sha256 of every shard.",
        "",
        f"Licence: `{data.get('license', 'unknown')}`, the input videos' licence as the config's `license` "
        f"gives it (`unknown` when it was not given).",
        "",
    ]
    if data["pretrained"] is False:
        lines += [
            f"> **NOT pretrained**: the visual words come from S3D features with random weights "
            f"(`{data['weights']}`): they are not semantic. Use these shards to test code, not to train a "
            f"model you mean to use.",
            "",
        ]
    lines += [
        f"> **Codebook**: {warning}." if not warning.endswith(".") else f"> **Codebook**: {warning}"
        for warning in data.get("codebook_warnings") or []
    ]
    if data.get("codebook_warnings"):
        lines.append("")
    lines += [
        "## Loading",
        "",
        "```python",
        "from datasets import load_dataset",
        f'segments = load_dataset({root!r}, split="train")   # this card\'s default config: the align shards',
        "",
        "import pyarrow.dataset, duckdb, polars",
        f"pyarrow.dataset.dataset({root + '/align'!r})",
        f"duckdb.sql(\"SELECT kind, count(*) FROM read_parquet('{root}/align') GROUP BY kind\")",
        f"polars.read_parquet({root + '/align'!r})",
        "```",
        "",
        "The other configs are the earlier stages' tables, one schema per folder: "
        + (
            ", ".join(f"`{config}` (`{path}`)" for config, path in data["data_files"].items() if config != "default")
            or "none yet"
        )
        + ".",
        "",
        f"## Columns (schema `{data['schema']}`)",
        "",
        "| column | type | meaning |",
        "|---|---|---|",
    ]
    lines += [f"| `{name}` | `{kind}` | {COLUMNS.get(name, '')} |" for name, kind in data["columns"].items()]
    tokenizer_sha = (data["tokenizer_vocab_sha256"] or "?")[:16]
    layout = ""
    if data["tokenizer_vocab_size"] and data["visual_vocab_size"]:
        text, visual = data["tokenizer_vocab_size"], data["visual_vocab_size"]
        layout = (
            f" The bundled trainer's vocabulary is the {text:,} WordPiece ids, then visual word v at "
            f"{text:,} + v, then `[>]` at {text + visual:,}."
        )
    codebook = f"depth {data['codebook_depth']}, k {data['codebook_k']}" if data["codebook_depth"] else "shape unknown"
    lines += [
        "",
        "## What the ids mean",
        "",
        f"- `text_ids`: WordPiece ids of `{data['tokenizer']}` ({_count(data['tokenizer_vocab_size'])} tokens, "
        f"vocabulary sha256 {tokenizer_sha}...); text is kept for languages "
        f"{', '.join(data['text_languages'] or []) or '-'}.",
        f"- `visual_ids`: the {_count(data['visual_vocab_size'])} visual words, leaves of the hierarchical k-means "
        f"codebook sha256 {(data['codebook_sha256'] or '?')[:16]}... ({codebook}), fit on S3D clip "
        f"features.{layout}",
        "",
        "## Curation",
        "",
        *_curation_lines(data.get("curation") or {}),
        "",
        "## Provenance",
        "",
        f"- S3D weights: `{data['weights'] or 'unknown'}`; feature provenance "
        f"{data['feature_provenance_hash'] or '?'}"
        + (
            f" ({', '.join(f'{k} {v}' for k, v in sorted(data['feature_provenance'].items()) if k != 'weights')})"
            if set(data["feature_provenance"] or {}) - {"weights"}
            else ""
        ),
        f"- align config (hash {data['config_hash']}): `{json.dumps(data['config'], sort_keys=True)}`",
        "- Streaming the shards into a PyTorch training loop with pyarrow and torch alone: the pipeline's "
        'docs/shards.md, "Reading the shards".',
        "",
    ]
    return "\n".join(lines)


def _curation_lines(curation: dict) -> list[str]:
    quality, dedup, shots = curation.get("quality"), curation.get("dedup"), curation.get("shots")
    lines = []
    if quality:
        reasons = ", ".join(f"{reason} {count}" for reason, count in quality["clips_by_reason"].items()) or "none"
        lines.append(
            f"- Quality: {quality['clips_excluded']:,} of {quality['clips']:,} clips are in no segment (flagged, "
            f"of the reasons in `quality.exclude`); clips flagged: {reasons}."
        )
    if dedup:
        lines.append(
            f"- Near-duplicates: {dedup['groups']:,} group(s) of {dedup['copies'] + dedup['groups']:,} videos "
            f"(`dedup/groups.parquet`): all are in the shards; the bundled trainer trains on one video of each "
            f"group and never puts a group on both sides of a split."
        )
    if shots:
        lines.append(
            f"- Shot boundaries: {shots['boundaries']:,} ({shots['cuts']:,} cuts, {shots['gradual']:,} gradual; "
            f"`shots/part-*.parquet`)."
        )
    return lines or ["- no curation stage has run"]


def write_card(work_dir, license: str = "unknown") -> tuple[Path, Path]:
    """Write DIR/README.md and DIR/dataset.json; returns their paths. CardError: nothing written."""
    work = WorkDir(work_dir)
    data = collect(work, license)
    storage.atomic_write_json(work.card_sidecar, data)
    storage.atomic_write_bytes(work.card, markdown(data, work).encode())
    return work.card, work.card_sidecar


def card_state(work_dir) -> str | None:
    """None without a card; "current" when it names exactly the current align shards; else why not."""
    work = WorkDir(work_dir)
    try:
        card = read_json(work.card_sidecar)
    except ValueError as error:
        return f"unreadable ({error})"
    if card is None:
        return None
    checker = Lineage(work)
    now = {}
    for shard, record in checker.current_records("align").items():
        name = relative(work, work.part("align", shard))
        now[name] = record.get("outputs", {}).get(name, {}).get("sha256")
    written = {entry.get("path"): entry.get("sha256") for entry in card.get("files", [])}
    if now == written:
        return "current"
    changed = sorted(set(now.items()) ^ set(written.items()))
    return (
        f"stale: {len({name for name, _ in changed})} align shard(s) changed since it was written "
        f"(videobert card, or summary, writes it anew)"
    )
