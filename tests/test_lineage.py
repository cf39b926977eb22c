"""Trustworthy reruns: what a user does to a finished run (re-list the input, refit the codebook, change a
config value, flip a bit, truncate a file, break a record) never leaves a stale or corrupt output in use.
Stale work is redone by the stage that made it; corruption is named by path; readers use only what is
current."""

import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kmeans_factory import make_work_dir, planted_hierarchy
from media_factory import make_video, one_clip_videos
from work_factory import write_part

import schemas
from pipeline import cli, storage
from pipeline.config import load_config
from pipeline.engine.lineage import InputNotReady, Lineage
from pipeline.engine.manifest import read_manifest
from pipeline.engine.workdir import WorkDir
from reports.validate import validate_work_dir
from videobert.train_inputs import training_inputs

KMEANS = ["kmeans.depth=2", "kmeans.k=3", "kmeans.niter=5"]


def run(capsys, *args) -> tuple[int, str]:
    code = cli.main([str(arg) for arg in args])
    return code, capsys.readouterr().err


def flip_a_byte(path, offset_from_end: int | None = None) -> None:
    """One bit flipped in the middle of the file's data (or at a given distance from its end)."""
    data = bytearray(path.read_bytes())
    position = len(data) // 3 if offset_from_end is None else len(data) - offset_from_end
    data[position] ^= 0x01
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------- decode: re-listing and config changes


@pytest.fixture
def videos(tmp_path):
    return one_clip_videos(tmp_path / "videos", 4)


def decode_keys(work) -> list[str]:
    """The video of every clip in the current decode parts."""
    return [
        video
        for _, path in Lineage(work).current_parts("decode")
        for video in pq.read_table(path, columns=["video_id"])["video_id"].to_pylist()
    ]


def test_a_new_video_is_decoded_and_no_video_sits_in_two_parts_after_relisting(tmp_path, videos, capsys):
    work = tmp_path / "work"
    settings = ["--set", "shards.videos_per_shard=2", "--set", "executor.workers=1"]
    assert run(capsys, "manifest", "--work-dir", work, "--input", videos, *settings)[0] == 0
    assert run(capsys, "decode", "--work-dir", work, "--quiet", *settings)[0] == 0
    make_video(videos / "a_new.mp4", duration_s=1.6, fps=25, width=64, height=48)  # sorts first

    # listed again: the known videos keep their shards, the new one gets a new shard
    code, err = run(capsys, "manifest", "--work-dir", work, "--input", videos, *settings)
    assert code == 0 and "5 videos in 3 shard(s)" in err and "1 new, 0 removed" in err
    code, err = run(capsys, "decode", "--work-dir", work, "--quiet", *settings)
    assert code == 0 and "decode: 1 shard(s) run, 2 already current" in err
    clips = decode_keys(work)
    manifest_ids = read_manifest(work, columns=["video_id"])["video_id"].to_pylist()
    assert sorted(set(clips)) == sorted(manifest_ids) and len(clips) == 5  # one 1.5 s clip each, once

    # --force: every video assigned anew (the new one moves to shard 0): shifted shards are redone
    code, err = run(capsys, "manifest", "--work-dir", work, "--input", videos, "--force", *settings)
    assert code == 0 and "later stages redo" not in err
    code, err = run(capsys, "decode", "--work-dir", work, "--quiet", *settings)
    assert code == 0 and "3 shard(s) run (3 redone: stale or corrupt)" in err
    assert "its videos in the manifest changed" in err
    clips = decode_keys(work)
    assert sorted(clips) == sorted(manifest_ids) and len(clips) == 5
    assert run(capsys, "status", "--work-dir", work)[0] == 0
    assert validate_work_dir(work) == []

    # a video removed (agreed to): its shard is redone, and a shard no longer in the manifest is moved aside
    for name in ("v2.mp4", "v3.mp4"):
        (videos / name).unlink()
    code, err = run(capsys, "manifest", "--work-dir", work, "--input", videos, "--allow-removal", *settings)
    assert code == 0 and "0 new, 2 removed" in err and "_state/replaced/manifest-" in err
    code, err = run(capsys, "decode", "--work-dir", work, "--quiet", *settings)
    assert code == 0
    assert not WorkDir(work).part("decode", 2).exists() and not WorkDir(work).record("decode", 2).exists()
    assert sorted(decode_keys(work)) == sorted(read_manifest(work, columns=["video_id"])["video_id"].to_pylist())
    assert validate_work_dir(work) == []


