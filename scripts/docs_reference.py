"""The documentation site's reference pages, generated from the code so that they cannot drift from it:

- reference/config.md: every key the config loader accepts, as `section.key`, with its type, its default,
  its bounds, choices and rules (`setting(...)`, pipeline/config_fields.py), and its meaning: the comment
  block above the field and the comment at the end of its line, read from the source;
- reference/schemas.md: every table of schemas/ with its version, where it is written, and each column
  with its Arrow type, whether it may be null and the comments beside it; the Parquet metadata keys
  (schemas/metadata.py) and the codebook's files (schemas/codebook.py).

mkdocs.yml names this file under `hooks:`; `on_files` adds the two pages as files of the site that exist
in memory only, so nothing generated sits in docs/. `python scripts/docs_reference.py OUT` writes them
into OUT instead."""

from __future__ import annotations

import ast
import dataclasses
import html
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
import typing
from pathlib import Path

CONFIG_PAGE = "reference/config.md"
SCHEMAS_PAGE = "reference/schemas.md"


# ---------------------------------------------------------------- comments beside the code


def _comments(source: str) -> tuple[dict[int, str], set[int]]:
    """Line -> the text of its comment, and the lines that hold a comment and nothing else."""
    comments, alone = {}, set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            line = token.start[0]
            comments[line] = token.string.lstrip("#").strip()
            if not token.line[: token.start[1]].strip():
                alone.add(line)
    return comments, alone


class Commented:
    """A piece of source with its comments; `help(node)` is what the comments say about one of its nodes:
    the block of comment lines directly above it (no blank line between), then every comment on its own
    lines (the one at the end of its last line included), joined into one paragraph."""

    def __init__(self, source: str):
        self.source = textwrap.dedent(source)
        self.tree = ast.parse(self.source)
        self.comments, self.alone = _comments(self.source)

    def help(self, node: ast.AST) -> str:
        above = []
        line = node.lineno - 1
        while line in self.alone:
            above.append(self.comments[line])
            line -= 1
        inside = [self.comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in self.comments]
        return " ".join(part for part in [*reversed(above), *inside] if part)


def _of(obj) -> Commented:
    return Commented(inspect.getsource(obj))


# ---------------------------------------------------------------- markdown


def text(value: str) -> str:
    """Plain text safe in a table cell: nothing in it is read as markup, a link or a cell border, except its
    `code spans`, which stay code."""
    parts = re.split(r"(`[^`]+`)", value)
    return "".join(
        part if index % 2 else re.sub(r"([\\`*_\[\]|#])", r"\\\1", html.escape(part, quote=False))
        for index, part in enumerate(parts)
    )


def code(value: str) -> str:
    """An inline code span that holds any text (a backtick in it lengthens the fence; a table keeps the
    pipes of a code span in its cell)."""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", value)), default=0) + 1)
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(cell or " " for cell in row) + " |" for row in rows),
    ]


# ---------------------------------------------------------------- the config


@dataclasses.dataclass
class Key:
    """One key of the config as the loader takes it."""

    key: str  # "decode.fps"; a top-level key alone ("seed")
    type: str
    default: object
    rules: dict
    help: str


def _annotation(cls, name: str) -> str:
    raw = cls.__annotations__.get(name)
    return raw if isinstance(raw, str) else getattr(raw, "__name__", str(raw))


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _section_keys(cls, prefix: str) -> list[Key]:
    """The keys of one section (a dataclass) with the comments beside its fields in its source."""
    source = _of(cls)
    body = next(node for node in source.tree.body if isinstance(node, ast.ClassDef)).body
    helps = {
        node.target.id: source.help(node)
        for node in body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            keys += _section_keys(hints[f.name], f"{prefix}{f.name}.")
            continue
        keys.append(
            Key(f"{prefix}{f.name}", _annotation(cls, f.name), _default(f), dict(f.metadata), helps.get(f.name, ""))
        )
    return keys


def _top_level_helps() -> dict[str, str]:
    """The comments beside the entries of the sections no stage owns (pipeline/sections.py)."""
    from pipeline import sections

    source = _of(sections)
    helps = {}
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in ("LEADING_SECTIONS", "TRAILING_SECTIONS") for t in node.targets
        ):
            for entry in node.value.elts:
                if isinstance(entry, ast.Tuple) and isinstance(entry.elts[0], ast.Constant):
                    helps[entry.elts[0].value] = source.help(entry)
    return helps


