"""The rules of the config that types cannot say: finite numbers, bounds, choices, consistency between keys.
One `_check_<section>` per section; a broken rule is a ConfigError whose one line names the key. The bounds
are also written beside each field in pipeline/config.py."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.registry import NAMES as STAGES

if TYPE_CHECKING:
    from pipeline.config import (
        AlignConfig,
        AsrConfig,
        CaptionConfig,
        Config,
        DecodeConfig,
        EvalConfig,
        ExecutorConfig,
        FeaturesConfig,
        KmeansConfig,
        ShardsConfig,
        TrainConfig,
    )


class ConfigError(ValueError):
    """A config mistake; its message is one line that names the key, of bounded length: a value that is
    too long to show is cut in the middle (its head and tail kept, with how much was left out)."""

    def __init__(self, message: str = ""):
        message = str(message)
        if len(message) > MAX_MESSAGE_CHARS:
            head, tail = MAX_MESSAGE_CHARS * 2 // 3, MAX_MESSAGE_CHARS // 4
            message = (f"{message[:head]} ... ({len(message) - head - tail:,} characters left out) ... "
                       f"{message[-tail:]}")
        super().__init__(message)


MAX_MESSAGE_CHARS = 600      # a config error is one line a person reads
MAX_SHOWN_VALUE_CHARS = 120  # a value quoted in it


def shown_value(value) -> str:
    """`value` as a message quotes it (its repr), bounded: a few items of a long list or mapping, a few
    levels of a nested one and the ends of a long string. The cost is bounded too: a nested list built
    from YAML aliases is never walked whole."""
    import reprlib

    shown = reprlib.Repr()   # (keyword arguments only from Python 3.12)
    shown.maxlevel, shown.maxstring, shown.maxlong, shown.maxother = 3, MAX_SHOWN_VALUE_CHARS, 40, MAX_SHOWN_VALUE_CHARS
    shown.maxtuple = shown.maxlist = shown.maxdict = shown.maxset = shown.maxfrozenset = shown.maxdeque = 8
    text = shown.repr(value)
    return text if len(text) <= MAX_SHOWN_VALUE_CHARS else text[:MAX_SHOWN_VALUE_CHARS - 3] + "..."


# S3D's limits, as torchvision's S3D_Weights.KINETICS400_V1 states them (meta["min_temporal_size"], the
# transform's crop); kept here so that loading a config needs no torch, and held equal by a test
S3D_MIN_FRAMES = 14
S3D_MIN_CROP = 224

# Worker and thread counts: 0 means "the library's or the machine's choice"; more than this is a typo (no
# node has that many cores, and a pool that size would run out of processes or memory before any work)
MAX_WORKERS = 1024
MAX_SEED = 2**32 - 1                    # numpy's and ctranslate2's seeds are unsigned 32-bit
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")

# executor.slurm_* strings are written bare into #SBATCH lines: these are the forms sbatch takes for them,
# and none can hold a space, a quote, a "#" or a line break that would end the directive or add another
SLURM_VALUES = {
    "slurm_partition": (r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*",
                        "a partition name, or names separated by commas (letters, digits, _ . -)"),
    "slurm_time": (r"\d+(-\d+)?(:\d+){0,2}|UNLIMITED|INFINITE",
                   "a Slurm time limit such as 90, 04:00:00 or 2-00:00:00"),
    "slurm_mem": (r"\d+[KMGTkmgt]?", "a Slurm memory size such as 16G or 16000M"),
}


def _positive(value, key):
    if value <= 0:
        raise ConfigError(f"config error: {key} must be > 0 (got {value!r})")


def _non_negative(value, key):
    if value < 0:
        raise ConfigError(f"config error: {key} must be >= 0 (got {value!r})")


def _in_range(value, low, high, key, *, open_low=False, why=""):
    """low <= value <= high (low < value with open_low); the message states both bounds, then why."""
    if (value <= low if open_low else value < low) or value > high:
        bounds = f"{'>' if open_low else '>='} {low} and <= {high}"
        raise ConfigError(f"config error: {key} must be {bounds}{' ' + why if why else ''} (got {value!r})")


def finite(value: float, key):
    # NaN passes every comparison test, and inf passes "> 0": both would reach the stages
    if not math.isfinite(value):
        raise ConfigError(f"config error: {key} must be a finite number (got {value!r})")


def _count(value, key):
    """A worker or thread count; 0 leaves the choice to the library or the machine."""
    _in_range(value, 0, MAX_WORKERS, key)


def _one_of(value, choices, key):
    if value not in choices:
        raise ConfigError(f"config error: {key} must be one of {', '.join(choices)} (got {value!r})")


def has_control_characters(text: str) -> bool:
    """A line break, tab, NUL, escape or DEL: a name shown in a one-line message, or text written into a
    script, must not hold one."""
    return CONTROL_CHARACTERS.search(text) is not None


def _check_shards(s: ShardsConfig) -> None:
    _in_range(s.videos_per_shard, 0, 1_000_000, "shards.videos_per_shard", open_low=True)


def _check_executor(ex: ExecutorConfig) -> None:
    _one_of(ex.kind, ("local", "ray", "slurm"), "executor.kind")
    _count(ex.workers, "executor.workers")
    _in_range(ex.max_retries, 0, 100, "executor.max_retries")
    _in_range(ex.max_failed_share, 0, 1, "executor.max_failed_share")
    for key in ("slurm_gpus", "ray_feature_models"):
        _non_negative(getattr(ex, key), f"executor.{key}")
    _in_range(ex.slurm_cpus_per_task, 0, MAX_WORKERS, "executor.slurm_cpus_per_task", open_low=True)
    if ex.slurm_array_parallelism is not None:
        _positive(ex.slurm_array_parallelism, "executor.slurm_array_parallelism")
    _in_range(ex.slurm_max_array_size, 1, 4_000_001, "executor.slurm_max_array_size")
    _in_range(ex.slurm_nodes, 1, 4096, "executor.slurm_nodes")
    _in_range(ex.slurm_rdzv_port, 1024, 65535, "executor.slurm_rdzv_port")
    for key, (pattern, form) in SLURM_VALUES.items():
        value = getattr(ex, key)
        if value is not None and not re.fullmatch(pattern, value, re.ASCII):
            raise ConfigError(f"config error: executor.{key} must be {form} (got {value!r})")
    for index, line in enumerate(ex.slurm_extra):
        # bash reads these lines as comments, sbatch as options: they stay harmless while each is one line
        if not line.startswith("#SBATCH ") or has_control_characters(line):
            raise ConfigError(f"config error: executor.slurm_extra[{index}] must be one line starting with "
                              f"'#SBATCH ' (got {line!r})")
    for index, stage in enumerate(ex.slurm_gpu_stages):
        _one_of(stage, STAGES, f"executor.slurm_gpu_stages[{index}]")
    roles = tuple(type(ex)().ray_resources)   # the roles the defaults name
    for role, resources in ex.ray_resources.items():
        _one_of(role, roles, f"executor.ray_resources.{role}")
        for name, amount in resources.items():
            _one_of(name, ("num_cpus", "num_gpus", "memory_gb"), f"executor.ray_resources.{role}.{name}")
            _non_negative(amount, f"executor.ray_resources.{role}.{name}")


def _check_decode(d: DecodeConfig) -> None:
    _in_range(d.fps, 0, 120, "decode.fps", open_low=True)
    # S3D's temporal stride is 8 and its last pool spans 2 steps: shorter clips have no output
    _in_range(d.clip_frames, S3D_MIN_FRAMES, 1024, "decode.clip_frames", why="for S3D")
    _in_range(d.min_clip_frames, 1, d.clip_frames, "decode.min_clip_frames",
              why="(the clip length, decode.clip_frames)")
    # S3D downsamples space by 32 and ends with a 7x7 pool; the crop is cut from the resized frame
    _in_range(d.crop, S3D_MIN_CROP, 1024, "decode.crop", why="for S3D")
    _in_range(d.resize, d.crop, 1024, "decode.resize", why="(decode.crop is cut from it)")
    _in_range(d.thumbnail_size, 16, 512, "decode.thumbnail_size")
    _in_range(d.thumbnail_quality, 1, 100, "decode.thumbnail_quality")
    _in_range(d.max_pixels, 1, 2**28, "decode.max_pixels")
    _count(d.decode_threads, "decode.decode_threads")
    _in_range(d.io_timeout_s, 0, 3600, "decode.io_timeout_s", open_low=True)
    _in_range(d.max_gap_s, 0, 86_400, "decode.max_gap_s", open_low=True)
    _one_of(d.backend, ("pyav", "torchcodec"), "decode.backend")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", d.device):
        raise ConfigError(f"config error: decode.device must be cpu, cuda or cuda:N (got {d.device!r})")
    if d.device != "cpu" and d.backend != "torchcodec":
        raise ConfigError(f"config error: decode.device={d.device} needs decode.backend=torchcodec (PyAV decodes "
                          f"on the CPU)")


def _check_features(f: FeaturesConfig) -> None:
    if f.weights not in ("kinetics400", "random") and not f.weights.endswith((".pth", ".pt")):
        raise ConfigError(f"config error: features.weights must be kinetics400, random or a .pth/.pt path (got {f.weights!r})")
    _one_of(f.precision, ("auto", "float32", "bfloat16", "float16"), "features.precision")
    if not (f.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", f.device)):
        raise ConfigError(f"config error: features.device must be auto, cpu, cuda or cuda:N (got {f.device!r})")
    _in_range(f.batch_size, 0, 1024, "features.batch_size")
    if f.decode_workers is not None:
        _count(f.decode_workers, "features.decode_workers")
    _count(f.num_threads, "features.num_threads")


def _check_kmeans(k: KmeansConfig) -> None:
    _in_range(k.k, 2, 4096, "kmeans.k")
    if k.depth < 1:
        raise ConfigError(f"config error: kmeans.depth must be >= 1 (got {k.depth})")
    # tokens are int32 leaf ids; any depth over 31 exceeds them even at k = 2 (and k ** depth is not computed).
    # Checked before the depth bound: with the usual k, a deeper tree fails for its leaf count
    if k.depth > 31 or k.k ** k.depth > 2**31 - 1:
        raise ConfigError(f"config error: kmeans.k ** kmeans.depth must be < 2**31 (got {k.k}**{k.depth})")
    _in_range(k.depth, 1, 8, "kmeans.depth")     # a few levels of k-means; the paper uses 4
    _in_range(k.max_fit_vectors, 0, 100_000_000, "kmeans.max_fit_vectors", open_low=True)
    if k.max_points_per_node < k.k:
        raise ConfigError(f"config error: kmeans.max_points_per_node must be >= kmeans.k (got {k.max_points_per_node})")
    _in_range(k.niter, 0, 1000, "kmeans.niter", open_low=True)
    _in_range(k.nredo, 0, 100, "kmeans.nredo", open_low=True)
    _count(k.workers, "kmeans.workers")
    _in_range(k.seed, 0, MAX_SEED, "kmeans.seed")


def _model_name(value: str, key: str) -> None:
    """A model named by hub name, path or pkg:<module> must name something: an empty one fails every shard."""
    if not value.strip() or value.strip() in ("pkg:", "random:"):
        raise ConfigError(f"config error: {key} must name a model: a hub name, a local path or pkg:<module> "
                          f"(got {value!r})")


def _check_asr(a: AsrConfig) -> None:
    _one_of(a.backend, ("faster-whisper", "whisper"), "asr.backend")
    _model_name(a.model, "asr.model")
    _one_of(a.device, ("auto", "cpu", "cuda"), "asr.device")
    _one_of(a.compute_type, ("auto", "float32", "float16") if a.backend == "whisper" else
            ("auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16",
             "float32"), "asr.compute_type")
    _in_range(a.max_sentence_s, 0, 600, "asr.max_sentence_s", open_low=True)
    _in_range(a.pause_split_s, 0, 60, "asr.pause_split_s", open_low=True)
    _in_range(a.beam_size, 0, 64, "asr.beam_size", open_low=True)
    if a.language is not None and not re.fullmatch(r"[a-z]{2,3}", a.language):
        raise ConfigError(f"config error: asr.language must be null (detect) or a Whisper language code such as "
                          f"en or es (got {a.language!r})")
    _in_range(a.language_detection_s, 0, 600, "asr.language_detection_s", open_low=True)
    _in_range(a.language_threshold, 0, 1, "asr.language_threshold")
    _in_range(a.batch_size, 0, 256, "asr.batch_size")
    if a.batch_size and a.backend != "faster-whisper":
        raise ConfigError(f"config error: asr.batch_size > 0 needs asr.backend faster-whisper (got {a.backend!r})")
    _count(a.num_threads, "asr.num_threads")
    _in_range(a.max_transcript_bytes, 1, 2**30, "asr.max_transcript_bytes")
    _in_range(a.filter_no_speech_prob, 0, 1, "asr.filter_no_speech_prob")
    _in_range(a.filter_no_speech_logprob, -20, 0, "asr.filter_no_speech_logprob")
    _in_range(a.filter_min_word_prob, 0, 1, "asr.filter_min_word_prob")
    _in_range(a.filter_compression_ratio, 1, 100, "asr.filter_compression_ratio")
    _in_range(a.filter_short_speech_s, 0, 600, "asr.filter_short_speech_s")
    _in_range(a.filter_short_speech_language_prob, 0, 1, "asr.filter_short_speech_language_prob")
    if a.filter_short_speech_language_prob < a.language_threshold:
        raise ConfigError(f"config error: asr.filter_short_speech_language_prob must be at least "
                          f"asr.language_threshold ({a.language_threshold:g}; got {a.filter_short_speech_language_prob:g})")
    for index, root in enumerate(a.transcript_roots):
        if not Path(root).is_absolute() and "://" not in root:
            # a relative root would depend on the directory each worker happens to start in
            raise ConfigError(f"config error: asr.transcript_roots[{index}] must be an absolute path or a URL "
                              f"(got {root!r})")


def _check_align(al: AlignConfig) -> None:
    _model_name(al.tokenizer, "align.tokenizer")
    _in_range(al.tokens_per_segment_without_text, 0, 512, "align.tokens_per_segment_without_text", open_low=True)
    _in_range(al.min_sentence_overlap, 0, 1, "align.min_sentence_overlap", open_low=True)
    _in_range(al.row_group_size, 0, 2**20, "align.row_group_size", open_low=True)


def _check_train(t: TrainConfig) -> None:
    _in_range(t.max_len, 8, 4096, "train.max_len")
    _in_range(t.batch_size, 0, 65_536, "train.batch_size", open_low=True)
    _in_range(t.grad_accum, 0, 1024, "train.grad_accum", open_low=True)
    if t.batch_size % t.grad_accum:
        raise ConfigError(f"config error: train.batch_size must be a multiple of train.grad_accum "
                          f"(got {t.batch_size} and {t.grad_accum})")
    for key in ("max_steps", "max_subsample_step", "max_concat", "shuffle_buffer", "log_every",
                "checkpoint_every", "keep_checkpoints"):
        _positive(getattr(t, key), f"train.{key}")
    for key in ("warmup_steps", "steps_per_run", "grad_clip", "negative_min_gap"):
        _non_negative(getattr(t, key), f"train.{key}")
    _in_range(t.lr, 0, 1, "train.lr", open_low=True)
    _in_range(t.weight_decay, 0, 1, "train.weight_decay")
    if not 0 < t.mask_prob < 1:
        raise ConfigError(f"config error: train.mask_prob must be > 0 and < 1 (got {t.mask_prob})")
    for key in ("negative_prob", "negative_same_video_share", "concat_prob"):
        _in_range(getattr(t, key), 0, 1, f"train.{key}")
    for mapping in ("regime_weights", "loss_weights"):
        for name, weight in getattr(t, mapping).items():
            _one_of(name, tuple(getattr(type(t)(), mapping)), f"train.{mapping}.{name}")
            _non_negative(weight, f"train.{mapping}.{name}")
    _one_of(t.regime_mix, ("exact", "natural"), "train.regime_mix")
    if sum(t.regime_weights.values()) <= 0:
        raise ConfigError("config error: train.regime_weights must give some regime a weight > 0")
    _model_name(t.init_checkpoint, "train.init_checkpoint")
    if t.init_checkpoint.startswith("random:"):
        from pipeline.models import PRESETS
        _one_of(t.init_checkpoint[len("random:"):], tuple(PRESETS), "train.init_checkpoint random:<preset>")
    _count(t.num_workers, "train.num_workers")
    _count(t.num_threads, "train.num_threads")
    _in_range(t.seed, 0, MAX_SEED, "train.seed")
    if not (t.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", t.device)):
        raise ConfigError(f"config error: train.device must be auto, cpu, cuda or cuda:N (got {t.device!r})")
    _one_of(t.precision, ("auto", "float32", "bfloat16"), "train.precision")
    _non_negative(t.subset_videos, "train.subset_videos")
    _in_range(t.subset_seed, 0, MAX_SEED, "train.subset_seed")
    if not (t.validation_videos == 0 or 0 < t.validation_videos < 1 or float(t.validation_videos).is_integer()) \
            or t.validation_videos < 0:
        raise ConfigError(f"config error: train.validation_videos must be 0, a share in (0, 1) or a whole count "
                          f">= 1 (got {t.validation_videos!r})")
    _positive(t.validation_every, "train.validation_every")


def _check_eval(e: EvalConfig) -> None:
    if e.zero_shot_template.count("[MASK]") != 2:
        raise ConfigError(f"config error: eval.zero_shot_template must hold two [MASK] (verb, noun) "
                          f"(got {e.zero_shot_template!r})")
    if "[MASK]" not in e.features_template:
        raise ConfigError(f"config error: eval.features_template must hold a [MASK] (got {e.features_template!r})")
    _positive(e.batch_size, "eval.batch_size")
    _positive(e.predict_video_tokens, "eval.predict_video_tokens")
    _positive(e.forecast_words, "eval.forecast_words")
    if not e.forecast_steps:
        raise ConfigError("config error: eval.forecast_steps must name at least one horizon (in clips)")
    for index, step in enumerate(e.forecast_steps):
        _in_range(step, 1, 510, f"eval.forecast_steps[{index}]")
    _one_of(e.videos, ("all", "validation"), "eval.videos")
    if not e.rankings:
        raise ConfigError("config error: eval.rankings must name at least one of open, closed")
    for index, mode in enumerate(e.rankings):
        _one_of(mode, ("open", "closed"), f"eval.rankings[{index}]")
    if len(set(e.rankings)) != len(e.rankings):
        raise ConfigError(f"config error: eval.rankings names a ranking twice (got {e.rankings!r})")
    if e.segments != "align" and not e.segments.endswith(".json"):
        raise ConfigError(f"config error: eval.segments must be align or a YouCook II annotations .json file "
                          f"(got {e.segments!r})")
    for key in ("list_verbs", "list_nouns"):
        _positive(getattr(e, key), f"eval.{key}")
    _in_range(e.probe_test_share, 0, 1, "eval.probe_test_share", open_low=True)
    if e.probe_test_share >= 1:
        raise ConfigError(f"config error: eval.probe_test_share must be < 1 (got {e.probe_test_share!r})")
    _positive(e.probe_c, "eval.probe_c")
    _in_range(e.probe_seed, 0, MAX_SEED, "eval.probe_seed")


def _check_caption(c: CaptionConfig) -> None:
    rows = ("s3d", "videobert", "videobert_s3d")
    if not c.rows:
        raise ConfigError(f"config error: caption.rows must name at least one of {', '.join(rows)}")
    for index, row in enumerate(c.rows):
        _one_of(row, rows, f"caption.rows[{index}]")
    if len(set(c.rows)) != len(c.rows):
        raise ConfigError(f"config error: caption.rows names a row twice (got {c.rows!r})")
    for key in ("train_subsets", "test_subsets"):
        subsets = getattr(c, key)
        if not subsets:
            raise ConfigError(f"config error: caption.{key} must name at least one YouCook II subset")
        for index, subset in enumerate(subsets):
            _one_of(subset, ("training", "validation", "testing"), f"caption.{key}[{index}]")
    if set(c.train_subsets) & set(c.test_subsets):
        raise ConfigError(f"config error: caption.test_subsets must not share a subset with caption.train_subsets "
                          f"(got {c.test_subsets!r} and {c.train_subsets!r})")
    for key in ("layers", "hidden", "heads", "feedforward", "lr", "batch_size", "steps", "max_words",
                "min_word_count"):
        _positive(getattr(c, key), f"caption.{key}")
    if c.hidden % c.heads:
        raise ConfigError(f"config error: caption.hidden must be a multiple of caption.heads "
                          f"(got {c.hidden} and {c.heads})")
    _in_range(c.dropout, 0, 1, "caption.dropout")
    if c.dropout >= 1:
        raise ConfigError(f"config error: caption.dropout must be < 1 (got {c.dropout!r})")
    _in_range(c.seed, 0, MAX_SEED, "caption.seed")
    _count(c.num_threads, "caption.num_threads")
    if c.cv_folds == 1 or c.cv_folds < 0:
        raise ConfigError(f"config error: caption.cv_folds must be 0 (no cross-validation) or >= 2 (got {c.cv_folds!r})")
    grid_keys = ("layers", "hidden", "heads", "feedforward", "dropout", "lr", "batch_size", "steps")
    for key, values in c.cv_grid.items():
        _one_of(key, grid_keys, "caption.cv_grid key")
        if not values:
            raise ConfigError(f"config error: caption.cv_grid.{key} must list at least one value")
    _one_of(c.cv_metric, ("BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr"), "caption.cv_metric")


def _check_license(value: str) -> None:
    """A licence identifier as a dataset card's `license:` takes (SPDX-like: letters, digits, . + -)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+-]{0,63}", value):
        raise ConfigError(f"config error: license must be a licence identifier such as cc-by-4.0, apache-2.0, "
                          f"other or unknown (got {value!r})")


