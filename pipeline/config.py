"""One YAML file holds every parameter. Loading validates it completely, so that a typo or an impossible
value stops the run at once with one line naming the key (`ConfigError`), not hours later on a cluster.

Sections are dataclasses; a field's annotation is its type, and its bounds and rules stand beside it
(`setting`, pipeline/config_fields.py; the rules that bounds cannot say are in pipeline/config_rules.py).
A stage's own section is in its folder (stages/<name>/__init__.py), named by its record: the Config's
sections are the global ones (pipeline/sections.py) and those of the stages in run order (pipeline/registry.py).
`--set decode.fps=25` overrides are applied before validation."""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import field
from pathlib import Path

import yaml

from pipeline import registry
from pipeline.config_fields import (
    ConfigError,
    check_section,
    finite,
    has_control_characters,
    shown_value,
)
from pipeline.contract import Stage
from pipeline.sections import LEADING_SECTIONS, TRAILING_SECTIONS, Sections

_CLASSES: dict[tuple[str, ...], tuple[tuple[Stage, ...], type]] = {}


def config_class(stages: tuple[Stage, ...]) -> type:
    """The Config dataclass of a registry: the global sections with each stage's own section between them.
    Made once per registry (the same class every time, so that configs pickle by reference)."""
    names = tuple(spec.name for spec in stages)
    made = _CLASSES.get(names)
    if made is None or made[0] != stages:
        made = _CLASSES[names] = (stages, _make_config_class(stages))
    return made[1]


def _make_config_class(stages: tuple[Stage, ...]) -> type:
    own = [(spec.section, spec.function("section_type")) for spec in stages if spec.section]
    taken = {name for name, _, _ in LEADING_SECTIONS + TRAILING_SECTIONS}
    for name, _ in own:
        if name in taken:
            raise ValueError(f"config section {name!r} is named twice (stages' registry records)")
        taken.add(name)
    fields = [*LEADING_SECTIONS, *((name, kind, field(default_factory=kind)) for name, kind in own), *TRAILING_SECTIONS]
    made = dataclasses.make_dataclass("Config", fields, bases=(Sections,))
    made.__module__ = __name__  # found by pickle as pipeline.config.Config
    return made


Config = config_class(registry.STAGES)


