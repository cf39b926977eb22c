"""`python -m pipeline submit STAGE --num-shards N ...`: a stage as a Slurm job array.

Every array task runs the same command line; its SLURM_ARRAY_TASK_ID picks its manifest shards (shard s
goes to task s % N, see executors.select_shards), so N may be smaller than the number of manifest shards.
Resources come from the executor section (slurm_*); the stages in `executor.slurm_gpu_stages` get
`executor.slurm_gpus` GPUs. `--requeue` lets Slurm restart a preempted or failed-node task: completion
records make the rerun skip finished shards, and atomic outputs mean a killed task never leaves a file
that passes for complete. kmeans and train are one job each (not arrays); train resumes from its newest
checkpoint, so a requeued or time-limited job continues where it stopped.

Stages chain with afterok dependencies; the job id is the only thing printed on stdout:

    decode=$(python -m pipeline submit decode --num-shards 100 --work-dir W)
    python -m pipeline submit features --num-shards 20 --work-dir W --after "$decode"
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pipeline.config import Config
from pipeline.lineage import Lineage
from pipeline.registry import SHARD_STAGES
from pipeline.workdir import WorkDir

REPO = Path(__file__).resolve().parent.parent
JOB_ID = re.compile(r"\d+(_\d+)?")


def pipeline_command(stage: str, *, work_dir: Path, config: str | None, overrides: list[str],
                     num_shards: int, gpus: int, python: str = sys.executable) -> str:
    """The command line every task of the job runs (shell syntax; the task id is read at run time)."""
    common = ["--work-dir", str(Path(work_dir).resolve())]
    if config:
        common += ["--config", str(Path(config).resolve())]
    for assignment in overrides:
        common += ["--set", assignment]
    quoted = " ".join(shlex.quote(part) for part in common)
    if stage in SHARD_STAGES:
        return (f"{shlex.quote(python)} -m pipeline {stage} {quoted} --quiet --executor local "
                f'--shard "$SLURM_ARRAY_TASK_ID" --num-shards {num_shards} --workers "${{SLURM_CPUS_PER_TASK:-1}}"')
    if stage == "train":
        launcher = (f"{shlex.quote(python)} -m torch.distributed.run --standalone --nproc-per-node {gpus} -m pipeline"
                    if gpus > 1 else f"{shlex.quote(python)} -m pipeline")
        return f"{launcher} train {quoted} --quiet --resume"
    return (f'{shlex.quote(python)} -m pipeline {stage} {quoted} --quiet --executor local '
            f'--workers "${{SLURM_CPUS_PER_TASK:-1}}"')


def sbatch_script(cfg: Config, stage: str, *, work_dir: Path, config: str | None = None,
                  overrides: list[str] = (), num_shards: int = 1, array_parallelism: int | None = None,
                  after: list[str] = (), python: str = sys.executable) -> str:
    ex = cfg.executor
    work_dir = Path(work_dir).resolve()
    gpus = ex.slurm_gpus if stage in ex.slurm_gpu_stages else 0
    is_array = stage in SHARD_STAGES
    parallelism = array_parallelism or ex.slurm_array_parallelism
    what = f"a job array of {num_shards} task(s)" if is_array else "one job"
    lines = ["#!/bin/bash",
             f"# VideoBERT pipeline: the {stage} stage as {what}, written by `python -m pipeline submit`",
             f"#SBATCH --job-name=videobert-{stage}"]
    if is_array:
        lines.append(f"#SBATCH --array=0-{num_shards - 1}" + (f"%{parallelism}" if parallelism else ""))
    lines += [f"#SBATCH --cpus-per-task={ex.slurm_cpus_per_task}",
              f"#SBATCH --mem={ex.slurm_mem}",
              f"#SBATCH --time={ex.slurm_time}"]
    if ex.slurm_partition:
        lines.append(f"#SBATCH --partition={ex.slurm_partition}")
    if gpus:
        lines.append(f"#SBATCH --gres=gpu:{gpus}")
    log_name = "%x-%A_%a.out" if is_array else "%x-%j.out"
    lines += [f"#SBATCH --output={shlex.quote(str(WorkDir(work_dir).slurm_logs / log_name))}",
              "#SBATCH --open-mode=append",     # a requeued attempt appends to the same log
              "#SBATCH --requeue"]
    if after:
        # a failed upstream stage cancels this job instead of leaving it pending forever
        lines += [f"#SBATCH --dependency=afterok:{':'.join(after)}", "#SBATCH --kill-on-invalid-dep=yes"]
    lines += list(ex.slurm_extra)
    lines += ["",
              "set -euo pipefail",
              f"cd {shlex.quote(str(REPO))}",
              # torch and FFmpeg would otherwise start a thread per core of the node, not of the allocation
              'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"',
              "exec " + pipeline_command(stage, work_dir=work_dir, config=config, overrides=list(overrides),
                                         num_shards=num_shards, gpus=gpus, python=python),
              ""]
    return "\n".join(lines)


def submit(cfg: Config, args) -> int:
    """Write the stage's sbatch script under DIR/slurm and submit it (print it only, with --dry-run).
    Prints the job id on stdout, so that `--after "$(...)"` chains stages."""
    if args.num_shards < 1:
        print(f"submit: --num-shards must be >= 1 (got {args.num_shards})", file=sys.stderr)
        return 2
    if args.array_parallelism is not None and args.array_parallelism < 1:
        print(f"submit: --array-parallelism must be >= 1 (got {args.array_parallelism})", file=sys.stderr)
        return 2
    for job in args.after:
        if not JOB_ID.fullmatch(job):
            print(f"submit: --after takes a Slurm job id such as 12345 (got {job!r})", file=sys.stderr)
            return 2
    if args.stage in SHARD_STAGES and WorkDir(args.work_dir).manifest.exists():
        shards = len(Lineage(args.work_dir).manifest_shards())
        if args.num_shards > shards:
            print(f"submit: warning: {args.num_shards} tasks for {shards} manifest shard(s): "
                  f"{args.num_shards - shards} task(s) will find nothing to do", file=sys.stderr)
    script = sbatch_script(cfg, args.stage, work_dir=args.work_dir, config=args.config, overrides=args.set,
                           num_shards=args.num_shards, array_parallelism=args.array_parallelism, after=args.after)
    if args.dry_run:
        print(script, end="")
        return 0
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        print("submit: sbatch not found on PATH (run this on a Slurm login node, or use --dry-run to print "
              "the script)", file=sys.stderr)
        return 1
    work = WorkDir(Path(args.work_dir).resolve())
    work.slurm_logs.mkdir(parents=True, exist_ok=True)
    path = work.slurm_folder / f"{args.stage}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.sbatch"
    path.write_text(script)
    done = subprocess.run([sbatch, "--parsable", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"submit: sbatch failed ({done.returncode}): {done.stderr.strip()}", file=sys.stderr)
        return 1
    job_id = done.stdout.strip().split(";")[0]   # --parsable: "jobid[;cluster]"
    print(job_id)
    if not args.quiet:
        print(f"submit: {args.stage} is job {job_id} ({path}); logs in {work.slurm_logs}", file=sys.stderr)
    return 0
