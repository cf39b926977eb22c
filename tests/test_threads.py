"""Threads follow the allocation (pipeline/threads.py): each source of the CPU count (Ray's num_cpus, OMP_NUM_THREADS,
SLURM_CPUS_PER_TASK, the CPU affinity), the share of a local pool's workers and of torchrun's ranks, an explicit
setting winning, and the stages and the trainer taking that count."""

import os
import shutil
import subprocess
import sys

import pytest

from pipeline import threads
from pipeline.config import load_config
from pipeline.executors.local import LocalExecutor, default_workers
from stages.kmeans import tree as kmeans_tree

pytestmark = pytest.mark.slow

ALLOCATION_ENV = ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK", "LOCAL_WORLD_SIZE")


@pytest.fixture(autouse=True)
def no_allocation_env(monkeypatch):
    for name in ALLOCATION_ENV:
        monkeypatch.delenv(name, raising=False)


def _pretend_affinity(monkeypatch, cpus: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))


def _child(code: str, env: dict | None = None, cpus: str | None = None) -> str:
    """stdout of `code` in a fresh Python (so torch's own start-up choice is there to be overridden),
    with `env` added and, with `cpus`, pinned by taskset to those CPUs."""
    command = [sys.executable, "-c", code]
    if cpus is not None:
        command = [shutil.which("taskset"), "-c", cpus] + command
    base = {k: v for k, v in os.environ.items() if k not in ALLOCATION_ENV}
    result = subprocess.run(command, env={**base, **(env or {})}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_cpu_affinity_is_the_allocation_outside_any_scheduler(monkeypatch):
    _pretend_affinity(monkeypatch, 6)
    assert threads.allocated_cpus() == (6, "CPU affinity")
    assert threads.threads() == 6
    assert threads.threads(3) == 3  # an explicit setting wins
    assert threads.describe() == "6 threads (6 CPUs from CPU affinity)"
    assert threads.describe(3) == "3 threads (set)"


@pytest.mark.skipif(not shutil.which("taskset") or not hasattr(os, "sched_getaffinity"), reason="needs taskset")
def test_a_process_pinned_to_one_cpu_runs_torch_on_one_thread():
    code = (
        "import torch; from pipeline import threads; before = torch.get_num_threads(); "
        "print(before, threads.set_torch_threads(), torch.get_num_threads(), threads.allocated_cpus()[1])"
    )
    assert _child(code, cpus="0").split()[1:] == ["1", "1", "CPU", "affinity"]


def test_slurm_cpus_per_task_within_the_affinity(monkeypatch):
    _pretend_affinity(monkeypatch, 128)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
    assert threads.allocated_cpus() == (4, "SLURM_CPUS_PER_TASK")
    assert threads.threads() == 4 and threads.threads(16) == 16
    # Slurm's count, where the process may run on fewer CPUs than that, is cut to them
    _pretend_affinity(monkeypatch, 2)
    assert threads.allocated_cpus() == (2, "SLURM_CPUS_PER_TASK")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "not-a-number")
    assert threads.allocated_cpus() == (2, "CPU affinity")


def test_omp_num_threads_is_the_allocation_where_it_is_set(monkeypatch):
    _pretend_affinity(monkeypatch, 64)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "8")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.allocated_cpus() == (3, "OMP_NUM_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "0")  # not a count: the next source
    assert threads.allocated_cpus() == (8, "SLURM_CPUS_PER_TASK")


def test_torchrun_ranks_of_a_node_share_its_cpus(monkeypatch):
    _pretend_affinity(monkeypatch, 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert threads.threads() == 4
    assert threads.describe() == "4 threads (16 CPUs from CPU affinity, shared by 4 processes)"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert threads.threads() == 1  # never 0


def _share(_item) -> tuple[int, int]:
    return threads.threads(), threads.set_torch_threads()


def test_a_local_pool_divides_the_allocation_among_its_workers(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "6")  # inherited by the spawned workers
    cfg = load_config(None, [])
    assert default_workers(cfg) == 6  # one worker per allocated CPU, not per core of the machine
    assert LocalExecutor(cfg, workers=3).map(_share, range(3)) == [(2, 2)] * 3
    assert LocalExecutor(cfg, workers=1).map(_share, range(2)) == [(6, 6)] * 2  # in this process: all of them
    # the k-means subtree fits: the allocation over the subtrees that run at once
    assert kmeans_tree.threads_per_task(3, 12) == 2 and kmeans_tree.threads_per_task(12, 2) == 3
    assert kmeans_tree.threads_per_task(None, 12) == 0  # a Ray task: its own num_cpus


def test_the_trainer_and_the_features_encoder_take_the_allocation_and_an_explicit_setting_wins():
    # one fresh Python for every case (each would start torch again): before each, torch is set to a count
    # that no case expects, so a call that left the threads alone shows as that count
    code = """
import os, torch
from pipeline.config import load_config
from stages.features.s3d.encoder import encoder_for
from videobert.runtime import start_runtime
def case(env, run):
    for name in ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(name, None)
    os.environ.update(env)
    torch.set_num_threads(7)
    run()
    return torch.get_num_threads()
train = lambda setting: lambda: start_runtime("cpu", setting)
features = lambda setting: lambda: encoder_for(load_config(None, ["features.weights=random", "features.device=cpu",
                                                                  f"features.num_threads={setting}"]))
print(case({"SLURM_CPUS_PER_TASK": "1"}, train(0)), case({"OMP_NUM_THREADS": "3", "LOCAL_WORLD_SIZE": "3"}, train(0)),
      case({"SLURM_CPUS_PER_TASK": "1"}, train(5)), case({"OMP_NUM_THREADS": "3"}, features(0)),
      case({"OMP_NUM_THREADS": "3"}, features(2)))
"""
    assert _child(code) == "1 1 5 3 2"


def test_a_ray_task_and_actor_get_their_num_cpus():
    ray = pytest.importorskip("ray")
    code = """
import ray
from pipeline import threads
ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
def task_share():
    import torch
    return threads.allocated_cpus(), threads.set_torch_threads(), torch.get_num_threads()
class Actor:
    def share(self):
        return threads.allocated_cpus()
# one after another: an actor holds its 2 CPUs for its life, so a 3-CPU task queued behind it would wait forever
three = ray.get(ray.remote(num_cpus=3)(task_share).remote())
quarter = ray.get(ray.remote(num_cpus=0.25)(task_share).remote())
actor = ray.remote(num_cpus=2)(Actor).remote()
print(threads.allocated_cpus()[1] != "Ray num_cpus", three, quarter, ray.get(actor.share.remote()))
"""
    assert ray is not None
    assert _child(code) == ("True ((3, 'Ray num_cpus'), 3, 3) ((1, 'Ray num_cpus'), 1, 1) (2, 'Ray num_cpus')")


# the real trainer's torchrun ranks, one thread each of a task's 2 CPUs, are checked where it trains on two
# ranks: tests/test_videobert.py::test_torchrun_data_parallel_on_cpu
