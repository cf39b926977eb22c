"""FFmpeg's shared libraries for torchcodec (`decode.backend: torchcodec`).

torchcodec's wheel carries no FFmpeg: it loads libavcodec.so.N and its siblings (FFmpeg 4 to 8) by their
standard names. Debian 12 has none unless installed (`apt-get install libavcodec59 libavformat59
libavutil57 libavfilter8 libavdevice59 libswscale6 libswresample4`). PyAV's wheel carries FFmpeg 8, the
one the default path decodes with, under renamed files: `link_folder()` gives them their standard names
in a cache folder, so that a process started with `environment()` (LD_LIBRARY_PATH, read by the dynamic
linker at process start) loads torchcodec on PyAV's FFmpeg. The features stage starts its decode worker
processes that way; a process that decodes with torchcodec itself (decode_workers 0, GPU decoding) must
be started so: `eval "$(python -m pipeline.media.ffmpeg_libs)"` prints the export."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
from pathlib import Path

LIBRARIES = ("avcodec", "avformat", "avutil", "avfilter", "avdevice", "swscale", "swresample")


def pyav_libs() -> Path | None:
    import av

    folder = Path(av.__file__).resolve().parent.parent / "av.libs"
    return folder if folder.is_dir() else None


def link_folder() -> Path | None:
    """A folder of links libavcodec.so.62 -> PyAV's renamed libavcodec-<hash>.so.62..., made once."""
    source = pyav_libs()
    if source is None:
        return None
    from pipeline.storage import user_cache

    folder = user_cache("ffmpeg") / f"{hashlib.sha256(str(source).encode()).hexdigest()[:12]}"
    for path in source.iterdir():
        match = re.fullmatch(r"lib(\w+)-[0-9a-f]{8}\.so\.(\d+)(\.[\d.]+)?", path.name)
        if not match or match.group(1) not in LIBRARIES:
            continue
        link = folder / f"lib{match.group(1)}.so.{match.group(2)}"
        if link.is_symlink() and link.resolve() == path.resolve():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        temporary = folder / f".{link.name}.{os.getpid()}"
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(path)
        temporary.replace(link)
    return folder if folder.is_dir() else None


def library_path() -> str:
    """LD_LIBRARY_PATH with PyAV's FFmpeg under its standard names (and PyAV's own folder, where its
    libraries find what they need) in front of what is set already."""
    parts = [str(folder) for folder in (link_folder(), pyav_libs()) if folder is not None]
    current = os.environ.get("LD_LIBRARY_PATH", "")
    parts += [part for part in current.split(":") if part and part not in parts]
    return ":".join(parts)


def environment() -> dict[str, str]:
    return {**os.environ, "LD_LIBRARY_PATH": library_path()}


def prepare_children() -> None:
    """Processes started from now on (spawned decode workers) find FFmpeg for torchcodec."""
    os.environ["LD_LIBRARY_PATH"] = library_path()


@functools.lru_cache(maxsize=1)
def torchcodec_error() -> str | None:
    """None when torchcodec loads in this process, else why not (one line)."""
    try:
        import torchcodec

        if getattr(torchcodec, "ffmpeg_major_version", None) is None:
            # `import torchcodec` keeps going without FFmpeg; loading its core says why it cannot
            from torchcodec._internally_replaced_utils import load_core_libraries

            load_core_libraries()
        return None
    except Exception as error:  # noqa: BLE001 - torchcodec raises RuntimeError/OSError/ImportError
        line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return (
            f"torchcodec cannot be used in this process ({line}): start it with FFmpeg's libraries on "
            f'LD_LIBRARY_PATH (eval "$(python -m pipeline.media.ffmpeg_libs)") or install them'
        )


if __name__ == "__main__":
    sys.stdout.write(f"export LD_LIBRARY_PATH='{library_path()}'\n")
