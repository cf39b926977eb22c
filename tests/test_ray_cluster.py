"""The pipeline on a multi-node Ray cluster (Ray's own `ray.cluster_utils.Cluster`: a head and two worker nodes,
each its own raylet and object store, on this machine): `--executor ray --ray-address` gives the local run's
bytes in every data folder; a worker node removed mid-features has its task retried on another node with
nothing lost; per-stage resources decide the node a task runs on and its threads; a stage asking for more
than any node has fails at once with one line."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
from media_factory import make_video

from pipeline import cli
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

# the real schedulers run in `make test-cluster` (CI runs it after `make test`)
pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parent.parent
# random S3D on the smallest clips it takes, decoded in the task's own process; every video has a transcript
# (imported, no speech model); a 2-leaf codebook
SETTINGS = [
    "features.weights=random",
    "decode.clip_frames=14",
    "decode.min_clip_frames=7",
    "features.batch_size=2",
    "features.decode_workers=0",
    "shards.videos_per_shard=2",
    "kmeans.depth=1",
    "kmeans.k=2",
]
STAGES = ("features", "quality", "dedup", "kmeans", "quantize", "asr", "align")
SMALL_NODE_CPUS, LARGE_NODE_CPUS = 2, 3  # features tasks take 2 CPUs: they run on the worker nodes only
VTT = "WEBVTT\n\n00:00:00.000 --> 00:00:00.700\ncut the {0} thin.\n\n00:00:00.700 --> 00:00:01.500\nfry the {0}.\n"


@pytest.fixture(scope="module")
def cluster():
    # GCS health checks every second: a removed node is known dead within seconds, not Ray's default 30 s
    head_config = {
        "health_check_initial_delay_ms": 0,
        "health_check_period_ms": 1000,
        "health_check_failure_threshold": 3,
    }
    store = 80 * 2**20
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "object_store_memory": store,
            "_system_config": head_config,
        },
    )
    try:
        small = cluster.add_node(num_cpus=SMALL_NODE_CPUS, object_store_memory=store)
        large = cluster.add_node(num_cpus=LARGE_NODE_CPUS, object_store_memory=store)
        cluster.wait_for_nodes()
        yield {
            "cluster": cluster,
            "address": cluster.address,
            "head": cluster.head_node.node_id,
            "small": small,
            "large": large,
        }
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("videos")
    for name, duration_s, fps, food in (
        ("a", 1.7, 25, "onion"),
        ("b", 0.8, 30, "leek"),
        ("c", 1.5, 24, "carrot"),
        ("d", 1.2, 25, "garlic"),
        ("e", 1.6, 30, "pepper"),
    ):
        make_video(folder / f"{name}.mp4", duration_s=duration_s, fps=fps)
        (folder / f"{name}.vtt").write_text(VTT.format(food))
    (folder / "f.mp4").write_text("not a video")  # an error row in every stage that reads it
    return folder


def _sets(settings) -> list[str]:
    return [part for setting in settings for part in ("--set", setting)]


def _data_files(work: Path) -> dict[str, bytes]:
    """Every file of the data folders (the completion records, logs and remembered config under _state hold
    timings, hosts and paths)."""
    return {
        str(p.relative_to(work)): p.read_bytes()
        for p in sorted(work.rglob("*"))
        if p.is_file() and p.relative_to(work).parts[0] != "_state"
    }


def _attempts(work: Path, stage: str, shard: int) -> list[str]:
    """The lines of the shard's log that start an attempt."""
    path = WorkDir(work).shard_log(stage, shard)
    return [line for line in path.read_text().splitlines() if ": attempt on " in line] if path.exists() else []


def _chain(work: Path, videos: Path, executor: list[str]) -> None:
    assert cli.main(["manifest", "--input", str(videos), "--work-dir", str(work), "--quiet", *_sets(SETTINGS)]) == 0
    for stage in STAGES:
        assert cli.main([stage, "--work-dir", str(work), "--quiet", *executor]) == 0, stage


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, videos):
    work = tmp_path_factory.mktemp("local") / "work"
    _chain(work, videos, ["--workers", "1"])
    return work


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory, videos, cluster, local_run):
    work = tmp_path_factory.mktemp("cluster") / "work"
    _chain(work, videos, ["--executor", "ray", "--ray-address", cluster["address"]])
    return work


