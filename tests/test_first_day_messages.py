"""The messages a new user meets on the first day with their own videos: what --config defaults to, stages run
out of order, one spelling of the command, a read-only work dir, a missing input, eval's answers."""

from __future__ import annotations

import argparse
import errno
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from media_factory import one_clip_videos

from pipeline import cli
from pipeline.cli import table, tools

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *args) -> tuple[int, str]:
    code = cli.main([str(arg) for arg in args])
    return code, capsys.readouterr().err


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_help_says_config_defaults_to_the_remembered_config():
    checked = 0
    for name, sub in _subparsers(table.build_parser()).items():
        for action in sub._actions:
            if "--config" in action.option_strings and action.help != table.CHECK_CONFIG_HELP and name != "config":
                assert "remember" in action.help, name
                assert "(default: the built-in defaults" not in action.help, name
                checked += 1
    assert checked >= 15
    assert "the built-in defaults, the paper's values)" not in table.CHECK_CONFIG_HELP


@pytest.fixture
def listed(tmp_path) -> Path:
    """A work dir with a manifest of eight one-video shards and nothing else."""
    videos = one_clip_videos(tmp_path / "videos", 8)
    work = tmp_path / "work"
    assert (
        cli.main(
            [
                "manifest",
                "--config",
                str(ROOT / "configs/demo.yaml"),
                "--work-dir",
                str(work),
                "--input",
                str(videos),
                "--set",
                "shards.videos_per_shard=1",
                "--quiet",
            ]
        )
        == 0
    )
    return work


def test_a_stage_run_out_of_order_says_so_in_one_line_not_one_per_shard(listed, capsys):
    capsys.readouterr()
    code, err = run(capsys, "align", "--work-dir", listed, "--workers", 1, "--quiet")
    assert code == cli.EXIT_FAILED
    lines = [line for line in err.splitlines() if not line.startswith("config:")]
    assert lines == [
        "align: 0 shard(s) run, 0 already current, 0 failed, 8 could not run; 0 videos, 0 clips in "
        + lines[0].split(" clips in ")[1],
        "  align: 8 parts could not run (00000, 00001, 00002, 00003, 00004 ...), for the same reason as "
        "the first: align part 00000 needs quantize part 00000, which is missing: run the quantize "
        "stage first",
    ]


@pytest.mark.parametrize(
    "argv0, name", [("/x/.venv/bin/videobert", "videobert"), ("/x/pipeline/__main__.py", "python -m pipeline")]
)
def test_messages_spell_the_command_as_it_was_typed(monkeypatch, capsys, argv0, name):
    monkeypatch.setattr("sys.argv", [argv0])
    code, err = run(capsys, "validate")
    assert code == cli.EXIT_USAGE
    assert err.strip() == f"validate: give the work dir ({name} validate --work-dir DIR)"


def test_a_read_only_work_dir_is_named_not_the_probe_file(tmp_path, monkeypatch, capsys):
    from pipeline.engine import workdir

    work = tmp_path / "work"

    def read_only(path, mode="r", *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(workdir, "open", read_only, raising=False)
    code, err = run(capsys, "manifest", "--config", ROOT / "configs/demo.yaml", "--work-dir", work, "--input", tmp_path)
    assert code == cli.EXIT_FAILED
    assert err.startswith(f"manifest: error: {work}: Read-only file system")
    assert ".probe-" not in err


def test_a_manifest_of_a_missing_input_leaves_no_empty_work_dir(tmp_path, capsys):
    work = tmp_path / "work"
    code, err = run(
        capsys,
        "manifest",
        "--config",
        ROOT / "configs/demo.yaml",
        "--work-dir",
        work,
        "--input",
        tmp_path / "no-such-folder",
    )
    assert code != 0 and "no-such-folder" in err
    assert not work.exists()
    (tmp_path / "kept").mkdir()  # a work dir that was there stays, without an empty _state/ in it
    code, _ = run(
        capsys,
        "manifest",
        "--config",
        ROOT / "configs/demo.yaml",
        "--work-dir",
        tmp_path / "kept",
        "--input",
        tmp_path / "no-such-folder",
    )
    assert code != 0 and (tmp_path / "kept").is_dir() and not (tmp_path / "kept" / "_state").exists()


def test_eval_captioning_without_its_annotations_is_a_config_error(tmp_path, capsys):
    (tmp_path / "work").mkdir()
    code, err = run(capsys, "eval", "captioning", "--work-dir", tmp_path / "work", "--quiet")
    assert code == cli.EXIT_USAGE
    assert err.strip().splitlines() == [
        "eval: config error: eval captioning needs eval.segments to be a YouCook II annotations .json file (the "
        "captions and their subsets) (got 'align'): --set eval.segments=FILE.json"
    ]


def test_predict_video_prints_what_it_predicted(tmp_path, capsys):
    path = tmp_path / "predict_video.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [
                {"sentence": "chop the onion", "visual_ids": [3, 7], "probs": [0.5, 0.25]},
                {"sentence": "stir", "visual_ids": [1, 1], "probs": [0.125, 0.75]},
            ]
        ),
        path,
    )
    tools.print_predictions(path)
    assert capsys.readouterr().out.splitlines() == [
        "'chop the onion': v3 0.50, v7 0.25",
        "'stir': v1 0.12, v1 0.75",
        f"(visual word ids are codebook leaves: `gallery --ids` shows their clips) -> {path}",
    ]


# ---------------------------------------------------------------- packaging


def test_the_pyproject_declares_the_licence_of_the_license_file():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().split()[:2] == ["Apache", "License"]


def test_no_other_distribution_owns_a_top_level_package_and_doctor_says_when_one_does(monkeypatch, capsys):
    from pipeline import packaging

    assert packaging.collisions() == []
    assert set(packaging.TOP_LEVEL) == {path.parent.name for path in ROOT.glob("*/__init__.py")}
    owners = {"reports": ["reportlab-reports"], "pipeline": ["videobert_pipeline"]}
    monkeypatch.setattr("importlib.metadata.packages_distributions", lambda: owners)
    assert packaging.collisions() == [
        "the top-level package 'reports' is also installed by reportlab-reports: the two overwrite each other's "
        "files; install videobert-pipeline in its own virtual environment"
    ]
    assert packaging.main() == 1
    assert "reportlab-reports" in capsys.readouterr().err
    code, err = run(capsys, "doctor", "--config", ROOT / "configs/demo.yaml")
    assert code == cli.EXIT_USAGE and "  the top-level package 'reports' is also installed by" in err