@dataclasses.dataclass
class Section:
    name: str  # "" for the top-level keys
    about: str
    keys: list[Key]


def config_sections() -> list[Section]:
    """Every section of the Config in its order (pipeline/config.py assembles them), each with its keys."""
    from pipeline import registry
    from pipeline.config import Config

    owners = {spec.section: spec for spec in registry.STAGES if spec.section}
    top_helps = _top_level_helps()
    hints = typing.get_type_hints(Config)
    top = Section("", "keys of the whole run, outside any section", [])
    found = [top]
    for f in dataclasses.fields(Config):
        kind = hints[f.name]
        if not dataclasses.is_dataclass(kind):
            top.keys.append(
                Key(f.name, _annotation(Config, f.name), _default(f), dict(f.metadata), top_helps.get(f.name, ""))
            )
            continue
        if f.name in owners:
            spec = owners[f.name]
            about = f"the {spec.name} stage's section ({spec.summary}); declared in {inspect.getmodule(kind).__name__}"
        else:
            about = top_helps.get(f.name) or f"a section no stage owns; declared in {inspect.getmodule(kind).__name__}"
        found.append(Section(f.name, about, _section_keys(kind, f"{f.name}.")))
    return found


def config_keys() -> list[str]:
    return [key.key for section in config_sections() for key in section.keys]


def yaml_value(value) -> str:
    """A default as a config file or `--set` writes it (JSON is YAML)."""
    return json.dumps(value, sort_keys=True)


def _rule_text(rule) -> str:
    """A rule's name and the first sentence of its docstring (of the function that made it, for a made one)."""
    name = rule.__qualname__.split(".<locals>")[0]
    maker = getattr(inspect.getmodule(rule), name, None)
    doc = inspect.getdoc(rule) or (inspect.getdoc(maker) if maker is not None else "") or ""
    first = doc.split("\n\n")[0].replace("\n", " ").strip()
    return code(name) + (f": {text(first)}" if first else "")


def bounds_text(key: Key, section: str) -> str:
    """The bounds, choices and rule of a key as one cell."""
    rules = key.rules
    sign = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    parts = []
    for name in ("ge", "gt", "le", "lt"):
        if name in rules:
            limit = rules[name]
            shown = code(f"{section}.{limit}" if section else limit) if isinstance(limit, str) else code(str(limit))
            parts.append(f"{sign[name]} {shown}")
    if "choices" in rules:
        parts.append("one of " + ", ".join(code(str(choice)) for choice in rules["choices"]))
    checks = " and ".join(parts)
    if checks and rules.get("each"):
        checks = f"each item {checks}"
    if checks and rules.get("why"):
        checks += f" {text(rules['why'])}"
    if "rule" in rules:
        checks = "; ".join(filter(None, [checks, "rule " + _rule_text(rules["rule"])]))
    return checks


def config_page() -> str:
    from pipeline.config import MOVED_KEYS

    lines = [
        "# Config reference",
        "",
        "Every key the config loader accepts (generated from the code: the sections' fields, their bounds and the",
        "comments beside them). A YAML config gives a key inside its section (`decode:` then `fps: 25`); `--set`",
        "gives it whole (`--set decode.fps=25`). Every value is checked when the config loads: its type, a finite",
        "number, the bounds and choices below, and the rule named beside a key; a mistake stops the command with one",
        "line naming the key (exit status 2). A default is shown as YAML (JSON is YAML).",
        "",
    ]
    for section in config_sections():
        lines += [
            f"## {section.name or 'Top-level keys'}",
            "",
            text(section.about[:1].upper() + section.about[1:]) + ".",
            "",
        ]
        rows = [
            [
                code(key.key),
                code(key.type),
                code(yaml_value(key.default)),
                bounds_text(key, section.name),
                text(key.help),
            ]
            for key in section.keys
        ]
        lines += table(["key", "type", "default", "bounds and rules", "what it is"], rows) + [""]
    if MOVED_KEYS:
        lines += ["## Keys that moved", "", "A config that gives one is refused, naming where it went.", ""]
        lines += table(["key", "now"], [[code(old), code(new)] for old, new in sorted(MOVED_KEYS.items())]) + [""]
    return "\n".join(lines)


