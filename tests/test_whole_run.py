"""`run` (every stage in order), a rerun that starts no pool, `doctor`, the remembered config recorded only by
a command that succeeded, its history, `config show/diff/history`, and the make targets' --config."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from media_factory import one_clip_videos

from pipeline import cli, remembered
from pipeline.cli.whole_run import RUN_STAGES
from pipeline.engine.workdir import WorkDir

ROOT = Path(__file__).resolve().parents[1]
# the demo config, smaller still: one short clip per video, two visual words
SMALL = [
    "decode.clip_frames=14",
    "decode.min_clip_frames=7",
    "features.batch_size=2",
    "kmeans.k=2",
    "kmeans.depth=1",
    "kmeans.niter=5",
    "shards.videos_per_shard=2",
    "executor.workers=1",
]
SRT = "1\n00:00:00,000 --> 00:00:01,500\nchop the onion and stir the pan\n"


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """No host answers, nothing is in torch's cache."""
    from pipeline import probing

    monkeypatch.setattr(probing, "unreachable", lambda url: "[Errno -2] Name or service not known")
    monkeypatch.setattr("torch.hub.get_dir", lambda: str(tmp_path / "torch-hub"))


def _sets(values=SMALL) -> list[str]:
    return [part for value in values for part in ("--set", value)]


def run(capsys, *args) -> tuple[int, str]:
    code = cli.main([str(arg) for arg in args])
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> Path:
    """Three one-clip videos with a transcript each (the asr stage imports them: no speech model)."""
    folder = one_clip_videos(tmp_path_factory.mktemp("videos") / "videos", 3)
    for video in folder.glob("*.mp4"):
        video.with_suffix(".srt").write_text(SRT)
    return folder


def _parquet_digests(work: Path) -> dict[str, str]:
    return {
        str(path.relative_to(work)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(work.rglob("*.parquet"))
        if "_state" not in path.parts
    }


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory, videos) -> tuple[Path, int, str]:
    work = tmp_path_factory.mktemp("run") / "work"
    code = cli.main(
        ["run", "--config", str(ROOT / "configs/demo.yaml"), "--work-dir", str(work), "--input", str(videos), *_sets()]
    )
    return work, code


def test_run_gives_the_same_shards_as_the_stage_commands_one_by_one(tmp_path, videos, whole_run, capsys):
    work, code = whole_run
    assert code == 0
    by_stage = tmp_path / "by_stage"
    common = ["--config", ROOT / "configs/demo.yaml", "--work-dir", by_stage, *_sets()]
    assert run(capsys, "manifest", *common, "--input", videos)[0] == 0
    for stage in ("features", "quality", "dedup", "kmeans", "quantize", "asr", "align"):
        assert run(capsys, stage, *common)[0] == 0, stage
    made, expected = _parquet_digests(work), _parquet_digests(by_stage)
    assert {name.split("/")[0] for name in expected} >= {"manifest", "decode", "features", "quantize", "asr", "align"}
    assert made == expected
    codebook = "kmeans/codebook.safetensors"
    assert (work / codebook).read_bytes() == (by_stage / codebook).read_bytes()
    assert (work / "summary.json").is_file() and (work / "README.md").is_file()  # summary and the card


def test_a_rerun_starts_no_pool_and_says_every_stage_is_current(whole_run, videos, monkeypatch, capsys):
    from pipeline.executors import local

    def no_pool(workers):
        raise AssertionError("a pool was started with every shard current")

    monkeypatch.setattr(local, "_spawn_pool", no_pool)
    work, _ = whole_run
    before = _parquet_digests(work)
    code, err = run(capsys, "run", "--work-dir", work, "--input", videos, "--workers", 2)
    assert code == 0
    table = err[err.index("run: done in") :].splitlines()
    assert table[0].startswith("run: done in") and str(work) in table[0]
    rows = {line.split()[0]: line for line in table[1:] if line.startswith("  ")}
    assert list(rows) == [*RUN_STAGES, "validate", "summary"]
    assert rows["manifest"].endswith("3 video(s) in 2 shard(s), unchanged")
    for stage in ("features", "quantize", "asr", "align"):
        assert rows[stage].endswith("0 shard(s) run, 2 already current"), rows[stage]
    assert rows["kmeans"].endswith("the codebook is current")
    assert "run: [2/11] features" in err
    assert err.count("config: this work dir's") == 1  # said once, not once per stage
    assert _parquet_digests(work) == before


