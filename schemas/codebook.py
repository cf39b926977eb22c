"""The visual-word codebook file: the contract between kmeans and its readers (quantize, gallery, trainer).

`DIR/kmeans/codebook.safetensors` holds, for each level L = 1..depth, `centroids_L{L}` (k**L x dim,
float32) and `counts_L{L}` (k**L, int64: training members per node). Child c of row n at level L is
row n*k + c at level L+1, so a leaf id is the base-k number of the path from the root. A node with no
training members is empty: its centroid row is meaningless and descent never chooses it.
`DIR/kmeans/codebook.json` is the sidecar: depth, k, dim, seed, sample size, inertia per level, empty and
small node counts, the features' provenance hash, and the sha256 of the safetensors file."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

VERSION = 1
FILE_NAME = "codebook.safetensors"
SIDECAR_NAME = "codebook.json"


class CorruptCodebook(ValueError):
    """The codebook files cannot be trusted; the message names the file."""


@dataclass
class Codebook:
    depth: int
    k: int
    centroids: list[np.ndarray]           # level L-1 -> (k**L, dim) float32
    counts: list[np.ndarray]              # level L-1 -> (k**L,) int64
    info: dict = field(default_factory=dict)   # the sidecar

    @property
    def dim(self) -> int:
        return int(self.centroids[0].shape[1])

    @property
    def num_leaves(self) -> int:
        return self.k ** self.depth


def node_path(k: int, level: int, node: int) -> list[int]:
    """Child index at each level from the root to the node `node` (a row) of level `level`."""
    path = []
    for _ in range(level):
        path.append(node % k)
        node //= k
    return path[::-1]


def path_label(k: int, level: int, node: int) -> str:
    """The node's path as dotted child indexes, e.g. "5.7.11"."""
    return ".".join(str(step) for step in node_path(k, level, node))


def check_feature_provenance(codebook: Codebook, shard_index: int, features_hash: str | None, remedy: str) -> None:
    """Tokens or clusters from another feature space (other S3D weights, frame rate) are silently wrong:
    refuse a features part whose provenance is not the one the codebook was fit on."""
    codebook_hash = codebook.info.get("feature_provenance_hash")
    if features_hash != codebook_hash:
        raise ValueError(f"features part {shard_index} has feature provenance {features_hash}, the codebook "
                         f"was fit on {codebook_hash}: {remedy}")


def save(codebook: Codebook, folder: Path) -> tuple[Path, str]:
    """Write the tensors and the sidecar atomically; returns (path, sha256 of the tensors file)."""
    from safetensors.numpy import save as save_bytes

    from pipeline import storage

    tensors = {}
    for level in range(1, codebook.depth + 1):
        tensors[f"centroids_L{level}"] = np.ascontiguousarray(codebook.centroids[level - 1], dtype=np.float32)
        tensors[f"counts_L{level}"] = np.ascontiguousarray(codebook.counts[level - 1], dtype=np.int64)
    # one metadata key only: safetensors writes several in hash-map order, which differs between
    # processes and would change the file's bytes (and sha256) for the same tensors; depth and k
    # are the tensors' shapes
    data = save_bytes(tensors, metadata={"format": f"videobert-codebook:{VERSION}"})
    folder = Path(folder)
    path = folder / FILE_NAME
    sha = hashlib.sha256(data).hexdigest()
    storage.atomic_write_bytes(path, data)
    info = dict(codebook.info, depth=codebook.depth, k=codebook.k, dim=codebook.dim,
                format_version=VERSION, sha256=sha)
    storage.atomic_write_json(folder / SIDECAR_NAME, info)
    return path, sha


def load(path: Path) -> Codebook:
    """Load from the safetensors file or from the folder holding it (e.g. DIR/kmeans)."""
    from safetensors.numpy import load as load_bytes

    path = Path(path)
    if path.is_dir():
        path = path / FILE_NAME
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the kmeans stage first")
    data = path.read_bytes()
    sidecar = path.with_name(SIDECAR_NAME)
    try:
        info = json.loads(sidecar.read_text()) if sidecar.exists() else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CorruptCodebook(f"{sidecar} is not valid JSON ({error}): rerun the kmeans stage") from None
    # the sidecar names the tensors file by content: a flipped bit would silently move every token
    if info.get("sha256") and hashlib.sha256(data).hexdigest() != info["sha256"]:
        raise CorruptCodebook(f"{path} does not match the sha256 in {sidecar}: the codebook is corrupt or was "
                              f"replaced; rerun the kmeans stage")
    try:
        tensors = load_bytes(data)
    except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
        raise CorruptCodebook(f"cannot read {path}: {error}: rerun the kmeans stage") from None
    depth = sum(1 for key in tensors if key.startswith("centroids_L"))
    k = tensors["centroids_L1"].shape[0]
    return Codebook(depth=depth, k=k,
                    centroids=[tensors[f"centroids_L{level}"] for level in range(1, depth + 1)],
                    counts=[tensors[f"counts_L{level}"] for level in range(1, depth + 1)], info=info)


def descend(codebook: Codebook, vectors: np.ndarray, *, return_path: bool = False, levels: int | None = None,
            chunk_rows: int = 65_536) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
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
    biases = [np.where(counts > 0, np.einsum("ij,ij->i", centroids, centroids), np.inf).astype(np.float32)
              for centroids, counts in zip(codebook.centroids[:levels], codebook.counts[:levels])]
    path = np.empty((len(vectors), levels), dtype=np.int64)
    for start in range(0, len(vectors), chunk_rows):
        chunk = np.ascontiguousarray(vectors[start:start + chunk_rows], dtype=np.float32)
        path[start:start + len(chunk)] = _descend_chunk(codebook, biases, chunk, levels)
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
            distances = bias[first:first + k] - 2.0 * (chunk[rows] @ centroids[first:first + k].T)
            chosen[rows] = first + distances.argmin(axis=1)
        path[:, level] = parent = chosen
    return path
