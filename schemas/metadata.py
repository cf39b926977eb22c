"""The second contract between stages: the key-value metadata every Parquet output carries (`videobert.<key>`).

Writers fill a `Provenance`; readers parse one from a file's schema. No other module spells a key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pyarrow as pa

PREFIX = "videobert."


@dataclass(frozen=True)
class Provenance:
    """How a file was made. Every field is optional: a stage fills what shapes its output."""

    stage: str | None = None
    schema: str | None = None  # "<name>:<version>" of the schema written
    config: str | None = None  # canonical JSON of the config sections that shaped it
    config_hash: str | None = None
    # the feature space: S3D weights, fps, clip length, transform, dimension (JSON) and its hash
    feature_provenance: str | None = None
    feature_provenance_hash: str | None = None
    weights: str | None = None  # the S3D weights' identity ("random(...) - NOT pretrained")
    codebook_sha256: str | None = None  # the codebook the visual words index
    codebook_depth: int | None = None
    codebook_k: int | None = None
    visual_vocab_size: int | None = None  # k ** depth
    tokenizer: str | None = None  # the WordPiece vocabulary text_ids index
    tokenizer_vocab_sha256: str | None = None
    tokenizer_vocab_size: int | None = None
    text_languages: str | None = None  # JSON list of the languages whose text was kept
    input: str | None = None  # the manifest's --input
    transcript_root: str | None = None  # the folder the manifest's transcripts may be read from
    extra: dict[str, str] = field(default_factory=dict)  # a stage's own details (models, devices, seeds)

    def to_metadata(self) -> dict[bytes, bytes]:
        """The prefixed key-value pairs of a Parquet schema."""
        values = {name: value for name, value in dataclasses.asdict(self).items() if name != "extra"}
        values.update(self.extra)
        return {(PREFIX + name).encode(): str(value).encode() for name, value in values.items() if value is not None}

    def merged(self, **changes) -> Provenance:
        return dataclasses.replace(self, **changes)


_FIELDS = {f.name: f for f in dataclasses.fields(Provenance) if f.name != "extra"}


def read(schema: pa.Schema) -> Provenance:
    """The provenance of a Parquet file's (or a table's) schema; keys it does not know go to `extra`."""
    known, extra = {}, {}
    for key, value in (schema.metadata or {}).items():
        key, value = key.decode(), value.decode()
        if not key.startswith(PREFIX):
            continue
        name = key[len(PREFIX) :]
        if name in _FIELDS:
            known[name] = int(value) if _FIELDS[name].type == "int | None" and value != "" else value
        else:
            extra[name] = value
    return Provenance(**known, extra=extra)
