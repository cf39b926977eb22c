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
# every stage but the root (the manifest lists the input where the user is, before any job)
SUBMIT_STAGES = tuple(spec.name for spec in registry.STAGES if spec.reads)
SLURM_DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's own default: array indexes 0..1000
# a value sbatch reads as one plain word on a #SBATCH line: no space, quote, backslash, "#" (a comment) or
# control character
PLAIN_DIRECTIVE_VALUE = re.compile(r"[^\s'\"\\#\x00-\x1f\x7f]+")
PLAIN_PATH = re.compile(r"[\w@%+=:,./-]+", re.ASCII)


class ScriptError(ValueError):
    """A value that cannot go into an sbatch script safely; its message names the argument or key."""


def _one_line(value: str, what: str) -> str:
    if has_control_characters(value):
        raise ScriptError(f"{what} must not contain control characters such as a line break or a tab (got {value!r})")
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
        raise ScriptError(
            f"--work-dir must not contain a backslash: sbatch would then not name the logs by "
            f"job and task (got {folder!r})"
        )
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


def pipeline_command(
    stage: str,
    *,
    work_dir: Path,
    config: str | None,
    overrides: list[str],
    num_shards: int,
    gpus: int,
    python: str = sys.executable,
    first_task: int = 0,
    nodes: int = 1,
    rdzv_port: int = 29400,
) -> str:
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
        return (
            f"{shlex.quote(python)} -m pipeline {stage} {quoted} --executor local "
            f'--shard {task} --num-shards {int(num_shards)} --workers "${{SLURM_CPUS_PER_TASK:-1}}"'
        )
    spec = registry.stage(stage)
    if spec.distributed:
        if nodes > 1:
            # one torchrun per node (srun), which starts a process per GPU; all meet at the first node
            launcher = (
                f"srun --nodes={int(nodes)} --ntasks={int(nodes)} --ntasks-per-node=1 "
                f'--cpus-per-task="${{SLURM_CPUS_PER_TASK:-1}}" --kill-on-bad-exit=1 '
                f"{shlex.quote(python)} -m pipeline.executors.torchrun --nnodes {int(nodes)} "
                f"--nproc-per-node {max(int(gpus), 1)} --rdzv-backend c10d "
                f'--rdzv-endpoint "$MASTER_ADDR:{int(rdzv_port)}" --rdzv-id "$SLURM_JOB_ID" '
                f"--max-restarts 0 -m pipeline"
            )
        elif gpus > 1:
            launcher = (
                f"{shlex.quote(python)} -m torch.distributed.run --standalone --nproc-per-node {int(gpus)} -m pipeline"
            )
        else:
            launcher = f"{shlex.quote(python)} -m pipeline"
    else:
        launcher = f"{shlex.quote(python)} -m pipeline"
    line = f"{launcher} {stage} {quoted}"
    if spec.workers:  # its parts in a local pool of the task's CPUs
        line += ' --executor local --workers "${SLURM_CPUS_PER_TASK:-1}"'
    return " ".join([line, *map(shlex.quote, spec.batch_arguments)])


def _check_job_ids(after: list[str]) -> list[str]:
    """--after values: job ids, or several joined by ":" (what submit prints for a split array)."""
    ids = []
    for value in after:
        for job in str(value).split(":"):
            if not JOB_ID.fullmatch(job):
                raise ScriptError(f"--after takes a Slurm job id such as 12345, or ids joined by ':' (got {value!r})")
            ids.append(job)
    return ids


