"""Slurm job arrays: the sbatch script (array, resources from the config, logs, requeue, afterok chains),
what each array task runs, and the submission through sbatch. There is no Slurm here: the array tasks are
run by bash with the variables Slurm would set, and a stand-in sbatch on PATH records how it was called."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from media_factory import make_video
from work_factory import write_manifest_rows, write_part

import schemas
from pipeline import cli
from pipeline.config import ConfigError, load_config
from pipeline.engine.manifest import write_manifest
from pipeline.engine.workdir import WorkDir
from pipeline.executors.sbatch import REPO, ScriptError, sbatch_script, sbatch_scripts


def _directives(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


def _command(script: str) -> list[str]:
    exec_line = next(line for line in script.splitlines() if line.startswith("exec "))
    return shlex.split(exec_line[len("exec ") :])


def test_a_shard_stage_is_an_array_with_the_configs_resources(tmp_path):
    cfg = load_config(
        None,
        [
            "executor.slurm_partition=gpu",
            "executor.slurm_gpus=2",
            "executor.slurm_cpus_per_task=8",
            "executor.slurm_mem=32G",
            "executor.slurm_time=01:30:00",
            "executor.slurm_extra=['#SBATCH --account=vb']",
        ],
    )
    config = tmp_path / "my config.yaml"
    script = sbatch_script(
        cfg,
        "features",
        work_dir=tmp_path / "work",
        config=str(config),
        overrides=["decode.fps=25"],
        num_shards=10,
        array_parallelism=3,
        after=["41", "42_7"],
    )
    directives = _directives(script)
    for expected in (
        "--job-name=videobert-features",
        "--array=0-9%3",
        "--cpus-per-task=8",
        "--mem=32G",
        "--time=01:30:00",
        "--partition=gpu",
        "--gres=gpu:2",
        "--requeue",
        "--dependency=afterok:41:42_7",
        "--account=vb",
    ):
        assert f"#SBATCH {expected}" in directives, expected
    assert f"#SBATCH --output={WorkDir(tmp_path / 'work').slurm_logs}/%x-%A_%a.out" in directives
    command = _command(script)
    assert command[1:4] == ["-m", "pipeline", "features"]
    assert command[command.index("--config") + 1] == str(config)  # the space survives quoting
    assert command[command.index("--set") + 1] == "decode.fps=25"
    assert command[command.index("--shard") + 1] == "$SLURM_ARRAY_TASK_ID"  # shlex keeps it literal
    assert command[command.index("--num-shards") + 1] == "10"
    assert command[command.index("--executor") + 1] == "local"

    decode = sbatch_script(cfg, "decode", work_dir=tmp_path, num_shards=4)
    assert not any("--gres" in line or "--dependency" in line for line in _directives(decode))  # CPU stage
    assert "#SBATCH --array=0-3" in _directives(decode)
    throttled = sbatch_script(
        load_config(None, ["executor.slurm_array_parallelism=5"]), "asr", work_dir=tmp_path, num_shards=20
    )
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
    # job ids 4242, 4243, ... one per call
    (folder / "sbatch").write_text(
        f'#!/bin/bash\necho "$@" >> {shlex.quote(str(calls))}\n'
        f'echo "$((4241 + $(wc -l < {shlex.quote(str(calls))})));cluster"\n'
    )
    (folder / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_submit_writes_the_script_calls_sbatch_and_prints_the_job_id(tmp_path, fake_sbatch, capsys):
    work = tmp_path / "work"
    assert cli.main(["submit", "asr", "--work-dir", str(work), "--num-shards", "3", "--after", "77", "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == "4242"  # only the id: `--after "$(...)"` chains stages
    scripts = sorted(WorkDir(work).slurm_folder.glob("asr-*.sbatch"))
    assert len(scripts) == 1 and WorkDir(work).slurm_logs.is_dir()
    assert "#SBATCH --dependency=afterok:77" in _directives(scripts[0].read_text())
    assert fake_sbatch.read_text().split() == ["--parsable", str(scripts[0])]


def test_dry_run_prints_the_script_and_submits_nothing(tmp_path, fake_sbatch, capsys):
    assert cli.main(["submit", "decode", "--work-dir", str(tmp_path), "--num-shards", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("#!/bin/bash") and "#SBATCH --array=0-1" in out
    assert not fake_sbatch.exists() and not WorkDir(tmp_path).slurm_folder.exists()


def test_submit_refuses_bad_arguments_and_a_missing_sbatch(tmp_path, monkeypatch, capsys):
    assert cli.main(["submit", "decode", "--work-dir", str(tmp_path), "--num-shards", "2", "--after", "x1"]) == 2
    assert "--after takes a Slurm job id" in capsys.readouterr().err
    assert cli.main(["submit", "decode", "--work-dir", str(tmp_path), "--num-shards", "0"]) == 2
    assert "--num-shards must be >= 1" in capsys.readouterr().err
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch anywhere
    assert cli.main(["submit", "decode", "--work-dir", str(tmp_path), "--num-shards", "2"]) == 1
    assert "sbatch not found on PATH" in capsys.readouterr().err


def test_slurm_config_mistakes_stop_at_load():
    from pipeline.config import ConfigError

    with pytest.raises(ConfigError, match="executor.slurm_gpu_stages"):
        load_config(None, ["executor.slurm_gpu_stages=[featurs]"])
    with pytest.raises(ConfigError, match="executor.slurm_array_parallelism"):
        load_config(None, ["executor.slurm_array_parallelism=0"])


def _sbatch_words(line: str) -> list[str]:
    """How sbatch splits an #SBATCH line into options (its own rules, not a shell's, see slurm.sbatch_path):
    whitespace separates unless quoted, ' and " group, a backslash escapes the next character, an unquoted
    '#' starts a comment."""
    words, word, quote, escaped, started = [], "", None, False, False
    for char in line[len("#SBATCH") :]:
        if escaped:
            word, escaped, started = word + char, False, True
        elif char == "\\":
            escaped = True
        elif quote:
            quote, word = (None, word) if char == quote else (quote, word + char)
        elif char in "'\"":
            quote, started = char, True
        elif char == "#":
            break
        elif char.isspace():
            if started:
                words.append(word)
            word, started = "", False
        else:
            word, started = word + char, True
    return words + [word] if started else words


def test_a_work_dir_with_a_line_break_is_refused_and_no_script_is_written(tmp_path, fake_sbatch, capsys):
    # the text after the line break would end the #SBATCH --output line and run as a command
    work = tmp_path / f"w\n touch {tmp_path / 'pwned'}"
    for dry_run in ([], ["--dry-run"]):
        assert cli.main(["submit", "decode", "--work-dir", str(work), "--num-shards", "2", *dry_run]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1
        assert err.startswith("submit: --work-dir must not contain control characters"), err
    assert not work.exists() and not fake_sbatch.exists() and not (tmp_path / "pwned").exists()


def test_a_config_path_or_override_with_a_control_character_is_refused_naming_it(tmp_path, fake_sbatch, capsys):
    config = tmp_path / "c\nx.yaml"
    config.write_text("decode:\n  fps: 20\n")
    assert (
        cli.main(["submit", "decode", "--work-dir", str(tmp_path), "--config", str(config), "--num-shards", "1"]) == 2
    )
    assert capsys.readouterr().err.startswith("submit: --config must not contain control characters")
    # valid YAML (a folded string) for the config, yet a line break in the script
    assert (
        cli.main(
            ["submit", "decode", "--work-dir", str(tmp_path), "--set", "eval.verbs=a\ntouch b", "--num-shards", "1"]
        )
        == 2
    )
    assert capsys.readouterr().err.startswith("submit: --set must not contain control characters")
    with pytest.raises(ScriptError, match="Python interpreter"):
        sbatch_script(load_config(None), "decode", work_dir=tmp_path, python="/usr/bin/python3\tx")
    assert not fake_sbatch.exists() and not WorkDir(tmp_path).slurm_folder.exists()


def test_paths_with_spaces_quotes_and_substitutions_reach_the_command_as_written(tmp_path):
    weird = tmp_path / "my work $(touch pwned) `touch pwned` 'single' \"double\" #hash 100%j"
    config = tmp_path / "my config $(touch pwned).yaml"
    verbs = "$(touch pwned) 'v' \"w\""
    # a stand-in interpreter (in a folder with a space) that records the arguments it was given
    argv_file = tmp_path / "argv.json"
    python = tmp_path / "bin dir" / "python"
    python.parent.mkdir()
    python.write_text(
        f"#!{sys.executable}\nimport json, sys\nopen({str(argv_file)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
    )
    python.chmod(0o755)
    script = sbatch_script(
        load_config(None),
        "decode",
        work_dir=weird,
        config=str(config),
        overrides=[f"eval.verbs={verbs}"],
        num_shards=3,
        python=str(python),
    )
    path = tmp_path / "decode.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0

    env = dict(os.environ, SLURM_ARRAY_TASK_ID="2", SLURM_ARRAY_TASK_COUNT="3", SLURM_CPUS_PER_TASK="1")
    run = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    argv = json.loads(argv_file.read_text())
    # what bash passed is what shlex reads in the exec line, with only the task's two variables expanded
    expected = [
        word.replace("$SLURM_ARRAY_TASK_ID", "2").replace("${SLURM_CPUS_PER_TASK:-1}", "1")
        for word in _command(script)[1:]
    ]
    assert argv == expected
    assert argv[argv.index("--work-dir") + 1] == str(weird)
    assert argv[argv.index("--config") + 1] == str(config)
    assert argv[argv.index("--set") + 1] == f"eval.verbs={verbs}"
    assert argv[argv.index("--shard") + 1] == "2"
    assert not list(tmp_path.rglob("pwned")) and not (REPO / "pwned").exists()  # nothing was substituted

    # sbatch reads the log path back whole: "%" doubled (a literal one), its own %x/%A/%a kept
    output = next(line for line in _directives(script) if line.startswith("#SBATCH --output="))
    assert _sbatch_words(output) == ["--output=" + str(WorkDir(weird).slurm_logs).replace("%", "%%") + "/%x-%A_%a.out"]


def test_a_backslash_in_the_work_dir_is_refused_for_the_log_names(tmp_path):
    with pytest.raises(ScriptError, match="--work-dir must not contain a backslash"):
        sbatch_script(load_config(None), "decode", work_dir=tmp_path / "a\\b")


@pytest.mark.parametrize(
    "yaml_text, key",
    [
        ('executor:\n  slurm_partition: "gpu\\n touch /tmp/pwned"\n', "executor.slurm_partition"),
        ("executor:\n  slurm_partition: gpu --wrap=x\n", "executor.slurm_partition"),
        ('executor:\n  slurm_mem: "16G\\n#SBATCH --uid=0"\n', "executor.slurm_mem"),
        ("executor:\n  slurm_mem: 16 GB\n", "executor.slurm_mem"),
        ("executor:\n  slurm_time: 04:00:00 # four hours\n", None),  # a YAML comment: accepted
        ("executor:\n  slurm_time: '04:00:00 #x'\n", "executor.slurm_time"),
        ("executor:\n  slurm_extra: ['--account=vb']\n", "executor.slurm_extra[0]"),
        ('executor:\n  slurm_extra: ["#SBATCH --account=vb\\ntouch /tmp/pwned"]\n', "executor.slurm_extra[0]"),
        ('executor:\n  slurm_extra: ["#SBATCH\\t--account=vb"]\n', "executor.slurm_extra[0]"),
    ],
)
def test_slurm_values_that_could_add_a_directive_or_command_are_refused_at_load(tmp_path, yaml_text, key):
    config = tmp_path / "config.yaml"
    config.write_text(yaml_text)
    if key is None:
        assert load_config(config).executor.slurm_time == "04:00:00"
        return
    with pytest.raises(ConfigError) as error:
        load_config(config)
    assert str(error.value).startswith(f"config error: {key} must be") and "\n" not in str(error.value)
    assert (
        cli.main(
            ["submit", "decode", "--config", str(config), "--work-dir", str(tmp_path), "--num-shards", "1", "--dry-run"]
        )
        == 2
    )


def test_usual_slurm_values_are_accepted(tmp_path):
    cfg = load_config(
        None, ["executor.slurm_partition=gpu,cpu_long", "executor.slurm_time=2-00:00:00", "executor.slurm_mem=16000M"]
    )
    directives = _directives(sbatch_script(cfg, "decode", work_dir=tmp_path))
    assert {"#SBATCH --partition=gpu,cpu_long", "#SBATCH --time=2-00:00:00", "#SBATCH --mem=16000M"} <= set(directives)
    for time in ("90", "UNLIMITED", "1-12", "30:00"):
        assert load_config(None, [f"executor.slurm_time='{time}'"]).executor.slurm_time == time


def test_a_config_built_in_code_cannot_inject_a_directive_either(tmp_path):
    cfg = load_config(None)
    cfg.executor.slurm_partition = "gpu\ntouch pwned"
    with pytest.raises(ScriptError, match="executor.slurm_partition"):
        sbatch_script(cfg, "decode", work_dir=tmp_path)
    cfg = load_config(None)
    cfg.executor.slurm_extra = ["#SBATCH --account=vb\ntouch pwned"]
    with pytest.raises(ScriptError, match=r"executor.slurm_extra\[0\]"):
        sbatch_script(cfg, "decode", work_dir=tmp_path)


# ---------------------------------------------------------------- logs, long arrays, multi-node training


def _recorder(path, argv_file):
    """A stand-in program that writes the arguments it was given, one per line, and exits 0."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {shlex.quote(str(argv_file))}\n')
    path.chmod(0o755)
    return path


