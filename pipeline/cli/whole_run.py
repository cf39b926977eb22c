"""The commands about a whole run: `run` (every stage in order, each as its own command), `doctor` (every
stage's preflight at once) and `config` (the work dir's remembered config)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pipeline import registry
from pipeline.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, RunNotes, count, outcomes, program_name

# the stages `run` runs, in order (not decode: features writes its outputs, in the same read of each video)
RUN_STAGES = tuple(spec.name for spec in registry.run_stages())
# the stages whose preflight `doctor` checks (`run` checks those it runs, before its first stage)
CHECKED_STAGES = tuple(spec.name for spec in registry.STAGES if spec.preflight)


def _stage_argv(args, stage: str) -> list[str]:
    argv = [stage, "--work-dir", str(args.work_dir)]
    if args.config:
        argv += ["--config", str(args.config)]
    for value in args.set:
        argv += ["--set", value]
    if args.quiet:
        argv.append("--quiet")
    spec = registry.stage(stage)
    if not spec.reads:  # the root stage lists the input
        argv += ["--input", str(args.input)]
    if args.force:
        argv.append("--force")
    if args.workers is not None and (spec.per_shard or spec.workers):
        argv += ["--workers", str(args.workers)]
    return argv


def _refuse(header: str, problems: list[str]) -> int:
    """The problems that stop a run before it starts: a header line, then one line each; usage exit."""
    print(header, file=sys.stderr)
    for line in problems:
        print(f"  {line}", file=sys.stderr)
    return EXIT_USAGE


def run_pipeline(args, cfg) -> int:
    """`run`: the stage commands one by one (each as if typed, so the same shards, records and exit codes),
    after one preflight of every stage that has work to do; a table of what each did at the end."""
    from pipeline import remembered

    started = time.time()
    cfg, _ = remembered.resolve(args, writes=True)  # the config the stages will resolve, as they will
    problems = _doctor_problems(
        cfg, args.work_dir, args.input, stages=[name for name in CHECKED_STAGES if name in RUN_STAGES]
    )
    if problems:
        return _refuse(f"run: cannot start ({count(len(problems), 'problem')}, nothing was run):", problems)
    steps = [*RUN_STAGES, "validate", "summary"]
    done: list[tuple[str, int, float, str]] = []
    RunNotes.printed = set()
    try:
        code = _run_steps(args, steps, done)
    finally:
        RunNotes.printed = None
    _print_run_table(args, steps, done, code, time.time() - started)
    return code


def _run_steps(args, steps: list[str], done: list) -> int:
    """The steps one by one, each as its own command, until one fails: its exit code (0 when none did)."""
    from pipeline import cli

    code = EXIT_OK
    for number, stage in enumerate(steps, 1):
        if not args.quiet:
            print(f"run: [{number}/{len(steps)}] {stage}", file=sys.stderr, flush=True)
        argv = (
            ["validate", "--work-dir", str(args.work_dir)]
            if stage == "validate"
            else ["summary", "--work-dir", str(args.work_dir), "--quiet"]
            if stage == "summary"
            else _stage_argv(args, stage)
        )
        outcomes.pop(stage, None)
        stage_started = time.time()
        code = cli.main(argv)
        done.append((stage, code, time.time() - stage_started, outcomes.get(stage, "")))
        if code != EXIT_OK:
            break
    return code


def _print_run_table(args, steps: list[str], done: list, code: int, seconds: float) -> None:
    shown = program_name()
    width = max(len(stage) for stage in steps)
    verdict = "done" if code == EXIT_OK else f"stopped at {done[-1][0]} (exit {code})"
    print(f"run: {verdict} in {seconds:.1f}s, work dir {args.work_dir}", file=sys.stderr)
    for stage, stage_code, stage_seconds, outcome in done:
        status = outcome or ("ok" if stage_code == EXIT_OK else f"exit {stage_code}")
        print(f"  {stage:<{width}} {stage_seconds:7.1f}s  {status}", file=sys.stderr)
    if code == EXIT_OK:
        print(
            f"next: {shown} train --work-dir {args.work_dir} --resume, then {shown} report --work-dir {args.work_dir}",
            file=sys.stderr,
        )
    elif code != EXIT_USAGE:
        print(
            f"  what failed: {shown} errors --work-dir {args.work_dir}; rerun the same command to go on "
            f"(finished shards are kept)",
            file=sys.stderr,
        )


def _doctor_problems(cfg, work_dir, input_path=None, stages=CHECKED_STAGES) -> list[str]:
    """Every reason the run cannot start, one line each: a model or weights that cannot load (each stage's
    preflight, for the stages that have work to do), a work dir that cannot be written, an input that is
    not there."""
    import os

    from pipeline import storage
    from pipeline.contract import PreflightError
    from pipeline.engine.lineage import Lineage
    from pipeline.engine.workdir import WorkDir
    from pipeline.packaging import collisions

    problems = collisions()  # another distribution owning one of the product's top-level package names
    if input_path is not None and not storage.is_url(str(input_path)) and not Path(input_path).exists():
        problems.append(f"--input {input_path}: no such file or folder")
    if work_dir is not None and not storage.is_url(str(work_dir)):
        place = Path(work_dir)
        existing = next((p for p in (place, *place.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            problems.append(f"--work-dir {work_dir}: {existing} is a file, not a folder")
        elif existing is not None and not os.access(existing, os.W_OK | os.X_OK):
            problems.append(f"--work-dir {work_dir}: {existing} is not writable here")
    checker = None
    if work_dir is not None and (storage.is_remote(storage.location(work_dir)) or WorkDir(work_dir).manifest.exists()):
        checker = Lineage(work_dir, cfg)
    for stage in stages:
        if checker is not None and registry.stage(stage).per_shard:
            try:  # a stage with nothing to do needs nothing (as the stage itself decides)
                if all(state.current for state in checker.stage_states(stage).values()):
                    continue
            except Exception:  # noqa: BLE001 - an unreadable run is the stage's to report; check everything
                pass
        try:
            registry.stage(stage).run_preflight(cfg, work_dir if checker is not None else None)
        except PreflightError as error:
            problems.append(f"{stage}: {error}")
    return problems


def run_doctor(args, cfg) -> int:
    from pipeline import remembered

    cfg, _ = remembered.resolve(args, writes=args.work_dir is not None)  # the work dir's, as a stage's
    problems = _doctor_problems(cfg, args.work_dir, args.input)
    where = f" for {args.work_dir}" if args.work_dir else ""
    if problems:
        return _refuse(f"doctor: the run cannot start{where}: {count(len(problems), 'problem')}", problems)
    print(f"doctor: ok{where}: every stage ({', '.join(CHECKED_STAGES)}) can start with this config", file=sys.stderr)
    return EXIT_OK


def run_config(args, cfg) -> int:
    from pipeline import remembered

    if args.action == "show":
        text = remembered.show(args.work_dir)
    elif args.action == "history":
        text = remembered.history_text(args.work_dir)
    else:
        given = cfg if (args.config or args.set) else None
        text = remembered.diff_text(args.work_dir, given)
    if text is None:
        print(
            f"config: {args.work_dir} remembers no config yet (a command that wrote there and succeeded records it)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    print(text)
    return EXIT_OK
