"""Idempotent, atomic, resumable stage runs: skip, --force, SIGKILL then rerun, byte-identical reruns."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from media_factory import make_video

import schemas
from pipeline import storage
from pipeline.config import load_config
from pipeline.engine.lineage import Lineage
from pipeline.engine.manifest import write_manifest
from pipeline.engine.runner import run_one_shard
from pipeline.engine.workdir import WorkDir
from pipeline.executors.dispatch import select_shards

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("videos")
    for index in range(6):
        make_video(folder / f"video {index}.mp4", duration_s=2.0 + index, fps=25, width=128, height=96)
    return folder


def _cli(*args, **kwargs):
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", *map(str, args)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def _outputs(work: Path) -> dict[str, bytes]:
    """Every data file (not the completion records, which hold timings) by relative path."""
    return {str(p.relative_to(work)): p.read_bytes() for p in sorted(work.rglob("*.parquet"))}


def test_rerun_skips_complete_shards_and_force_redoes_them(tmp_path, videos):
    cfg = load_config(None, ["shards.videos_per_shard=3"])
    write_manifest(cfg, videos, tmp_path)
    first = run_one_shard(cfg, tmp_path, "decode", 0)
    assert not first.get("skipped") and first["videos"] == 3 and first["clips"] > 0
    again = run_one_shard(cfg, tmp_path, "decode", 0)
    assert again["skipped"]
    forced = run_one_shard(cfg, tmp_path, "decode", 0, force=True)
    assert not forced.get("skipped")
    assert not list(tmp_path.rglob(".tmp_*"))  # no temporary file left behind


def test_two_runs_with_one_config_are_byte_identical(tmp_path, videos):
    outputs = []
    for run in ("a", "b"):
        work = tmp_path / run
        assert _cli("manifest", "--work-dir", work, "--input", videos, "--set", "shards.videos_per_shard=2").wait() == 0
        process = _cli("decode", "--work-dir", work, "--set", "shards.videos_per_shard=2", "--workers", "2", "--quiet")
        assert process.wait() == 0, process.stderr.read()
        outputs.append(_outputs(work))
    # the manifest; per shard decode's two tables, the shots its pass found, and both stages' error rows
    assert outputs[0].keys() == outputs[1].keys() and len(outputs[0]) == 1 + 3 * 5
    assert outputs[0] == outputs[1]


def test_sigkill_mid_run_then_rerun_gives_the_uninterrupted_outputs(tmp_path, videos):
    settings = ["--set", "shards.videos_per_shard=1"]
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    for work in (reference, killed):
        assert _cli("manifest", "--work-dir", work, "--input", videos, *settings).wait() == 0
    assert _cli("decode", "--work-dir", reference, "--workers", "1", "--quiet", *settings).wait() == 0
    process = _cli("decode", "--work-dir", killed, "--workers", "1", "--quiet", *settings)
    deadline = time.time() + 60
    records = WorkDir(killed).records_folder("decode")
    while time.time() < deadline and not list(records.glob("part-*.json")):
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    done_before = len(list(records.glob("part-*.json")))
    assert 1 <= done_before < 6, "the kill should land mid-run"
    # every file present is complete: readable Parquet, never a partial one under the final name; and the
    # data folders hold nothing else (a half-written file waits under _state, so any reader lists them)
    for path in killed.rglob("*.parquet"):
        pq.read_metadata(path)
    for folder in ("decode", "videos"):
        assert all(path.name.startswith("part-") and path.suffix == ".parquet" for path in (killed / folder).iterdir())
    assert _cli("decode", "--work-dir", killed, "--workers", "1", "--quiet", *settings).wait() == 0
    assert not list(killed.rglob(".tmp_*"))  # the rerun removed what the killed writer left
    assert _outputs(killed) == _outputs(reference)


def test_a_killed_writers_leftovers_match_no_output_glob(tmp_path):
    """What SIGKILL leaves mid-write (a half Parquet file, a half record) is invisible to every reader."""
    storage.atomic_path(WorkDir(tmp_path).part("decode", 3)).write_bytes(b"PAR1 half a file")
    storage.atomic_path(WorkDir(tmp_path).record("decode", 3)).write_text('{"shard": ')
    assert not list(tmp_path.rglob("*.parquet")) and not list(tmp_path.rglob("*.json"))
    assert Lineage(tmp_path).current_parts("decode") == []


def test_slurm_array_environment_selects_this_tasks_shards(monkeypatch):
    shards = list(range(10))
    assert select_shards(shards, None, None) == shards
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "4")
    assert select_shards(shards, None, None) == [1, 5, 9]
    assert select_shards(shards, 0, 2) == [0, 2, 4, 6, 8]  # explicit flags win
    with pytest.raises(ValueError):
        select_shards(shards, 4, 4)


def test_outputs_record_config_schema_and_inputs(tmp_path, videos):
    cfg = load_config(None, ["shards.videos_per_shard=6"])
    write_manifest(cfg, videos, tmp_path)
    run_one_shard(cfg, tmp_path, "decode", 0)
    metadata = storage.read_metadata(WorkDir(tmp_path).part("decode", 0))
    assert metadata.schema == "decode:2" and metadata.stage == "decode"
    assert '"fps":20.0' in metadata.config and metadata.config_hash == cfg.section_hash("decode")
    assert storage.read_metadata(WorkDir(tmp_path).part("decode", 0, "videos")).schema == schemas.DECODE_VIDEOS.tag
