"""The sbatch script of a stage: its #SBATCH lines (array, resources, logs, dependencies) and the pipeline
command line every task runs, split into several array jobs where the array is longer than the cluster's
MaxArraySize (pipeline/executors/slurm.py submits them).

What goes into the script is checked first: a path or value with a control character (a line break
would end a #SBATCH line and start a command) is refused, the #SBATCH values are plain words (the
config checks executor.slurm_*; see sbatch_path for the log path), and every word of the command
lines is shlex.quote'd; the numbers written bare are ints.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from pipeline import registry, storage
from pipeline.config import Config
from pipeline.config_rules import has_control_characters
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


def check_job_ids(after: list[str]) -> list[str]:
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
    after = check_job_ids(list(after))
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