def test_a_changed_config_value_redoes_the_stage_and_names_the_key(tmp_path, videos, capsys):
    work = tmp_path / "work"
    assert run(capsys, "manifest", "--work-dir", work, "--input", videos)[0] == 0
    assert run(capsys, "decode", "--work-dir", work, "--quiet")[0] == 0
    before = pq.read_table(WorkDir(work).part("decode", 0), columns=["end_s"])["end_s"].to_pylist()
    code, err = run(
        capsys,
        "decode",
        "--work-dir",
        work,
        "--quiet",
        "--set",
        "decode.fps=10",
        "--set",
        "decode.clip_frames=14",
        "--set",
        "decode.min_clip_frames=7",
    )
    assert code == 0 and "1 shard(s) run (1 redone: stale or corrupt)" in err
    assert "config decode.clip_frames 30 -> 14, decode.fps 20.0 -> 10.0, decode.min_clip_frames 15 -> 7" in err
    after = pq.read_table(WorkDir(work).part("decode", 0), columns=["end_s"])["end_s"].to_pylist()
    assert before != after and after[0] == pytest.approx(1.4)
    # validate with the run's config agrees, and names the part stale under the default config
    assert (
        validate_work_dir(
            work, load_config(None, ["decode.fps=10", "decode.clip_frames=14", "decode.min_clip_frames=7"])
        )
        == []
    )
    problems = validate_work_dir(work, load_config(None, []))
    # decode's pass made the shots part from the same frames (at 10 fps): stale too, for decode.fps alone
    assert len(problems) == 2 and "decode part 00000 is stale: config decode.clip_frames 14 -> 30" in problems[0]
    assert "shots part 00000 is stale: config decode.fps 10.0 -> 20.0" in problems[1]


