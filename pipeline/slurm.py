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

What goes into the script is checked first: a path or value with a control character (a line break
would end a #SBATCH line and start a command) is refused, the #SBATCH values are plain words (the
config checks executor.slurm_*; see sbatch_path for the log path), and every word of the command
lines is shlex.quote'd.
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
from pipeline.config_rules import has_control_characters
from pipeline.lineage import Lineage
from pipeline.registry import SHARD_STAGES
from pipeline.workdir import WorkDir

REPO = Path(__file__).resolve().parent.parent
JOB_ID = re.compile(r"\d+(_\d+)?")
SUBMIT_STAGES = SHARD_STAGES + ("kmeans", "train")
# a value sbatch reads as one plain word on a #SBATCH line: no space, quote, backslash, "#" (a comment) or
# control character
PLAIN_DIRECTIVE_VALUE = re.compile(r"[^\s'\"\\#\x00-\x1f\x7f]+")
PLAIN_PATH = re.compile(r"[\w@%+=:,./-]+", re.ASCII)


class ScriptError(ValueError):
    """A value that cannot go into an sbatch script safely; its message names the argument or key."""


def _one_line(value: str, what: str) -> str:
    if has_control_characters(value):
        raise ScriptError(f"{what} must not contain control characters such as a line break or a tab "
                          f"(got {value!r})")
    return value


def sbatch_path(folder: str, pattern: str) -> str:
    """The file `pattern` (sbatch's %-symbols) in `folder`, as the value of an #SBATCH --output line.

    sbatch reads directive lines with rules of its own, not a shell's: a space ends the value unless
    quoted, single or double quotes group, a backslash escapes the next character (inside quotes too),
    an unquoted "#" starts a comment, and nothing ($, `) is expanded. In the file name, "%x", "%A"...
    are replaced, "%%" is a "%", and a backslash anywhere turns the replacement off. So: "%" is doubled,
    a backslash is refused (the per-task log names would be lost), a plain path is written bare and any
    other in double quotes with its '"' escaped: spaces, quotes, "#" and "$(...)" then reach sbatch as
    written. A line break is refused before this (it would end the directive and start a command)."""
    if "\\" in folder:
        raise ScriptError(f"--work-dir must not contain a backslash: sbatch would then not name the logs by "
                          f"job and task (got {folder!r})")
    path = folder.replace("%", "%%") + "/" + pattern
    return path if PLAIN_PATH.fullmatch(path) else '"' + path.replace('"', '\\"') + '"'


def _directive(option: str, value, key: str) -> str:
    # the config refuses such values at load; this keeps a Config built in code from reaching the script
    if not PLAIN_DIRECTIVE_VALUE.fullmatch(str(value)):
        raise ScriptError(f"{key} must be one plain word for #SBATCH --{option} (got {value!r})")
    return f"#SBATCH --{option}={value}"


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
    """The sbatch script of a stage; ScriptError names the argument or key of a value that cannot go in."""
    if stage not in SUBMIT_STAGES:
        raise ScriptError(f"the stage must be one of {', '.join(SUBMIT_STAGES)} (got {stage!r})")
    work_dir = Path(_one_line(str(Path(work_dir).resolve()), "--work-dir"))
    if config:
        _one_line(str(Path(config).resolve()), "--config")
    for assignment in overrides:
        _one_line(assignment, "--set")
    _one_line(python, "the Python interpreter's path")
    _one_line(str(REPO), "the pipeline's folder")
    for job in after:
        if not JOB_ID.fullmatch(job):
            raise ScriptError(f"--after takes a Slurm job id such as 12345 (got {job!r})")
    ex = cfg.executor
    for index, line in enumerate(ex.slurm_extra):
        # bash reads them as comments and sbatch as options: harmless while each stays one #SBATCH line
        if not line.startswith("#SBATCH "):
            raise ScriptError(f"executor.slurm_extra[{index}] must start with '#SBATCH ' (got {line!r})")
        _one_line(line, f"executor.slurm_extra[{index}]")
    gpus = ex.slurm_gpus if stage in ex.slurm_gpu_stages else 0
    is_array = stage in SHARD_STAGES
    parallelism = array_parallelism or ex.slurm_array_parallelism
    what = f"a job array of {num_shards} task(s)" if is_array else "one job"
    lines = ["#!/bin/bash",
             f"# VideoBERT pipeline: the {stage} stage as {what}, written by `python -m pipeline submit`",
             f"#SBATCH --job-name=videobert-{stage}"]
    if is_array:
        lines.append(f"#SBATCH --array=0-{int(num_shards) - 1}" + (f"%{int(parallelism)}" if parallelism else ""))
    lines += [f"#SBATCH --cpus-per-task={int(ex.slurm_cpus_per_task)}",
              _directive("mem", ex.slurm_mem, "executor.slurm_mem"),
              _directive("time", ex.slurm_time, "executor.slurm_time")]
    if ex.slurm_partition:
        lines.append(_directive("partition", ex.slurm_partition, "executor.slurm_partition"))
    if gpus:
        lines.append(f"#SBATCH --gres=gpu:{int(gpus)}")
    log_name = "%x-%A_%a.out" if is_array else "%x-%j.out"
    lines += [f"#SBATCH --output={sbatch_path(str(WorkDir(work_dir).slurm_logs), log_name)}",
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
    try:   # before anything is read or written: a refused value leaves no script behind
        script = sbatch_script(cfg, args.stage, work_dir=args.work_dir, config=args.config, overrides=args.set,
                               num_shards=args.num_shards, array_parallelism=args.array_parallelism,
                               after=args.after)
    except ScriptError as error:
        print(f"submit: {error}", file=sys.stderr)
        return 2
    if args.stage in SHARD_STAGES and WorkDir(args.work_dir).manifest.exists():
        shards = len(Lineage(args.work_dir).manifest_shards())
        if args.num_shards > shards:
            print(f"submit: warning: {args.num_shards} tasks for {shards} manifest shard(s): "
                  f"{args.num_shards - shards} task(s) will find nothing to do", file=sys.stderr)
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