# ---------------------------------------------------------------- the schemas


@dataclasses.dataclass
class _Field:
    help: str
    refs: list[str]  # module-level names the field's call uses (a struct it is made of)


class _SchemaSource:
    """schemas/__init__.py read once: each module-level assignment's fields (pa.field calls) with their
    comments, the names it refers to, and the comment block above it."""

    def __init__(self, module):
        self.module = module
        source = _of(module)
        self.fields: dict[str, dict[str, _Field]] = {}
        self.refs: dict[str, list[str]] = {}
        self.notes: dict[str, str] = {}
        assigns = [
            node
            for node in source.tree.body
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        ]
        names = {node.targets[0].id for node in assigns}
        for node in assigns:
            target = node.targets[0].id
            fields, in_calls = {}, set()
            for call in ast.walk(node.value):
                if _is_field_call(call):
                    refs = [n.id for n in ast.walk(call) if isinstance(n, ast.Name) and n.id in names]
                    fields.setdefault(call.args[0].value, _Field(source.help(call), refs))
                    in_calls |= {id(n) for n in ast.walk(call)}
            self.fields[target] = fields
            self.refs[target] = [
                n.id
                for n in ast.walk(node.value)
                if isinstance(n, ast.Name) and n.id in names and id(n) not in in_calls
            ]
            above = []
            line = node.lineno - 1
            while line in source.alone:
                above.append(source.comments[line])
                line -= 1
            self.notes[target] = " ".join(reversed(above))

    def scopes(self, name: str) -> list[str]:
        """`name` and, transitively, the assignments its value is built from (_clip_key + [...])."""
        found, todo = [], [name]
        while todo:
            current = todo.pop(0)
            if current not in found:
                found.append(current)
                todo += self.refs.get(current, [])
        return found

    def field(self, column: str, scopes: list[str]) -> _Field:
        for scope in scopes:
            if column in self.fields.get(scope, {}):
                return self.fields[scope][column]
        return _Field("", [])

    def resolved(self, help_text: str) -> str:
        """A comment that names a tuple of the module (`one of VIDEO_STATUSES`) gets its values after it."""

        def values(match: re.Match) -> str:
            value = getattr(self.module, match.group(0), None)
            if isinstance(value, tuple) and all(isinstance(item, str) for item in value):
                return f"{match.group(0)} ({', '.join(value)})"
            return match.group(0)

        return re.sub(r"\b[A-Z][A-Z0-9_]{2,}\b", values, help_text)


def _is_field_call(node) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "field"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


def arrow_type(kind) -> str:
    import pyarrow as pa

    plain = {"halffloat": "float16", "float": "float32", "double": "float64"}
    if pa.types.is_fixed_size_list(kind):
        return f"fixed_size_list<{arrow_type(kind.value_type)}>[{kind.list_size}]"
    if pa.types.is_list(kind):
        return f"list<{arrow_type(kind.value_type)}>"
    if pa.types.is_struct(kind):
        return "struct"
    return plain.get(str(kind), str(kind))


def _struct_of(kind):
    import pyarrow as pa

    while pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind):
        kind = kind.value_type
    return kind if pa.types.is_struct(kind) else None


def schema_tables() -> list[tuple[str, object]]:
    """Every table schemas/ declares (a module-level Schema), in the order of the source."""
    import schemas

    return [(name, value) for name, value in vars(schemas).items() if isinstance(value, schemas.Schema)]


