"""The config rules that bounds cannot say: a key's form, consistency between keys. Each is a function
(section, prefix) named by its field in pipeline/config.py (`setting(..., rule=...)`), run after that field's
bounds; a broken rule is a ConfigError whose one line names the key. And the device check of a command."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline import registry
from pipeline.config_fields import ConfigError, has_control_characters, one_of, shown_value

# S3D's limits, as torchvision's S3D_Weights.KINETICS400_V1 states them (meta["min_temporal_size"], the
# transform's crop); kept here so that loading a config needs no torch, and held equal by a test
S3D_MIN_FRAMES = 14
S3D_MIN_CROP = 224

# executor.slurm_* strings are written bare into #SBATCH lines: these are the forms sbatch takes for them,
# and none can hold a space, a quote, a "#" or a line break that would end the directive or add another
SLURM_VALUES = {
    "slurm_partition": (r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*",
                        "a partition name, or names separated by commas (letters, digits, _ . -)"),
    "slurm_time": (r"\d+(-\d+)?(:\d+){0,2}|UNLIMITED|INFINITE",
                   "a Slurm time limit such as 90, 04:00:00 or 2-00:00:00"),
    "slurm_mem": (r"\d+[KMGTkmgt]?", "a Slurm memory size such as 16G or 16000M"),
}


# ---------------------------------------------------------------- rules of one key

def licence(top, prefix: str) -> None:
    """A licence identifier as a dataset card's `license:` takes (SPDX-like: letters, digits, . + -)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+-]{0,63}", top.license):
        raise ConfigError(f"config error: license must be a licence identifier such as cc-by-4.0, apache-2.0, "
                          f"other or unknown (got {top.license!r})")


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
            raise ConfigError(f"config error: {prefix}slurm_extra[{index}] must be one line starting with "
                              f"'#SBATCH ' (got {line!r})")


def ray_roles(ex, prefix: str) -> None:
    """Every role is one a stage's registry record names; every resource one Ray takes."""
    roles = tuple(registry.ray_resources())
    for role, resources in ex.ray_resources.items():
        one_of(role, roles, f"{prefix}ray_resources.{role}")
        for name, amount in resources.items():
            key = f"{prefix}ray_resources.{role}.{name}"
            one_of(name, ("num_cpus", "num_gpus", "memory_gb"), key)
            if amount < 0:
                raise ConfigError(f"config error: {key} must be >= 0 (got {amount!r})")


def device_of_decoder(d, prefix: str) -> None:
    if not re.fullmatch(r"cpu|cuda(:\d+)?", d.device):
        raise ConfigError(f"config error: {prefix}device must be cpu, cuda or cuda:N (got {d.device!r})")
    if d.device != "cpu" and d.backend != "torchcodec":
        raise ConfigError(f"config error: {prefix}device={d.device} needs {prefix}backend=torchcodec (PyAV decodes "
                          f"on the CPU)")


