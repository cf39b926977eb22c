"""What Slurm adds, measured on a real two-node Slurm started on this machine (scripts/slurm_cluster.py): the
scheduler's cost per array task, and per stage; and a long array split over MaxArraySize that runs each task
exactly once.

1. Per array task: `--tasks` tasks of `submit`'s own scripts (sbatch_scripts, split over --max-array-size)
   whose interpreter is a stand-in that only records the task it was given: the wall time from the first
   sbatch to the last task's end, over the tasks, is Slurm's own cost per task (submit, schedule, start a
   batch step, end it). Every task 0..N-1 must have run exactly once.
2. Per stage: decode of --shards tiny shards (one video each) as one local command, and as `submit decode`
   (one array task per shard) until the last task ends: the difference, per stage and per task, is what
   running a stage as a job array costs (Slurm, plus a Python and its imports per task).

    python benchmarks/bench_slurm.py [--tasks 250] [--max-array-size 100] [--shards 6]
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, clip_video, machine  # noqa: E402

from pipeline.config import load_config  # noqa: E402
from pipeline.executors.sbatch import sbatch_scripts  # noqa: E402
from scripts.slurm_cluster import SlurmCluster, missing_programs  # noqa: E402

SETTINGS = [
    "shards.videos_per_shard=1",
    "executor.slurm_cpus_per_task=1",
    "executor.slurm_mem=200M",
    "executor.slurm_time=00:10:00",
]


def _sbatch(cluster: SlurmCluster, path: Path) -> str:
    done = subprocess.run(
        ["sbatch", "--parsable", str(path)], env=cluster.env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip().split(";")[0]


def per_task(cluster: SlurmCluster, root: Path, tasks: int) -> dict:
    """`tasks` array tasks of the decode stage's scripts, each recording its --shard: Slurm's cost per task."""
    record = root / "tasks.txt"
    standin = root / "python"
    # what each task runs in place of the interpreter: its --shard value, appended (O_APPEND: one line each)
    standin.write_text(
        f'#!/bin/bash\nwhile [ $# -gt 0 ]; do [ "$1" = --shard ] && echo "$2" >> "{record}"; shift; done\n'
    )
    standin.chmod(0o755)
    cfg = load_config(None, SETTINGS)
    scripts = sbatch_scripts(
        cfg,
        "decode",
        work_dir=root / "work",
        num_shards=tasks,
        python=str(standin),
        max_array_size=cluster.max_array_size,
    )
    (root / "work" / "_state" / "slurm" / "logs").mkdir(parents=True)
    paths = []
    for index, script in enumerate(scripts):
        paths.append(root / f"part-{index}.sbatch")
        paths[-1].write_text(script)
    start = time.perf_counter()
    jobs = [_sbatch(cluster, path) for path in paths]
    cluster.wait_for_jobs(1800)
    wall = time.perf_counter() - start
    ran = collections.Counter(int(line) for line in record.read_text().split())
    states = collections.Counter(state for job in jobs for state in cluster.job_states(job).values())
    return {
        "tasks": tasks,
        "jobs": len(jobs),
        "wall_s": wall,
        "per_task_ms": 1000 * wall / tasks,
        "exactly_once": sorted(ran) == list(range(tasks)) and set(ran.values()) == {1},
        "ran": sum(ran.values()),
        "distinct": len(ran),
        "states": dict(states),
    }


def per_stage(cluster: SlurmCluster, root: Path, shards: int) -> dict:
    videos = root / "videos"
    videos.mkdir()
    for index in range(shards):
        clip_video(videos / f"v{index}.mp4", duration_s=1.0, seed=index)
    sets = [word for value in SETTINGS for word in ("--set", value)]
    env = dict(cluster.env, PYTHONPATH=str(REPO))

    def pipeline(*args):
        return subprocess.run(
            [sys.executable, "-m", "pipeline", *map(str, args), "--quiet", *sets],
            cwd=REPO,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )

    timings = {}
    for kind in ("local", "slurm"):
        work = root / kind
        pipeline("manifest", "--input", videos, "--work-dir", work)
        start = time.perf_counter()
        if kind == "local":
            pipeline("decode", "--work-dir", work, "--workers", 1)
        else:
            jobs = pipeline("submit", "decode", "--work-dir", work).stdout.strip().split(":")
            cluster.wait_for_jobs(1800)
            states = {state for job in jobs for state in cluster.job_states(job).values()}
            assert states == {"COMPLETED"}, states
        timings[kind] = time.perf_counter() - start
    same = all(
        (root / "local" / p.relative_to(root / "slurm")).read_bytes() == p.read_bytes()
        for p in (root / "slurm").rglob("*.parquet")
    )
    return {
        "shards": shards,
        "local_s": timings["local"],
        "slurm_s": timings["slurm"],
        "per_stage_s": timings["slurm"] - timings["local"],
        "per_task_s": (timings["slurm"] - timings["local"]) / shards,
        "same_bytes": same,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=250)
    parser.add_argument("--max-array-size", type=int, default=100)
    parser.add_argument("--shards", type=int, default=6)
    args = parser.parse_args()
    missing = missing_programs()
    if missing:
        print(
            f"bench_slurm: needs Slurm and munge ({', '.join(missing)} not found): apt-get install slurm-wlm munge",
            file=sys.stderr,
        )
        return 2
    print(machine())
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    cluster = SlurmCluster(max_array_size=args.max_array_size, max_job_count=10 * args.tasks).start()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-slurm-") as folder:
            root = Path(folder)
            (root / "array").mkdir()
            (root / "stage").mkdir()
            array = per_task(cluster, root / "array", args.tasks)
            print(
                f"array: {array['tasks']} tasks in {array['jobs']} array jobs (MaxArraySize {args.max_array_size}), "
                f"2 nodes x 2 CPUs: {array['wall_s']:.1f} s, {array['per_task_ms']:.0f} ms per task; "
                f"ran {array['ran']} task(s), {array['distinct']} distinct, exactly once: {array['exactly_once']}; "
                f"states {array['states']}"
            )
            stage = per_stage(cluster, root / "stage", args.shards)
            print(
                f"decode, {stage['shards']} one-video shards: local (one process) {stage['local_s']:.1f} s, "
                f"submit (one task per shard) {stage['slurm_s']:.1f} s until the last task ended: "
                f"+{stage['per_stage_s']:.1f} s per stage, +{stage['per_task_s']:.1f} s per task; "
                f"same bytes: {stage['same_bytes']}"
            )
    finally:
        cluster.stop()
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0 if array["exactly_once"] and stage["same_bytes"] else 1


if __name__ == "__main__":
    sys.exit(main())
