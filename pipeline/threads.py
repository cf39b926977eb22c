"""Threads follow the allocation: every thread count left at 0 (features, asr, train, caption, the k-means
fits, the encoders) is this process's share of the CPUs its task was given, not the machine's cores.

torch, faiss (OpenMP) and CTranslate2 each default to one thread per core of the machine: a Slurm task given
4 CPUs of a 128-core node, or each of 8 local pool workers, would run 128 threads on 4 cores, and a thread
that waits for its core stalls every other one at the next barrier (measured in benchmarks/bench_threads.py).

The CPUs given, the first of these that applies:
1. Ray's `num_cpus` for the task or actor this process runs (executor.ray_resources);
2. OMP_NUM_THREADS, where it is set (the OpenMP convention, which torch and faiss read themselves);
3. SLURM_CPUS_PER_TASK (Slurm's allocation; within the CPU affinity, where that is smaller);
4. the process's CPU affinity (taskset, a cgroup cpuset, a Slurm or container CPU binding);
5. os.cpu_count().
They are divided among the processes sharing them: a local pool's workers (`share_among`, from the pool's
initializer) or torchrun's ranks on this node (LOCAL_WORLD_SIZE). An explicit setting (> 0) always wins."""

from __future__ import annotations

import os
import sys

_processes_sharing = 1  # set in a local pool's worker by its initializer


def allocated_cpus() -> tuple[int, str]:
    """(the CPUs this process's task was given, where that count comes from)."""
    ray_cpus = _ray_task_cpus()
    if ray_cpus is not None:
        return max(1, int(ray_cpus)), "Ray num_cpus"
    omp = _positive_int(os.environ.get("OMP_NUM_THREADS"))
    if omp:
        return omp, "OMP_NUM_THREADS"
    affinity = _affinity()
    slurm = _positive_int(os.environ.get("SLURM_CPUS_PER_TASK"))
    if slurm:
        return (min(slurm, affinity), "SLURM_CPUS_PER_TASK") if affinity else (slurm, "SLURM_CPUS_PER_TASK")
    if affinity:
        return affinity, "CPU affinity"
    return os.cpu_count() or 1, "os.cpu_count"


def share_among(processes: int) -> None:
    """Called in each worker of a pool of `processes` started together on this allocation."""
    global _processes_sharing
    _processes_sharing = max(1, int(processes))


def processes_sharing() -> int:
    return max(_processes_sharing, _positive_int(os.environ.get("LOCAL_WORLD_SIZE")) or 1)


def threads(setting: int = 0) -> int:
    """`setting` where it is > 0, else this process's share of its allocation (at least 1)."""
    if setting and setting > 0:
        return int(setting)
    return max(1, allocated_cpus()[0] // processes_sharing())


def describe(setting: int = 0) -> str:
    """What `threads(setting)` is and why, for logs and run summaries."""
    n = threads(setting)
    if setting and setting > 0:
        return f"{n} threads (set)"
    cpus, source = allocated_cpus()
    sharing = processes_sharing()
    shared = f", shared by {sharing} processes" if sharing > 1 else ""
    return f"{n} threads ({cpus} CPUs from {source}{shared})"


def set_torch_threads(setting: int = 0) -> int:
    """torch's intra-op threads in this process: `threads(setting)`. Returns the count."""
    import torch

    n = threads(setting)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def _ray_task_cpus() -> float | None:
    """The CPUs Ray assigned to the task or actor running in this process; None outside a Ray worker (the
    driver included). Ray is not imported here: a process that runs Ray tasks has imported it already."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    try:
        context = ray.get_runtime_context()
        if context.worker.mode != ray.WORKER_MODE:
            return None
        return float(context.get_assigned_resources().get("CPU", 0.0))
    except Exception:  # noqa: BLE001 - a Ray without these calls: the other sources apply
        return None


def _affinity() -> int | None:
    try:
        return len(os.sched_getaffinity(0)) or None
    except (AttributeError, OSError):  # not on Linux
        return None


def _positive_int(value: str | None) -> int | None:
    try:
        number = int(value) if value else 0
    except ValueError:
        return None
    return number if number > 0 else None
