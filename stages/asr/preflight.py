"""asr's preflight: the speech model can be loaded here (a packaged model, a local file, a download that can
be reached), unless imported transcripts leave nothing to recognise."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import probing, storage
from pipeline.contract import PreflightError
from stages.asr import PACKAGED_WHISPER

if TYPE_CHECKING:
    from pipeline.config import Config


def every_video_has_a_transcript(work_dir) -> bool:
    """The work dir's manifest lists a transcript for each of its videos (False without a manifest, or with
    one that cannot be read: the model is then checked, and the stage itself reports the manifest)."""
    from pipeline.engine.manifest import read_manifest
    from pipeline.engine.workdir import WorkDir

    try:
        if not (storage.is_remote(storage.location(work_dir)) or WorkDir(work_dir).manifest.exists()):
            return False
        return all(read_manifest(work_dir, columns=["transcript_uri"])["transcript_uri"].to_pylist())
    except Exception:  # noqa: BLE001 - see above
        return False


def check_asr(cfg: Config, work_dir=None) -> None:
    """The speech model loads, unless the work dir's manifest gives every video a transcript (asr then
    recognises nothing)."""
    if work_dir is not None and every_video_has_a_transcript(work_dir):
        return
    spec = cfg.asr.model
    hub_repo, fix = None, f"or {PACKAGED_WHISPER} (Whisper base, packaged)"
    if cfg.asr.backend == "whisper" and not spec.startswith("pkg:") and not Path(spec).expanduser().exists():
        import whisper

        if spec in whisper._MODELS:  # openai-whisper downloads its own files, not from the hub
            url = whisper._MODELS[spec]
            root = Path(os.getenv("XDG_CACHE_HOME", Path.home() / ".cache")) / "whisper"
            if (root / Path(url).name).is_file():
                return
            why = probing.unreachable(url)
            if why:
                raise PreflightError(
                    f"asr.model: {spec!r} (openai-whisper) is downloaded from {url}, which cannot "
                    f"be reached from here ({why}): give a local path, {fix}"
                )
            return
    if cfg.asr.backend == "faster-whisper":
        from faster_whisper.utils import _MODELS

        hub_repo = _MODELS.get(spec)
    probing.check_model_spec("asr.model", spec, hub_repo=hub_repo, fix=fix)
