import json

import numpy as np
import pytest
from kmeans_factory import PROVENANCE_HASH, brute_force_descent, make_work_dir, planted_hierarchy, write_features_shard
from kmeans_factory import write_manifest as write_features_manifest

from pipeline import visual_words
from pipeline.config import load_config
from pipeline.engine.lineage import InputNotReady, Lineage
from pipeline.engine.workdir import WorkDir
from pipeline.executors.local import LocalExecutor
from stages.kmeans import KmeansConfig
from stages.kmeans import run as kmeans
from stages.kmeans import tree as kmeans_tree

PLANTED_SETTINGS = ["kmeans.depth=2", "kmeans.k=12", "kmeans.niter=10", "kmeans.nredo=3"]


def fit(work_dir, overrides, workers=1):
    cfg = load_config(None, overrides)
    return cfg, kmeans.run(cfg, work_dir, LocalExecutor(cfg, workers=workers), quiet=True)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """12 groups x 12 subgroups x 8 clips, spread over two features shards, fit with depth 2, k 12."""
    vectors, group, subgroup = planted_hierarchy()
    work_dir = tmp_path_factory.mktemp("planted")
    make_work_dir(work_dir, [vectors[:700], vectors[700:]])
    cfg, stats = fit(work_dir, PLANTED_SETTINGS)
    return {
        "work_dir": work_dir,
        "vectors": vectors,
        "group": group,
        "subgroup": subgroup,
        "cfg": cfg,
        "stats": stats,
        "codebook": visual_words.load(WorkDir(work_dir).codebook),
    }


