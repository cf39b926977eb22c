"""Model specs, resolved the same way for the speech model, the tokenizer and the trainer's checkpoint:
`pkg:<module>` names an installed package that ships the model offline (its `get_model_path()`, or its
`model/` folder); a local path is used as it is and identified by its content; anything else is a hub
name, for machines that reach the hub."""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from pathlib import Path

from pipeline import storage


class ModelNotFound(ValueError):
    """A `pkg:` spec whose package is not installed or ships no model; one line with the fix."""


@dataclass(frozen=True)
class ResolvedModel:
    location: str              # what a loader takes: a local path or a hub name
    label: str                 # a short name for outputs (the package's MODEL_NAME, the file or folder name)
    sha256: str | None         # of the local weights (a folder: every file); None for a hub name


def location(spec: str) -> str:
    """The path or hub name a loader takes for `spec` (nothing is hashed)."""
    if not spec.startswith("pkg:"):
        return spec
    module = _package(spec)
    if hasattr(module, "get_model_path"):
        return str(module.get_model_path())
    folder = Path(module.__file__).parent / "model"
    if not folder.is_dir():
        raise ModelNotFound(f"package {module.__name__!r} ships no model folder at {folder}")
    return str(folder)


@functools.lru_cache(maxsize=8)
def resolve(spec: str) -> ResolvedModel:
    """`spec` located, labelled and (when local) identified by content; hashed once per process."""
    path = Path(location(spec)).expanduser()
    if not path.exists():
        return ResolvedModel(location=spec, label=spec, sha256=None)
    if spec.startswith("pkg:"):
        label = getattr(_package(spec), "MODEL_NAME", spec[len("pkg:"):])
    else:
        label = path.stem if path.is_file() else path.name
    return ResolvedModel(location=str(path), label=label, sha256=storage.file_sha256(path))


def _package(spec: str):
    module_name = spec[len("pkg:"):]
    try:
        return importlib.import_module(module_name)
    except ImportError:
        raise ModelNotFound(f"model package {module_name!r} is not installed "
                            f"(pip install {module_name.replace('_', '-')})") from None
