"""The command line's own mistakes end in one line with the usage code 2, and nothing is run: a --work-dir
that is a file, shard and worker options no run can take; an error of the OS is one line naming its file;
a reader that stops reading the output (`| head -1`) ends the command quietly."""

import errno
import subprocess
import sys
from pathlib import Path

import pytest
from work_factory import write_manifest_rows

from pipeline import cli

REPO = Path(__file__).resolve().parent.parent


def _run(capsys, *args) -> tuple[int, str]:
    code = cli.main([str(arg) for arg in args])
    return code, capsys.readouterr().err


@pytest.fixture
def work(tmp_path):
    """A manifest of two shards (no video is read by the commands here)."""
    work = tmp_path / "work"
    write_manifest_rows(
        work,
        [
            {
                "video_id": f"v{shard}",
                "uri": f"/videos/v{shard}.mp4",
                "bytes": 1,
                "transcript_uri": None,
                "shard": shard,
            }
            for shard in (0, 1)
        ],
    )
    return work


@pytest.mark.parametrize(
    "command",
    [["status"], ["decode"], ["validate"], ["summary"], ["errors"], ["card"], ["manifest", "--input", "."], ["kmeans"]],
)
def test_a_work_dir_that_is_a_file_is_one_line_with_the_usage_code(tmp_path, capsys, command):
    file = tmp_path / "notes.txt"
    file.write_text("not a folder")
    for work_dir in (file, file / "run1"):
        code, err = _run(capsys, *command, "--work-dir", work_dir)
        assert code == 2 and err == (
            f"{command[0]}: --work-dir {work_dir}: {file} is a file, not a folder: give "
            f"a folder (one that does not exist yet is made)\n"
        ), err
    assert file.read_text() == "not a folder"


@pytest.mark.parametrize(
    "options, message",
    [
        (["--shard", "2", "--num-shards", "2"], "--shard must be in 0..1 for --num-shards 2 (got 2)"),
        (["--shard", "-1", "--num-shards", "2"], "--shard must be in 0..1 for --num-shards 2 (got -1)"),
        (["--shard", "0", "--num-shards", "0"], "--num-shards must be >= 1 (got 0)"),
        (["--num-shards", "0"], "--num-shards must be >= 1 (got 0)"),
        (["--shard", "1"], "--shard and --num-shards go together"),
        (["--workers", "-3"], "--workers must be >= 0 and <= 1024 (0: the config's value) (got -3)"),
        (["--workers", "100000"], "--workers must be >= 0 and <= 1024 (0: the config's value) (got 100000)"),
    ],
)
def test_shard_and_worker_options_no_run_can_take_are_usage_errors(work, capsys, options, message):
    code, err = _run(capsys, "decode", "--work-dir", work, "--quiet", *options)
    assert (code, err) == (2, f"decode: {message}\n")
    assert not (work / "decode").exists() and not (work / "_state" / "done" / "decode").exists()


def test_kmeans_and_submit_options_too(work, capsys):
    assert _run(capsys, "kmeans", "--work-dir", work, "--workers", "-1") == (
        2,
        "kmeans: --workers must be >= 0 and <= 1024 (0: the config's value) (got -1)\n",
    )
    assert _run(capsys, "submit", "decode", "--work-dir", work, "--num-shards", "0", "--dry-run") == (
        2,
        "submit: --num-shards must be >= 1 (got 0)\n",
    )
    assert _run(capsys, "submit", "decode", "--work-dir", work, "--array-parallelism", "0", "--dry-run") == (
        2,
        "submit: --array-parallelism must be >= 1 (got 0)\n",
    )


def test_an_os_error_is_one_line_without_an_empty_place(work, capsys, monkeypatch):
    def full(args, cfg):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cli, "dispatch", full)
    assert _run(capsys, "decode", "--work-dir", work) == (
        1,
        "decode: error: No space left on device (the disk is full: free space or choose another --work-dir)\n",
    )

    def missing(args, cfg):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/videos/v0.mp4")

    monkeypatch.setattr(cli, "dispatch", missing)
    assert _run(capsys, "decode", "--work-dir", work) == (
        1,
        "decode: error: /videos/v0.mp4: No such file or directory\n",
    )


@pytest.mark.parametrize("command", ["status", "errors"])
def test_output_into_a_closed_pipe_ends_quietly(work, command):
    """As `python -m pipeline status | head -1` when the reader has gone: no traceback, and the exit code
    of a command stopped by its reader (128 + SIGPIPE)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline", command, "--work-dir", str(work)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.close()  # before the command writes: its first write finds no reader
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == cli.EXIT_BROKEN_PIPE and err == "", err
    shell = subprocess.run(
        f"{sys.executable} -m pipeline {command} --work-dir {work} | head -1",
        shell=True,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert shell.returncode == 0 and shell.stderr == "" and shell.stdout.count("\n") == 1, shell


def test_help_imports_no_torch():
    """`--help` of the program and of every command reads the command table alone: no network library loads."""
    import subprocess
    import sys

    from pipeline.cli import table

    names = [entry.name for entry in table.commands()]
    script = (
        "import sys\nfrom pipeline import cli\n"
        f"for argv in [['--help']] + [[name, '--help'] for name in {names!r}]:\n"
        "    try:\n        cli.main(argv)\n    except SystemExit:\n        pass\n"
        "print(sorted(m for m in ('torch', 'transformers', 'faiss', 'av', 'ray') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_version_is_the_installed_distributions(capsys):
    from importlib import metadata

    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip().endswith(f" {metadata.version('videobert-pipeline')}")
