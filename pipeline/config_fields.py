"""The bottom layer of the config: its error, the bounds a field declares beside itself, and the one checker
that reads them. Imports nothing of the project, so that config sections may be declared anywhere (a stage's
own module, a test) and checked the same way.

A section is a dataclass whose fields are made by `setting(default, ...)`: bounds (`ge`/`gt` below,
`le`/`lt` above; a bound may name another field of the section), `choices`, `each` (the bounds apply to
every item of a list) and `rule` (a function for what bounds cannot say, run after the field's bounds).
`check_section` checks a section's fields in order, a field whose bound names another one after that one;
the first broken rule is a ConfigError whose one line names the key."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

MAX_MESSAGE_CHARS = 600  # a config error is one line a person reads
MAX_SHOWN_VALUE_CHARS = 120  # a value quoted in it

# Worker and thread counts: 0 means "the library's or the machine's choice"; more than this is a typo (no
# node has that many cores, and a pool that size would run out of processes or memory before any work)
MAX_WORKERS = 1024
MAX_SEED = 2**32 - 1  # numpy's and ctranslate2's seeds are unsigned 32-bit
FRACTION = {"ge": 0, "le": 1}  # bounds of a share or probability: setting(0.5, **FRACTION)
SEED = {"ge": 0, "le": MAX_SEED}
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")

BOUNDS = ("ge", "gt", "le", "lt")


class ConfigError(ValueError):
    """A config mistake; its message is one line that names the key, of bounded length: a value that is
    too long to show is cut in the middle (its head and tail kept, with how much was left out)."""

    def __init__(self, message: str = ""):
        message = str(message)
        if len(message) > MAX_MESSAGE_CHARS:
            head, tail = MAX_MESSAGE_CHARS * 2 // 3, MAX_MESSAGE_CHARS // 4
            message = f"{message[:head]} ... ({len(message) - head - tail:,} characters left out) ... {message[-tail:]}"
        super().__init__(message)


def shown_value(value) -> str:
    """`value` as a message quotes it (its repr), bounded: a few items of a long list or mapping, a few
    levels of a nested one and the ends of a long string. The cost is bounded too: a nested list built
    from YAML aliases is never walked whole."""
    import reprlib

    shown = reprlib.Repr()  # (keyword arguments only from Python 3.12)
    shown.maxlevel, shown.maxstring, shown.maxlong, shown.maxother = 3, MAX_SHOWN_VALUE_CHARS, 40, MAX_SHOWN_VALUE_CHARS
    shown.maxtuple = shown.maxlist = shown.maxdict = shown.maxset = shown.maxfrozenset = shown.maxdeque = 8
    text = shown.repr(value)
    return text if len(text) <= MAX_SHOWN_VALUE_CHARS else text[: MAX_SHOWN_VALUE_CHARS - 3] + "..."


def has_control_characters(text: str) -> bool:
    """A line break, tab, NUL, escape or DEL: a name shown in a one-line message, or text written into a
    script, must not hold one."""
    return CONTROL_CHARACTERS.search(text) is not None


def finite(value: float, key):
    # NaN passes every comparison test, and inf passes "> 0": both would reach the stages
    if not math.isfinite(value):
        raise ConfigError(f"config error: {key} must be a finite number (got {value!r})")


def one_of(value, choices, key):
    if value not in choices:
        raise ConfigError(f"config error: {key} must be one of {', '.join(choices)} (got {value!r})")


def setting(
    default=dataclasses.MISSING,
    *,
    factory=dataclasses.MISSING,
    ge=None,
    gt=None,
    le=None,
    lt=None,
    choices: tuple[str, ...] | None = None,
    each: bool = False,
    why: str = "",
    rule: Callable | None = None,
):
    """A section field with its rules beside it. `why` follows the bounds in the message ("for S3D");
    `rule(section, prefix)` raises ConfigError for what bounds cannot say (prefix: "decode.")."""
    metadata = {
        name: value
        for name, value in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt), ("choices", choices), ("rule", rule))
        if value is not None
    }
    if each:
        metadata["each"] = True
    if why:
        metadata["why"] = why
    return dataclasses.field(default=default, default_factory=factory, metadata=metadata)


def count(default: int = 0, **rules):
    """A worker or thread count; 0 leaves the choice to the library or the machine."""
    return setting(default, ge=0, le=MAX_WORKERS, **rules)


def _limit(section, bound):
    """A bound's value: a number, or the name of another field of the section."""
    return getattr(section, bound) if isinstance(bound, str) else bound


def _check_bounds(value, section, rules: dict, key: str) -> None:
    if "choices" in rules:
        one_of(value, rules["choices"], key)
    low = next(((name, _limit(section, rules[name])) for name in ("ge", "gt") if name in rules), None)
    high = next(((name, _limit(section, rules[name])) for name in ("le", "lt") if name in rules), None)
    if low is None and high is None:
        return
    broken = (low is not None and (value <= low[1] if low[0] == "gt" else value < low[1])) or (
        high is not None and (value >= high[1] if high[0] == "lt" else value > high[1])
    )
    if broken:
        sign = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
        bounds = " and ".join(f"{sign[name]} {limit}" for name, limit in filter(None, (low, high)))
        why = f" {rules['why']}" if "why" in rules else ""
        raise ConfigError(f"config error: {key} must be {bounds}{why} (got {value!r})")


def _order(fields: list[dataclasses.Field]) -> list[dataclasses.Field]:
    """Declaration order, except that a field whose bound names another field comes after that one."""
    by_name = {f.name: f for f in fields}
    ordered: list[dataclasses.Field] = []

    def visit(f: dataclasses.Field) -> None:
        if f in ordered:
            return
        for bound in BOUNDS:
            if isinstance(f.metadata.get(bound), str):
                visit(by_name[f.metadata[bound]])
        ordered.append(f)

    for f in fields:
        visit(f)
    return ordered


def check_section(section, prefix: str) -> None:
    """Every field's bounds, choices and rule; a nested section (a dataclass value) is checked in turn.
    `prefix` names the section in messages ("decode."; "" at the top level)."""
    for f in _order(list(dataclasses.fields(section))):
        value = getattr(section, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_section(value, f"{key}.")
            continue
        rules = f.metadata
        if value is not None:
            if rules.get("each"):
                for index, item in enumerate(value):
                    _check_bounds(item, section, rules, f"{key}[{index}]")
            else:
                _check_bounds(value, section, rules, key)
        if "rule" in rules:
            rules["rule"](section, prefix)