def test_a_truncated_part_and_a_broken_record_are_named_and_redone(tmp_path, videos, capsys):
    work = tmp_path / "work"
    settings = ["--set", "shards.videos_per_shard=2", "--set", "executor.workers=1"]
    assert run(capsys, "manifest", "--work-dir", work, "--input", videos, *settings)[0] == 0
    assert run(capsys, "decode", "--work-dir", work, "--quiet", *settings)[0] == 0
    reference = {shard: WorkDir(work).part("decode", shard).read_bytes() for shard in (0, 1)}
    part = WorkDir(work).part("decode", 0)
    part.write_bytes(part.read_bytes()[: len(part.read_bytes()) // 2])
    record = WorkDir(work).record("decode", 1)
    record.write_text(record.read_text()[:40])
    problems = validate_work_dir(work)
    assert any(f"{part} has {part.stat().st_size} bytes" in problem for problem in problems)
    assert any(f"{record} is not a valid JSON record" in problem for problem in problems)
    status = cli_output(capsys, "status", "--work-dir", work)
    assert f"decode part 00000 corrupt: {part} has {part.stat().st_size} bytes" in status
    assert f"decode part 00001 corrupt: {record} is not a valid JSON record" in status
    code, err = run(capsys, "decode", "--work-dir", work, "--quiet", *settings)
    assert code == 0 and "2 shard(s) run (2 redone: stale or corrupt)" in err
    assert {shard: WorkDir(work).part("decode", shard).read_bytes() for shard in (0, 1)} == reference
    assert validate_work_dir(work) == []


WRONG_SHAPES = {  # valid JSON objects that are not completion records
    "empty": {},
    "lineage-a-list": {"lineage": [], "outputs": {}},
    "outputs-a-list": "outputs=[]",
    "output-a-number": "outputs.first=3",
    "sha256-a-number": "outputs.first.sha256=7",
    "bytes-a-string": "outputs.first.bytes='12'",
    "config-a-string": "lineage.config='x'",
    "inputs-a-list": "lineage.inputs=[1]",
    "seconds-a-string": "seconds='slow'",
    "error-types-a-list": "error_types=['x']",
}


def _wrong_shape(record: dict, change) -> dict:
    """`record` with one value replaced ("outputs.first" is its first output), or a whole object."""
    if isinstance(change, dict):
        return change
    path, value = change.split("=")
    keys = path.split(".")
    node = record
    for key in keys[:-1]:
        node = node[next(iter(node))] if key == "first" else node[key]
    node[next(iter(node)) if keys[-1] == "first" else keys[-1]] = eval(value)  # noqa: S307 - test literals
    return record


def test_a_record_of_the_wrong_shape_is_named_corrupt_and_its_shard_redone(tmp_path, videos, capsys):
    work = tmp_path / "work"
    settings = ["--set", "shards.videos_per_shard=2", "--set", "executor.workers=1"]
    assert run(capsys, "manifest", "--work-dir", work, "--input", videos, *settings)[0] == 0
    assert run(capsys, "decode", "--work-dir", work, "--quiet", *settings)[0] == 0
    reference = WorkDir(work).part("decode", 1).read_bytes()
    record = WorkDir(work).record("decode", 1)
    for name, change in WRONG_SHAPES.items():
        record.write_text(json.dumps(_wrong_shape(json.loads(record.read_text()), change)))
        problems = validate_work_dir(work)
        assert any(
            problem.startswith(f"{record}: decode part 00001 is corrupt: {record} is not a valid completion record (")
            for problem in problems
        ), (name, problems)
        assert run(capsys, "validate", "--work-dir", work)[0] == 1
        status = cli_output(capsys, "status", "--work-dir", work)
        assert f"decode part 00001 corrupt: {record} is not a valid completion record (" in status, name
        code, err = run(capsys, "decode", "--work-dir", work, "--quiet", *settings)
        assert code == 0 and "1 shard(s) run (1 redone: stale or corrupt), 1 already current" in err, (name, err)
        assert WorkDir(work).part("decode", 1).read_bytes() == reference
        assert validate_work_dir(work) == [], name


def test_a_manifest_record_of_the_wrong_shape_is_named(tmp_path, videos, capsys):
    work = tmp_path / "work"
    assert run(capsys, "manifest", "--work-dir", work, "--input", videos)[0] == 0
    record = WorkDir(work).record("manifest")
    for change in (
        {"shards": [0], "lineage": {}, "outputs": {}},
        {"shards": {"0": 5}, "lineage": {}, "outputs": {}},
        {"lineage": {"config": []}, "outputs": {}, "shards": {}},
    ):
        record.write_text(json.dumps(change))
        problems = validate_work_dir(work)
        assert len(problems) == 1 and problems[0].startswith(f"{record} is not a valid completion record ("), problems
        code, err = run(capsys, "decode", "--work-dir", work, "--quiet")
        assert code == 1 and err.startswith(f"decode: cannot run: {record} is not a valid completion record"), err
        assert err.count("\n") == 1
        code, err = run(capsys, "manifest", "--work-dir", work, "--input", videos)  # made anew
        assert code == 0 and validate_work_dir(work) == []


def cli_output(capsys, *args) -> str:
    assert cli.main([str(arg) for arg in args]) == 0
    return capsys.readouterr().out


# ---------------------------------------------------------------- the codebook and what is made from it

# the chain's shards run in this process (a pool of spawned workers is not what these tests are about:
# tests/test_runner.py and tests/test_status.py run them)
SETTINGS = [part for setting in [*KMEANS, "executor.workers=1"] for part in ("--set", setting)]


@pytest.fixture(scope="module")
def finished_chain(tmp_path_factory):
    """features (hand-made, two shards of two videos) -> kmeans -> quantize -> asr (hand-made) -> align, run
    once for the module."""
    work = tmp_path_factory.mktemp("chain") / "work"
    vectors, _, _ = planted_hierarchy(groups=3, subgroups=3, per_subgroup=4, seed=5)
    tables = make_work_dir(work, [vectors[:18], vectors[18:]], clips_per_video=9)
    for shard, table in tables.items():
        rows = [
            {
                "video_id": video,
                "status": "ok",
                "source": "test",
                "language": "en",
                "language_prob": 0.9,
                "audio_s": 13.5,
                "sentences": [{"text": "Chop the onion.", "start_s": 0.0, "end_s": 3.0}],
                "words": [],
            }
            for video in sorted(set(table["video_id"].to_pylist()))
        ]
        write_part(
            work,
            "asr",
            shard,
            pa.Table.from_pylist(rows, schema=schemas.ASR.arrow),
            schemas.ASR,
            record={"videos": len(rows)},
        )
    for stage in ("kmeans", "quantize", "align"):
        assert cli.main([stage, "--work-dir", str(work), "--quiet", *SETTINGS]) == 0, stage
    return work


@pytest.fixture
def chain(finished_chain, tmp_path):
    """A copy of the finished chain, for the test to change."""
    work = tmp_path / "work"
    shutil.copytree(finished_chain, work)
    assert validate_work_dir(work) == []
    return work, SETTINGS


def test_a_refit_codebook_redoes_quantize_and_align_and_train_refuses_until_then(chain, capsys):
    work, settings = chain
    old = json.loads(WorkDir(work).codebook_sidecar.read_text())["sha256"]
    seed = ["--set", "kmeans.seed=7"]
    code, err = run(capsys, "kmeans", "--work-dir", work, "--quiet", *settings, *seed)
    assert code == 0 and "config kmeans.seed 0 -> 7" in err
    new = json.loads(WorkDir(work).codebook_sidecar.read_text())["sha256"]
    assert new != old
    # align cannot run on tokens of the old tree, and says which stage to run first
    code, err = run(capsys, "align", "--work-dir", work, "--quiet", *settings, *seed)
    assert code == 1 and "needs quantize part 00000, which is stale" in err and "run the quantize stage first" in err
    assert "Traceback" not in err
    cfg = load_config(None, KMEANS + ["kmeans.seed=7"])
    with pytest.raises(InputNotReady, match="needs quantize part 00000, which is stale"):
        training_inputs(cfg, WorkDir(work))
    problems = validate_work_dir(work)
    assert any("quantize part 00000 is stale: its kmeans input changed" in problem for problem in problems)
    code, err = run(capsys, "quantize", "--work-dir", work, "--quiet", *settings, *seed)
    assert code == 0 and "2 shard(s) run (2 redone: stale or corrupt)" in err
    for shard in (0, 1):
        assert storage.read_metadata(WorkDir(work).part("quantize", shard)).codebook_sha256 == new
    code, err = run(capsys, "align", "--work-dir", work, "--quiet", *settings, *seed)
    assert code == 0 and "(2 redone: stale or corrupt)" in err
    for shard in (0, 1):
        assert storage.read_metadata(WorkDir(work).part("align", shard)).codebook_sha256 == new
    assert validate_work_dir(work) == []


@pytest.mark.parametrize("stage", ["features", "quantize"])
def test_a_bit_flip_in_a_part_that_still_parses_never_reaches_the_training_shards(chain, capsys, stage):
    work, settings = chain
    part = WorkDir(work).part(stage, 1)
    tokens_before = pq.read_table(WorkDir(work).part("align", 1))["visual_ids"].to_pylist()
    flip_a_byte(part)
    problems = validate_work_dir(work)
    assert any(f"{part} does not match its sha256" in problem for problem in problems)
    reader = "quantize" if stage == "features" else "align"
    code, err = run(capsys, reader, "--work-dir", work, "--quiet", "--force", *settings)
    assert code == 1 and f"{part} does not match its sha256" in err and "Traceback" not in err
    if stage == "quantize":
        # the stage that made the part redoes it; then its readers run on the restored bytes
        code, err = run(capsys, "quantize", "--work-dir", work, "--quiet", *settings)
        assert code == 0 and "1 shard(s) run (1 redone: stale or corrupt)" in err
        assert run(capsys, "align", "--work-dir", work, "--quiet", "--force", *settings)[0] == 0
        assert pq.read_table(WorkDir(work).part("align", 1))["visual_ids"].to_pylist() == tokens_before
        assert validate_work_dir(work) == []


def test_a_bit_flip_in_the_codebook_is_caught_before_any_token_is_made(chain, capsys):
    work, settings = chain
    flip_a_byte(WorkDir(work).codebook, offset_from_end=100)
    code, err = run(capsys, "quantize", "--work-dir", work, "--quiet", "--force", *settings)
    assert code == 1 and f"{WorkDir(work).codebook} does not match its sha256" in err
    assert "run the kmeans stage first" in err
    assert any("codebook.safetensors" in problem for problem in validate_work_dir(work))
    code, err = run(capsys, "kmeans", "--work-dir", work, "--quiet", *settings)  # refit: the record was broken
    assert code == 0 and "corrupt" in err
    assert validate_work_dir(work) == []


@pytest.mark.parametrize("name", ["features part", "codebook"])
def test_a_deleted_input_file_is_named_missing_not_corrupt(chain, capsys, name):
    work, settings = chain
    path = WorkDir(work).part("features", 1) if name == "features part" else WorkDir(work).codebook
    path.unlink()
    problems = validate_work_dir(work)
    assert any(f"{path} is missing" in problem for problem in problems), problems
    assert not any("does not match its sha256" in problem for problem in problems)
    code, err = run(capsys, "quantize", "--work-dir", work, "--quiet", "--force", *settings)
    assert code == 1 and f"{path} is missing" in err and "does not match its sha256" not in err
    assert "Traceback" not in err


# ---------------------------------------------------------------- exit codes and traces


def test_exit_codes_for_no_videos_all_failing_and_a_stage_run_too_early(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no videos here")
    code, err = run(capsys, "manifest", "--work-dir", tmp_path / "w0", "--input", empty)
    assert code == 3 and "no videos found" in err

    broken = tmp_path / "broken"
    broken.mkdir()
    for index in range(3):
        (broken / f"b{index}.mp4").write_text("not a video")
    work = tmp_path / "w1"
    assert run(capsys, "manifest", "--work-dir", work, "--input", broken)[0] == 0
    code, err = run(capsys, "decode", "--work-dir", work, "--quiet")
    assert code == 3 and "3 of 3 videos failed (100%), more than executor.max_failed_share=0.5" in err
    code, err = run(capsys, "decode", "--work-dir", work, "--quiet", "--set", "executor.max_failed_share=1")
    assert code == 0 and "1 already current" in err

    code, err = run(capsys, "align", "--work-dir", work, "--quiet")
    assert code == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1].endswith("run the quantize stage first") or "run the asr stage first" in err


def test_a_crashed_shard_is_recorded_shown_by_status_and_errors_and_cleared_by_a_good_rerun(tmp_path, capsys):
    from kmeans_factory import pin_codebook, write_features_shard
    from kmeans_factory import write_manifest as write_features_manifest

    work = tmp_path / "work"
    vectors, _, _ = planted_hierarchy(groups=3, subgroups=2, per_subgroup=4, seed=3)
    tables = make_work_dir(work, [vectors[:12], vectors[12:]], clips_per_video=6)
    settings = ["--set", "kmeans.depth=1", "--set", "kmeans.k=3"]
    assert run(capsys, "kmeans", "--work-dir", work, "--quiet", *settings)[0] == 0
    pin_codebook(work)
    # shard 1's features come from another S3D: the stage itself raises on them (a crash, not a bad video)
    tables[1] = write_features_shard(work, 1, vectors[12:], provenance_hash="another-model", clips_per_video=6)
    write_features_manifest(work, tables)
    code, err = run(capsys, "quantize", "--work-dir", work, "--quiet", "--workers", "1", *settings)
    assert (
        code == 1
        and "quantize part 00001 FAILED: ValueError: features part 1 has feature provenance another-model" in err
    )
    assert "Traceback" not in err
    failure = json.loads(WorkDir(work).failure("quantize", 1).read_text())
    assert "Traceback" in failure["traceback"] and failure["error"].startswith("ValueError: features part 1")
    status = cli_output(capsys, "status", "--work-dir", work)
    assert "quantize part 00001 failed: ValueError: features part 1 has feature provenance another-model" in status
    assert cli.main(["errors", "--work-dir", str(work)]) == 1  # a crashed shard: the run is not done
    errors = capsys.readouterr().out
    assert "1 shard(s) crashed" in errors.splitlines()[0]
    assert "quantize  part 00001  (whole shard)  ValueError: features part 1 has feature provenance" in errors

    tables[1] = write_features_shard(work, 1, vectors[12:], clips_per_video=6)
    write_features_manifest(work, tables)
    code, err = run(capsys, "quantize", "--work-dir", work, "--quiet", "--workers", "1", *settings)
    assert code == 0 and not WorkDir(work).failure("quantize", 1).exists()
    assert "failed" not in cli_output(capsys, "status", "--work-dir", work).split("slowest")[0].split("\n", 3)[3]


# ---------------------------------------------------------------- leftovers of killed runs


def test_leftovers_of_killed_runs_are_removed_by_the_next_run(chain, capsys):
    import subprocess
    import sys

    work, settings = chain
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    host = os.uname().nodename.replace("_", "-")
    sample = WorkDir(work).kmeans_folder / f".tmp_{dead_pid}_{host}_0badc0de_fit-sample.npy.partial"
    sample.write_bytes(b"\0" * 4096)
    part = WorkDir(work).data_folder("quantize") / f".tmp_{dead_pid}_{host}_0badc0de_part-00000.parquet.partial"
    part.write_bytes(b"PAR1 half")
    live = WorkDir(work).data_folder("quantize") / f".tmp_{os.getpid()}_{host}_0badc0de_part-00001.parquet.partial"
    live.write_bytes(b"a live writer's file")
    assert run(capsys, "kmeans", "--work-dir", work, "--quiet", "--force", *settings)[0] == 0
    assert not sample.exists()
    assert run(capsys, "quantize", "--work-dir", work, "--quiet", *settings)[0] == 0
    assert not part.exists() and live.exists()  # (the trainer's: tests/test_videobert.py)
