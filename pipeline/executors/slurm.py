"""`python -m pipeline submit STAGE [--num-shards N] ...`: a stage as a Slurm job array.

Every array task runs the same command line; its task index picks its manifest shards (shard s goes to
task s % N, see dispatch.select_shards), so N may be smaller than the number of manifest shards (it
defaults to their number). Resources come from the executor section (slurm_*); the stages whose registry
record says they use a GPU (`uses_gpu`: features, asr, train) get `executor.slurm_gpus` GPUs. `--requeue`
lets Slurm restart a preempted or failed-node task: completion records make the rerun skip finished shards,
and atomic outputs mean a killed task never leaves a file that passes for complete. kmeans and train are one job each (not arrays); train
resumes from its newest checkpoint, so a requeued or time-limited job continues where it stopped.

- **Logs**: tasks run without --quiet: their progress lines, each starting with its time, go to
  DIR/_state/slurm/logs/<job name>-<array job>_<index>.out.
- **Arrays longer than the cluster's MaxArraySize** (`executor.slurm_max_array_size`, Slurm's default
  1001: indexes 0..1000) are submitted as several array jobs of at most that many tasks; the job for
  tasks F.. runs `--shard $((SLURM_ARRAY_TASK_ID + F))`, so together they run every task 0..N-1 once.
  With a throttle (`--array-parallelism M`) each job waits for the one before it (afterany), so that at
  most M tasks run at once over all of them; without one they are all submitted at once.
- **Multi-node training**: with `executor.slurm_nodes` > 1, `submit train` asks for that many nodes with
  one task each; srun starts one torchrun per node, and the torchruns meet in a c10d rendezvous on the
  job's first node (`scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1`, port
  `executor.slurm_rdzv_port`, id $SLURM_JOB_ID) and start `executor.slurm_gpus` training processes each
  (torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; videobert/train.py reads them).

Stages chain with afterok dependencies; the job id is the only thing printed on stdout (several ids of a
split array joined by ":", which --after and --dependency take as they are):

    decode=$(python -m pipeline submit decode --num-shards 100 --work-dir W)
    python -m pipeline submit features --num-shards 20 --work-dir W --after "$decode"

What goes into the script is checked first: a path or value with a control character (a line break
would end a #SBATCH line and start a command) is refused, the #SBATCH values are plain words (the
config checks executor.slurm_*; see sbatch_path for the log path), and every word of the command
lines is shlex.quote'd; the numbers written bare are ints.
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

from pipeline import registry, storage
from pipeline.config import Config
from pipeline.config_rules import has_control_characters
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir
from pipeline.registry import SHARD_STAGES

REPO = Path(__file__).resolve().parents[2]
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


def array_parts(num_shards: int, max_array_size: int) -> list[tuple[int, int]]:
    """(first task, number of tasks) of each array job: at most `max_array_size` tasks each, in order."""
    return [(first, min(max_array_size, num_shards - first)) for first in range(0, num_shards, max_array_size)]


def slurm_home(work_dir) -> WorkDir:
    """Where the sbatch scripts and Slurm's job logs go: DIR/_state/slurm; Slurm writes its logs to a file
    system, so for a work dir on object storage a folder of the submitting directory stands in
    (./slurm-jobs/<a name of the URL>)."""
    place = storage.location(str(work_dir))
    if not storage.is_remote(place):
        return WorkDir(Path(place).resolve())
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(place))
    return WorkDir(Path.cwd() / "slurm-jobs" / name)


def pipeline_command(stage: str, *, work_dir: Path, config: str | None, overrides: list[str],
                     num_shards: int, gpus: int, python: str = sys.executable, first_task: int = 0,
                     nodes: int = 1, rdzv_port: int = 29400) -> str:
    """The command line every task of the job runs (shell syntax; the task id, the job id and the first
    node's address are read at run time)."""
    common = ["--work-dir", storage.canonical(work_dir)]
    if config:
        common += ["--config", str(Path(config).resolve())]
    for assignment in overrides:
        common += ["--set", assignment]
    quoted = " ".join(shlex.quote(part) for part in common)
    if stage in SHARD_STAGES:
        task = '"$SLURM_ARRAY_TASK_ID"' if not first_task else f'"$((SLURM_ARRAY_TASK_ID + {int(first_task)}))"'
        return (f"{shlex.quote(python)} -m pipeline {stage} {quoted} --executor local "
                f'--shard {task} --num-shards {int(num_shards)} --workers "${{SLURM_CPUS_PER_TASK:-1}}"')
    if stage == "train":
        if nodes > 1:
            # one torchrun per node (srun), which starts a process per GPU; all meet at the first node
            launcher = (f'srun --nodes={int(nodes)} --ntasks={int(nodes)} --ntasks-per-node=1 '
                        f'--cpus-per-task="${{SLURM_CPUS_PER_TASK:-1}}" --kill-on-bad-exit=1 '
                        f"{shlex.quote(python)} -m torch.distributed.run --nnodes {int(nodes)} "
                        f"--nproc-per-node {max(int(gpus), 1)} --rdzv-backend c10d "
                        f'--rdzv-endpoint "$MASTER_ADDR:{int(rdzv_port)}" --rdzv-id "$SLURM_JOB_ID" '
                        f"--max-restarts 0 -m pipeline")
        elif gpus > 1:
            launcher = f"{shlex.quote(python)} -m torch.distributed.run --standalone --nproc-per-node {int(gpus)} -m pipeline"
        else:
            launcher = f"{shlex.quote(python)} -m pipeline"
        return f"{launcher} train {quoted} --resume"
    return (f'{shlex.quote(python)} -m pipeline {stage} {quoted} --executor local '
            f'--workers "${{SLURM_CPUS_PER_TASK:-1}}"')


def _check_job_ids(after: list[str]) -> list[str]:
    """--after values: job ids, or several joined by ":" (what submit prints for a split array)."""
    ids = []
    for value in after:
        for job in str(value).split(":"):
            if not JOB_ID.fullmatch(job):
                raise ScriptError(f"--after takes a Slurm job id such as 12345, or ids joined by ':' (got {value!r})")
            ids.append(job)
    return ids


def sbatch_script(cfg: Config, stage: str, *, work_dir: Path, config: str | None = None,
                  overrides: list[str] = (), num_shards: int = 1, array_parallelism: int | None = None,
                  after: list[str] = (), python: str = sys.executable, first_task: int = 0,
                  tasks: int | None = None) -> str:
    """The sbatch script of a stage (for an array stage: of its tasks first_task .. first_task+tasks-1,
    all of them by default); ScriptError names the argument or key of a value that cannot go in."""
    if stage not in SUBMIT_STAGES:
        raise ScriptError(f"the stage must be one of {', '.join(SUBMIT_STAGES)} (got {stage!r})")
    work_dir = _one_line(storage.canonical(work_dir), "--work-dir")
    if config:
        _one_line(str(Path(config).resolve()), "--config")
    for assignment in overrides:
        _one_line(assignment, "--set")
    _one_line(python, "the Python interpreter's path")
    _one_line(str(REPO), "the pipeline's folder")
    after = _check_job_ids(list(after))
    ex = cfg.executor
    for index, line in enumerate(ex.slurm_extra):
        # bash reads them as comments and sbatch as options: harmless while each stays one #SBATCH line
        if not line.startswith("#SBATCH "):
            raise ScriptError(f"executor.slurm_extra[{index}] must start with '#SBATCH ' (got {line!r})")
        _one_line(line, f"executor.slurm_extra[{index}]")
    gpus = int(ex.slurm_gpus) if registry.stage(stage).uses_gpu else 0
    nodes = int(ex.slurm_nodes) if stage == "train" else 1
    is_array = stage in SHARD_STAGES
    num_shards, first_task = int(num_shards), int(first_task)
    tasks = num_shards - first_task if tasks is None else int(tasks)
    if is_array and not (0 <= first_task and 1 <= tasks and first_task + tasks <= num_shards):
        raise ScriptError(f"array tasks {first_task}..{first_task + tasks - 1} are not within 0..{num_shards - 1}")
    if is_array and tasks > ex.slurm_max_array_size:
        raise ScriptError(f"{tasks} array tasks are more than executor.slurm_max_array_size "
                          f"({ex.slurm_max_array_size}): submit them as several jobs (sbatch_scripts)")
    parallelism = array_parallelism or ex.slurm_array_parallelism
    if not is_array:
        what = "one job" if nodes == 1 else f"one job on {nodes} nodes"
    elif tasks == num_shards:
        what = f"a job array of {num_shards} task(s)"
    else:
        what = (f"a job array of tasks {first_task}..{first_task + tasks - 1} of {num_shards} "
                f"(array index i runs task i + {first_task})")
    lines = ["#!/bin/bash",
             f"# VideoBERT pipeline: the {stage} stage as {what}, written by `python -m pipeline submit`",
             f"#SBATCH --job-name=videobert-{stage}"]
    if is_array:
        lines.append(f"#SBATCH --array=0-{tasks - 1}" + (f"%{int(parallelism)}" if parallelism else ""))
    if nodes > 1:
        lines += [f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1"]
    lines += [f"#SBATCH --cpus-per-task={int(ex.slurm_cpus_per_task)}",
              _directive("mem", ex.slurm_mem, "executor.slurm_mem"),
              _directive("time", ex.slurm_time, "executor.slurm_time")]
    if ex.slurm_partition:
        lines.append(_directive("partition", ex.slurm_partition, "executor.slurm_partition"))
    if gpus:
        lines.append(f"#SBATCH --gres=gpu:{gpus}")
    log_name = "%x-%A_%a.out" if is_array else "%x-%j.out"
    lines += [f"#SBATCH --output={sbatch_path(str(slurm_home(work_dir).slurm_logs), log_name)}",
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
              'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"']
    if nodes > 1:
        lines += ["# the rendezvous is hosted on the job's first node",
                  'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
                  ': "${MASTER_ADDR:?cannot read the first node of $SLURM_JOB_NODELIST with scontrol}"',
                  f"export MASTER_PORT={int(ex.slurm_rdzv_port)}"]
    lines += ["exec " + pipeline_command(stage, work_dir=work_dir, config=config, overrides=list(overrides),
                                         num_shards=num_shards, gpus=gpus, python=python, first_task=first_task,
                                         nodes=nodes, rdzv_port=int(ex.slurm_rdzv_port)),
              ""]
    return "\n".join(lines)


def sbatch_scripts(cfg: Config, stage: str, *, num_shards: int = 1, **options) -> list[str]:
    """The scripts of a stage: one, or for an array longer than executor.slurm_max_array_size one per
    part (array_parts), each covering its tasks."""
    if stage not in SHARD_STAGES:
        return [sbatch_script(cfg, stage, num_shards=num_shards, **options)]
    return [sbatch_script(cfg, stage, num_shards=num_shards, first_task=first, tasks=tasks, **options)
            for first, tasks in array_parts(int(num_shards), cfg.executor.slurm_max_array_size)]


def _num_tasks(args) -> int | None:
    """--num-shards, or for an array stage the number of manifest shards (one task each)."""
    if args.num_shards is not None or args.stage not in SHARD_STAGES:
        return args.num_shards if args.num_shards is not None else 1
    if WorkDir(args.work_dir).manifest.exists():
        return len(Lineage(args.work_dir).manifest_shards())
    return None


def submit(cfg: Config, args) -> int:
    """Write the stage's sbatch script(s) under DIR/_state/slurm and submit them (print them only, with
    --dry-run). Prints the job id on stdout (the ids of a split array joined by ":"), so that
    `--after "$(...)"` chains stages."""
    num_shards = _num_tasks(args)
    if num_shards is None:
        print(f"submit: give --num-shards N (the array's tasks): there is no manifest in {args.work_dir} yet to "
              f"take the number of shards from", file=sys.stderr)
        return 2
    if num_shards < 1:
        print(f"submit: --num-shards must be >= 1 (got {num_shards})", file=sys.stderr)
        return 2
    if args.array_parallelism is not None and args.array_parallelism < 1:
        print(f"submit: --array-parallelism must be >= 1 (got {args.array_parallelism})", file=sys.stderr)
        return 2
    try:   # before anything is read or written: a refused value leaves no script behind
        scripts = sbatch_scripts(cfg, args.stage, work_dir=args.work_dir, config=args.config, overrides=args.set,
                                 num_shards=num_shards, array_parallelism=args.array_parallelism,
                                 after=args.after)
        after = _check_job_ids(args.after)
    except ScriptError as error:
        print(f"submit: {error}", file=sys.stderr)
        return 2
    if args.stage in SHARD_STAGES and WorkDir(args.work_dir).manifest.exists():
        shards = len(Lineage(args.work_dir).manifest_shards())
        if num_shards > shards:
            print(f"submit: warning: {num_shards} tasks for {shards} manifest shard(s): "
                  f"{num_shards - shards} task(s) will find nothing to do", file=sys.stderr)
    # a split array under a throttle: each job after the one before, so the throttle holds over all of them
    chained = len(scripts) > 1 and bool(args.array_parallelism or cfg.executor.slurm_array_parallelism)
    if args.dry_run:
        for index, script in enumerate(scripts):
            if len(scripts) > 1:
                waits = " --dependency=afterany:<the job before>" if chained and index else ""
                print(f"# ---- job {index + 1} of {len(scripts)}: sbatch{waits} ----")
            print(script, end="")
        return 0
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        print("submit: sbatch not found on PATH (run this on a Slurm login node, or use --dry-run to print "
              "the script)", file=sys.stderr)
        return 1
    work = slurm_home(args.work_dir)
    work.slurm_logs.mkdir(parents=True, exist_ok=True)
    stem = f"{args.stage}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    job_ids, paths = [], []
    for index, script in enumerate(scripts):
        path = work.slurm_folder / (f"{stem}.sbatch" if len(scripts) == 1 else f"{stem}-{index + 1}.sbatch")
        path.write_text(script)
        options = ["--parsable"]
        if chained and job_ids:
            # on the command line, a --dependency replaces the script's: the afterok of --after goes too
            options.append("--dependency=" + ",".join(([f"afterok:{':'.join(after)}"] if after else [])
                                                      + [f"afterany:{job_ids[-1]}"]))
        done = subprocess.run([sbatch, *options, str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            submitted = f" (already submitted: {', '.join(job_ids)}; scancel them or submit again)" if job_ids else ""
            print(f"submit: sbatch failed ({done.returncode}) for {path}: {done.stderr.strip()}{submitted}",
                  file=sys.stderr)
            return 1
        job_ids.append(done.stdout.strip().split(";")[0])   # --parsable: "jobid[;cluster]"
        paths.append(path)
    print(":".join(job_ids))
    if not args.quiet:
        jobs = f"job {job_ids[0]}" if len(job_ids) == 1 else f"jobs {', '.join(job_ids)}"
        print(f"submit: {args.stage} is {jobs} ({', '.join(map(str, paths))}); logs in {work.slurm_logs}",
              file=sys.stderr)
    return 0
