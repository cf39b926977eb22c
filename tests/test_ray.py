"""The Ray executor on a local Ray instance: outputs byte-identical to the local executor's (decode, and
features, a split stage, with producer tasks feeding an encoder actor; its one pass also writes decode's
outputs), retries, the report of a shard that keeps failing, and the k-means subtrees as Ray tasks."""

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from kmeans_factory import PROVENANCE_HASH, make_work_dir, pin_codebook, planted_hierarchy, write_features_shard
from kmeans_factory import write_manifest as write_features_manifest
from media_factory import make_video

from pipeline import cli
from pipeline.config import ConfigError, load_config
from pipeline.engine.lineage import Lineage
from pipeline.engine.manifest import write_manifest
from pipeline.engine.workdir import WorkDir
from pipeline.executors.local import LocalExecutor
from reports.status import status_text
from stages.kmeans import run as kmeans

ray = pytest.importorskip("ray")
from pipeline.executors.ray import RayExecutor, task_options  # noqa: E402

pytestmark = pytest.mark.slow

# the smallest clips S3D takes (14 frames), random weights: each clip costs about a second on 2 cores. One
# encoder thread on both executors (a Ray actor's default is its num_cpus, 1; the local one's the CPUs, 2): in
# float32 (features.precision auto on a CPU without bf16) a vector's last bits depend on the thread count
TINY_FEATURES = [
    "features.weights=random",
    "features.num_threads=1",
    "decode.clip_frames=14",
    "decode.min_clip_frames=7",
    "features.batch_size=2",
    "features.decode_workers=2",
    "shards.videos_per_shard=2",
]


@pytest.fixture(scope="module")
def ray_instance():
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def _outputs(work: Path) -> dict[str, bytes]:
    """Every data file (not the completion records, which hold timings and hosts) by relative path."""
    return {str(p.relative_to(work)): p.read_bytes() for p in sorted(work.rglob("*.parquet"))}


def test_decode_and_features_are_byte_identical_to_the_local_executor(tmp_path, ray_instance):
    videos = tmp_path / "videos"
    videos.mkdir()
    make_video(videos / "a.mp4", duration_s=1.7, fps=25)  # two clips
    make_video(videos / "b.mp4", duration_s=0.8, fps=30)  # one
    make_video(videos / "c.mp4", duration_s=1.0, fps=24)  # one
    (videos / "broken.mp4").write_text("not a video")  # an error row in both stages
    # features on Ray: the shard's two producer streams (decode_workers=2) are decode tasks feeding one
    # encoder actor (on CPU here; on a cluster it asks for a GPU)
    cfg = load_config(
        None, TINY_FEATURES + ["features.ray_models=1", "executor.ray_resources={features_model: {num_gpus: 0}}"]
    )
    local, distributed = tmp_path / "local", tmp_path / "ray"
    for work in (local, distributed):
        write_manifest(cfg, videos, work)
    shards = Lineage(local).manifest_shards()
    assert shards == [0, 1]
    executor = RayExecutor(cfg)
    # features alone: its pass makes decode's outputs too, on either executor
    LocalExecutor(cfg, workers=1).run_shards(local, "features", shards, quiet=True)
    results = executor.run_shards(distributed, "features", shards, quiet=True)
    assert [r["shard"] for r in results] == shards and not any(r.get("failed") for r in results)
    assert results[0]["encoder_actors"] == 1 and results[0]["producer_streams"] == 2
    assert results[0]["clips"] + results[1]["clips"] == 4
    assert _outputs(distributed) == _outputs(local)
    # the manifest; per shard: decode's clips and videos, features, the shots of the same pass, each stage's
    # error table
    assert len(_outputs(local)) == 1 + 2 * 7
    # a rerun finds every shard complete and starts no task; so does decode, made by the features pass
    assert all(r["skipped"] for r in executor.run_shards(distributed, "features", shards, quiet=True))
    assert all(r["skipped"] for r in executor.run_shards(distributed, "decode", shards, quiet=True))
    # decode alone on Ray makes the same files as locally
    for work in (local, distributed):
        for shard in shards:
            WorkDir(work).record("decode", shard).unlink()
    LocalExecutor(cfg, workers=1).run_shards(local, "decode", shards, quiet=True)
    assert not any(
        r.get("failed") or r.get("skipped") for r in executor.run_shards(distributed, "decode", shards, quiet=True)
    )
    assert _outputs(distributed) == _outputs(local)


def test_a_shard_that_keeps_failing_is_reported_with_its_log_and_the_others_complete(tmp_path, ray_instance, capsys):
    vectors, _, _ = planted_hierarchy(groups=3, subgroups=2, per_subgroup=4, seed=1)
    settings = ["kmeans.depth=1", "kmeans.k=3", "executor.max_retries=1"]
    cfg = load_config(None, settings)
    make_work_dir(tmp_path, [vectors[:12]], clips_per_video=6)
    kmeans.run(cfg, tmp_path, RayExecutor(cfg), quiet=True)
    pin_codebook(tmp_path)
    # shard 1's features come from another S3D: quantize refuses them on every attempt
    write_features_shard(tmp_path, 1, vectors[12:], provenance_hash="another-model", clips_per_video=6)
    write_features_manifest(
        tmp_path, {index: pq.read_table(WorkDir(tmp_path).part("features", index)) for index in (0, 1)}
    )

    args = ["quantize", "--work-dir", str(tmp_path), "--executor", "ray", "--quiet"] + [
        part for setting in settings for part in ("--set", setting)
    ]
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert "1 shard(s) run, 0 already current, 1 failed" in err
    assert "quantize part 00001 FAILED: ValueError: features part 1 has feature provenance another-model" in err
    assert "(after 2 attempt(s))" in err and str(WorkDir(tmp_path).shard_log("quantize", 1)) in err
    log = WorkDir(tmp_path).shard_log("quantize", 1).read_text()
    assert log.count(": attempt on ") == 2 and log.count(": attempt failed") == 2  # retried once
    assert Lineage(tmp_path).current("quantize", 0)  # kept
    assert not Lineage(tmp_path).current("quantize", 1)
    assert "quantize part 00001 failed: ValueError: features part 1 has feature provenance" in status_text(tmp_path)

    write_features_shard(tmp_path, 1, vectors[12:], provenance_hash=PROVENANCE_HASH, clips_per_video=6)
    assert cli.main(args) == 0
    assert "1 shard(s) run, 1 already current, 0 failed" in capsys.readouterr().err
    assert "failed shards" not in status_text(tmp_path)


