"""The visual-word codebook file: the contract between kmeans and its readers (quantize, gallery, trainer).

`DIR/kmeans/codebook.safetensors` holds, for each level L = 1..depth, `centroids_L{L}` (k**L x dim,
float32) and `counts_L{L}` (k**L, int64: training members per node). Child c of row n at level L is
row n*k + c at level L+1, so a leaf id is the base-k number of the path from the root. A node with no
training members is empty: its centroid row is meaningless and descent never chooses it.
`DIR/kmeans/codebook.json` is the sidecar: depth, k, dim, seed, sample size, inertia per level, empty and
small node counts, the features' provenance hash, and the sha256 of the safetensors file."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

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
    centroids: list[np.ndarray]  # level L-1 -> (k**L, dim) float32
    counts: list[np.ndarray]  # level L-1 -> (k**L,) int64
    info: dict = field(default_factory=dict)  # the sidecar

    @property
    def dim(self) -> int:
        return int(self.centroids[0].shape[1])

    @property
    def num_leaves(self) -> int:
        return self.k**self.depth


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
        raise ValueError(
            f"features part {shard_index} has feature provenance {features_hash}, the codebook "
            f"was fit on {codebook_hash}: {remedy}"
        )


def to_bytes(codebook: Codebook) -> bytes:
    """The tensors file's bytes (safetensors)."""
    from safetensors.numpy import save as save_bytes

    tensors = {}
    for level in range(1, codebook.depth + 1):
        tensors[f"centroids_L{level}"] = np.ascontiguousarray(codebook.centroids[level - 1], dtype=np.float32)
        tensors[f"counts_L{level}"] = np.ascontiguousarray(codebook.counts[level - 1], dtype=np.int64)
    # one metadata key only: safetensors writes several in hash-map order, which differs between
    # processes and would change the file's bytes (and sha256) for the same tensors; depth and k
    # are the tensors' shapes
    return save_bytes(tensors, metadata={"format": f"videobert-codebook:{VERSION}"})


def sidecar(codebook: Codebook, sha256: str) -> dict:
    """The sidecar's content: the fit's information, the shape, and the tensors file's sha256."""
    return dict(
        codebook.info, depth=codebook.depth, k=codebook.k, dim=codebook.dim, format_version=VERSION, sha256=sha256
    )


def from_bytes(data: bytes, info: dict, name: str) -> Codebook:
    """A codebook from the tensors file's bytes and its sidecar; bytes that do not match the sidecar's
    sha256 (a flipped bit would silently move every token) are a CorruptCodebook naming `name`."""
    from safetensors.numpy import load as load_bytes

    if info.get("sha256") and hashlib.sha256(data).hexdigest() != info["sha256"]:
        raise CorruptCodebook(
            f"{name} does not match the sha256 in its sidecar {SIDECAR_NAME}: the codebook is "
            f"corrupt or was replaced; rerun the kmeans stage"
        )
    try:
        tensors = load_bytes(data)
    except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
        raise CorruptCodebook(f"cannot read {name}: {error}: rerun the kmeans stage") from None
    depth = sum(1 for key in tensors if key.startswith("centroids_L"))
    k = tensors["centroids_L1"].shape[0]
    return Codebook(
        depth=depth,
        k=k,
        centroids=[tensors[f"centroids_L{level}"] for level in range(1, depth + 1)],
        counts=[tensors[f"counts_L{level}"] for level in range(1, depth + 1)],
        info=info,
    )
