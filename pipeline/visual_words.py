"""The visual-word codebook's files and the tree descent that turns a feature into a visual word: shared by
kmeans (which writes the codebook), quantize (which descends every clip), the gallery and the trainer.
The file format itself is the contract in schemas/codebook.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from pipeline import storage
from schemas.codebook import FILE_NAME, SIDECAR_NAME, Codebook, CorruptCodebook, from_bytes, sidecar, to_bytes


def save(codebook: Codebook, folder: Path) -> tuple[Path, str]:
    """Write the tensors and the sidecar atomically; returns (path, sha256 of the tensors file)."""
    data = to_bytes(codebook)
    path = storage.location(folder) / FILE_NAME
    sha = hashlib.sha256(data).hexdigest()
    storage.atomic_write_bytes(path, data)
    storage.atomic_write_json(path.with_name(SIDECAR_NAME), sidecar(codebook, sha))
    return path, sha


def load(path: Path) -> Codebook:
    """Load from the safetensors file or from the folder holding it (e.g. DIR/kmeans), checked against the
    sha256 its sidecar records."""
    path = storage.location(path)
    if path.is_dir():
        path = path / FILE_NAME
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the kmeans stage first")
    data = path.read_bytes()
    sidecar_path = path.with_name(SIDECAR_NAME)
    try:
        info = json.loads(sidecar_path.read_text()) if sidecar_path.exists() else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CorruptCodebook(f"{sidecar_path} is not valid JSON ({error}): rerun the kmeans stage") from None
    return from_bytes(data, info, str(path))


def descend(
    codebook: Codebook,
    vectors: np.ndarray,
    *,
    return_path: bool = False,
    levels: int | None = None,
    chunk_rows: int = 65_536,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """The leaf id (int64, in [0, k**depth)) of each row of `vectors` (n x dim, any float dtype): at each
    level the nearest (L2) non-empty child of the node chosen one level up; ties go to the lower child.
    With `return_path`, also the (n, levels) rows chosen at each level (the last column is the leaf id).
    `levels` < depth stops there: the ids are then of that level's nodes (a level depends only on those
    above it, so the columns are the full descent's)."""
    vectors = np.asarray(vectors)
    if vectors.ndim != 2 or vectors.shape[1] != codebook.dim:
        raise ValueError(f"descend needs an (n, {codebook.dim}) array, got shape {vectors.shape}")
    levels = codebook.depth if levels is None else levels
    if not 1 <= levels <= codebook.depth:
        raise ValueError(f"descend: levels must be in 1..{codebook.depth}, got {levels}")
    # ||x - c||^2 = ||x||^2 + ||c||^2 - 2 x.c; ||x||^2 is the same for every child, so it is left out.
    # An empty child's bias is +inf, so it never wins while its parent has a non-empty child (always true).
    biases = [
        np.where(counts > 0, np.einsum("ij,ij->i", centroids, centroids), np.inf).astype(np.float32)
        for centroids, counts in zip(codebook.centroids[:levels], codebook.counts[:levels])
    ]
    path = np.empty((len(vectors), levels), dtype=np.int64)
    for start in range(0, len(vectors), chunk_rows):
        chunk = np.ascontiguousarray(vectors[start : start + chunk_rows], dtype=np.float32)
        path[start : start + len(chunk)] = _descend_chunk(codebook, biases, chunk, levels)
    return (path[:, -1].copy(), path) if return_path else path[:, -1].copy()


def _descend_chunk(codebook: Codebook, biases: list[np.ndarray], chunk: np.ndarray, levels: int) -> np.ndarray:
    k = codebook.k
    path = np.empty((len(chunk), levels), dtype=np.int64)
    parent = np.zeros(len(chunk), dtype=np.int64)
    for level in range(levels):
        centroids, bias = codebook.centroids[level], biases[level]
        # rows sharing a parent are compared against the same k children in one matrix product
        order = np.argsort(parent, kind="stable")
        parents, starts = np.unique(parent[order], return_index=True)
        chosen = np.empty(len(chunk), dtype=np.int64)
        for node, begin, end in zip(parents.tolist(), starts.tolist(), [*starts[1:].tolist(), len(chunk)]):
            # one parent for the whole chunk (always at level 1): no gather copy
            rows = order[begin:end] if end - begin < len(chunk) else slice(None)
            first = node * k
            distances = bias[first : first + k] - 2.0 * (chunk[rows] @ centroids[first : first + k].T)
            chosen[rows] = first + distances.argmin(axis=1)
        path[:, level] = parent = chosen
    return path