def test_kmeans_subtrees_as_ray_tasks_give_the_local_codebook(tmp_path, ray_instance):
    vectors, _, _ = planted_hierarchy(groups=3, subgroups=3, per_subgroup=5, seed=3)
    cfg = load_config(None, ["kmeans.depth=2", "kmeans.k=3", "kmeans.niter=5"])
    for name, executor in (("local", LocalExecutor(cfg, workers=1)), ("ray", RayExecutor(cfg))):
        make_work_dir(tmp_path / name, [vectors[:20], vectors[20:]], clips_per_video=5)
        stats = kmeans.run(cfg, tmp_path / name, executor, quiet=True)
        assert stats["leaves"] == 9
    files = [(tmp_path / name / "kmeans" / "codebook.safetensors").read_bytes() for name in ("local", "ray")]
    assert files[0] == files[1]
    sidecars = [json.loads((tmp_path / name / "kmeans" / "codebook.json").read_text()) for name in ("local", "ray")]
    assert sidecars[0] == sidecars[1]


def test_map_retries_a_part_that_raised_or_whose_worker_died(tmp_path, ray_instance):
    def flaky(item):
        marker = tmp_path / f"attempted-{item}"
        first = not marker.exists()
        marker.touch()
        if first and item == 1:
            raise RuntimeError("transient failure")
        if first and item == 2:
            os._exit(1)  # the worker process dies, as on a lost node or the OOM killer
        return item * 10

    assert RayExecutor(load_config(None, ["executor.max_retries=1"])).map(flaky, [0, 1, 2], role="kmeans") == [
        0,
        10,
        20,
    ]

    def always_fails(item):
        raise ValueError(f"part {item} is broken")

    with pytest.raises(RuntimeError, match=r"always_fails failed on part 0 after 1 attempt\(s\): ValueError"):
        RayExecutor(load_config(None, ["executor.max_retries=0"])).map(always_fails, [0], role="kmeans")


def test_task_resources_come_from_the_config_over_the_defaults():
    cfg = load_config(
        None, ["executor.ray_resources={features_model: {num_gpus: 0.5, memory_gb: 8}, asr: {num_gpus: 1}}"]
    )
    assert task_options(cfg, "features_model") == {"num_cpus": 1, "num_gpus": 0.5, "memory": 8 * 2**30}
    assert task_options(cfg, "asr") == {"num_cpus": 2, "num_gpus": 1}  # num_cpus kept from the defaults
    assert task_options(cfg, "decode") == {"num_cpus": 1, "num_gpus": 0}
    with pytest.raises(ConfigError, match="executor.ray_resources.featurs"):
        load_config(None, ["executor.ray_resources={featurs: {num_gpus: 1}}"])
    with pytest.raises(ConfigError, match="executor.ray_resources.asr.gpus"):
        load_config(None, ["executor.ray_resources={asr: {gpus: 1}}"])
    assert (
        task_options(load_config(None, ["executor.ray_resources={decode: {num_cpus: 0.25}}"]), "decode")["num_cpus"]
        == 0.25
    )


def test_the_ray_executor_names_no_stage():
    """Split stages come to it through their registry record (pipeline/engine/split.py): it branches on no stage's
    name and knows nothing of features or decode; `map`'s tasks take the Ray role their stage passes (kmeans)."""
    import re

    from pipeline import registry
    from pipeline.executors import ray as ray_executor

    source = Path(ray_executor.__file__).read_text()
    assert not re.search(r"stage *(==|!=|in) ", source)
    assert [name for name in registry.NAMES if re.search(rf"[\"']{name}[\"']", source)] == []
    assert "feature" not in source.lower() and "s3d" not in source.lower()


def test_a_task_no_node_can_hold_is_named_before_it_is_submitted():
    from pipeline.executors.ray import infeasible

    nodes = [
        {"Alive": True, "Resources": {"CPU": 3.0, "memory": 16 * 2**30}},
        {"Alive": True, "Resources": {"CPU": 1.0, "GPU": 1.0, "memory": 2**30}},
        {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}},
    ]  # a dead node holds nothing
    assert infeasible("asr", {"num_cpus": 1, "num_gpus": 1}, nodes) is None
    assert infeasible("asr", {"num_cpus": 3, "num_gpus": 0}, nodes) is None
    assert infeasible("asr", {"num_cpus": 16, "num_gpus": 0}, nodes) == (
        "executor.ray_resources.asr asks for 16 CPU(s) per task, but no node of the Ray cluster has that (its 2 "
        "node(s) have at most 3 CPUs, 1 GPUs, 16.0 GB of memory): lower it, or add such a node"
    )
    # each alone fits a node, together none: both named
    assert "asks for 2 CPU(s), 1 GPU(s) per task" in infeasible("asr", {"num_cpus": 2, "num_gpus": 1}, nodes)
    assert "asks for 1024 GB of memory per task" in infeasible("asr", {"num_cpus": 1, "memory": 2**40}, nodes)