def sbatch_script(
    cfg: Config,
    stage: str,
    *,
    work_dir: Path,
    config: str | None = None,
    overrides: list[str] = (),
    num_shards: int = 1,
    array_parallelism: int | None = None,
    after: list[str] = (),
    python: str = sys.executable,
    first_task: int = 0,
    tasks: int | None = None,
    max_array_size: int | None = None,
    indexes: list[int] | None = None,
) -> str:
    """The sbatch script of a stage (for an array stage: of its tasks first_task .. first_task+tasks-1,
    all of them by default, or only the array indexes `indexes` of them: task first_task + i each);
    ScriptError names the argument or key of a value that cannot go in."""
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
    nodes = int(ex.slurm_nodes) if registry.stage(stage).distributed else 1
    is_array = stage in SHARD_STAGES
    num_shards, first_task = int(num_shards), int(first_task)
    tasks = num_shards - first_task if tasks is None else int(tasks)
    if is_array and not (0 <= first_task and 1 <= tasks and first_task + tasks <= num_shards):
        raise ScriptError(f"array tasks {first_task}..{first_task + tasks - 1} are not within 0..{num_shards - 1}")
    max_array_size = max_array_size or ex.slurm_max_array_size or SLURM_DEFAULT_MAX_ARRAY_SIZE
    if is_array and tasks > max_array_size:
        raise ScriptError(
            f"{tasks} array tasks are more than executor.slurm_max_array_size "
            f"({max_array_size}): submit them as several jobs (sbatch_scripts)"
        )
    if indexes is not None and (not indexes or not all(0 <= int(i) < tasks for i in indexes)):
        raise ScriptError(f"array indexes {indexes} are not within 0..{tasks - 1}")
    parallelism = array_parallelism or ex.slurm_array_parallelism
    if not is_array:
        what = "one job" if nodes == 1 else f"one job on {nodes} nodes"
    elif tasks == num_shards:
        what = f"a job array of {num_shards} task(s)"
    else:
        what = (
            f"a job array of tasks {first_task}..{first_task + tasks - 1} of {num_shards} "
            f"(array index i runs task i + {first_task})"
        )
    lines = [
        "#!/bin/bash",
        f"# VideoBERT pipeline: the {stage} stage as {what}, written by `python -m pipeline submit`",
        f"#SBATCH --job-name=videobert-{stage}",
    ]
    if is_array:
        spec = f"0-{tasks - 1}" if indexes is None else ",".join(str(int(i)) for i in sorted(set(indexes)))
        lines.append(f"#SBATCH --array={spec}" + (f"%{int(parallelism)}" if parallelism else ""))
    if nodes > 1:
        lines += [f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1"]
    lines += [
        f"#SBATCH --cpus-per-task={int(ex.slurm_cpus_per_task)}",
        _directive("mem", ex.slurm_mem, "executor.slurm_mem"),
        _directive("time", ex.slurm_time, "executor.slurm_time"),
    ]
    if ex.slurm_partition:
        lines.append(_directive("partition", ex.slurm_partition, "executor.slurm_partition"))
    if gpus:
        lines.append(f"#SBATCH --gres=gpu:{gpus}")
    log_name = "%x-%A_%a.out" if is_array else "%x-%j.out"
    lines += [
        f"#SBATCH --output={sbatch_path(str(slurm_home(work_dir).slurm_logs), log_name)}",
        "#SBATCH --open-mode=append",  # a requeued attempt appends to the same log
        "#SBATCH --requeue",
    ]
    if after:
        # a failed upstream stage cancels this job instead of leaving it pending forever
        lines += [f"#SBATCH --dependency=afterok:{':'.join(after)}", "#SBATCH --kill-on-invalid-dep=yes"]
    lines += list(ex.slurm_extra)
    lines += [
        "",
        "set -euo pipefail",
        f"cd {shlex.quote(str(REPO))}",
        # torch and FFmpeg would otherwise start a thread per core of the node, not of the allocation
        'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"',
    ]
    if nodes > 1:
        lines += [
            "# the rendezvous is hosted on the job's first node, at its address (NodeAddr): a node's",
            "# name need not be a host name that resolves",
            'first_node="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1 || true)"',
            ': "${first_node:?cannot read the first node of $SLURM_JOB_NODELIST with scontrol}"',
            "MASTER_ADDR=\"$(scontrol show node \"$first_node\" 2>/dev/null | tr ' ' '\\n' "
            "| sed -n 's/^NodeAddr=//p' | head -n 1 || true)\"",
            'export MASTER_ADDR="${MASTER_ADDR:-$first_node}"',
            f"export MASTER_PORT={int(ex.slurm_rdzv_port)}",
            'getent ahosts "$MASTER_ADDR" >/dev/null || { echo "train: the first node\'s address '
            '$MASTER_ADDR (node $first_node) does not resolve: the rendezvous cannot start" >&2; exit 1; }',
        ]
    lines += [
        "exec "
        + pipeline_command(
            stage,
            work_dir=work_dir,
            config=config,
            overrides=list(overrides),
            num_shards=num_shards,
            gpus=gpus,
            python=python,
            first_task=first_task,
            nodes=nodes,
            rdzv_port=int(ex.slurm_rdzv_port),
        ),
        "",
    ]
    return "\n".join(lines)


def sbatch_scripts(
    cfg: Config,
    stage: str,
    *,
    num_shards: int = 1,
    max_array_size: int | None = None,
    only_tasks: set[int] | None = None,
    **options,
) -> list[str]:
    """The scripts of a stage: one, or for an array longer than the MaxArraySize (max_array_size, else
    executor.slurm_max_array_size, else Slurm's default) one per part (array_parts), each covering its
    tasks; with `only_tasks`, only the parts holding one of them, each asking for those alone."""
    if stage not in SHARD_STAGES:
        return [sbatch_script(cfg, stage, num_shards=num_shards, **options)]
    size = max_array_size or cfg.executor.slurm_max_array_size or SLURM_DEFAULT_MAX_ARRAY_SIZE
    scripts = []
    for first, tasks in array_parts(int(num_shards), size):
        indexes = None if only_tasks is None else [t - first for t in sorted(only_tasks) if first <= t < first + tasks]
        if indexes == []:
            continue
        scripts.append(
            sbatch_script(
                cfg,
                stage,
                num_shards=num_shards,
                first_task=first,
                tasks=tasks,
                max_array_size=size,
                indexes=indexes,
                **options,
            )
        )
    return scripts


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
    made_by = {made: spec.name for spec in registry.STAGES for made in spec.also_makes}
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
        after = _check_job_ids(args.after)
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