def _coerce(value, annotation, key):
    """Check `value` against a field annotation; ints are accepted where floats are expected."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"config error: {key} must be a list (got {shown_value(value)})")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config error: {key} must be a mapping (got {shown_value(value)})")
        return {str(k): _coerce(v, args[1], f"{key}.{k}") for k, v in value.items()}
    if annotation is float:
        if isinstance(value, str):
            try:  # YAML 1.1 reads 1e-5 (no dot) as a string
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config error: {key} must be a number (got {shown_value(value)})")
        try:
            value = float(value)
        except OverflowError:  # an integer beyond any float
            value = math.inf
        finite(value, key)
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config error: {key} must be an integer (got {shown_value(value)})")
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config error: {key} must be true or false (got {shown_value(value)})")
        return value
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"config error: {key} must be a string (got {shown_value(value)})")
        return value
    raise TypeError(f"unsupported annotation {annotation} for {key}")


def _build(cls, data: dict, prefix: str):
    if not isinstance(data, dict):
        raise ConfigError(f"config error: {prefix.rstrip('.') or 'config'} must be a mapping (got {shown_value(data)})")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if f"{prefix}{key}" in MOVED_KEYS:
            raise ConfigError(f"config error: {prefix}{key} moved to {MOVED_KEYS[f'{prefix}{key}']}: give it there")
        if key not in names:
            raise ConfigError(f"config error: unknown key {_shown(f'{prefix}{key}')}{_near_miss(key, names, prefix)}")
    kwargs = {}
    defaults = cls()
    for name in names:
        if name not in data:
            continue
        annotation = hints[name]
        if dataclasses.is_dataclass(annotation):
            # an empty section ("decode:" with every key commented out) reads as None
            section = {} if data[name] is None else data[name]
            kwargs[name] = _build(annotation, section, f"{prefix}{name}.")
        else:
            kwargs[name] = _coerce(data[name], annotation, f"{prefix}{name}")
            if isinstance(kwargs[name], dict):
                # a mapping overrides its defaults key by key: readers find every key
                kwargs[name] = _merged(getattr(defaults, name), kwargs[name])
    return cls(**kwargs)


# keys that moved to another section: refused naming the new place
MOVED_KEYS = {"executor.ray_feature_models": "features.ray_models"}


def _near_miss(key, names: set[str], prefix: str) -> str:
    """ "; did you mean decode.fps?" for a key one typo away from a real one ("" when none is close)."""
    import difflib

    close = difflib.get_close_matches(str(key), sorted(names), n=1, cutoff=0.6)
    return f"; did you mean {prefix}{close[0]}?" if close else ""


def _merged(default: dict, given: dict) -> dict:
    merged = dict(default)
    for key, value in given.items():
        merged[key] = (
            _merged(default[key], value) if isinstance(default.get(key), dict) and isinstance(value, dict) else value
        )
    return merged


def _shown(text) -> str:
    """A file name or key as written in a one-line message: quoted when it holds a line break or the like."""
    text = str(text)
    text = repr(text) if has_control_characters(text) else text
    return text if len(text) <= MAX_SHOWN_NAME_CHARS else f"{text[: MAX_SHOWN_NAME_CHARS - 3]}..."


MAX_SHOWN_NAME_CHARS = 200  # a message line stays readable whatever name it quotes


def _yaml_problem(error: Exception, text: str) -> tuple[tuple[int, int] | None, str]:
    """Where a YAML error is in `text` (line, column: 1-based; None when unknown) and its problem in one line."""
    place = None
    if isinstance(error, yaml.MarkedYAMLError):
        mark = error.problem_mark or error.context_mark
        place = (mark.line + 1, mark.column + 1) if mark else None
        problem = error.problem or error.context
    elif isinstance(error, yaml.reader.ReaderError):  # a character YAML refuses anywhere, e.g. NUL
        line_start = text.rfind("\n", 0, error.position) + 1
        place = (text.count("\n", 0, error.position) + 1, error.position - line_start + 1)
        code = error.character if isinstance(error.character, int) else ord(error.character)
        problem = f"character U+{code:04X} is not allowed in YAML"
    elif isinstance(error, RecursionError):
        problem = "nested too deeply"
    else:
        problem = str(error)
    return place, " ".join(str(problem).split())


# A config is a few hundred lines; YAML aliases (*name) repeat a node without repeating its text, so a
# file of a few hundred bytes can stand for billions of values ("billion laughs"). Its size with every
# alias expanded (characters of scalars, plus one per node) is counted on the parsed node graph, each node
# once, before any value is built: more than this is refused
MAX_EXPANDED_CHARS = 1_000_000
MERGE_TAG = "tag:yaml.org,2002:merge"


def _check_nodes(root: yaml.Node, where: str) -> None:
    """Refuse a YAML node graph whose expansion is absurd, that refers to itself, or whose mapping gives
    a key twice (YAML keeps the last silently: the first is a value the user believes is in effect)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node, key: str) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:
            raise ConfigError(
                f"config error: {where}: {_shown(key.rstrip('.') or 'the config')} is an alias (*name) "
                f"of a node that holds it (line {node.start_mark.line + 1}): a value without end"
            )
        open_nodes.add(id(node))
        total = 1
        if isinstance(node, yaml.ScalarNode):
            total += len(node.value)
        elif isinstance(node, yaml.SequenceNode):
            total += sum(size(item, f"{key.rstrip('.')}[{index}].") for index, item in enumerate(node.value))
        else:
            lines: dict[str, int] = {}
            for key_node, value_node in node.value:
                name = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                if name is not None and key_node.tag != MERGE_TAG:
                    line = key_node.start_mark.line + 1
                    if name in lines:
                        raise ConfigError(
                            f"config error: {where}: key {_shown(key + name)} at line "
                            f"{lines[name]} and line {line}: give it once"
                        )
                    lines[name] = line
                total += size(key_node, key) + size(value_node, f"{key}{name}." if name is not None else key)
        open_nodes.discard(id(node))
        if total > MAX_EXPANDED_CHARS:
            raise ConfigError(
                f"config error: {where}: the config is more than {MAX_EXPANDED_CHARS:,} characters "
                f"with its aliases (*name) expanded ({_shown(key.rstrip('.') or 'the top level')}, "
                f"line {node.start_mark.line + 1}): refused"
            )
        sizes[id(node)] = total
        return total

    size(root, "")


