import numpy as np
import pyarrow.parquet as pq
import pytest
from kmeans_factory import PROVENANCE_HASH, brute_force_descent, make_work_dir, pin_codebook, planted_hierarchy

import schemas
from pipeline import storage, visual_words
from pipeline.config import load_config
from pipeline.engine import runner
from pipeline.engine.lineage import InputNotReady
from pipeline.engine.workdir import WorkDir
from pipeline.executors.local import LocalExecutor
from stages.kmeans import run as kmeans

SETTINGS = ["kmeans.depth=2", "kmeans.k=12", "kmeans.niter=10", "kmeans.nredo=3"]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A planted work dir (two features shards) with its codebook fit."""
    vectors, group, subgroup = planted_hierarchy(per_subgroup=6, seed=2)
    work_dir = tmp_path_factory.mktemp("quantize")
    tables = make_work_dir(work_dir, [vectors[:500], vectors[500:]], clips_per_video=40)
    cfg = load_config(None, SETTINGS)
    kmeans.run(cfg, work_dir, LocalExecutor(cfg, workers=1), quiet=True)
    return {
        "work_dir": work_dir,
        "cfg": cfg,
        "tables": tables,
        "vectors": vectors,
        "group": group,
        "subgroup": subgroup,
    }


def test_tokens_are_the_tree_descent_of_each_clip(fitted):
    work_dir, cfg = fitted["work_dir"], fitted["cfg"]
    codebook = visual_words.load(work_dir / "kmeans")
    tokens_by_clip = {}
    for shard_index, features in fitted["tables"].items():
        stats = runner.run_one_shard(cfg, work_dir, "quantize", shard_index, quiet=True)
        assert stats["clips"] == features.num_rows and stats["errors"] == 0
        path = WorkDir(work_dir).part("quantize", shard_index)
        table = pq.read_table(path)
        assert table.schema.remove_metadata() == schemas.QUANTIZE.arrow
        keys = list(zip(table["video_id"].to_pylist(), table["clip_index"].to_pylist()))
        assert keys == sorted(keys) and len(keys) == features.num_rows
        metadata = storage.read_metadata(path)
        assert metadata.schema == schemas.QUANTIZE.tag
        assert metadata.codebook_sha256 == storage.file_sha256(work_dir / "kmeans" / "codebook.safetensors")
        assert metadata.feature_provenance_hash == PROVENANCE_HASH
        # the same clip in the features shard: its vector descended by hand
        vectors = {
            (v, c): np.asarray(f, dtype=np.float32)
            for v, c, f in zip(
                features["video_id"].to_pylist(),
                features["clip_index"].to_pylist(),
                features["feature"].to_numpy(zero_copy_only=False),
            )
        }
        for key, token, start_s in zip(keys, table["token"].to_pylist(), table["start_s"].to_pylist()):
            path_rows, margins = brute_force_descent(codebook.centroids, codebook.counts, 12, vectors[key])
            assert token == path_rows[-1] or min(margins) < 1e-5 * float(vectors[key] @ vectors[key])
            assert start_s == key[1] * 1.5
            tokens_by_clip[key] = token
    # the planted subgroups become the visual words: one token per subgroup, all 144 distinct
    all_features = [
        row
        for shard in fitted["tables"].values()
        for row in zip(shard["video_id"].to_pylist(), shard["clip_index"].to_pylist())
    ]
    words = {(g, s): set() for g, s in zip(fitted["group"].tolist(), fitted["subgroup"].tolist())}
    for key, g, s in zip(all_features, fitted["group"].tolist(), fitted["subgroup"].tolist()):
        words[(g, s)].add(tokens_by_clip[key])
    assert all(len(tokens) == 1 for tokens in words.values())
    assert len({next(iter(tokens)) for tokens in words.values()}) == 144


def _with_fitted_codebook(work_dir, fitted) -> None:
    """The fitted codebook copied into another work dir, recorded as made outside its stage."""
    (work_dir / "kmeans").mkdir()
    for name in ("codebook.safetensors", "codebook.json"):
        (work_dir / "kmeans" / name).write_bytes((fitted["work_dir"] / "kmeans" / name).read_bytes())
    pin_codebook(work_dir)


def test_features_from_another_provenance_are_refused(tmp_path, fitted):
    make_work_dir(tmp_path, [fitted["vectors"][:20]], provenance_hash="ffffffffffffffff")
    _with_fitted_codebook(tmp_path, fitted)
    with pytest.raises(ValueError, match=f"ffffffffffffffff.*{PROVENANCE_HASH}"):
        runner.run_one_shard(fitted["cfg"], tmp_path, "quantize", 0, quiet=True)
    assert not WorkDir(tmp_path).part("quantize", 0).exists()
    assert not WorkDir(tmp_path).record("quantize", 0).exists()


def test_an_empty_features_shard_gives_an_empty_token_shard(tmp_path, fitted):
    make_work_dir(tmp_path, [np.zeros((0, 1024), dtype=np.float16)])
    _with_fitted_codebook(tmp_path, fitted)
    stats = runner.run_one_shard(fitted["cfg"], tmp_path, "quantize", 0, quiet=True)
    assert stats["clips"] == 0 and stats["errors"] == 0
    assert pq.read_table(WorkDir(tmp_path).part("quantize", 0)).num_rows == 0


def test_a_missing_codebook_says_to_run_kmeans(tmp_path):
    vectors, _, _ = planted_hierarchy(groups=2, subgroups=2, per_subgroup=2)
    make_work_dir(tmp_path, [vectors])
    with pytest.raises(InputNotReady, match="run the kmeans stage first"):
        runner.run_one_shard(load_config(None, SETTINGS), tmp_path, "quantize", 0, quiet=True)
