"""kill -9 of a stage leaves nothing behind: its pool workers (and multiprocessing's resource tracker) end
with it, and the next run removes the local temporary files it wrote through for a remote work dir."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from pipeline import storage

REPO = Path(__file__).resolve().parents[1]


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_pool_workers_end_when_their_parent_is_killed(tmp_path):
    script = (
        "import time\n"
        "from pipeline.config import load_config\n"
        "from pipeline.executors.local import LocalExecutor\n"
        "LocalExecutor(load_config(None, []), 2).map(time.sleep, [120, 120])\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    workers: set[int] = set()
    try:
        deadline = time.time() + 60
        while time.time() < deadline and len(descendants(parent.pid)) < 3:  # 2 workers + resource tracker
            time.sleep(0.2)
        workers = descendants(parent.pid)
        assert len(workers) >= 2, workers
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.time() + 15
        while time.time() < deadline and any(alive(pid) for pid in workers):
            time.sleep(0.2)
        assert not [pid for pid in workers if alive(pid)]
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in workers | descendants(parent.pid):  # only on failure: none should be left to end
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_killed_runs_local_temporaries_are_removed_by_the_next_run(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = storage.local_temporary("fit_sample.npy")  # a live writer's (this process)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname().replace("_", "-")
    leftover = tmp_path / f".tmp_{int(gone.stdout)}_{host}_k3j9x_fit_sample.npy"  # as local_temporary names it
    leftover.write_bytes(b"\0" * 1024)
    unrelated = tmp_path / "notes.txt"
    unrelated.write_text("kept")
    assert storage.remove_stale_local_temporaries() == [leftover]
    assert mine.exists() and unrelated.exists() and not leftover.exists()