def _where(schema) -> list[str]:
    """The files a table is written to, from the stages' records and the work dir's layout."""
    import schemas
    from pipeline import registry
    from pipeline.engine.workdir import WorkDir, part_name

    work = WorkDir("DIR")

    def shown(path) -> str:
        return str(path).replace(part_name(0), "part-NNNNN.parquet")

    found = [
        f"{code(shown(work.part(spec.name, 0, key)))} (the {spec.name} stage)"
        for spec in registry.STAGES
        for key, table_schema in spec.tables.items()
        if table_schema is schema
    ]
    whole = {schemas.MANIFEST: work.manifest, schemas.DEDUP_GROUPS: work.dedup_groups}
    if schema in whole:
        found.append(f"{code(shown(whole[schema]))} (the {schema.name} stage)")
    if schema is schemas.ERRORS:
        found.append(f"{code(shown(work.errors('STAGE', 0)))} (every per-shard stage: its failed videos)")
    return found


def _column_rows(source: _SchemaSource, fields, scopes: list[str], prefix: str = "") -> list[list[str]]:
    rows = []
    for f in fields:
        described = source.field(f.name, scopes)
        rows.append(
            [
                code(prefix + f.name),
                code(arrow_type(f.type)),
                "yes" if f.nullable else "no",
                text(source.resolved(described.help)),
            ]
        )
        struct = _struct_of(f.type)
        if struct is not None:
            inner = [scope for ref in described.refs for scope in source.scopes(ref)] + scopes
            suffix = "." if struct == f.type else "[]."
            rows += _column_rows(source, list(struct), inner, prefix + f.name + suffix)
    return rows


def schemas_page() -> str:
    import schemas
    from schemas import codebook, metadata

    source = _SchemaSource(schemas)
    lines = [
        "# Schema reference",
        "",
        "Every table the stages write (generated from `schemas/`, the contract between stages: the Arrow schemas",
        "and the comments beside their columns). Each data folder holds one table in Parquet parts; every file",
        "records its table and version in its metadata (`videobert.schema`, below), and a change of a column's",
        "meaning or type raises the version. `name[].field` is a field of each item of a list of structs.",
        "",
    ]
    for constant, schema in schema_tables():
        lines += [f"## {schema.name}", "", f"`schemas.{constant}`, version {schema.version} (`{schema.tag}`)."]
        where = _where(schema)
        if where:
            lines += ["", "Written to " + "; ".join(where) + "."]
        notes = source.notes.get(constant)
        if notes:
            lines += ["", text(source.resolved(notes))]
        lines += [""] + table(
            ["column", "type", "null", "what it is"], _column_rows(source, list(schema.arrow), source.scopes(constant))
        )
        lines += [""]
    provenance = _of(metadata.Provenance)
    body = next(node for node in provenance.tree.body if isinstance(node, ast.ClassDef)).body
    helps = {n.target.id: provenance.help(n) for n in body if isinstance(n, ast.AnnAssign)}
    lines += [
        "## Parquet metadata",
        "",
        text(inspect.getdoc(metadata).split("\n\n")[0].replace("\n", " ")),
        f"Each key is `{metadata.PREFIX}<name>`; a stage writes the ones that shape its output, and its own",
        "details (models, devices, seeds) under further keys.",
        "",
    ]
    lines += table(
        ["key", "type", "what it is"],
        [
            [code(metadata.PREFIX + f.name), code(str(f.type)), text(helps.get(f.name, ""))]
            for f in dataclasses.fields(metadata.Provenance)
            if f.name != "extra"
        ],
    )
    lines += [
        "",
        "## The codebook",
        "",
        f"Format version {codebook.VERSION}: `DIR/kmeans/{codebook.FILE_NAME}` and its sidecar "
        f"`DIR/kmeans/{codebook.SIDECAR_NAME}`.",
        "",
        text(inspect.getdoc(codebook).replace("\n", " ")),
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------- the MkDocs hook


def pages() -> dict[str, str]:
    return {CONFIG_PAGE: config_page(), SCHEMAS_PAGE: schemas_page()}


def on_files(files, config):
    """Add the reference pages to the site (in memory: the nav lists them like any page)."""
    from mkdocs.structure.files import File

    for uri, content in pages().items():
        files.append(File.generated(config, uri, content=content))
    return files


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs-reference")
    for uri, content in pages().items():
        (out / uri).parent.mkdir(parents=True, exist_ok=True)
        (out / uri).write_text(content)
        print(out / uri)
