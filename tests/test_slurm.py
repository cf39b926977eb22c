"""Slurm job arrays: the sbatch script (array, resources from the config, logs, requeue, afterok chains),
what each array task runs, and the submission through sbatch. There is no Slurm here: the array tasks are
run by bash with the variables Slurm would set, and a stand-in sbatch on PATH records how it was called."""

import os
import shlex
import subprocess

import pytest

from media_factory import make_video
from pipeline import cli, io
from pipeline.config import load_config
from pipeline.manifest import write_manifest
from pipeline.slurm import sbatch_script
from pipeline.workdir import WorkDir


def _directives(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


def _command(script: str) -> list[str]:
    exec_line = next(line for line in script.splitlines() if line.startswith("exec "))
    return shlex.split(exec_line[len("exec "):])


def test_a_shard_stage_is_an_array_with_the_configs_resources(tmp_path):
    cfg = load_config(None, ["executor.slurm_partition=gpu", "executor.slurm_gpus=2",
                             "executor.slurm_cpus_per_task=8", "executor.slurm_mem=32G",
                             "executor.slurm_time=01:30:00", "executor.slurm_extra=['#SBATCH --account=vb']"])
    config = tmp_path / "my config.yaml"
    script = sbatch_script(cfg, "features", work_dir=tmp_path / "work", config=str(config),
                           overrides=["decode.fps=25"], num_shards=10, array_parallelism=3, after=["41", "42_7"])
    directives = _directives(script)
    for expected in ("--job-name=videobert-features", "--array=0-9%3", "--cpus-per-task=8", "--mem=32G",
                     "--time=01:30:00", "--partition=gpu", "--gres=gpu:2", "--requeue",
                     "--dependency=afterok:41:42_7", "--account=vb"):
        assert f"#SBATCH {expected}" in directives, expected
    assert f"#SBATCH --output={WorkDir(tmp_path / 'work').slurm_logs}/%x-%A_%a.out" in directives
    command = _command(script)
    assert command[1:4] == ["-m", "pipeline", "features"]
    assert command[command.index("--config") + 1] == str(config)          # the space survives quoting
    assert command[command.index("--set") + 1] == "decode.fps=25"
    assert command[command.index("--shard") + 1] == "$SLURM_ARRAY_TASK_ID"   # shlex keeps it literal
    assert command[command.index("--num-shards") + 1] == "10"
    assert command[command.index("--executor") + 1] == "local"

    decode = sbatch_script(cfg, "decode", work_dir=tmp_path, num_shards=4)
    assert not any("--gres" in line or "--dependency" in line for line in _directives(decode))   # CPU stage
    assert "#SBATCH --array=0-3" in _directives(decode)
    throttled = sbatch_script(load_config(None, ["executor.slurm_array_parallelism=5"]), "asr",
                              work_dir=tmp_path, num_shards=20)
    assert "#SBATCH --array=0-19%5" in _directives(throttled)


def test_global_stages_are_one_job_and_train_resumes_on_requeue(tmp_path):
    cfg = load_config(None, ["executor.slurm_gpus=4"])
    kmeans = sbatch_script(cfg, "kmeans", work_dir=tmp_path, num_shards=8)
    assert not any(line.startswith("#SBATCH --array") for line in _directives(kmeans))
    assert not any("--gres" in line for line in _directives(kmeans))
    assert "#SBATCH --output=" + str(WorkDir(tmp_path).slurm_logs) + "/%x-%j.out" in _directives(kmeans)
    train = _command(sbatch_script(cfg, "train", work_dir=tmp_path, num_shards=1))
    assert train[1:3] == ["-m", "torch.distributed.run"] and "--nproc-per-node" in train
    assert train[train.index("--nproc-per-node") + 1] == "4"
    assert train[-1] == "--resume" and "train" in train
    single = _command(sbatch_script(load_config(None, ["executor.slurm_gpus=1"]), "train", work_dir=tmp_path))
    assert single[1:4] == ["-m", "pipeline", "train"]


def test_each_array_task_runs_the_same_command_and_together_they_cover_every_shard(tmp_path):
    videos = tmp_path / "videos"
    videos.mkdir()
    for index in range(4):
        make_video(videos / f"v{index}.mp4", duration_s=1.0, fps=25)
    overrides = ["shards.videos_per_shard=1"]
    cfg = load_config(None, overrides)
    work = tmp_path / "work"
    write_manifest(cfg, videos, work)
    script_path = tmp_path / "decode.sbatch"
    script_path.write_text(sbatch_script(cfg, "decode", work_dir=work, overrides=overrides, num_shards=2))
    for task, expected in ((1, [1, 3]), (0, [0, 1, 2, 3])):
        env = dict(os.environ, SLURM_ARRAY_TASK_ID=str(task), SLURM_ARRAY_TASK_COUNT="2", SLURM_CPUS_PER_TASK="1")
        run = subprocess.run(["bash", str(script_path)], env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert [s for s in range(4) if WorkDir(work).record("decode", s).exists()] == expected


@pytest.fixture
def fake_sbatch(tmp_path, monkeypatch):
    """An sbatch on PATH that records its arguments and answers like `sbatch --parsable`."""
    folder = tmp_path / "bin"
    folder.mkdir()
    calls = tmp_path / "sbatch-calls.txt"
    (folder / "sbatch").write_text(f'#!/bin/bash\necho "$@" >> {shlex.quote(str(calls))}\necho "4242;cluster"\n')
    (folder / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_submit_writes_the_script_calls_sbatch_and_prints_the_job_id(tmp_path, fake_sbatch, capsys):
    work = tmp_path / "work"
    assert cli.main(["submit", "asr", "--work-dir", str(work), "--num-shards", "3", "--after", "77", "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == "4242"     # only the id: `--after "$(...)"` chains stages
    scripts = sorted(WorkDir(work).slurm_folder.glob("asr-*.sbatch"))
    assert len(scripts) == 1 and WorkDir(work).slurm_logs.is_dir()
    assert "#SBATCH --dependency=afterok:77" in _directives(scripts[0].read_text())
    assert fake_sbatch.read_text().split() == ["--parsable", str(scripts[0])]


def test_dry_run_prints_the_script_and_submits_nothing(tmp_path, fake_sbatch, capsys):
    assert cli.main(["submit", "decode", "--work-dir", str(tmp_path), "--num-shards", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("#!/bin/bash") and "#SBATCH --array=0-1" in out
    assert not fake_sbatch.exists() and not (tmp_path / "slurm").exists()


def test_submit_refuses_bad_arguments_and_a_missing_sbatch(tmp_path, monkeypatch, capsys):
    assert cli.main(["submit", "decode", "--work-dir", str(tmp_path), "--num-shards", "2", "--after", "x1"]) == 2
    assert "--after takes a Slurm job id" in capsys.readouterr().err
    assert cli.main(["submit", "decode", "--work-dir", str(tmp_path), "--num-shards", "0"]) == 2
    assert "--num-shards must be >= 1" in capsys.readouterr().err
    monkeypatch.setenv("PATH", str(tmp_path))   # no sbatch anywhere
    assert cli.main(["submit", "decode", "--work-dir", str(tmp_path), "--num-shards", "2"]) == 1
    assert "sbatch not found on PATH" in capsys.readouterr().err


def test_slurm_config_mistakes_stop_at_load():
    from pipeline.config import ConfigError
    with pytest.raises(ConfigError, match="executor.slurm_gpu_stages"):
        load_config(None, ["executor.slurm_gpu_stages=[featurs]"])
    with pytest.raises(ConfigError, match="executor.slurm_array_parallelism"):
        load_config(None, ["executor.slurm_array_parallelism=0"])