def check(cfg: Config) -> None:
    """Every rule of every section; the first broken one is a ConfigError naming its key."""
    _in_range(cfg.seed, 0, MAX_SEED, "seed")
    _check_license(cfg.license)
    _check_shards(cfg.shards)
    _check_executor(cfg.executor)
    _check_decode(cfg.decode)
    _check_features(cfg.features)
    _check_kmeans(cfg.kmeans)
    _check_asr(cfg.asr)
    _check_align(cfg.align)
    _check_train(cfg.train)
    _check_eval(cfg.eval)
    _check_caption(cfg.caption)


# the device keys each command runs a model or a decoder on, in this process
DEVICE_KEYS = {"decode": ("decode.device",), "features": ("features.device", "decode.device"),
               "asr": ("asr.device",), "train": ("train.device",), "eval": ("train.device",)}


def check_devices(cfg: Config, command: str) -> None:
    """The GPUs the device keys of `command` name must exist on this machine: none without CUDA, an index
    below the number of GPUs with it. Checked by the command that uses them (not by `submit` on a login
    node, or a Ray driver whose workers have the GPUs), at load: a wrong one would fail every shard."""
    from pipeline import devices

    for key in DEVICE_KEYS.get(command, ()):
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if not value.startswith("cuda") or (section == "decode" and cfg.decode.backend != "torchcodec"):
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
