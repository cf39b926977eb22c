"""The config rules that bounds cannot say: a key's form, consistency between keys. Each is a function
(section, prefix) named by its field (`setting(..., rule=...)`), run after that field's bounds; a broken rule
is a ConfigError whose one line names the key. Here: the rules of pipeline/config.py's sections and those
several stages share; a rule only one stage uses is in its folder (stages/<name>/__init__.py)."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.config_fields import ConfigError, has_control_characters, one_of, shown_value

# executor.slurm_* strings are written bare into #SBATCH lines: these are the forms sbatch takes for them,
# and none can hold a space, a quote, a "#" or a line break that would end the directive or add another
SLURM_VALUES = {
    "slurm_partition": (
        r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*",
        "a partition name, or names separated by commas (letters, digits, _ . -)",
    ),
    "slurm_time": (
        r"\d+(-\d+)?(:\d+){0,2}|UNLIMITED|INFINITE",
        "a Slurm time limit such as 90, 04:00:00 or 2-00:00:00",
    ),
    "slurm_mem": (r"\d+[KMGTkmgt]?", "a Slurm memory size such as 16G or 16000M"),
}


# ---------------------------------------------------------------- rules of one key


def licence(top, prefix: str) -> None:
    """A licence identifier as a dataset card's `license:` takes (SPDX-like: letters, digits, . + -)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+-]{0,63}", top.license):
        raise ConfigError(
            f"config error: license must be a licence identifier such as cc-by-4.0, apache-2.0, "
            f"other or unknown (got {top.license!r})"
        )


def slurm_word(name: str):
    """executor.<name> must have the form sbatch takes for it (SLURM_VALUES)."""
    pattern, form = SLURM_VALUES[name]

    def rule(ex, prefix: str) -> None:
        value = getattr(ex, name)
        if value is not None and not re.fullmatch(pattern, value, re.ASCII):
            raise ConfigError(f"config error: {prefix}{name} must be {form} (got {value!r})")

    return rule


def sbatch_lines(ex, prefix: str) -> None:
    for index, line in enumerate(ex.slurm_extra):
        # bash reads these lines as comments, sbatch as options: they stay harmless while each is one line
        if not line.startswith("#SBATCH ") or has_control_characters(line):
            raise ConfigError(
                f"config error: {prefix}slurm_extra[{index}] must be one line starting with '#SBATCH ' (got {line!r})"
            )


def device_of_model(section, prefix: str) -> None:
    if not (section.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", section.device)):
        raise ConfigError(f"config error: {prefix}device must be auto, cpu, cuda or cuda:N (got {section.device!r})")


def model_name(name: str):
    """A model named by hub name, path or pkg:<module> must name something: an empty one fails every shard."""

    def rule(section, prefix: str) -> None:
        value = getattr(section, name)
        if not value.strip() or value.strip() in ("pkg:", "random:"):
            raise ConfigError(
                f"config error: {prefix}{name} must name a model: a hub name, a local path or "
                f"pkg:<module> (got {value!r})"
            )
        if not _names_a_model(value.strip()):
            raise ConfigError(
                f"config error: {prefix}{name} must name a model: a hub name (name or owner/name), "
                f"a local path or pkg:<module>; {shown_value(value)} is none (no such path)"
            )

    return rule


# a model hub's repository name, as the hub checks it: [owner/]name of letters, digits, "-", "_" and "."
_HUB_NAME = re.compile(r"^([A-Za-z0-9_.-]{1,96}/)?[A-Za-z0-9_.-]{1,96}$")


def _names_a_model(value: str) -> bool:
    """A prefixed name (pkg:, random:, a URL), something spelled as a path (checked where it is loaded,
    which may be another machine), an existing path, or a well-formed hub name; not `a/b/c` or `bad name!`,
    which the hub library rejects with a traceback."""
    if ":" in value or value.startswith(("/", "./", "../", "~")):
        return True
    try:
        if Path(value).exists():
            return True
    except OSError:  # a name too long for a path
        pass
    return bool(_HUB_NAME.match(value)) and ".." not in value and "--" not in value and not value.endswith(".git")


def multiple_of(name: str, divisor: str):
    """The rule that field `name` is a whole multiple of field `divisor` (a batch of whole accumulation
    steps, a hidden size the attention heads divide)."""

    def rule(section, prefix: str) -> None:
        if getattr(section, name) % getattr(section, divisor):
            raise ConfigError(
                f"config error: {prefix}{name} must be a multiple of {prefix}{divisor} "
                f"(got {getattr(section, name)} and {getattr(section, divisor)})"
            )

    return rule


def weights_of(name: str):
    """A mapping of weights: its keys those of the default, each weight >= 0."""

    def rule(section, prefix: str) -> None:
        for key, weight in getattr(section, name).items():
            one_of(key, tuple(getattr(type(section)(), name)), f"{prefix}{name}.{key}")
            if weight < 0:
                raise ConfigError(f"config error: {prefix}{name}.{key} must be >= 0 (got {weight!r})")

    return rule


def masks(count: int, what: str, name: str, each: bool = False):
    """A template (with `each`, every template of a list) must hold `count` [MASK] (at least one when count
    is 0)."""

    def rule(e, prefix: str) -> None:
        templates = getattr(e, name) if each else [getattr(e, name)]
        for template in templates:
            if (template.count("[MASK]") != count) if count else ("[MASK]" not in template):
                raise ConfigError(f"config error: {prefix}{name} must hold {what} (got {template!r})")

    return rule


def some_horizon(e, prefix: str) -> None:
    if not e.forecast_steps:
        raise ConfigError(f"config error: {prefix}forecast_steps must name at least one horizon (in clips)")


def named_once(name: str, singular: str, choices: tuple[str, ...]):
    """A list that must name at least one of `choices`, none twice."""

    def rule(section, prefix: str) -> None:
        values = getattr(section, name)
        if not values:
            raise ConfigError(f"config error: {prefix}{name} must name at least one of {', '.join(choices)}")
        if len(set(values)) != len(values):
            raise ConfigError(f"config error: {prefix}{name} names a {singular} twice (got {values!r})")

    return rule


def segments_source(e, prefix: str) -> None:
    if e.segments != "align" and not e.segments.endswith(".json"):
        raise ConfigError(
            f"config error: {prefix}segments must be align or a YouCook II annotations .json file (got {e.segments!r})"
        )


def some_subset(name: str):
    def rule(c, prefix: str) -> None:
        if not getattr(c, name):
            raise ConfigError(f"config error: {prefix}{name} must name at least one YouCook II subset")

    return rule


def subsets_apart(c, prefix: str) -> None:
    some_subset("test_subsets")(c, prefix)
    if set(c.train_subsets) & set(c.test_subsets):
        raise ConfigError(
            f"config error: {prefix}test_subsets must not share a subset with {prefix}train_subsets "
            f"(got {c.test_subsets!r} and {c.train_subsets!r})"
        )


def folds(c, prefix: str) -> None:
    if c.cv_folds == 1 or c.cv_folds < 0:
        raise ConfigError(
            f"config error: {prefix}cv_folds must be 0 (no cross-validation) or >= 2 (got {c.cv_folds!r})"
        )


CV_GRID_KEYS = ("layers", "hidden", "heads", "feedforward", "dropout", "lr", "batch_size", "steps")


def grid(c, prefix: str) -> None:
    for key, values in c.cv_grid.items():
        one_of(key, CV_GRID_KEYS, f"{prefix}cv_grid key")
        if not values:
            raise ConfigError(f"config error: {prefix}cv_grid.{key} must list at least one value")
