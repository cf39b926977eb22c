"""Full and read-only work dirs: one line naming the problem and the fix, never a SIGBUS or a traceback.

Each test runs the CLI in a mount namespace of its own (`unshare -Urm`: no privileges needed on a kernel
with user namespaces) with the work dir on a small tmpfs, so the disk really fills up or really is
read-only. Where user namespaces are unavailable the tests skip."""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from kmeans_factory import make_work_dir
from media_factory import make_video

from pipeline.config import load_config
from pipeline.engine.manifest import write_manifest

REPO = Path(__file__).resolve().parent.parent


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _namespaces_work(), reason="no user and mount namespaces (unshare -Urm)")


def run_on_tmpfs(
    prepared: Path, size: str, command: list[str], *, read_only: bool = False
) -> subprocess.CompletedProcess:
    """Copy the work dir `prepared` onto a tmpfs of `size`, optionally remount it read-only, and run
    `python -m pipeline COMMAND --work-dir <it>` there."""
    script = textwrap.dedent(f"""\
        set -e
        mount -t tmpfs -o size={size} tmpfs /mnt
        cp -a {prepared}/. /mnt/
        {"mount -o remount,ro /mnt" if read_only else ""}
        set +e
        cd {REPO}
        {sys.executable} -m pipeline {" ".join(command)} --work-dir /mnt --quiet
        echo "exit=$?"
        ls -a /mnt/kmeans 2>/dev/null | tr '\\n' ' '
    """)
    return subprocess.run(["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True, timeout=600)


def test_kmeans_on_a_full_disk_is_one_line_not_a_sigbus(tmp_path):
    # 4,000 features that compress to almost nothing in Parquet, but make an 8 MB float16 fit sample
    vectors = np.repeat(np.linspace(-1, 1, 4000, dtype=np.float16)[:, None], 1024, axis=1)
    make_work_dir(tmp_path / "work", [vectors[:2000], vectors[2000:]])
    assert sum(path.stat().st_size for path in (tmp_path / "work").rglob("*") if path.is_file()) < 2 << 20
    done = run_on_tmpfs(tmp_path / "work", "5m", ["kmeans", "--set", "kmeans.depth=1", "--set", "kmeans.k=4"])
    assert "exit=1" in done.stdout, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if "WARNING" not in line and line.strip()]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert (
        "No space left on device" in errors[0]
        and "the disk is full: free space or choose another --work-dir" in errors[0]
    )
    assert ".tmp_" not in done.stdout.split("exit=1")[1]  # the half-written sample was removed


@pytest.fixture(scope="module")
def decoded_manifest(tmp_path_factory):
    root = tmp_path_factory.mktemp("readonly")
    videos = root / "videos"
    videos.mkdir()
    noise = np.random.default_rng(0)
    # noise: its thumbnails do not compress, so a decode part is large (about 1 MB at 512 px, quality 100)
    make_video(
        videos / "a.mp4",
        duration_s=9.0,
        width=320,
        height=240,
        frame_fn=lambda index, width, height: noise.integers(0, 256, (height, width, 3), dtype=np.uint8),
    )
    write_manifest(load_config(None, []), videos, root / "work")
    return root / "work"


def test_a_read_only_work_dir_is_one_line(decoded_manifest):
    done = run_on_tmpfs(decoded_manifest, "8m", ["decode"], read_only=True)
    assert "exit=1" in done.stdout, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "Read-only file system" in lines[0] and "choose a writable --work-dir" in lines[0]


def test_a_full_disk_during_a_stage_fails_the_shard_in_one_line(decoded_manifest):
    # room for the state folder's probe, not for a decode part with its thumbnails
    done = run_on_tmpfs(
        decoded_manifest,
        "128k",
        ["decode", "--set", "decode.thumbnail_size=512", "--set", "decode.thumbnail_quality=100"],
    )
    assert "exit=1" in done.stdout, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "No space left on device" in done.stderr and "the disk is full" in done.stderr