def test_run_stops_at_the_failing_stage_with_its_exit_code(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, err = run(
        capsys,
        "run",
        "--config",
        ROOT / "configs/demo.yaml",
        "--work-dir",
        tmp_path / "work",
        "--input",
        empty,
        *_sets(),
    )
    assert code == cli.EXIT_TOO_MANY_FAILED  # the input holds no videos: the manifest stage's code
    assert "run: stopped at manifest (exit 3)" in err
    assert "features" not in err.split("run: stopped at")[1]


def test_run_checks_every_stage_before_the_first_and_runs_nothing(tmp_path, videos, capsys, no_network):
    work = tmp_path / "work"
    code, err = run(capsys, "run", "--work-dir", work, "--input", videos, "--set", "align.tokenizer=./nowhere.txt")
    assert code == cli.EXIT_USAGE
    lines = err.strip().splitlines()
    assert lines[0] == "run: cannot start (2 problems, nothing was run):"
    assert lines[1].startswith("  features: features.weights: kinetics400")
    assert lines[2].startswith("  align: align.tokenizer: ./nowhere.txt not found")
    assert not work.exists()


# ---------------------------------------------------------------- doctor


def test_doctor_names_every_stage_that_cannot_start_and_exits_2(capsys, no_network):
    code, err = run(capsys, "doctor")
    assert code == cli.EXIT_USAGE
    lines = err.strip().splitlines()
    assert lines[0] == "doctor: the run cannot start: 2 problems"
    assert lines[1].startswith("  features: features.weights: kinetics400")
    assert lines[2].startswith("  train: train.init_checkpoint: 'bert-large-uncased' is a model hub name")


def test_doctor_passes_the_demo_config_and_uses_the_remembered_one(tmp_path, videos, whole_run, capsys):
    code, err = run(
        capsys, "doctor", "--config", ROOT / "configs/demo.yaml", "--work-dir", tmp_path / "new", "--input", videos
    )
    assert code == 0 and err.strip().endswith(
        "every stage (features, shots, asr, align, train) can start with this config"
    )
    work, _ = whole_run
    assert run(capsys, "doctor", "--work-dir", work)[0] == 0  # the demo config it remembers
    code, err = run(capsys, "doctor", "--work-dir", tmp_path / "new", "--input", tmp_path / "missing")
    assert code == 2 and f"  --input {tmp_path / 'missing'}: no such file or folder" in err.splitlines()


# ---------------------------------------------------------------- the remembered config and its history


def test_a_command_that_failed_on_every_shard_is_not_remembered(tmp_path, whole_run, monkeypatch, capsys):
    import stages.align.run

    work = tmp_path / "work"
    shutil.copytree(whole_run[0], work)
    remembered_before = WorkDir(work).remembered_config.read_bytes()
    history_before = remembered.history(work)

    def crash(ctx):
        raise RuntimeError("the tokenizer broke")

    monkeypatch.setattr(stages.align.run, "run_shard", crash)
    code, err = run(
        capsys, "align", "--work-dir", work, "--force", "--set", "align.tokens_per_segment_without_text=12", "--quiet"
    )
    assert code == cli.EXIT_FAILED and "2 failed" in err
    assert WorkDir(work).remembered_config.read_bytes() == remembered_before
    assert remembered.history(work) == history_before


def test_the_history_keeps_one_entry_per_config_and_config_shows_and_diffs_it(tmp_path, whole_run, capsys):
    work = tmp_path / "work"
    shutil.copytree(whole_run[0], work)
    entries = remembered.history(work)
    assert [entry["written_by"] for entry in entries] == ["manifest"]  # the later stages used the same one
    assert (
        run(capsys, "align", "--work-dir", work, "--set", "align.tokens_per_segment_without_text=12", "--quiet")[0] == 0
    )
    entries = remembered.history(work)
    assert [entry["written_by"] for entry in entries] == ["manifest", "align"]

    assert cli.main(["config", "history", "--work-dir", str(work)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[0] == "1" and lines[0].endswith("manifest   first config")
    assert lines[1].split()[0] == "2" and lines[1].endswith("align      align.tokens_per_segment_without_text")

    assert cli.main(["config", "show", "--work-dir", str(work)]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"# the config {WorkDir(work).remembered_config} remembers: recorded by align at ")
    import yaml

    assert yaml.safe_load(shown)["align"]["tokens_per_segment_without_text"] == 12

    assert cli.main(["config", "diff", "--work-dir", str(work)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("the remembered config (align, ") and out[1:] == [
        "  align.tokens_per_segment_without_text: "
        f"{entries[0]['config']['align']['tokens_per_segment_without_text']} -> 12"
    ]

    assert cli.main(["config", "diff", "--work-dir", str(work), "--set", "kmeans.k=3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "the config given against the one this work dir remembers (1 key; a run with it redoes "
        "kmeans, quantize, align):",
        "  kmeans.k: 2 -> 3",
    ]


def test_config_on_a_work_dir_that_remembers_nothing_says_so(tmp_path, capsys):
    (tmp_path / "work").mkdir()
    code, err = run(capsys, "config", "show", "--work-dir", tmp_path / "work")
    assert code == 1 and "remembers no config yet" in err


# ---------------------------------------------------------------- the make targets


def _make_lines(*assignments) -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("no make here")
    # the make that runs these tests (make test ARGS=...) passes its variables down: not to this one
    env = {k: v for k, v in os.environ.items() if k not in ("ARGS", "CONFIG", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    result = subprocess.run(
        ["make", "-n", "ARGS=", "pipeline", "kmeans", "eval", *assignments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines() if "/bin/videobert " in line]


def test_the_make_targets_pass_config_only_when_config_is_given():
    lines = _make_lines("WORK=w")
    assert len(lines) == 3 and lines[0].endswith("videobert run  --work-dir w --input samples ")
    assert not any("--config" in line for line in lines)
    lines = _make_lines("WORK=w", "CONFIG=configs/demo.yaml")
    assert len(lines) == 3 and all(" --config configs/demo.yaml --work-dir w" in line for line in lines)


def test_the_remembered_config_file_is_json(whole_run):
    record = json.loads(WorkDir(whole_run[0]).remembered_config.read_text())
    assert record["config"]["kmeans"]["k"] == 2


# ---------------------------------------------------------------- status and summary after the run


def test_status_shows_kmeans_stale_after_a_features_part_was_corrupted(tmp_path, whole_run):
    from reports.status import status_text

    work = tmp_path / "work"
    shutil.copytree(whole_run[0], work)
    assert "kmeans" in status_text(work) and " current  codebook" in status_text(work)
    part = WorkDir(work).part("features", 1)
    part.write_bytes(part.read_bytes()[:-100])  # cut short
    kmeans_line = next(line for line in status_text(work).splitlines() if line.startswith("kmeans"))
    assert kmeans_line.split()[1] == "stale"
    assert "features part 00001 is corrupt: run the features stage, then kmeans" in kmeans_line


def test_the_summary_counts_the_features_pass_once_not_under_decode_too(whole_run):
    summary = json.loads((whole_run[0] / "summary.json").read_text())
    assert summary["stages"]["decode"]["made_in"] == "features"
    assert summary["stages"]["decode"]["seconds"] == 0.0 and summary["stages"]["features"]["seconds"] > 0
    from reports import summary as summary_module

    line = next(line for line in summary_module.render(summary).splitlines() if line.strip().startswith("decode"))
    assert line.rstrip().endswith("in features")
