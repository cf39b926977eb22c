"""`python -m pipeline submit STAGE [--num-shards N] ...`: a stage as a Slurm job array.

Every array task runs the same command line; its task index picks its manifest shards (shard s goes to
task s % N, see dispatch.select_shards), so N may be smaller than the number of manifest shards (it
defaults to their number). Resources come from the executor section (slurm_*); the stages whose registry
record says they use a GPU (`uses_gpu`: features, asr, train) get `executor.slurm_gpus` GPUs. `--requeue`
lets Slurm restart a preempted or failed-node task: completion records make the rerun skip finished shards,
and atomic outputs mean a killed task never leaves a file that passes for complete. The whole-collection
stages (kmeans, train) are one job each (not arrays); train
resumes from its newest checkpoint, so a requeued or time-limited job continues where it stopped.

- **Logs**: tasks run without --quiet: their progress lines, each starting with its time, go to
  DIR/_state/slurm/logs/<job name>-<array job>_<index>.out.
- **Arrays longer than the cluster's MaxArraySize** (read from `scontrol show config`;
  `executor.slurm_max_array_size` overrides it; Slurm's default 1001, indexes 0..1000, where neither says)
  are submitted as several array jobs of at most that many tasks; the job for
  tasks F.. runs `--shard $((SLURM_ARRAY_TASK_ID + F))`, so together they run every task 0..N-1 once.
  With a throttle (`--array-parallelism M`) each job waits for the one before it (afterany), so that at
  most M tasks run at once over all of them; without one they are all submitted at once.
- **Multi-node training**: with `executor.slurm_nodes` > 1, `submit train` asks for that many nodes with
  one task each; srun starts one torchrun per node, and the torchruns meet in a c10d rendezvous on the
  job's first node (`scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1`, at its NodeAddr from
  `scontrol show node`: a node's name need not resolve; port `executor.slurm_rdzv_port`, id $SLURM_JOB_ID;
  an address that does not resolve stops the job with one line, and so does a rendezvous that cannot start:
  pipeline/executors/torchrun.py runs torchrun, exit 2) and start `executor.slurm_gpus` training processes each
  (torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; videobert/train.py reads them).

Stages chain with afterok dependencies; the job id is the only thing printed on stdout (several ids of a
split array joined by ":", which --after and --dependency take as they are):

    decode=$(python -m pipeline submit decode --num-shards 100 --work-dir W)
    python -m pipeline submit features --num-shards 20 --work-dir W --after "$decode"

`submit pipeline` submits features, kmeans, quantize, asr and align (and train, --with-train) as one such
chain, each stage after the ones it reads (pipeline_after), and prints a `STAGE IDS` line per stage.
`--only-incomplete` submits only the tasks with a shard that is not current, with their own task numbers
(`--array=1,4`), so a retry after a failure redoes nothing that is done. A refusal of sbatch is printed on
one line with the setting that fixes it (sbatch_failure) and exits 2.

The scripts are written by pipeline/executors/sbatch.py; this file submits them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

from pipeline import registry
from pipeline.config import Config
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir
from pipeline.executors.sbatch import (
    SLURM_DEFAULT_MAX_ARRAY_SIZE,
    ScriptError,
    check_job_ids,
    sbatch_scripts,
    slurm_home,
)
from pipeline.registry import SHARD_STAGES


def _num_tasks(args, stage: str) -> int | None:
    """--num-shards, or for an array stage the number of manifest shards (one task each)."""
    if args.num_shards is not None or stage not in SHARD_STAGES:
        return args.num_shards if args.num_shards is not None else 1
    if WorkDir(args.work_dir).manifest.exists():
        return len(Lineage(args.work_dir).manifest_shards())
    return None


MAX_ARRAY_SIZE_LINE = re.compile(r"^MaxArraySize\s*=\s*(\d+)\s*$", re.MULTILINE)


def cluster_max_array_size() -> int | None:
    """The cluster's MaxArraySize (`scontrol show config`); None where scontrol is absent or does not say."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    try:
        done = subprocess.run([scontrol, "show", "config"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = MAX_ARRAY_SIZE_LINE.search(done.stdout) if done.returncode == 0 else None
    return int(match.group(1)) if match and int(match.group(1)) > 0 else None


# sbatch's refusals that a setting of this pipeline fixes, with that fix
SBATCH_FIXES = (
    (
        "invalid job array specification",
        "the array is longer than the cluster's MaxArraySize ({max_array_size} assumed; `scontrol show config | "
        "grep MaxArraySize`): set executor.slurm_max_array_size to it",
    ),
    (
        "requested node configuration is not available",
        "no node has what the job asks for: lower executor.slurm_cpus_per_task, slurm_mem, slurm_gpus or slurm_nodes "
        "(`sinfo -N -l` lists the nodes)",
    ),
    ("invalid partition", "set executor.slurm_partition to one that `sinfo` lists"),
    ("time limit", "lower executor.slurm_time to the partition's limit (`sinfo -o '%P %l'`)"),
    ("memory specification", "lower executor.slurm_mem to what the nodes have (`sinfo -N -l`)"),
    (
        "dependency",
        "a job of --after is unknown or already failed (`squeue`, `sacct`): submit without it or "
        "after a job that can still succeed",
    ),
    ("maxjobcount", "the cluster holds at most MaxJobCount jobs: lower the number of tasks or wait"),
    ("maxsubmitjobs", "the account may queue no more jobs now: wait or submit fewer tasks"),
)


def sbatch_failure(stderr: str, *, max_array_size: int) -> str:
    """sbatch's own message, on one line, with the fix where a setting of this pipeline is the cause."""
    message = " ".join(line.strip() for line in stderr.strip().splitlines() if line.strip()) or "no message"
    lowered = message.lower()
    fix = next((fix for key, fix in SBATCH_FIXES if key in lowered), None)
    return message + (f"; {fix.format(max_array_size=max_array_size)}" if fix else "")


def _only_incomplete_tasks(cfg: Config, work_dir, stage: str, num_shards: int) -> set[int]:
    """The tasks (of num_shards, task t taking manifest shards s % num_shards == t) with a shard of `stage`
    that is not current; for a whole-collection stage, {0} unless it is current (train never is: its job
    resumes)."""
    lineage = Lineage(work_dir, cfg)
    if stage not in SHARD_STAGES:
        return set() if lineage.state(stage).current else {0}
    return {
        shard % num_shards for shard, state in lineage.stage_states(stage, verify="size").items() if not state.current
    }


class SubmitFailed(Exception):
    """A refusal, already worded for the user; `code` is submit's exit status."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def _submit_stage(cfg: Config, args, stage: str, after: list[str], max_array_size: int) -> list[str]:
    """Write and submit one stage's script(s); returns their job ids ([] when nothing is left to run, or
    with --dry-run, which prints the scripts)."""
    num_shards = _num_tasks(args, stage)
    if num_shards is None:
        raise SubmitFailed(
            f"give --num-shards N (the array's tasks): there is no manifest in {args.work_dir} yet "
            f"to take the number of shards from"
        )
    if num_shards < 1:
        raise SubmitFailed(f"--num-shards must be >= 1 (got {num_shards})")
    if args.array_parallelism is not None and args.array_parallelism < 1:
        raise SubmitFailed(f"--array-parallelism must be >= 1 (got {args.array_parallelism})")
    only_tasks = None
    if getattr(args, "only_incomplete", False):
        if not WorkDir(args.work_dir).manifest.exists():
            raise SubmitFailed(f"--only-incomplete needs the manifest in {args.work_dir} to see which shards are done")
        only_tasks = _only_incomplete_tasks(cfg, args.work_dir, stage, num_shards)
        if not only_tasks:
            print(f"submit: every shard of {stage} is current: nothing to submit", file=sys.stderr)
            return []
    try:  # before anything is read or written: a refused value leaves no script behind
        scripts = sbatch_scripts(
            cfg,
            stage,
            work_dir=args.work_dir,
            config=args.config,
            overrides=args.set,
            num_shards=num_shards,
            array_parallelism=args.array_parallelism,
            after=after,
            max_array_size=max_array_size,
            only_tasks=only_tasks if stage in SHARD_STAGES else None,
        )
    except ScriptError as error:
        raise SubmitFailed(str(error)) from None
    if stage in SHARD_STAGES and WorkDir(args.work_dir).manifest.exists():
        shards = len(Lineage(args.work_dir).manifest_shards())
        if num_shards > shards:
            print(
                f"submit: warning: {num_shards} tasks for {shards} manifest shard(s): "
                f"{num_shards - shards} task(s) will find nothing to do",
                file=sys.stderr,
            )
    # a split array under a throttle: each job after the one before, so the throttle holds over all of them
    chained = len(scripts) > 1 and bool(args.array_parallelism or cfg.executor.slurm_array_parallelism)
    if args.dry_run:
        for index, script in enumerate(scripts):
            if len(scripts) > 1:
                waits = " --dependency=afterany:<the job before>" if chained and index else ""
                print(f"# ---- job {index + 1} of {len(scripts)}: sbatch{waits} ----")
            print(script, end="")
        return []
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise SubmitFailed(
            "sbatch not found on PATH (run this on a Slurm login node, or use --dry-run to print the script)", code=1
        )
    work = slurm_home(args.work_dir)
    work.slurm_logs.mkdir(parents=True, exist_ok=True)
    stem = f"{stage}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    job_ids, paths = [], []
    for index, script in enumerate(scripts):
        path = work.slurm_folder / (f"{stem}.sbatch" if len(scripts) == 1 else f"{stem}-{index + 1}.sbatch")
        path.write_text(script)
        options = ["--parsable"]
        if chained and job_ids:
            # on the command line, a --dependency replaces the script's: the afterok of --after goes too
            options.append(
                "--dependency="
                + ",".join(([f"afterok:{':'.join(after)}"] if after else []) + [f"afterany:{job_ids[-1]}"])
            )
        done = subprocess.run([sbatch, *options, str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            submitted = f" (already submitted: {', '.join(job_ids)}; scancel them or submit again)" if job_ids else ""
            raise SubmitFailed(
                f"sbatch refused {stage} ({path.name}): "
                f"{sbatch_failure(done.stderr, max_array_size=max_array_size)}{submitted}"
            )
        job_ids.append(done.stdout.strip().split(";")[0])  # --parsable: "jobid[;cluster]"
        paths.append(path)
    if not args.quiet:
        jobs = f"job {job_ids[0]}" if len(job_ids) == 1 else f"jobs {', '.join(job_ids)}"
        print(f"submit: {stage} is {jobs} ({', '.join(map(str, paths))}); logs in {work.slurm_logs}", file=sys.stderr)
    return job_ids


def pipeline_after(with_optional: bool) -> dict[str, tuple[str, ...]]:
    """`submit pipeline`'s stages in order, each after the submitted stages it reads (asr reads only the
    manifest: it runs beside features; a stage made in another's pass, decode, is that stage)."""
    made_by = registry.made_by()
    stages = [spec for spec in registry.run_stages(with_optional=with_optional) if spec.reads]
    return {
        spec.name: tuple(dict.fromkeys(made_by.get(name, name) for name in spec.reads if registry.stage(name).reads))
        for spec in stages
    }


def submit(cfg: Config, args) -> int:
    """Write the stage's sbatch script(s) under DIR/_state/slurm and submit them (print them only, with
    --dry-run). Prints the job id on stdout (the ids of a split array joined by ":"), so that
    `--after "$(...)"` chains stages. `submit pipeline` submits features, kmeans, quantize, asr and align
    (and train, with --with-train) as one afterok chain and prints `STAGE IDS` lines."""
    try:
        after = check_job_ids(args.after)
        # a setting wins; else the cluster's own limit, so that a split matches what sbatch accepts
        max_array_size = cfg.executor.slurm_max_array_size or cluster_max_array_size() or SLURM_DEFAULT_MAX_ARRAY_SIZE
        if args.stage != "pipeline":
            job_ids = _submit_stage(cfg, args, args.stage, after, max_array_size)
            if job_ids or not args.dry_run:
                print(":".join(job_ids))
            return 0
        chain = pipeline_after(with_optional=getattr(args, "with_train", False))
        submitted: dict[str, list[str]] = {}
        for stage, reads in chain.items():
            upstream = [job for name in reads for job in submitted.get(name, [])]
            job_ids = _submit_stage(cfg, args, stage, after + upstream, max_array_size)
            submitted[stage] = job_ids
            if not args.dry_run:
                print(f"{stage} {':'.join(job_ids) or '-'}", flush=True)
        return 0
    except ScriptError as error:
        print(f"submit: {error}", file=sys.stderr)
        return 2
    except SubmitFailed as error:
        print(f"submit: {error}", file=sys.stderr)
        return error.code
