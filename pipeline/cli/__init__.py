"""`python -m pipeline COMMAND ...`: every stage and tool of the product.

    python -m pipeline STAGE --config FILE --work-dir DIR [--set key=value ...]
                             [--shard I --num-shards N] [--force] [--executor local|ray] [--quiet]

Stages, in run order: manifest (with --input), decode, features, kmeans, quantize, asr, align, train;
then eval (zero-shot, linear-probe, features, predict-video, captioning, forecast). YouCook II:
youcook2-manifest (the manifest from its annotations file) and youcook2-labels (verb/noun lists and labels from
its captions). A stage redoes what is stale (its inputs or config changed since it ran) and skips what is
current. The whole run: run (every stage in order), doctor (every preflight at once).
Exit codes: 0 done; 1 a shard failed or could not run, or a file is unreadable; 2 a usage or config error;
3 the input holds no videos, or more videos failed than executor.max_failed_share allows; 141 the reader of
the output stopped reading (`| head -1`)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from pipeline.cli import table
from pipeline.cli.common import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TOO_MANY_FAILED,
    EXIT_USAGE,
    RunNotes,
    program_name,
)
from pipeline.config import ConfigError, load_config
from pipeline.devices import check_devices

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_FAILED", "EXIT_OK", "EXIT_TOO_MANY_FAILED", "EXIT_USAGE", "main"]


def _command_config(args, entry):
    """The config the command runs with: --config and --set, or without --config the work dir's remembered
    config with --set on top; the notes about it (which one, what differs from the remembered) printed."""
    from pipeline import remembered
    from pipeline.config import check_given_once

    if not entry.resolves_config:
        return load_config(None, [])
    check_given_once(getattr(args, "set", None) or [])  # --set a=1 --set a=2: which one did the user mean?
    cfg, notes = remembered.resolve(args, writes=entry.writes)
    args.config_differs = any(note.startswith(remembered.DIFFERS) for note in notes)
    for note in notes:
        if RunNotes.printed is not None:  # inside `run`: each note once, not once per stage
            if note in RunNotes.printed:
                continue
            RunNotes.printed.add(note)
        if not (args.quiet and note.startswith("config: this work dir's")):
            print(note, file=sys.stderr)
    return cfg


def _remember_config(args, cfg) -> None:
    from pipeline import remembered

    try:
        remembered.record(args.work_dir, cfg, args.command)
    except OSError as error:  # best effort: a full disk was already reported by the command itself
        logging.getLogger("pipeline").warning("the work dir's config was not recorded: %s", error)


def _missing_work_dir(args, entry) -> str | None:
    """One line when the command needs an existing local work dir and --work-dir names none (a typo must
    not become a new, empty work dir)."""
    from pipeline import storage

    if entry.makes_work_dir or args.work_dir is None:
        return None
    where = storage.location(args.work_dir)
    if storage.is_remote(where) or where.exists():
        return None
    return (
        f"{args.command}: cannot run: the work dir {args.work_dir} does not exist: run the manifest stage first "
        f"({program_name()} manifest --work-dir {args.work_dir} --input VIDEOS)"
    )


def dispatch(args, cfg) -> int:
    """Run the command the table names for args.command."""
    from pipeline.contract import resolve

    return resolve(table.command(args.command).run)(args, cfg)


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # run as the program (not called from Python): Ctrl-C ends it in one line
        _end_on_interrupt()
    args = table.build_parser(__doc__).parse_args(argv)
    entry = table.command(args.command)
    _configure_logging(args.quiet, as_program=argv is None)
    logging.getLogger("faiss").setLevel(logging.WARNING)  # its loader's INFO lines are noise here
    for client in ("botocore", "aiobotocore"):  # "Found credentials in environment variables", ...
        logging.getLogger(client).setLevel(logging.WARNING)
    problem = _option_problem(args) or (entry.usage_problem(args) if entry.usage_problem else None)
    if problem:
        print(f"{args.command}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        cfg = _command_config(args, entry)
        if (getattr(args, "executor", None) or cfg.executor.kind) != "ray":  # Ray: the workers' GPUs
            check_devices(cfg, args.command)
    except Exception as error:  # noqa: BLE001 - those with an exit code end in one line, the others go on
        code = _exit_for(error, args, loading=True)
        if code is None:
            raise
        return code
    blocker = _file_in_the_way(args.work_dir)
    if blocker is not None:
        print(
            f"{args.command}: --work-dir {args.work_dir}: {blocker} is a file, not a folder: give a folder "
            f"(one that does not exist yet is made)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    missing = _missing_work_dir(args, entry)
    if missing:
        print(missing, file=sys.stderr)
        return EXIT_FAILED
    left_empty = _folders_made_by(args, entry)
    try:
        from pipeline.engine.workdir import WorkDir

        if entry.checks_layout and args.work_dir is not None:
            WorkDir(args.work_dir).check_layout()
        if entry.writes:
            WorkDir(args.work_dir).check_writable()
        code = dispatch(args, cfg)
        if entry.writes and entry.resolves_config and (code == EXIT_OK or getattr(args, "made_outputs", False)):
            # what its outputs were made with: a refused config, or one every shard failed with, is not
            _remember_config(args, cfg)
        return code
    except KeyboardInterrupt:
        return _interrupted(args.command)
    except Exception as error:  # noqa: BLE001 - those with an exit code end in one line, the others go on
        code = _exit_for(error, args)
        if code is None:
            raise
        return code
    finally:
        _remove_if_empty(left_empty)


def _exit_for(error: Exception, args, loading: bool = False) -> int | None:
    """The exit code of an error, after its one line on stderr; None for an error that has none (a bug:
    its traceback is the report). `loading`: raised while the command's config was resolved."""
    from pipeline import storage
    from pipeline.contract import PreflightError
    from pipeline.engine.lineage import InputNotReady
    from pipeline.engine.manifest import ManifestError, NoVideos
    from pipeline.engine.records import CorruptFile
    from pipeline.engine.workdir import LayoutError
    from schemas.codebook import CorruptCodebook
    from videobert.checkpoints import TrainingDiverged, TrainingLocked

    command = args.command
    if isinstance(error, ConfigError):  # found at load, or after it (a value the command needs is not set)
        print(error if loading else f"{command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(error, storage.remote_error_types()):  # an unreachable endpoint, no credentials, a refused request
        line = storage.remote_error_line(error, args.work_dir, getattr(args, "input", None))
        print(f"{command}: error: {line}", file=sys.stderr)
        return EXIT_FAILED
    if isinstance(error, OSError) and _store_refused(error, args):
        print(f"{command}: error: {_store_line(error, args)}", file=sys.stderr)
        return EXIT_FAILED
    if loading:
        return None
    if isinstance(error, NoVideos):
        print(f"error: {error}", file=sys.stderr)
        return EXIT_TOO_MANY_FAILED
    if isinstance(error, PreflightError):
        print(f"{command}: cannot start: {error}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(error, (TrainingDiverged, TrainingLocked)):
        print(f"{command}: {error}", file=sys.stderr)
        return EXIT_FAILED
    if isinstance(
        error, (InputNotReady, CorruptFile, CorruptCodebook, storage.UnreadableFile, LayoutError, ManifestError)
    ):
        print(f"{command}: cannot run: {error}", file=sys.stderr)
        if isinstance(error, InputNotReady) and getattr(args, "config_differs", False):
            print(
                "  (the config given differs from the one this work dir's outputs were made with, named "
                "above: leave out --config and --set to go on with that one)",
                file=sys.stderr,
            )
        return EXIT_FAILED
    if isinstance(error, (FileExistsError, ValueError)):
        print(f"{command}: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    if isinstance(error, OSError):
        hint = storage.disk_error_hint(error)
        if hint is None and not isinstance(error, FileNotFoundError):
            return None
        where = f"{error.filename}: " if error.filename else ""
        bucket = storage.bucket_of(args.work_dir) if args.work_dir else None
        on = f" (object storage: bucket {bucket})" if bucket else ""
        print(
            f"{command}: error: {where}{error.strerror or error}{on}" + (f" ({hint})" if hint else ""), file=sys.stderr
        )
        return EXIT_FAILED
    return None


def _configure_logging(quiet: bool, as_program: bool = True) -> None:
    """Log lines start with the same ISO 8601 time as progress lines, and are written above a progress bar
    (through tqdm), never over it; run as the program, Python warnings go the same way."""
    from pipeline.progress import timestamp

    class Formatter(logging.Formatter):
        def formatTime(self, record, datefmt=None):
            return timestamp(record.created)

    class AboveProgressBars(logging.StreamHandler):
        def emit(self, record):
            try:
                from tqdm import tqdm

                tqdm.write(self.format(record), file=sys.stderr)
            except Exception:  # noqa: BLE001 - logging's own policy for a failed emit
                self.handleError(record)

    handler = AboveProgressBars()
    handler.setFormatter(Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, handlers=[handler])
    if as_program:  # a process-wide switch: not flipped by a call from Python (tests, notebooks)
        logging.captureWarnings(True)


def _interrupted(command: str) -> int:
    print(
        f"{command or 'pipeline'}: interrupted; rerun the same command to continue (finished shards are kept, "
        f"the one cut short is redone)",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_INTERRUPTED


def _end_on_interrupt() -> None:
    """SIGINT (Ctrl-C) ends the program like SIGTERM does, at once and without a traceback, after one line:
    outputs appear only complete (a temporary name, then a rename), so nothing half-written is left; the
    pool's worker processes end with it."""
    import multiprocessing
    import os
    import signal

    def handler(signum, frame):
        for child in multiprocessing.active_children():
            child.terminate()
        command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), "")
        _interrupted(command)
        os._exit(EXIT_INTERRUPTED)

    signal.signal(signal.SIGINT, handler)


def _folders_made_by(args, entry) -> list[Path]:
    """The local work dir and its _state/ folder where they do not exist yet (the writable check makes
    them): a command that fails before writing anything must not leave them behind, empty."""
    from pipeline import storage
    from pipeline.engine.workdir import WorkDir

    if args.work_dir is None or not entry.writes or storage.is_url(str(args.work_dir)):
        return []
    work = WorkDir(args.work_dir)
    return [folder for folder in (work.state, Path(work.root)) if not folder.exists()]


def _remove_if_empty(folders: list[Path]) -> None:
    for folder in folders:  # the innermost first
        try:
            folder.rmdir()  # only an empty folder goes
        except OSError:
            pass


def _store_refused(error: OSError, args) -> bool:
    """An OSError an object-storage client made of a refused request (s3fs: wrong credentials, no
    permission: a PermissionError without an errno), while the input or the work dir is on a store."""
    from pipeline import storage

    places = (getattr(args, "work_dir", None), getattr(args, "input", None))
    return (
        isinstance(error, PermissionError)
        and error.errno is None
        and any(
            place is not None and storage.is_url(str(place)) and not str(place).startswith("file:") for place in places
        )
    )


def _store_line(error: OSError, args) -> str:
    from pipeline import storage

    line = storage.remote_error_line(error, getattr(args, "work_dir", None), getattr(args, "input", None))
    if isinstance(error, PermissionError):
        line += " (check the store's credentials, e.g. AWS_ACCESS_KEY_ID / AWS_PROFILE, and the bucket's permissions)"
    return line


def _option_problem(args) -> str | None:
    """A --shard, --num-shards, --workers or --array-parallelism that no run can take, in one line."""
    from pipeline.config_fields import MAX_WORKERS

    workers = getattr(args, "workers", None)
    if workers is not None and not 0 <= workers <= MAX_WORKERS:
        return f"--workers must be >= 0 and <= {MAX_WORKERS} (0: the config's value) (got {workers})"
    for option in ("num_shards", "array_parallelism"):
        value = getattr(args, option, None)
        if value is not None and value < 1:
            return f"--{option.replace('_', '-')} must be >= 1 (got {value})"
    if hasattr(args, "shard"):
        from pipeline.executors.dispatch import shard_problem

        return shard_problem(args.shard, args.num_shards)
    return None


def _file_in_the_way(work_dir) -> Path | None:
    """The regular file a local --work-dir is, or lies under (nothing could be written into it)."""
    from pipeline import storage

    if work_dir is None or storage.is_url(str(work_dir)):
        return None
    path = Path(work_dir)
    for place in (path, *path.parents):
        if place.exists():
            return None if place.is_dir() else place
    return None