def test_tasks_log_their_progress(tmp_path):
    cfg = load_config(None, ["executor.slurm_gpus=2", "executor.slurm_nodes=2"])
    for stage in ("decode", "kmeans", "train"):
        assert "--quiet" not in _command(sbatch_script(cfg, stage, work_dir=tmp_path, num_shards=3)), stage


def test_an_array_longer_than_max_array_size_is_split_and_its_jobs_run_every_task_once(tmp_path):
    cfg = load_config(None, ["executor.slurm_max_array_size=3"])
    python = _recorder(tmp_path / "bin" / "python", tmp_path / "argv.txt")
    scripts = sbatch_scripts(cfg, "asr", work_dir=tmp_path / "work", num_shards=7, python=str(python))
    assert [next(line for line in _directives(script) if "--array" in line) for script in scripts] == [
        "#SBATCH --array=0-2",
        "#SBATCH --array=0-2",
        "#SBATCH --array=0-0",
    ]
    tasks = []
    for index, script in enumerate(scripts):
        path = tmp_path / f"asr-{index}.sbatch"
        path.write_text(script)
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
        for array_index in range(3 if index < 2 else 1):
            env = dict(
                os.environ, SLURM_ARRAY_TASK_ID=str(array_index), SLURM_ARRAY_TASK_COUNT="3", SLURM_CPUS_PER_TASK="2"
            )
            assert subprocess.run(["bash", str(path)], env=env, timeout=60).returncode == 0
            argv = (tmp_path / "argv.txt").read_text().splitlines()
            assert argv[argv.index("--num-shards") + 1] == "7" and argv[argv.index("--workers") + 1] == "2"
            tasks.append(int(argv[argv.index("--shard") + 1]))
    assert tasks == list(range(7))  # task t takes manifest shards s with s % 7 == t: every shard once
    with pytest.raises(ScriptError, match="more than executor.slurm_max_array_size"):
        sbatch_script(cfg, "asr", work_dir=tmp_path, num_shards=4)
    assert len(sbatch_scripts(load_config(None), "asr", work_dir=tmp_path, num_shards=1001)) == 1  # 0..1000
    assert len(sbatch_scripts(load_config(None), "asr", work_dir=tmp_path, num_shards=1002)) == 2