def device_of_model(section, prefix: str) -> None:
    if not (section.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", section.device)):
        raise ConfigError(f"config error: {prefix}device must be auto, cpu, cuda or cuda:N (got {section.device!r})")


def s3d_weights(f, prefix: str) -> None:
    if f.weights not in ("kinetics400", "random") and not f.weights.endswith((".pth", ".pt")):
        raise ConfigError(f"config error: {prefix}weights must be kinetics400, random or a .pth/.pt path "
                          f"(got {f.weights!r})")


def leaves_fit_int32(k, prefix: str) -> None:
    # tokens are int32 leaf ids; any depth over 31 exceeds them even at k = 2 (and k ** depth is not computed).
    # Checked before the depth bound: with the usual k, a deeper tree fails for its leaf count
    if k.depth > 31 or k.k ** k.depth > 2**31 - 1:
        raise ConfigError(f"config error: {prefix}k ** {prefix}depth must be < 2**31 (got {k.k}**{k.depth})")


def node_holds_k(k, prefix: str) -> None:
    if k.max_points_per_node < k.k:
        raise ConfigError(f"config error: {prefix}max_points_per_node must be >= {prefix}k "
                          f"(got {k.max_points_per_node})")


def model_name(name: str):
    """A model named by hub name, path or pkg:<module> must name something: an empty one fails every shard."""
    def rule(section, prefix: str) -> None:
        value = getattr(section, name)
        if not value.strip() or value.strip() in ("pkg:", "random:"):
            raise ConfigError(f"config error: {prefix}{name} must name a model: a hub name, a local path or "
                              f"pkg:<module> (got {value!r})")
        if not _names_a_model(value.strip()):
            raise ConfigError(f"config error: {prefix}{name} must name a model: a hub name (name or owner/name), "
                              f"a local path or pkg:<module>; {shown_value(value)} is none (no such path)")
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
    except OSError:   # a name too long for a path
        pass
    return bool(_HUB_NAME.match(value)) and ".." not in value and "--" not in value and not value.endswith(".git")


def compute_type(a, prefix: str) -> None:
    one_of(a.compute_type, ("auto", "float32", "float16") if a.backend == "whisper" else
           ("auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16",
            "float32"), f"{prefix}compute_type")


def language_code(a, prefix: str) -> None:
    if a.language is not None and not re.fullmatch(r"[a-z]{2,3}", a.language):
        raise ConfigError(f"config error: {prefix}language must be null (detect) or a Whisper language code such as "
                          f"en or es (got {a.language!r})")


def batched_needs_faster_whisper(a, prefix: str) -> None:
    if a.batch_size and a.backend != "faster-whisper":
        raise ConfigError(f"config error: {prefix}batch_size > 0 needs {prefix}backend faster-whisper "
                          f"(got {a.backend!r})")


def short_speech_is_stricter(a, prefix: str) -> None:
    if a.filter_short_speech_language_prob < a.language_threshold:
        raise ConfigError(f"config error: {prefix}filter_short_speech_language_prob must be at least "
                          f"{prefix}language_threshold ({a.language_threshold:g}; got "
                          f"{a.filter_short_speech_language_prob:g})")


def absolute_roots(a, prefix: str) -> None:
    for index, root in enumerate(a.transcript_roots):
        if not Path(root).is_absolute() and "://" not in root:
            # a relative root would depend on the directory each worker happens to start in
            raise ConfigError(f"config error: {prefix}transcript_roots[{index}] must be an absolute path or a URL "
                              f"(got {root!r})")


def multiple_of(name: str, divisor: str):
    """The rule that field `name` is a whole multiple of field `divisor` (a batch of whole accumulation
    steps, a hidden size the attention heads divide)."""
    def rule(section, prefix: str) -> None:
        if getattr(section, name) % getattr(section, divisor):
            raise ConfigError(f"config error: {prefix}{name} must be a multiple of {prefix}{divisor} "
                              f"(got {getattr(section, name)} and {getattr(section, divisor)})")
    return rule


def weights_of(name: str):
    """A mapping of weights: its keys those of the default, each weight >= 0."""
    def rule(section, prefix: str) -> None:
        for key, weight in getattr(section, name).items():
            one_of(key, tuple(getattr(type(section)(), name)), f"{prefix}{name}.{key}")
            if weight < 0:
                raise ConfigError(f"config error: {prefix}{name}.{key} must be >= 0 (got {weight!r})")
    return rule


def some_regime(t, prefix: str) -> None:
    weights_of("regime_weights")(t, prefix)
    if sum(t.regime_weights.values()) <= 0:
        raise ConfigError(f"config error: {prefix}regime_weights must give some regime a weight > 0")


def init_checkpoint(t, prefix: str) -> None:
    model_name("init_checkpoint")(t, prefix)
    if t.init_checkpoint.startswith("random:"):
        from pipeline.models import PRESETS
        one_of(t.init_checkpoint[len("random:"):], tuple(PRESETS), f"{prefix}init_checkpoint random:<preset>")


def validation_share_or_count(t, prefix: str) -> None:
    if not (t.validation_videos == 0 or 0 < t.validation_videos < 1 or float(t.validation_videos).is_integer()) \
            or t.validation_videos < 0:
        raise ConfigError(f"config error: {prefix}validation_videos must be 0, a share in (0, 1) or a whole count "
                          f">= 1 (got {t.validation_videos!r})")


def splits_or_share(t, prefix: str) -> None:
    if t.splits is not None and t.validation_videos:
        raise ConfigError(f"config error: {prefix}splits and {prefix}validation_videos both choose the held-out "
                          f"videos: set one (got {t.splits!r} and {t.validation_videos!r})")


def masks(count: int, what: str, name: str):
    """A template must hold `count` [MASK] (at least one when count is 0)."""
    def rule(e, prefix: str) -> None:
        template = getattr(e, name)
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
        raise ConfigError(f"config error: {prefix}segments must be align or a YouCook II annotations .json file "
                          f"(got {e.segments!r})")


def some_subset(name: str):
    def rule(c, prefix: str) -> None:
        if not getattr(c, name):
            raise ConfigError(f"config error: {prefix}{name} must name at least one YouCook II subset")
    return rule


def subsets_apart(c, prefix: str) -> None:
    some_subset("test_subsets")(c, prefix)
    if set(c.train_subsets) & set(c.test_subsets):
        raise ConfigError(f"config error: {prefix}test_subsets must not share a subset with {prefix}train_subsets "
                          f"(got {c.test_subsets!r} and {c.train_subsets!r})")


def folds(c, prefix: str) -> None:
    if c.cv_folds == 1 or c.cv_folds < 0:
        raise ConfigError(f"config error: {prefix}cv_folds must be 0 (no cross-validation) or >= 2 "
                          f"(got {c.cv_folds!r})")


CV_GRID_KEYS = ("layers", "hidden", "heads", "feedforward", "dropout", "lr", "batch_size", "steps")


def grid(c, prefix: str) -> None:
    for key, values in c.cv_grid.items():
        one_of(key, CV_GRID_KEYS, f"{prefix}cv_grid key")
        if not values:
            raise ConfigError(f"config error: {prefix}cv_grid.{key} must list at least one value")


# ---------------------------------------------------------------- the devices of a command

# commands that are not stages, and the device keys they run a model on
COMMAND_DEVICE_KEYS = {"eval": ("train.device",)}


def check_devices(cfg, command: str) -> None:
    """The GPUs the device keys of `command` (its registry record's, or COMMAND_DEVICE_KEYS') name must
    exist on this machine: none without CUDA, an index below the number of GPUs with it. Checked by the
    command that uses them (not by `submit` on a login node, or a Ray driver whose workers have the GPUs),
    at load: a wrong one would fail every shard."""
    from pipeline import devices

    keys = registry.BY_NAME[command].device_keys if command in registry.BY_NAME else \
        COMMAND_DEVICE_KEYS.get(command, ())
    for key in keys:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if not value.startswith("cuda"):    # (a cuda decode.device without torchcodec is refused at load)
            continue
        library = "ctranslate2" if section == "asr" and cfg.asr.backend == "faster-whisper" else "torch"
        count = devices.cuda_device_count(library)
        index = int(value.split(":")[1]) if ":" in value else 0
        if count == 0:
            which = " that CTranslate2 (faster-whisper) can use" if library == "ctranslate2" else ""
            raise ConfigError(f"config error: {key}={value}, but this machine has no CUDA GPU{which}: use auto or cpu")
        if index >= count:
            raise ConfigError(f"config error: {key}={value}, but this machine has {count} GPU(s): "
                              f"cuda:0{f' to cuda:{count - 1}' if count > 1 else ''}")
