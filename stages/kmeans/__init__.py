"""kmeans: the visual-word codebook, a hierarchical k-means fitted on a sample of the features (a
whole-collection stage: one run; run.py)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config_fields import SEED, ConfigError, count, setting
from pipeline.contract import Option, Stage


def leaves_fit_int32(k, prefix: str) -> None:
    # tokens are int32 leaf ids; any depth over 31 exceeds them even at k = 2 (and k ** depth is not computed).
    # Checked before the depth bound: with the usual k, a deeper tree fails for its leaf count
    if k.depth > 31 or k.k**k.depth > 2**31 - 1:
        raise ConfigError(f"config error: {prefix}k ** {prefix}depth must be < 2**31 (got {k.k}**{k.depth})")


def node_holds_k(k, prefix: str) -> None:
    if k.max_points_per_node < k.k:
        raise ConfigError(
            f"config error: {prefix}max_points_per_node must be >= {prefix}k (got {k.max_points_per_node})"
        )


@dataclass
class KmeansConfig:
    # children per node; and k**depth < 2**31 (tokens are int32)
    k: int = setting(12, ge=2, le=4096, rule=leaves_fit_int32)
    depth: int = setting(4, ge=1, le=8)  # levels of the tree, k**depth leaves (12**4 = 20,736 visual words)
    # features sampled (evenly across shards) to fit the tree; 100,000,000 is 400 GB of float32 vectors
    max_fit_vectors: int = setting(2_000_000, gt=0, le=100_000_000)
    # per-node fit cap, at least k; faiss would silently use 256 per centroid
    max_points_per_node: int = setting(200_000, rule=node_holds_k)
    niter: int = setting(20, gt=0, le=1000)  # k-means iterations per node (faiss's default is 25)
    nredo: int = setting(1, gt=0, le=100)  # k-means restarts per node, the best one is kept
    # the fit sample's draw and every node's k-means initialisation
    seed: int = setting(0, **SEED)
    workers: int = count()  # processes fitting subtrees; 0 = the task's CPUs


STAGE = Stage(
    "kmeans",
    "fit the visual-word codebook (hierarchical k-means) on a sample of the features",
    reads=("features", "quality"),
    config_sections=("kmeans",),
    per_shard=False,
    writes="kmeans/codebook.safetensors + codebook.json",
    section="kmeans",
    section_type="stages.kmeans:KmeansConfig",
    ray_roles={"kmeans": {"num_cpus": 1}},
    run="stages.kmeans.run:run_collection",
    status_line="stages.kmeans.checks:status_line",
    validate="stages.kmeans.checks:validate",
    options=(Option("--force", "refit even when the codebook is current"),),
    workers="processes fitting subtrees (default: kmeans.workers)",
)