def test_the_second_job_of_a_split_array_runs_its_shards_for_real(tmp_path):
    videos = tmp_path / "videos"
    videos.mkdir()
    for index in range(4):
        make_video(videos / f"v{index}.mp4", duration_s=1.0, fps=25)
    overrides = ["shards.videos_per_shard=1", "executor.slurm_max_array_size=3"]
    cfg = load_config(None, overrides)
    work = tmp_path / "work"
    write_manifest(cfg, videos, work)
    first, second = sbatch_scripts(cfg, "decode", work_dir=work, overrides=overrides, num_shards=4)
    path = tmp_path / "decode-2.sbatch"
    path.write_text(second)
    env = dict(os.environ, SLURM_ARRAY_TASK_ID="0", SLURM_ARRAY_TASK_COUNT="1", SLURM_CPUS_PER_TASK="1")
    run = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert [s for s in range(4) if WorkDir(work).record("decode", s).exists()] == [3]
    assert "decode: 1 shard(s) run" in run.stderr


def test_submit_sends_each_job_of_a_split_array_and_prints_their_ids(tmp_path, fake_sbatch, capsys):
    work = tmp_path / "work"
    assert (
        cli.main(
            [
                "submit",
                "quantize",
                "--work-dir",
                str(work),
                "--num-shards",
                "5",
                "--after",
                "70:71",
                "--set",
                "executor.slurm_max_array_size=2",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip() == "4242:4243:4244"  # what --after takes
    calls = fake_sbatch.read_text().splitlines()
    assert [call.split()[:-1] for call in calls] == [["--parsable"]] * 3  # no throttle: all at once
    scripts = [Path(call.split()[-1]).read_text() for call in calls]
    assert all("#SBATCH --dependency=afterok:70:71" in _directives(script) for script in scripts)
    assert [_command(script)[_command(script).index("--shard") + 1] for script in scripts] == [
        "$SLURM_ARRAY_TASK_ID",
        "$((SLURM_ARRAY_TASK_ID + 2))",
        "$((SLURM_ARRAY_TASK_ID + 4))",
    ]

    # with a throttle, each job waits for the one before: at most 3 tasks at once over all of them
    fake_sbatch.unlink()
    assert (
        cli.main(
            [
                "submit",
                "quantize",
                "--work-dir",
                str(work),
                "--num-shards",
                "5",
                "--after",
                "70",
                "--array-parallelism",
                "3",
                "--set",
                "executor.slurm_max_array_size=2",
                "--quiet",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip() == "4242:4243:4244"
    calls = [call.split()[:-1] for call in fake_sbatch.read_text().splitlines()]
    assert calls == [
        ["--parsable"],
        ["--parsable", "--dependency=afterok:70,afterany:4242"],
        ["--parsable", "--dependency=afterok:70,afterany:4243"],
    ]

    assert (
        cli.main(
            [
                "submit",
                "quantize",
                "--work-dir",
                str(work),
                "--num-shards",
                "3",
                "--dry-run",
                "--set",
                "executor.slurm_max_array_size=2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("#!/bin/bash") == 2 and "# ---- job 2 of 2: sbatch ----" in out


def test_the_number_of_tasks_defaults_to_the_manifest_shards(tmp_path, capsys):
    assert cli.main(["submit", "decode", "--work-dir", str(tmp_path), "--dry-run"]) == 2
    assert "give --num-shards" in capsys.readouterr().err
    write_manifest_rows(
        tmp_path,
        [
            {"video_id": f"v{i}", "uri": f"/v/{i}.mp4", "bytes": 1, "transcript_uri": None, "shard": i // 2}
            for i in range(5)
        ],
    )
    assert cli.main(["submit", "decode", "--work-dir", str(tmp_path), "--dry-run"]) == 0
    assert "#SBATCH --array=0-2" in capsys.readouterr().out
    assert cli.main(["submit", "train", "--work-dir", str(tmp_path), "--dry-run"]) == 0  # one job, no array
    assert "--array" not in capsys.readouterr().out


def _launcher(command: list[str]) -> int:
    """Where the torchrun module stands in a train command: the rendezvous-checking launcher on several
    nodes, torch's own on one."""
    for name in ("pipeline.executors.torchrun", "torch.distributed.run"):
        if name in command:
            return command.index(name)
    raise AssertionError(f"no torchrun in {command}")


def _torchrun_args(command: list[str]):
    """The torchrun part of a train command, parsed by torchrun's own parser."""
    from torch.distributed.run import get_args_parser

    return get_args_parser().parse_args(command[_launcher(command) + 1 :])


def test_multi_node_training_is_srun_with_one_torchrun_per_node_meeting_at_the_first_node(tmp_path):
    cfg = load_config(
        None,
        [
            "executor.slurm_nodes=2",
            "executor.slurm_gpus=4",
            "executor.slurm_rdzv_port=29511",
            "executor.slurm_cpus_per_task=16",
        ],
    )
    config = tmp_path / "my config.yaml"
    python = tmp_path / "bin dir" / "python"
    script = sbatch_script(cfg, "train", work_dir=tmp_path / "work", config=str(config), python=str(python))
    directives = _directives(script)
    for expected in ("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:4", "--cpus-per-task=16", "--requeue"):
        assert f"#SBATCH {expected}" in directives, expected
    assert not any("--array" in line for line in directives)
    command = _command(script)
    assert command[0] == "srun" and "--ntasks-per-node=1" in command and "--kill-on-bad-exit=1" in command
    assert command[command.index("-m") - 1] == str(python)  # the path with a space, one word
    assert command[command.index("-m") + 1] == "pipeline.executors.torchrun"
    args = _torchrun_args(command)
    assert (args.nnodes, args.nproc_per_node, args.rdzv_backend) == ("2", "4", "c10d")
    assert (args.rdzv_endpoint, args.rdzv_id) == ("$MASTER_ADDR:29511", "$SLURM_JOB_ID")
    assert not args.standalone and args.module and args.training_script == "pipeline"
    assert args.training_script_args[0] == "train" and args.training_script_args[-1] == "--resume"
    assert args.training_script_args[args.training_script_args.index("--config") + 1] == str(config)

    # run it: scontrol names the job's nodes, srun records what it would start on each
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    # the first node's name does not resolve; its NodeAddr does
    (bin_dir / "scontrol").write_text(
        '#!/bin/bash\n[ "$1 $2 $3" = "show hostnames gpu-[07-08]" ] && '
        'printf "gpu-07\\ngpu-08\\n"\n'
        '[ "$1 $2 $3" = "show node gpu-07" ] && '
        'echo "NodeName=gpu-07 Arch=x86_64" && echo "   NodeAddr=127.0.0.1 NodeHostName=gpu-07"\n'
        "exit 0\n"
    )
    (bin_dir / "scontrol").chmod(0o755)
    recorded = tmp_path / "srun.txt"
    (bin_dir / "srun").write_text(
        f'#!/bin/bash\n{{ echo "MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"; '
        f'printf "%s\\n" "$@"; }} > {shlex.quote(str(recorded))}\n'
    )
    (bin_dir / "srun").chmod(0o755)
    path = tmp_path / "train.sbatch"
    path.write_text(script)
    env = dict(
        os.environ,
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        SLURM_JOB_NODELIST="gpu-[07-08]",
        SLURM_JOB_ID="9001",
        SLURM_CPUS_PER_TASK="16",
    )
    run = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = recorded.read_text().splitlines()
    assert lines[0] == "MASTER_ADDR=127.0.0.1 MASTER_PORT=29511"
    srun_args = lines[1:]
    assert "--cpus-per-task=16" in srun_args
    torchrun = _torchrun_args(["srun", *srun_args])
    assert (torchrun.rdzv_endpoint, torchrun.rdzv_id) == ("127.0.0.1:29511", "9001")

    # a first node whose address does not resolve stops the job with one line before any torchrun starts
    (bin_dir / "scontrol").write_text('#!/bin/bash\n[ "$1 $2" = "show hostnames" ] && echo gpu-07.invalid\nexit 0\n')
    recorded.unlink()
    run = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and not recorded.exists()
    assert run.stderr == (
        "train: the first node's address gpu-07.invalid (node gpu-07.invalid) does not resolve: "
        "the rendezvous cannot start\n"
    )

    # without scontrol's answer the job stops with one line instead of a torchrun that waits forever
    (bin_dir / "scontrol").write_text("#!/bin/bash\nexit 1\n")
    run = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "cannot read the first node" in run.stderr

    single = load_config(None, ["executor.slurm_gpus=4"])  # one node: torchrun --standalone, no srun
    assert _torchrun_args(_command(sbatch_script(single, "train", work_dir=tmp_path))).standalone


RENDEZVOUS_CHECK = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} local {os.environ['LOCAL_RANK']} sum {total.item():g}")
dist.destroy_process_group()
"""


@pytest.mark.slow  # four Python processes importing torch (~15 s on 2 cores)
def test_two_torchruns_with_the_scripts_options_form_one_job(tmp_path):
    """The torchrun options the script writes, run for real as two "nodes" on this machine: the agents meet
    in the c10d rendezvous and start a world of 2 x 1 processes."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cfg = load_config(None, ["executor.slurm_nodes=2", "executor.slurm_gpus=1", f"executor.slurm_rdzv_port={port}"])
    command = _command(sbatch_script(cfg, "train", work_dir=tmp_path))
    start, end = _launcher(command) + 1, command.index("-m", _launcher(command))
    options = [
        word.replace("$MASTER_ADDR", "127.0.0.1").replace("$SLURM_JOB_ID", "9001") for word in command[start:end]
    ]
    check = tmp_path / "check.py"
    check.write_text(RENDEZVOUS_CHECK)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    agents = [
        subprocess.Popen(
            [sys.executable, "-m", "pipeline.executors.torchrun", *options, str(check)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [agent.communicate(timeout=180) for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], [err[-2000:] for _, err in outputs]
    lines = sorted(line for out, _ in outputs for line in out.splitlines() if line.startswith("rank "))
    assert lines == ["rank 0 of 2 local 0 sum 3", "rank 1 of 2 local 0 sum 3"]


@pytest.mark.slow  # five Python processes importing torch (~15 s on 2 cores)
def test_a_rendezvous_that_cannot_start_is_one_line_and_other_outcomes_are_torchruns_own(tmp_path):
    """The script's torchrun options with short rendezvous timeouts: a port already taken by another socket
    and a second node that never joins each end in one line naming the endpoint, exit 2; a one-node run
    succeeds, and a training failure keeps torchrun's own exit code and report."""
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))  # bound, never listening: no store can start there
    frees = []
    for _ in range(3):  # one endpoint per run: they run at the same time
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            frees.append(probe.getsockname()[1])
    free, ok_port, fails_port = frees
    port = taken.getsockname()[1]
    cfg = load_config(None, ["executor.slurm_nodes=2", "executor.slurm_gpus=1", f"executor.slurm_rdzv_port={port}"])
    command = _command(sbatch_script(cfg, "train", work_dir=tmp_path))
    start, end = _launcher(command) + 1, command.index("-m", _launcher(command))
    options = [
        word.replace("$MASTER_ADDR", "127.0.0.1").replace("$SLURM_JOB_ID", "9001") for word in command[start:end]
    ]
    options += ["--rdzv-conf", "read_timeout=3,join_timeout=3"]
    ok, fails = tmp_path / "ok.py", tmp_path / "fails.py"
    ok.write_text("print('trained')\n")
    fails.write_text("raise SystemExit(3)\n")
    alone = [word.replace(f":{port}", f":{free}") for word in options]
    one_node = [word if word != "2" else "1" for word in alone]  # --nnodes 1
    assert one_node[one_node.index("--nnodes") + 1] == "1"
    fails_node = [word.replace(f":{free}", f":{fails_port}") for word in one_node]
    one_node = [word.replace(f":{free}", f":{ok_port}") for word in one_node]
    launcher, torchrun = (
        [sys.executable, "-m", "pipeline.executors.torchrun"],
        [sys.executable, "-m", "torch.distributed.run"],
    )
    runs = {
        "taken": [*launcher, *options, str(ok)],
        "alone": [*launcher, *alone, str(ok)],
        "ok": [*launcher, *one_node, str(ok)],
        "fails": [*launcher, *fails_node, str(fails)],
    }
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        started = {
            name: subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name, argv in runs.items()
        }
        results = {name: (agent.communicate(timeout=180), agent.returncode) for name, agent in started.items()}
        # torch's own launcher on the failing script, after the others (it would share their free port)
        own = subprocess.run([*torchrun, *fails_node, str(fails)], env=env, capture_output=True, text=True, timeout=180)
    finally:
        taken.close()
    for name, endpoint in (("taken", f"127.0.0.1:{port}"), ("alone", f"127.0.0.1:{free}")):
        (out, err), code = results[name]
        assert code == 2 and out == "", (name, err[-2000:])
        assert len(err.splitlines()) == 1 and "Traceback" not in err, (name, err[-2000:])
        assert err.startswith(f"train: the rendezvous at {endpoint} could not start (")
        assert "executor.slurm_rdzv_port" in err and "reachable" in err
    (out, err), code = results["ok"]
    assert code == 0 and "trained" in out, err[-2000:]
    (out, err), code = results["fails"]
    assert code == own.returncode != 0 and "ChildFailedError" in err and "ChildFailedError" in own.stderr


def test_array_size_and_node_counts_are_checked_at_load():
    for key, value in (("slurm_max_array_size", 0), ("slurm_nodes", 0), ("slurm_rdzv_port", 80)):
        with pytest.raises(ConfigError, match=f"executor.{key} must be"):
            load_config(None, [f"executor.{key}={value}"])


def test_submit_splits_at_the_clusters_max_array_size_unless_the_setting_says_otherwise(tmp_path, fake_sbatch, capsys):
    bin_dir = fake_sbatch.parent / "bin"
    (bin_dir / "scontrol").write_text(
        '#!/bin/bash\n[ "$1 $2" = "show config" ] && '
        'printf "MaxArrayJobs = 5\\nMaxArraySize            = 3\\nMaxJobCount = 10000\\n"\n'
    )
    (bin_dir / "scontrol").chmod(0o755)
    work = tmp_path / "work"
    assert cli.main(["submit", "asr", "--work-dir", str(work), "--num-shards", "7", "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == "4242:4243:4244"  # tasks 0-2, 3-5, 6
    fake_sbatch.unlink()
    assert (
        cli.main(
            [
                "submit",
                "asr",
                "--work-dir",
                str(work),
                "--num-shards",
                "7",
                "--quiet",
                "--set",
                "executor.slurm_max_array_size=4",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip() == "4242:4243"  # the setting wins


def test_an_sbatch_refusal_is_one_line_with_sbatchs_message_and_the_fix(tmp_path, monkeypatch, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        '#!/bin/bash\necho "sbatch: error: Batch job submission failed: Invalid job array specification" >&2\nexit 1\n'
    )
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert (
        cli.main(
            [
                "submit",
                "asr",
                "--work-dir",
                str(tmp_path),
                "--num-shards",
                "5",
                "--quiet",
                "--set",
                "executor.slurm_max_array_size=5",
            ]
        )
        == 2
    )
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("submit: sbatch refused asr (")
    assert (
        "sbatch: error: Batch job submission failed: Invalid job array specification; the array is longer "
        "than the cluster's MaxArraySize (5 assumed; "
    ) in err and "set executor.slurm_max_array_size" in err


def test_only_incomplete_asks_for_the_unfinished_tasks_by_their_numbers(tmp_path, capsys):
    write_manifest_rows(
        tmp_path,
        [{"video_id": f"v{i}", "uri": f"/v/{i}.mp4", "bytes": 1, "transcript_uri": None, "shard": i} for i in range(7)],
    )
    # shards 0, 2, 3 and 6 done (hand-made parts vouched for by their records)
    for shard in (0, 2, 3, 6):
        write_part(
            tmp_path,
            "decode",
            shard,
            pa.Table.from_pylist([], schema=schemas.DECODE_CLIPS.arrow),
            schemas.DECODE_CLIPS,
            record={"videos": 1},
        )
    args = [
        "submit",
        "decode",
        "--work-dir",
        str(tmp_path),
        "--dry-run",
        "--only-incomplete",
        "--set",
        "executor.slurm_max_array_size=3",
    ]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    # tasks 0-2 are one job, 3-5 the next, 6 the last: tasks 1, 4 and 5 remain
    assert "#SBATCH --array=1\n" in out and "#SBATCH --array=1,2\n" in out and out.count("#!/bin/bash") == 2
    assert '--shard "$SLURM_ARRAY_TASK_ID" --num-shards 7' in out
    assert '--shard "$((SLURM_ARRAY_TASK_ID + 3))" --num-shards 7' in out