def test_tree_recovers_the_planted_groups_and_subgroups(planted):
    _, path = visual_words.descend(planted["codebook"], planted["vectors"], return_path=True)
    level1 = {(g, node) for g, node in zip(planted["group"].tolist(), path[:, 0].tolist())}
    assert len(level1) == 12 and len({node for _, node in level1}) == 12  # a bijection group <-> node
    level2 = {
        ((g, s), leaf)
        for g, s, leaf in zip(planted["group"].tolist(), planted["subgroup"].tolist(), path[:, 1].tolist())
    }
    assert len(level2) == 144 and len({leaf for _, leaf in level2}) == 144
    # every leaf lies under the level-1 node its path went through
    assert np.array_equal(path[:, 1] // 12, path[:, 0])


def test_codebook_file_layout_and_sidecar(planted):
    codebook, work_dir = planted["codebook"], planted["work_dir"]
    assert (codebook.depth, codebook.k, codebook.dim) == (2, 12, 1024)
    assert [c.shape for c in codebook.centroids] == [(12, 1024), (144, 1024)]
    assert all(c.dtype == np.float32 for c in codebook.centroids)
    assert all(c.dtype == np.int64 and c.sum() == 1152 for c in codebook.counts)
    # a parent's members are exactly its children's members
    assert np.array_equal(codebook.counts[1].reshape(12, 12).sum(axis=1), codebook.counts[0])
    info = json.loads((work_dir / "kmeans" / "codebook.json").read_text())
    assert info["sample_size"] == 1152 and info["features_rows"] == 1152 and info["features_shards"] == 2
    assert info["feature_provenance_hash"] == PROVENANCE_HASH
    assert info["feature_provenance"]["fps"] == 20.0
    assert info["config"] == json.loads(planted["cfg"].section_json("kmeans"))
    assert info["empty_nodes"] == [0, 0] and info["empty_leaves"] == 0
    assert info["small_nodes"] == [0, 12 * 12]  # 8 clips per planted subgroup: every leaf has < k
    assert info["sha256"] == planted["stats"]["sha256"]
    assert len(info["inertia"]) == 2 and info["inertia"][1] < info["inertia"][0]


def test_descent_through_saved_file_equals_brute_force(planted):
    codebook = visual_words.load(planted["work_dir"] / "kmeans" / "codebook.safetensors")
    queries = np.concatenate(
        [
            planted["vectors"][:200].astype(np.float32),
            np.random.default_rng(1).normal(0, 3.0, (200, 1024)).astype(np.float32),
        ]
    )
    leaves, path = visual_words.descend(codebook, queries, return_path=True)
    for query, leaf, rows in zip(queries, leaves.tolist(), path.tolist()):
        expected, margins = brute_force_descent(codebook.centroids, codebook.counts, 12, query)
        assert rows == expected or min(margins) < 1e-5 * (1 + float(query @ query))
        assert leaf == rows[-1] and 0 <= leaf < 144
    top_nodes, top_path = visual_words.descend(codebook, queries, return_path=True, levels=1)
    assert np.array_equal(top_path, path[:, :1]) and np.array_equal(top_nodes, path[:, 0])


def test_same_seed_gives_the_same_tree_for_any_number_of_workers(planted, tmp_path):
    make_work_dir(tmp_path, [planted["vectors"][:700], planted["vectors"][700:]])
    _, stats = fit(tmp_path, PLANTED_SETTINGS + ["kmeans.workers=2"], workers=2)
    assert stats["sha256"] == planted["stats"]["sha256"]
    again = visual_words.load(tmp_path / "kmeans")
    ids = visual_words.descend(again, planted["vectors"])
    assert np.array_equal(ids, visual_words.descend(planted["codebook"], planted["vectors"]))
    assert ids.min() >= 0 and ids.max() < 144


def test_empty_and_small_nodes_are_kept_dense_and_never_chosen(tmp_path):
    rng = np.random.default_rng(3)
    spread = rng.normal(0, 1.0, (60, 1024))  # splits normally
    pair = 40.0 + rng.normal(0, 1.0, (2, 1024))  # 2 < k members: a small node
    duplicates = np.full((30, 1024), -40.0)  # >= k members, all identical
    make_work_dir(tmp_path, [np.concatenate([spread, pair, duplicates]).astype(np.float16)])
    fit(tmp_path, ["kmeans.depth=3", "kmeans.k=3", "kmeans.niter=10"])
    codebook = visual_words.load(tmp_path / "kmeans")
    assert [len(c) for c in codebook.counts] == [3, 9, 27]
    assert sorted(codebook.counts[0].tolist()) == [2, 30, 60]
    assert all(np.isfinite(c).all() for c in codebook.centroids)
    pair_node = int(np.flatnonzero(codebook.counts[0] == 2)[0])
    assert sorted(codebook.counts[1][pair_node * 3 : pair_node * 3 + 3].tolist()) == [0, 1, 1]
    duplicate_node = int(np.flatnonzero(codebook.counts[0] == 30)[0])
    assert sorted(codebook.counts[1][duplicate_node * 3 : duplicate_node * 3 + 3].tolist()) == [0, 0, 30]
    for level, counts in enumerate(codebook.counts[1:], start=1):  # children add up to their parent
        assert np.array_equal(counts.reshape(-1, 3).sum(axis=1), codebook.counts[level - 1])
    info = codebook.info
    assert info["empty_nodes"] == [int((c == 0).sum()) for c in codebook.counts]
    assert info["small_nodes"] == [int(((c > 0) & (c < 3)).sum()) for c in codebook.counts]
    assert info["empty_leaves"] == info["empty_nodes"][-1] > 0
    queries = np.concatenate([rng.normal(0, 40.0, (300, 1024)), pair, duplicates[:1]])
    leaves = visual_words.descend(codebook, queries)
    assert (codebook.counts[2][leaves] > 0).all()
    assert (leaves < 27).all() and (leaves >= 0).all()


def test_node_fit_uses_every_member_up_to_the_cap(tmp_path):
    # 4 separated groups of 800: over faiss's silent 256-per-centroid cap (1024 points for k=4)
    rng = np.random.default_rng(5)
    vectors = np.repeat(rng.normal(0, 50.0, (4, 8)), 800, axis=0) + rng.normal(0, 1.0, (3200, 8))
    np.save(tmp_path / "sample.npy", vectors.astype(np.float16))
    exact = vectors.astype(np.float16).astype(np.float64).reshape(4, 800, 8).mean(axis=1)

    def level1_centroids(cap):
        tree = kmeans_tree.fit_tree(tmp_path / "sample.npy", KmeansConfig(depth=1, k=4, max_points_per_node=cap))
        return tree.centroids[0][np.argsort(tree.centroids[0][:, 0])]

    order = np.argsort(exact[:, 0])
    assert np.allclose(level1_centroids(10_000), exact[order], atol=1e-4)  # all 3,200 members
    assert not np.allclose(level1_centroids(400), exact[order], atol=1e-2)  # a 400-point subsample


def test_sample_is_capped_spread_evenly_over_shards_and_seeded(tmp_path):
    shards, tables = [], {}
    for shard_index, rows in enumerate([50, 100, 150]):
        vectors = np.zeros((rows, 1024), dtype=np.float16)
        vectors[:, 0], vectors[:, 1] = shard_index, np.arange(rows)  # where each row came from
        tables[shard_index] = write_features_shard(tmp_path, shard_index, vectors)
        shards.append((shard_index, tmp_path / "features" / f"part-{shard_index:05d}.parquet"))
    write_features_manifest(tmp_path, tables)
    assert Lineage(tmp_path).current_parts("features") == shards

    def sample(seed, name):
        stats = kmeans.write_fit_sample(shards, 100, seed, tmp_path / name, quiet=True)
        return stats, np.load(tmp_path / name)

    stats, first = sample(7, "a.npy")
    assert stats["sample_size"] == 100 and stats["features_rows"] == 300
    origins = {(int(a), int(b)) for a, b in first[:, :2]}
    assert len(origins) == 100  # no row twice
    assert [sum(1 for s, _ in origins if s == shard) for shard in range(3)] == [17, 33, 50]
    assert np.array_equal(first, sample(7, "b.npy")[1])
    assert not np.array_equal(first, sample(8, "c.npy")[1])


def test_sample_quotas_are_proportional_and_exact():
    assert kmeans.sample_quotas([50, 100, 150], 1000) == [50, 100, 150]
    assert kmeans.sample_quotas([50, 100, 150], 100) == [17, 33, 50]
    quotas = kmeans.sample_quotas([7, 0, 13, 1], 9)
    assert sum(quotas) == 9 and quotas[1] == 0 and all(q <= n for q, n in zip(quotas, [7, 0, 13, 1]))


def test_nonfinite_features_are_dropped_and_empty_shards_skipped(tmp_path):
    vectors, _, _ = planted_hierarchy(groups=3, subgroups=2, per_subgroup=4)
    vectors[5, 10] = np.inf
    make_work_dir(tmp_path, [np.zeros((0, 1024), dtype=np.float16), vectors])
    fit(tmp_path, ["kmeans.depth=1", "kmeans.k=3"])
    info = json.loads((tmp_path / "kmeans" / "codebook.json").read_text())
    assert info["nonfinite_dropped"] == 1 and info["sample_size"] == len(vectors) - 1
    assert info["features_shards"] == 2 and info["features_rows"] == len(vectors)


def test_fewer_vectors_than_k_is_a_clear_error(tmp_path):
    make_work_dir(tmp_path, [np.ones((5, 1024), dtype=np.float16)])
    with pytest.raises(ValueError, match=r"at least kmeans.k=12 feature vectors.*got 5"):
        fit(tmp_path, [])
    assert not (tmp_path / "kmeans" / "codebook.safetensors").exists()
    assert not list((tmp_path / "kmeans").glob("*.npy"))  # the sample file is cleaned up


def test_missing_features_is_a_clear_error_naming_the_stage_to_run(tmp_path):
    with pytest.raises(InputNotReady, match="run the manifest stage first"):
        fit(tmp_path, [])
    vectors, _, _ = planted_hierarchy(groups=3, subgroups=2, per_subgroup=4)
    tables = make_work_dir(tmp_path, [vectors[:12], vectors[12:]])
    WorkDir(tmp_path).record("features", 1).unlink()
    with pytest.raises(
        InputNotReady, match="kmeans needs features part 00001, which is missing: run the features stage first"
    ):
        fit(tmp_path, [])
    assert tables


def test_mixed_feature_provenance_is_refused(tmp_path):
    vectors, _, _ = planted_hierarchy(groups=3, subgroups=2, per_subgroup=4)
    write_features_manifest(
        tmp_path,
        {
            0: write_features_shard(tmp_path, 0, vectors, provenance_hash="1111111111111111"),
            1: write_features_shard(tmp_path, 1, vectors, provenance_hash="2222222222222222"),
        },
    )
    with pytest.raises(ValueError, match="part 0 has 1111111111111111, part 1 has 2222222222222222"):
        fit(tmp_path, ["kmeans.k=3"])


def test_a_current_codebook_is_kept_and_a_stale_one_refit(planted):
    work_dir, cfg = planted["work_dir"], planted["cfg"]
    executor = LocalExecutor(cfg, workers=1)
    original = planted["stats"]["sha256"]
    assert kmeans.run(cfg, work_dir, executor, quiet=True) == {
        "stage": "kmeans",
        "skipped": True,
        "codebook": str(work_dir / "kmeans" / "codebook.safetensors"),
        "sha256": original,
    }
    changed = kmeans.run(load_config(None, PLANTED_SETTINGS + ["kmeans.seed=1"]), work_dir, executor, quiet=True)
    assert changed["redone"] == "stale: config kmeans.seed 0 -> 1" and changed["sha256"] != original
    back = kmeans.run(cfg, work_dir, executor, quiet=True)  # the config went back: so does the tree
    assert back["sha256"] == original and "skipped" not in back
    forced = kmeans.run(cfg, work_dir, executor, force=True, quiet=True)
    assert forced["sha256"] == original and "skipped" not in forced


def test_codebook_info_reports_levels_occupancy_and_top_clusters(planted):
    text = kmeans.codebook_info(planted["work_dir"], top=3)
    assert "depth 2, k 12, dim 1024: 144 leaves" in text
    assert "fit on 1,152 sampled clips of 1,152 in 2 features shards, seed 0" in text
    assert "empty leaves: 0 of 144" in text
    level_rows = [line.split() for line in text.splitlines() if line.strip().startswith(("1 ", "2 "))]
    assert level_rows[0][:4] == ["1", "12", "12", "0"] and level_rows[1][:4] == ["2", "144", "144", "0"]
    top = text.split("top 3 leaves by training members:")[1].strip().splitlines()[1:]
    assert len(top) == 3 and all(line.split()[2] == "8" for line in top)


@pytest.mark.parametrize(
    "override, message",
    [
        ("kmeans.nredo=0", "kmeans.nredo must be > 0"),
        ("kmeans.workers=-1", "kmeans.workers must be >= 0"),
        ("kmeans.seed=-1", "kmeans.seed must be >= 0"),
        ("kmeans.depth=9", r"kmeans.k \*\* kmeans.depth must be < 2\*\*31"),
    ],
)
def test_impossible_kmeans_settings_stop_at_load(override, message):
    from pipeline.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_a_codebook_far_larger_than_its_clips_is_warned_once_and_recorded(tmp_path, caplog):
    vectors, _, _ = planted_hierarchy(groups=5, subgroups=3, per_subgroup=4)  # 60 clips
    make_work_dir(tmp_path, [vectors])
    with caplog.at_level("WARNING", logger="pipeline.kmeans"):
        _, stats = fit(tmp_path, ["kmeans.depth=3", "kmeans.k=12", "kmeans.niter=5"])
    lines = [record.getMessage() for record in caplog.records if "too large" in record.getMessage()]
    assert lines == [
        "kmeans: codebook depth 3, k 12 is too large for 60 fit clips: at least 1,668 of its "
        "1,728 leaves stay empty; for this many clips use kmeans.depth=2, kmeans.k=5 (25 leaves), "
        "or fit on at least 3,456 clips"
    ]
    info = json.loads((tmp_path / "kmeans" / "codebook.json").read_text())
    assert info["warnings"] == [lines[0].removeprefix("kmeans: ")]
    assert not any("too large" in str(value) for value in stats.values())  # said once: the log line
    assert info["empty_leaves"] >= 1668
    assert f"warning: {info['warnings'][0]}" in kmeans.codebook_info(tmp_path)
    caplog.clear()
    with caplog.at_level("WARNING", logger="pipeline.kmeans"):  # a current codebook: nothing said again
        assert fit(tmp_path, ["kmeans.depth=3", "kmeans.k=12", "kmeans.niter=5"])[1]["skipped"]
    assert not caplog.records


def test_a_fit_that_leaves_most_leaves_empty_is_warned_after_it(tmp_path, caplog):
    # 40 identical clips and 2 others: enough clips for 9 leaves, but the tree can fill only a few of them
    vectors = np.concatenate([np.full((40, 1024), 1.0), np.full((1, 1024), -1.0), np.full((1, 1024), 3.0)])
    make_work_dir(tmp_path, [vectors.astype(np.float16)])
    with caplog.at_level("WARNING", logger="pipeline.kmeans"):
        fit(tmp_path, ["kmeans.depth=2", "kmeans.k=3", "kmeans.niter=5"])
    info = json.loads((tmp_path / "kmeans" / "codebook.json").read_text())
    filled = 9 - info["empty_leaves"]
    assert filled < 4.5
    # more clips like these would not help: the suggestion is a codebook no larger than the leaves they fill
    new_depth, new_k = kmeans.suggested_shape(42, 2, max_leaves=filled)
    assert new_k**new_depth <= filled
    assert info["warnings"] == [
        f"codebook depth 2, k 3 is too large for its 42 fit clips: {9 - filled} of its 9 "
        f"leaves are empty (the clips are alike enough to fill only {filled}); for these "
        f"clips use kmeans.depth={new_depth}, kmeans.k={new_k} ({new_k**new_depth} leaves)"
    ]
    assert [record.getMessage() for record in caplog.records if "too large" in record.getMessage()] == [
        f"kmeans: {info['warnings'][0]}"
    ]


def test_a_codebook_its_clips_can_fill_has_no_warning(planted):
    info = json.loads((planted["work_dir"] / "kmeans" / "codebook.json").read_text())
    assert info["warnings"] == []
    assert "warning:" not in kmeans.codebook_info(planted["work_dir"])


@pytest.mark.parametrize(
    "clips, depth, shape", [(65, 4, (2, 5)), (1000, 4, (4, 4)), (100_000, 4, (4, 14)), (10, 4, (1, 5)), (3, 2, (1, 2))]
)
def test_the_suggested_codebook_has_about_two_clips_per_leaf(clips, depth, shape):
    assert kmeans.suggested_shape(clips, depth) == shape
    new_depth, k = shape
    assert k**new_depth <= max(clips / 2, 2)


def test_a_capped_sample_is_named_in_the_warning():
    assert kmeans.size_warning(100, 3, 12, features_rows=5_000).endswith(
        "or fit on at least 3,456 clips (kmeans.max_fit_vectors sampled 100 of the 5,000)"
    )
    assert kmeans.size_warning(100, 3, 12, features_rows=100).endswith("or fit on at least 3,456 clips")
    assert kmeans.size_warning(2_000, 3, 12) is None
