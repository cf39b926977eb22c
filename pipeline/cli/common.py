"""What every command module of the CLI shares: the exit codes, how the program is called, the phrase each
stage leaves for `run`'s table."""

from __future__ import annotations

import sys
from pathlib import Path

# the exit codes, one place: 0 done; 1 a shard failed or could not run, or a file is unreadable; 2 a usage
# or config error; 3 the input holds no videos, or more videos failed than executor.max_failed_share allows
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_TOO_MANY_FAILED = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_BROKEN_PIPE = 141  # the reader of stdout stopped reading (128 + SIGPIPE, as a shell reports it)

SHOWN_PROBLEMS = 5  # per stage run: failed or blocked shards listed one line each

outcomes: dict[str, str] = {}  # command -> what it did, one phrase (set by the stage commands, for `run`)


class RunNotes:
    """While `run` runs its stages: the config notes already printed (each once, not once per stage)."""

    printed: set[str] | None = None


def program_name() -> str:
    """How the user called it: the console command (`videobert`) or `python -m pipeline`."""
    return "videobert" if sys.argv and Path(sys.argv[0]).name == "videobert" else "python -m pipeline"


def count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def confirm_removal(args):
    """--allow-removal says yes; a person at a terminal is asked; anything else (a batch job) is refused."""
    if args.allow_removal:
        return lambda message: True
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return None

    def ask(message: str) -> bool:
        print(f"{args.command}: {message}.", file=sys.stderr)
        print("Go on? [y/N] ", end="", file=sys.stderr, flush=True)  # stdout stays the command's output
        return sys.stdin.readline().strip().lower() in ("y", "yes")

    return ask