def test_the_pipeline_on_three_nodes_gives_the_local_bytes(local_run, cluster_run, cluster):
    local, distributed = _data_files(local_run), _data_files(cluster_run)
    folders = {Path(name).parts[0] for name in local}
    assert {"manifest", "decode", "features", "kmeans", "quantize", "asr", "align"} <= folders
    assert len(local) > 20 and distributed == local
    shards = Lineage(cluster_run).manifest_shards()
    assert shards == [0, 1, 2]
    # the two features tasks at once needed both worker nodes (2 CPUs each, the head has 1)
    nodes = {
        line.split("(Ray node ")[1].split(",")[0]
        for shard in shards
        for line in _attempts(cluster_run, "features", shard)
    }
    assert nodes <= {cluster["small"].node_id, cluster["large"].node_id} and len(nodes) == 2


def test_a_stage_runs_where_its_resources_are_and_with_as_many_threads(cluster_run, local_run, cluster):
    large_only = f"executor.ray_resources={{quantize: {{num_cpus: {LARGE_NODE_CPUS}}}}}"
    assert (
        cli.main(
            [
                "quantize",
                "--work-dir",
                str(cluster_run),
                "--quiet",
                "--force",
                "--executor",
                "ray",
                "--ray-address",
                cluster["address"],
                "--set",
                large_only,
            ]
        )
        == 0
    )
    for shard in Lineage(cluster_run).manifest_shards():
        last = _attempts(cluster_run, "quantize", shard)[-1]
        assert f"Ray node {cluster['large'].node_id}," in last
        assert f"{LARGE_NODE_CPUS} threads ({LARGE_NODE_CPUS} CPUs from Ray num_cpus)" in last
    assert _data_files(cluster_run) == _data_files(local_run)


@pytest.mark.parametrize(
    "asked, named",
    [("num_gpus: 1", "1 GPU(s)"), ("num_cpus: 16", "16 CPU(s)"), ("memory_gb: 100000", "100000 GB of memory")],
)
def test_a_stage_asking_for_what_no_node_has_fails_at_once_in_one_line(cluster_run, cluster, asked, named):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "quantize",
            "--work-dir",
            str(cluster_run),
            "--quiet",
            "--force",
            "--executor",
            "ray",
            "--ray-address",
            cluster["address"],
            "--set",
            f"executor.ray_resources={{quantize: {{{asked}}}}}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == cli.EXIT_USAGE
    lines = [line for line in result.stderr.splitlines() if line.startswith("quantize: cannot start: ")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        f"quantize: cannot start: executor.ray_resources.quantize asks for {named} per task, "
        f"but no node of the Ray cluster has that (its 3 node(s) have at most "
        f"{LARGE_NODE_CPUS} CPUs, 0 GPUs, "
    )
    assert lines[0].endswith("GB of memory): lower it, or add such a node")
    assert "Traceback" not in result.stderr


def test_a_worker_node_removed_mid_features_has_its_task_retried_on_another(tmp_path, videos, local_run, cluster):
    """Runs last: it takes a worker node away."""
    work = tmp_path / "work"
    assert cli.main(["manifest", "--input", str(videos), "--work-dir", str(work), "--quiet", *_sets(SETTINGS)]) == 0
    shards = Lineage(work).manifest_shards()
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "features",
            "--work-dir",
            str(work),
            "--quiet",
            "--executor",
            "ray",
            "--ray-address",
            cluster["address"],
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    workers = {cluster["small"].node_id: cluster["small"], cluster["large"].node_id: cluster["large"]}
    removed, removed_shard = None, None
    deadline = time.monotonic() + 600
    while removed is None and time.monotonic() < deadline and run.poll() is None:
        for shard in shards:
            attempts = _attempts(work, "features", shard)
            if attempts and not WorkDir(work).record("features", shard).exists():
                node_id = attempts[0].split("(Ray node ")[1].split(",")[0]
                removed, removed_shard = workers[node_id], shard
                cluster["cluster"].remove_node(removed, allow_graceful=False)  # as a machine that dies
                break
        time.sleep(0.1)
    out, err = run.communicate(timeout=600)
    assert removed is not None, f"no features task was seen running:\n{err[-3000:]}"
    assert run.returncode == 0, err[-3000:]
    # the task on the removed node ran again, on the node left; every shard once to completion
    attempts = _attempts(work, "features", removed_shard)
    assert len(attempts) == 2 and removed.node_id in attempts[0] and removed.node_id not in attempts[1]
    assert all(Lineage(work).current("features", shard) for shard in shards)
    ran = _data_files(work)
    folders = {Path(name).parts[0] for name in ran}
    assert {"manifest", "decode", "features"} <= folders and "quantize" not in folders
    assert ran == {name: data for name, data in _data_files(local_run).items() if Path(name).parts[0] in folders}
    assert "1 failed" not in err and "3 shard(s) run, 0 already current, 0 failed" in err
