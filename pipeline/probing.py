"""Before any shard starts: what a model a stage needs is there. A `pkg:` model is packaged, a local path
exists, a hub name is cached or its hub reachable; a missing one stops the stage with one line naming the
config value and the fix (a local path, `random`, a packaged model, HF_HUB_OFFLINE), instead of every shard
crashing on a bare URLError. The stages' preflight checks (their records' `preflight`) are built of these.

Checks are cheap: a file's existence, a cache lookup, one HEAD request (5 s at most) per host and process."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

from pipeline.contract import PreflightError

TIMEOUT_S = 5.0


def hub_offline() -> str | None:
    """The value of HF_HUB_OFFLINE when it forbids downloads, else None."""
    value = os.environ.get("HF_HUB_OFFLINE", "")
    return value if value.strip().lower() in ("1", "true", "yes", "on") else None


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
        return None  # it answered
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
        raise PreflightError(
            f"{key}: {spec!r} is a model hub name, not in the local cache, and HF_HUB_OFFLINE="
            f"{offline} forbids downloading it: give a local path{alternative}, or unset "
            f"HF_HUB_OFFLINE on a machine that reaches {_hub_endpoint()}"
        )
    why = unreachable(f"{_hub_endpoint()}/{repo}")
    if why:
        raise PreflightError(
            f"{key}: {spec!r} is a model hub name, not in the local cache, and {_hub_endpoint()} "
            f"cannot be reached from here ({why}): give a local path{alternative}, or download "
            f"it where the hub is reachable and run with HF_HUB_OFFLINE=1"
        )