def _safe_load(text: str, where: str):
    """yaml.safe_load, with the node graph checked (_check_nodes) before any value is built."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(node, where)
        return loader.construct_document(node)
    finally:
        loader.dispose()


# a config is a few hundred lines: a file far larger is not one (and /dev/zero would be read until memory ends)
MAX_CONFIG_BYTES = 1 << 20
# Python refuses to read longer integers (int_max_str_digits); its own message advises a Python call
MAX_INT_DIGITS = 4300


def _read_config_file(path) -> dict:
    import os
    import stat

    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(
                f"config error: {_shown(path)} is not a regular file (a folder, device or pipe): "
                f"give the YAML config file"
            )
        if info.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"config error: {_shown(path)} is {info.st_size:,} bytes, more than a config "
                f"can be ({MAX_CONFIG_BYTES:,}): give the YAML config file"
            )
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"config error: cannot read {_shown(path)}: {error.strerror}") from None
    if len(raw) > MAX_CONFIG_BYTES:  # grew while read
        raise ConfigError(
            f"config error: {_shown(path)} is more than {MAX_CONFIG_BYTES:,} bytes: give the YAML config file"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"config error: {_shown(path)} is not a YAML text file (byte {error.start} is not "
            f"UTF-8: {raw[error.start]:#04x}); give the YAML config"
        ) from None
    try:
        data = _safe_load(text, _shown(path))
    except ConfigError:
        raise
    except ValueError as error:  # a number of more than MAX_INT_DIGITS digits
        raise ConfigError(f"config error: {_shown(path)}: {_value_problem(error)}") from None
    except (yaml.YAMLError, RecursionError) as error:
        place, problem = _yaml_problem(error, text)
        where = f"{_shown(path)}:{place[0]}:{place[1]}" if place else _shown(path)
        raise ConfigError(f"config error: {where}: {problem}") from None
    if data is None:  # an empty file: every default
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config error: {_shown(path)} must hold a mapping of sections (decode:, kmeans:, ...) "
            f"at its top level (got a {type(data).__name__})"
        )
    return data


def _apply_override(data: dict, assignment: str) -> None:
    key, equals, raw = assignment.partition("=")
    parts = [part.strip() for part in key.split(".")]
    if not equals or not all(parts):
        raise ConfigError(
            f"config error: --set takes section.key=value, e.g. decode.fps=25 (got {shown_value(assignment)})"
        )
    key = ".".join(parts)
    try:
        value = _safe_load(raw, f"--set {_shown(key)}") if raw != "" else ""
    except ConfigError:
        raise
    except ValueError as error:  # a number of more than MAX_INT_DIGITS digits
        raise ConfigError(
            f"config error: --set {_shown(key)}: the value {shown_value(raw)} ({len(raw):,} "
            f"characters): {_value_problem(error)}"
        ) from None
    except (yaml.YAMLError, RecursionError) as error:
        place, problem = _yaml_problem(error, raw)
        at = f"line {place[0]}, column {place[1]}: " if place else ""
        raise ConfigError(
            f"config error: --set {_shown(key)}: the value {shown_value(raw)} is not valid YAML ({at}{problem}); "
            f"quote a string that holds YAML syntax"
        ) from None
    _set_into(data, parts, value, key)


def _value_problem(error: ValueError) -> str:
    if "integer string conversion" in str(error):
        return f"a number of more than {MAX_INT_DIGITS:,} digits, more than any setting takes"
    return shown_value(str(error))


def _leaves(value, key: str) -> list[str]:
    """The keys a --set value gives: a mapping gives each of its leaves (decode={fps: 10} gives decode.fps)."""
    if isinstance(value, dict) and value:
        return [leaf for name, item in value.items() for leaf in _leaves(item, f"{key}.{name}")]
    return [key]


def _merge(into: dict, value: dict) -> None:
    for name, item in value.items():
        if isinstance(item, dict) and isinstance(into.get(name), dict):
            _merge(into[name], item)
        else:
            into[name] = item


def _set_into(data: dict, parts: list[str], value, key: str) -> None:
    """A mapping set over a mapping is merged into it, key by key: `--set decode={crop: 112}` keeps an
    earlier `--set decode.fps=10` (or the file's fps), as the YAML would."""
    node = data
    for depth, part in enumerate(parts[:-1], 1):
        if node.get(part) is None:  # absent, or an empty section in the file
            node[part] = {}
        node = node[part]
        if not isinstance(node, dict):
            raise ConfigError(
                f"config error: --set {_shown(key)}: {_shown('.'.join(parts[:depth]))} is not a "
                f"section (it holds {shown_value(node)})"
            )
    if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict):
        _merge(node[parts[-1]], json.loads(json.dumps(value)))
    else:
        node[parts[-1]] = value


def check_given_once(overrides) -> None:
    """A key given by two --set options is refused naming both, as a key given twice in the YAML is: the
    first is a value the user believes is in effect."""
    given: dict[str, str] = {}
    for assignment in overrides:
        key, equals, raw = assignment.partition("=")
        if not equals:
            continue  # refused by _apply_override, naming the assignment
        key = ".".join(part.strip() for part in key.split("."))
        try:
            value = _safe_load(raw, f"--set {_shown(key)}") if raw != "" else ""
        except (yaml.YAMLError, RecursionError, ValueError, ConfigError):
            continue  # refused by _apply_override, with the reason
        for leaf in _leaves(value, key):
            earlier = given.get(leaf) or next(
                (given[other] for other in given if other.startswith(leaf + ".") or leaf.startswith(other + ".")), None
            )
            if earlier is not None:
                raise ConfigError(
                    f"config error: {_shown(leaf)} is given twice: --set {_shown(earlier)} "
                    f"and --set {_shown(assignment)}: give it once"
                )
            given[leaf] = assignment


def load_config(path: str | Path | None = None, overrides: list[str] = (), base: dict | None = None) -> Config:
    """`base`: the values to start from instead of the defaults when no file is given (a work dir's
    remembered config, pipeline/remembered.py)."""
    data = (json.loads(json.dumps(base)) if base else {}) if path is None else _read_config_file(path)
    for assignment in overrides:
        _apply_override(data, assignment)
    cfg = _build(config_class(registry.STAGES), data, "")
    check_section(cfg, "")
    return cfg
