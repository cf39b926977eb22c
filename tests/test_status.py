"""Status and failures: `status` and `errors` read a run from its files alone; a SIGKILL in the middle of a
stage and a rerun give the outputs of an uninterrupted run; two workers racing on one shard leave one
complete, correct file. (tests/test_runner.py kills decode; here: features, with its decode worker
process, and asr, with its Whisper model.)"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from bad_input_corpus import make_speech_video
from media_factory import make_video

from pipeline import cli
from pipeline.config import load_config
from pipeline.engine.manifest import write_manifest
from pipeline.engine.workdir import WorkDir
from pipeline.executors.local import LocalExecutor
from reports.status import errors_text, status_text

REPO = Path(__file__).resolve().parent.parent


def _cli(*args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", *map(str, args)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _outputs(work: Path) -> dict[str, bytes]:
    """Every data file (not the completion records, which hold timings) by relative path."""
    return {str(p.relative_to(work)): p.read_bytes() for p in sorted(work.rglob("*.parquet"))}


@pytest.fixture(scope="module")
def decoded(tmp_path_factory):
    """Three decode shards of two, two and one videos, each with a bad file; shard 2's completion record
    is gone, as when a worker is killed after writing its tables."""
    videos = tmp_path_factory.mktemp("videos")
    (videos / "a_text.mp4").write_text("not a video")
    (videos / "b_empty.mp4").write_bytes(b"")
    make_video(videos / "c_good.mp4", duration_s=1.6)
    make_video(videos / "d_good.mp4", duration_s=3.2)
    (videos / "e_text.mov").write_text("not a video either")
    work = tmp_path_factory.mktemp("work")
    cfg = load_config(None, ["shards.videos_per_shard=2"])
    write_manifest(cfg, videos, work)
    LocalExecutor(cfg, workers=1).run_shards(work, "decode", [0, 1, 2], quiet=True)
    WorkDir(work).record("decode", 2).unlink()
    return work


def test_status_counts_shards_errors_by_type_and_shows_the_slowest_shards(decoded):
    text = status_text(decoded)
    lines = text.splitlines()
    assert lines[0] == f"run {decoded}: 5 videos in 3 manifest shard(s)"
    decode = next(line for line in lines if line.startswith("decode "))
    # shard 2 has no completion record: neither it nor its error table counts
    assert "2/3  67%" in decode and decode.endswith("EmptyFile 1, VideoDecodeError 1; 1 missing")
    assert decode.split()[3:5] == ["4", "3"]  # videos; clips: 1.6 s gives one 1.5 s clip, 3.2 s two
    assert next(line for line in lines if line.startswith("features ")).split()[1:] == ["not", "started"]
    assert next(line for line in lines if line.startswith("kmeans ")).endswith("not run")
    slowest = lines[lines.index("slowest shards, per stage:") + 1 :]
    assert {line.split(":")[0].strip() for line in slowest} == {"decode part 0", "decode part 1"}
    seconds = [float(line.split(": ")[1].split(" s,")[0]) for line in slowest]
    assert seconds == sorted(seconds, reverse=True)
    assert any(
        line.startswith("  decode part 1:") and "2 videos, 3 clips" in line and "clips/s" in line for line in slowest
    )


def test_errors_lists_each_failed_video_with_its_reason(decoded, capsys):
    text = errors_text(decoded)
    lines = text.splitlines()
    assert lines[0] == f"2 failed video(s) in any stage of {decoded}"
    assert any(
        "part 00000" in line and "a_text-" in line and "VideoDecodeError: cannot open" in line and "a_text.mp4" in line
        for line in lines[1:]
    )
    assert any("b_empty-" in line and "EmptyFile:" in line and "is an empty file" in line for line in lines[1:])
    assert errors_text(decoded, "asr") == f"no failed videos in the asr stage of {decoded}"
    with pytest.raises(ValueError, match="--stage must be one of"):
        errors_text(decoded, "decoder")
    # the CLI commands print the same
    assert cli.main(["errors", "--work-dir", str(decoded), "--stage", "decode"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"2 failed video(s) in the decode stage of {decoded}"
    assert cli.main(["status", "--work-dir", str(decoded)]) == 0
    assert "2/3  67%" in capsys.readouterr().out
    assert cli.main(["status", "--work-dir", str(decoded / "nowhere")]) == 1
    assert "run the manifest stage first" in capsys.readouterr().err


@pytest.fixture(scope="module")
def speech_videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("speech")
    for index in range(2):
        make_speech_video(folder / f"speech {index}.mp4")
    return folder


# one video per shard; tiny random-weight S3D clips; the features stage's decode worker process is on
KILL_SETTINGS = [
    "shards.videos_per_shard=1",
    "features.weights=random",
    "decode.clip_frames=14",
    "decode.min_clip_frames=7",
    "features.decode_workers=1",
]


@pytest.mark.slow  # features: two CLI runs that each import torch and build S3D (~8 s apiece on 2 cores)
@pytest.mark.parametrize("stage", ["features", "asr"])
def test_sigkill_in_the_middle_of_a_stage_then_a_rerun_gives_the_uninterrupted_outputs(tmp_path, speech_videos, stage):
    settings = [part for setting in KILL_SETTINGS for part in ("--set", setting)]
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    cfg = load_config(None, KILL_SETTINGS)
    for work in (reference, killed):
        write_manifest(cfg, speech_videos, work)
    LocalExecutor(cfg, workers=1).run_shards(reference, stage, [0, 1], quiet=True)

    process = _cli(stage, "--work-dir", killed, "--workers", "1", "--quiet", *settings)
    done = WorkDir(killed).records_folder(stage)
    deadline = time.time() + 120
    while time.time() < deadline and not list(done.glob("part-*.json")):  # not a record being written
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    done_before = len(list(done.glob("part-*.json")))
    assert done_before == 1, "the kill should land mid-run"
    for path in killed.rglob("*.parquet"):
        pq.read_metadata(path)  # whatever is there under a final name is complete
    rerun = _cli(stage, "--work-dir", killed, "--workers", "1", "--quiet", *settings)
    assert rerun.wait() == 0, rerun.stderr.read()
    err = rerun.stderr.read()
    assert "1 shard(s) run, 1 already current" in err, err
    assert not list(killed.rglob(".tmp_*"))  # the rerun removed what the killed writer left
    assert _outputs(killed) == _outputs(reference)


@pytest.mark.slow
def test_two_workers_racing_on_one_shard_leave_one_complete_correct_file(tmp_path):
    videos = tmp_path / "videos"
    videos.mkdir()
    for index in range(4):
        make_video(videos / f"v{index}.mp4", duration_s=1.6 + index, width=96, height=64)
    settings = ["--set", "shards.videos_per_shard=2"]
    reference, raced = tmp_path / "reference", tmp_path / "raced"
    for work in (reference, raced):
        assert _cli("manifest", "--work-dir", work, "--input", videos, *settings).wait() == 0
    assert _cli("decode", "--work-dir", reference, "--quiet", *settings).wait() == 0
    # --force: both run every shard, whatever the other has finished
    racers = [_cli("decode", "--work-dir", raced, "--workers", "1", "--force", "--quiet", *settings) for _ in range(2)]
    assert [racer.wait() for racer in racers] == [0, 0]
    assert _outputs(raced) == _outputs(reference)
    assert not list(raced.rglob(".tmp_*"))
    for shard_index in (0, 1):
        record = json.loads(WorkDir(raced).record("decode", shard_index).read_text())
        assert record["shard"] == shard_index and record["videos"] == 2


def test_status_shows_the_codebook_from_its_sidecar(tmp_path):
    import gallery_factory

    work = gallery_factory.make_work_dir(tmp_path)
    kmeans = next(line for line in status_text(work).splitlines() if line.startswith("kmeans "))
    assert kmeans.split()[1:] == ["current", "codebook", "depth", "2,", "k", "3,", "fit", "on", "31", "clips"]


def test_status_with_a_config_names_what_that_config_would_redo(decoded, capsys):
    settings = ["--set", "shards.videos_per_shard=2"]
    assert cli.main(["status", "--work-dir", str(decoded), *settings]) == 0
    same = capsys.readouterr().out  # the config the run was made with: nothing to redo
    assert "checked against the config given" in same and " stale" not in same.split("\n", 1)[1]
    assert cli.main(["status", "--work-dir", str(decoded), *settings, "--set", "decode.fps=10"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "checked against the config given" in lines[0]
    assert next(line for line in lines if line.startswith("decode ")).endswith("1 missing, 2 stale")
    assert "  decode part 00000 stale: config decode.fps 20.0 -> 10.0" in lines


def test_errors_takes_no_config_and_validate_takes_the_work_dir_either_way(decoded, capsys):
    with pytest.raises(SystemExit) as refused:
        cli.main(["errors", "--work-dir", str(decoded), "--set", "decode.fps=10"])
    assert refused.value.code == 2 and "unrecognized arguments: --set" in capsys.readouterr().err
    assert cli.main(["validate", "--work-dir", str(decoded)]) == 1  # shard 2 lost its record
    by_option = capsys.readouterr().err
    assert cli.main(["validate", str(decoded)]) == 1
    assert capsys.readouterr().err == by_option and by_option.startswith("INVALID: ")
    assert cli.main(["validate", str(decoded), "--work-dir", str(decoded / "other")]) == 2
    assert "two work dirs given" in capsys.readouterr().err


def test_a_failure_record_of_the_wrong_shape_is_named_not_a_traceback(tmp_path):
    from work_factory import write_manifest_rows

    from pipeline import storage

    work = tmp_path / "work"
    write_manifest_rows(
        work, [{"video_id": "v0", "uri": "/videos/v0.mp4", "bytes": 1, "transcript_uri": None, "shard": 0}]
    )
    failure = WorkDir(work).failure("decode", 0)
    for wrong in ({"error": 5}, {"error": "crashed", "at": "yesterday"}, {"traceback": []}):
        storage.atomic_write_json(failure, wrong)
        assert f"decode part 00000 failed: {failure} is not a valid failure record" in status_text(work)
        assert f"part 00000  (whole shard)  {failure} is not a valid failure record" in errors_text(work)
