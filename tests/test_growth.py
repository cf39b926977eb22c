"""Memory bounded by the work window: the commands that read a whole work dir (status, validate, summary,
report) over 16 times the shards hold at most 1.5 times the memory. The work dirs are hand-made
(benchmarks/metadata_collection.py: every stage's tables and lineage records, one video a shard, no media),
so the test measures the work dir's own cost, apart from decoding and models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
import metadata_collection  # noqa: E402

pytestmark = pytest.mark.slow

BASE_SHARDS = 10
GROWTH = 16
RSS_LIMIT = 1.5  # the bench's own bound (benchmarks/bench_growth.py)

# run one command in a child and print the child's peak RSS (kB): the parent's import of nothing else keeps
# the figure the command's own
PEAK_OF = (
    "import resource, subprocess, sys; "
    "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE).returncode; "
    "print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def peak_kb(command: list[str]) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PEAK_OF, *command],
        cwd=REPO,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
        capture_output=True,
        text=True,
        check=True,
    )
    code, peak = done.stdout.split()
    assert code == "0", f"{command[3:5]} exited {code}: {done.stderr[-2000:]}"
    return int(peak)


@pytest.fixture(scope="module")
def work_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("growth")
    return {
        shards: metadata_collection.make(root / f"shards-{shards}", shards)
        for shards in (BASE_SHARDS, BASE_SHARDS * GROWTH)
    }


@pytest.mark.parametrize("command", ["status", "validate", "summary", "report"])
def test_peak_memory_stays_flat_at_sixteen_times_the_shards(work_dirs, command):
    peaks = {
        shards: peak_kb(
            [sys.executable, "-m", "pipeline", command, "--work-dir", str(work), *metadata_collection.SET_OPTIONS]
        )
        for shards, work in work_dirs.items()
    }
    small, large = peaks[BASE_SHARDS], peaks[BASE_SHARDS * GROWTH]
    assert large <= RSS_LIMIT * small, f"{command}: peak RSS {small} kB at {BASE_SHARDS} shards, {large} kB at 16x"


def test_the_hand_made_work_dir_is_current_and_valid(work_dirs):
    # the memory figures mean something only if the commands check what they check on a real run
    work = work_dirs[BASE_SHARDS]
    for command in ("status", "validate"):
        done = subprocess.run(
            [sys.executable, "-m", "pipeline", command, "--work-dir", str(work), *metadata_collection.SET_OPTIONS],
            cwd=REPO,
            env=dict(os.environ, HF_HUB_OFFLINE="1"),
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        if command == "status":
            for stage in ("decode", "features", "shots", "quality", "quantize", "asr", "align"):
                assert f"{BASE_SHARDS}/{BASE_SHARDS} 100%" in next(
                    line for line in done.stdout.splitlines() if line.startswith(stage + " ")
                ), done.stdout
