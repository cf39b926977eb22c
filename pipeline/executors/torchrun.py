"""torchrun for the Slurm train job: `python -m pipeline.executors.torchrun ARGS...` takes the arguments of
`python -m torch.distributed.run` and runs it unchanged, except that a rendezvous that cannot start (the
endpoint's port is taken or unreachable, a node never joins) ends in one line naming the endpoint and the
fix, exit 2, instead of torchrun's tracebacks. Success and a training failure keep torchrun's own outcome."""

from __future__ import annotations

import sys

RENDEZVOUS_EXIT = 2


def _rendezvous_errors() -> tuple[type[BaseException], ...]:
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    # OSError covers a socket that cannot bind or connect; TimeoutError is one of them
    return (RendezvousError, dist.DistStoreError, dist.DistNetworkError, OSError)


def _reason(exc: BaseException) -> str:
    """The innermost cause's first line: the wrapper's message says only "see inner exception"."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = (str(exc).strip().splitlines() or [""])[0].strip()
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def _import_torchrun():
    """torch.distributed.run, with this agent's C++ log (read once, when torch loads) kept to fatal errors
    unless the user chose a level: the c10d store's retries would print a C++ trace per try. The worker
    processes inherit the user's environment unchanged."""
    import os

    chosen = os.environ.get("TORCH_CPP_LOG_LEVEL")
    if chosen is None:
        os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    try:
        import torch.distributed.run as torchrun
    finally:
        if chosen is None:
            del os.environ["TORCH_CPP_LOG_LEVEL"]
    return torchrun


def main(argv: list[str] | None = None) -> int:
    torchrun = _import_torchrun()
    torchrun_main, parse_args = torchrun.main, torchrun.parse_args
    argv = list(sys.argv[1:] if argv is None else argv)
    endpoint = parse_args(argv).rdzv_endpoint or "(no --rdzv-endpoint)"
    try:
        torchrun_main(argv)
    except _rendezvous_errors() as exc:
        print(
            f"train: the rendezvous at {endpoint} could not start ({_reason(exc)}): set "
            f"executor.slurm_rdzv_port to a port that is free on the first node, and make sure the first "
            f"node is reachable at that address from the other nodes",
            file=sys.stderr,
            flush=True,
        )
        return RENDEZVOUS_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
